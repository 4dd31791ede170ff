// The lesson page's requests: one `complete` command (docs/protocol.md) as a promise of
// everything it produced. Owns: collecting a request's events into one record, and how many
// requests the page keeps in flight (the server allows PLAYGROUND_MAX_CONCURRENT_PER_CLIENT, 2
// by default, per browser; a refusal for that reason is retried, not shown). Must not know
// the sections or what they draw.

const MAX_IN_FLIGHT = 2;
const RETRY_MS = 800;
const MAX_RETRIES = 40;

/** A request's failure: the server's stable `code` and its message. */
export class RunError extends Error {
  constructor({ code, message }) {
    super(message);
    this.code = code;
  }
}

export class LessonRunner {
  constructor(socket) {
    this.socket = socket;
    this.numInFlight = 0;
    this.waiting = [];
  }

  /**
   * Runs `command` (a `complete`); resolves with {generationId, started, prefilled, steps,
   * beams, handoff, finished} once `generation.finished` arrives, rejects with a RunError.
   * `onStep(run)` is called as tokens stream.
   */
  async complete(command, { onStep = () => {} } = {}) {
    await this.slot();
    try {
      for (let attempt = 0; ; attempt += 1) {
        try {
          return await this.once(command, onStep);
        } catch (err) {
          if (err.code !== "too_many_generations" || attempt >= MAX_RETRIES) throw err;
          await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
        }
      }
    } finally {
      this.release();
    }
  }

  once(command, onStep) {
    return new Promise((resolve, reject) => {
      const run = { generationId: null, started: null, prefilled: null, steps: [], beams: [], handoff: null, finished: null };
      const handle = this.socket.start({ command: "complete", ...command }, {
        onQueued: (event) => { run.generationId = event.generation_id; },
        onStarted: (event) => { run.started = event; },
        onPrefilled: (event) => { run.prefilled = event; },
        onHandoff: (event) => { run.handoff = event; },
        onTokens: (event) => { run.steps.push(...event.steps); onStep(run); },
        onBeams: (event) => { run.beams.push(...event.steps); },
        onFinished: (event) => { run.finished = event; run.generationId = handle.generationId; resolve(run); },
        onError: (error) => reject(new RunError(error)),
      });
    });
  }

  async slot() {
    if (this.numInFlight < MAX_IN_FLIGHT) { this.numInFlight += 1; return; }
    await new Promise((resolve) => this.waiting.push(resolve));
  }

  release() {
    const next = this.waiting.shift();
    if (next) next(); else this.numInFlight -= 1;
  }
}
