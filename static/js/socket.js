// The /ws/generate/ connection (docs/protocol.md). Owns: connecting and reconnecting,
// request ids, and routing events to the generation they belong to. Pages see one
// `GenerationHandle` per command and never parse routing fields themselves; the workers' model
// states (`worker.model`, for no generation) go to `onWorkerModel`.
import { gettext, interpolate } from "./i18n.js";

import { pageToken, reloadForNewSession } from "./api.js";

const RECONNECT_MAX_MS = 8000;
const SESSION_CHANGED_CLOSE_CODE = 4409;  // the server's, after a `session_changed` error
// The server's PLAYGROUND_MAX_MESSAGE_BYTES default (512 KiB of text plus room for 4 images of
// 1 MiB as base64): a bigger message is refused here, with a clear message, instead of being
// sent (past daphne's 16 MiB the server would drop the connection).
const MAX_MESSAGE_BYTES = 512 * 1024 + Math.floor((4 * 1024 * 1024 * 4) / 3) + 4096;

// Each event type -> the handler it calls (run_state.js followRun makes one of each).
export const HANDLER_BY_TYPE = {
  "generation.queued": "onQueued",
  "generation.attached": "onAttached",
  "generation.started": "onStarted",
  "generation.waiting": "onWaiting",
  "generation.prefilled": "onPrefilled",
  "generation.tokens": "onTokens",
  "generation.beams": "onBeams",
  "generation.handoff": "onHandoff",
  "generation.finished": "onFinished",
};

export class GenerationHandle {
  constructor(socket, requestId, handlers) {
    this.socket = socket;
    this.requestId = requestId;
    this.handlers = handlers;
    this.generationId = null;
    this.isDone = false;
    this.stopRequested = false;
  }

  /** Ask the server to stop; safe before `generation.queued` arrived (sent once it does). */
  stop() {
    this.stopRequested = true;
    if (this.generationId !== null && !this.isDone) {
      this.socket.sendRaw({ command: "stop", generation_id: this.generationId });
    }
  }
}

export class GenerationSocket {
  constructor({ path = "/ws/generate/", onStatus = () => {}, onWorkerModel = null } = {}) {
    // The page token binds the socket to the session the page was rendered for (docs/protocol.md).
    const query = pageToken() ? `?page_token=${encodeURIComponent(pageToken())}` : "";
    this.url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}${query}`;
    this.onStatus = onStatus;
    this.onWorkerModel = onWorkerModel;  // given: every (re)connect asks for the workers' model states
    this.byRequest = new Map();
    this.byGeneration = new Map();
    this.outbox = [];
    this.nextRequest = 1;
    this.retryMs = 500;
    this.connect();
  }

  connect() {
    this.onStatus("connecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.retryMs = 500;
      this.onStatus("open");
      if (this.onWorkerModel) ws.send(JSON.stringify({ command: "follow_models" }));
      for (const message of this.outbox.splice(0)) ws.send(JSON.stringify(message));
    });
    ws.addEventListener("message", (msg) => this.dispatch(msg.data));
    ws.addEventListener("close", (closing) => {
      if (closing.code === SESSION_CHANGED_CLOSE_CODE && reloadForNewSession()) return;
      this.onStatus("closed");
      this.failAll("connection_lost", gettext("The connection to the server was lost. The answer so far is kept."));
      setTimeout(() => this.connect(), this.retryMs);
      this.retryMs = Math.min(this.retryMs * 2, RECONNECT_MAX_MS);
    });
  }

  /** Send a command; events answering it go to `handlers` (onQueued, onStarted, ..., onError). */
  start(command, handlers) {
    const requestId = `r${this.nextRequest++}`;
    const handle = new GenerationHandle(this, requestId, handlers);
    const message = { ...command, request_id: requestId };
    const size = new TextEncoder().encode(JSON.stringify(message)).length;
    if (size > MAX_MESSAGE_BYTES) {
      handle.isDone = true;
      const text = interpolate(gettext("This message is %(size)s KiB; the limit is %(limit)s KiB. Nothing was sent."),
        { size: Math.ceil(size / 1024), limit: Math.floor(MAX_MESSAGE_BYTES / 1024) });
      queueMicrotask(() => handlers.onError?.({ code: "message_too_large", message: text, isRefused: true }));
      return handle;
    }
    this.byRequest.set(requestId, handle);
    this.sendRaw(message);
    return handle;
  }

  /** Follow a generation started before (e.g. before a reload): `attach`, then its events. */
  attach(generationId, handlers) {
    const requestId = `r${this.nextRequest++}`;
    const handle = new GenerationHandle(this, requestId, handlers);
    handle.generationId = generationId;
    this.byRequest.set(requestId, handle);
    this.byGeneration.set(generationId, handle);
    this.sendRaw({ command: "attach", generation_id: generationId, request_id: requestId });
    return handle;
  }

  sendRaw(message) {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
    else this.outbox.push(message);
  }

  dispatch(raw) {
    let event;
    try { event = JSON.parse(raw); } catch { console.warn("ignored a non-JSON message", raw); return; }
    if (event.type === "worker.model") { this.onWorkerModel?.(event); return; }
    const handle = this.route(event);
    if (!handle) return;
    if (event.type === "error" || event.type === "generation.error") {
      this.finish(handle);
      handle.handlers.onError?.({ code: event.code, message: event.message, isRefused: event.type === "error" });
      return;
    }
    const name = HANDLER_BY_TYPE[event.type];
    if (!name) return;
    if (event.type === "generation.finished") this.finish(handle);
    handle.handlers[name]?.(event);
  }

  route(event) {
    let handle = event.generation_id != null ? this.byGeneration.get(event.generation_id) : undefined;
    if (!handle && event.request_id) handle = this.byRequest.get(event.request_id);
    if (handle && event.type === "generation.queued") {
      handle.generationId = event.generation_id;
      this.byGeneration.set(event.generation_id, handle);
      if (handle.stopRequested) handle.stop();
    }
    return handle;
  }

  finish(handle) {
    handle.isDone = true;
    this.byRequest.delete(handle.requestId);
    if (handle.generationId !== null) this.byGeneration.delete(handle.generationId);
  }

  failAll(code, message) {
    for (const handle of [...this.byRequest.values()]) {
      this.finish(handle);
      handle.handlers.onError?.({ code, message, isRefused: handle.generationId === null });
    }
  }
}

/** Reflect the socket state in the top bar's `.conn` element. */
export function showConnection(el) {
  const labels = { connecting: gettext("Connecting…"), open: gettext("Connected"), closed: gettext("Reconnecting…") };
  return (state) => {
    el.dataset.state = state;
    el.querySelector(".conn-label").textContent = labels[state];
  };
}
