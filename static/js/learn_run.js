// The lesson page's requests: one `complete` command (docs/protocol.md) as a promise of
// everything it produced (its run, run_state.js). Owns: how many
// requests the page keeps in flight (the server allows PLAYGROUND_MAX_CONCURRENT_PER_CLIENT, 2
// by default, per browser; a refusal for that reason is retried, not shown). Must not know
// the sections or what they draw.
import { followRun, newRun } from "./run_state.js";

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
   * Runs `command` (a `complete`); resolves with its run (run_state.js newRun: `generation_id`,
   * `model`, `params`, `prompt`, `prefilled`, `steps`, `text`, `stats`, ...) once
   * `generation.finished` arrives, rejects with a RunError. `onStep(run)` is called as tokens stream.
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
      const run = newRun();
      this.socket.start({ command: "complete", ...command }, followRun(run, (_, type, event) => {
        if (type === "generation.tokens") onStep(run);
        else if (type === "generation.finished") resolve(run);
        else if (type === "error" || type === "generation.error") reject(new RunError(event));
      }));
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
