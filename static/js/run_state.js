// One generation's run state, folded from the /ws/generate/ events (docs/protocol.md) by one
// reducer. Every page that runs generations (chat, explorer, lesson, A/B) draws from this object
// and keeps no copy of its own. Owns: the state's shape and how each event changes it. Must not
// know: the socket's routing (socket.js), what a page draws.
//
// Names: a field the protocol sends keeps the protocol's name (`generation_id`, `steps`,
// `segments`, `stats`, `finish_reason`, ...); `status` takes a generation's statuses (`queued`,
// `running`, `finished`, `cancelled`, `error`; "idle" before the server answered). Fields of the
// browser's own are camelCase (`beamSteps`, `handoff.receivedAt`).
import { HANDLER_BY_TYPE } from "./socket.js";

/** A run before its first event; `fields` adds to it (the chat's messages are runs with more). */
export function newRun(fields = {}) {
  return {
    generation_id: null,
    status: "idle",
    conversation_id: null,   // generation.queued (chat commands)
    user_message_id: null,
    message_id: null,        // the assistant message (null for `complete`)
    worker: null,            // generation.started
    model: null,
    params: null,            // the sampling params as the server resolved them
    prompt: null,
    waiting: null,           // the last generation.waiting (until prefilled)
    prefilled: null,         // generation.prefilled
    handoff: null,           // generation.handoff (PD), with `receivedAt` (Date.now())
    steps: [],               // token steps (inference/events.py Step): each index once, in order
    beamSteps: [],           // beam search's steps (generation.beams), each index once
    segments: [],            // the reasoning split of `text`
    text: "",                // the answer so far: the steps' text_delta, or the best live beam; then finished's `text`
    finish_reason: null,
    stats: null,             // generation.finished
    error: null,             // {code, message, isRefused}: `isRefused` when nothing was started
    ...fields,
  };
}

/** `steps` with `incoming` merged in: each index once (the first copy kept), in index order. */
export function mergeSteps(steps, incoming) {
  const last = steps.at(-1)?.index ?? -1;
  if (incoming.every((s, i) => s.index > last && (i === 0 || s.index > incoming[i - 1].index))) return [...steps, ...incoming];
  const byIndex = new Map(steps.map((s) => [s.index, s]));
  for (const step of incoming) if (!byIndex.has(step.index)) byIndex.set(step.index, step);
  return [...byIndex.values()].sort((a, b) => a.index - b.index);
}

export const isBeamStep = (record) => record?.type === "beam_step";

/** The answer so far from the steps: their text, or a beam search's best live beam. */
function streamedText(run) {
  if (run.beamSteps.length && !run.steps.length) return run.beamSteps.at(-1).beams[0]?.text ?? "";
  return run.steps.map((s) => s.text_delta).join("");
}

/**
 * Fold one event (a message of the socket, with its `type`; a refusal is `{type: "error", code,
 * message}`) into `run`, in place; returns `run`. Steps that come twice (a re-attached page gets
 * the snapshot's and the live ones) are kept once.
 */
export function reduceRun(run, event) {
  switch (event.type) {
    case "generation.queued":
      run.status = "queued";
      run.generation_id = event.generation_id;
      for (const name of ["conversation_id", "user_message_id", "message_id"]) run[name] = event[name] ?? run[name];
      break;
    case "generation.attached": {
      // Every step so far (docs/protocol.md, attach): token steps, or a beam search's.
      run.status = event.status ?? run.status;
      run.params = event.params ?? run.params;
      const steps = event.steps ?? [];
      if (isBeamStep(steps[0])) run.beamSteps = mergeSteps(run.beamSteps, steps);
      else run.steps = mergeSteps(run.steps, steps);
      run.segments = event.segments ?? run.segments;
      run.text = streamedText(run);
      break;
    }
    case "generation.started":
      run.status = "running";
      run.worker = event.worker ?? null;
      run.model = event.model ?? null;
      run.params = event.params ?? run.params;
      run.prompt = event.prompt ?? null;
      break;
    case "generation.waiting":
      run.waiting = event;
      break;
    case "generation.prefilled":
      run.prefilled = event;
      run.waiting = null;
      break;
    case "generation.handoff":
      run.handoff = { ...event, receivedAt: Date.now() };
      break;
    case "generation.tokens":
      run.status = "running";
      run.steps = mergeSteps(run.steps, event.steps);
      if (event.segments) run.segments = event.segments;
      run.text = streamedText(run);
      break;
    case "generation.beams":
      run.status = "running";
      run.beamSteps = mergeSteps(run.beamSteps, event.steps);
      run.text = streamedText(run);
      break;
    case "generation.finished":
      run.status = event.finish_reason === "cancelled" ? "cancelled" : "finished";
      run.text = event.text ?? run.text;
      run.stats = event.stats ?? null;
      run.finish_reason = event.finish_reason ?? event.stats?.finish_reason ?? null;
      run.segments = event.segments ?? run.segments;
      run.message_id = event.message_id ?? run.message_id;
      break;
    case "generation.error":
    case "error":
      run.status = "error";
      run.error = { code: event.code, message: event.message, isRefused: event.type === "error" };
      break;
    default:
      break;
  }
  return run;
}

/** Whether the run has ended (its one terminal event came, or it was refused). */
export const isEnded = (run) => ["finished", "cancelled", "error"].includes(run.status);

/**
 * The handlers for socket.js `start` / `attach` that fold every event of one generation into
 * `run`, then call `onEvent(run, type, event)` (`type`: the protocol's; a refused command's is
 * "error", a failed generation's "generation.error", and `event` then `{code, message, isRefused}`).
 */
export function followRun(run, onEvent = () => {}) {
  const handlers = {};
  for (const [type, name] of Object.entries(HANDLER_BY_TYPE)) {
    handlers[name] = (event) => {
      reduceRun(run, event);
      onEvent(run, type, event);
    };
  }
  handlers.onError = (error) => {
    const type = error.isRefused ? "error" : "generation.error";
    reduceRun(run, { ...error, type });
    onEvent(run, type, error);
  };
  return handlers;
}
