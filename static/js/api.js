// JSON over HTTP for the conversation records (docs/protocol.md, "HTTP JSON endpoints").
// Owns: CSRF header, the page token (which binds the page's calls to the session it was rendered
// for), JSON encoding, turning `{"error": {...}}` answers into ApiError, and the reload when the
// server says the session changed under the page.
import { gettext, interpolate } from "./i18n.js";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** The token the page was rendered with (`<meta name="page-token">`; "" on pages without one). */
export function pageToken() {
  return document.querySelector('meta[name="page-token"]')?.content ?? "";
}

const RELOAD_KEY = "playground-session-reload-at";
const MIN_RELOAD_INTERVAL_MS = 10000;

/** `session_changed`: another site swapped this browser's session cookie after the page loaded.
 * Reloading gives the page the browser's current session (its key rotated); at most once every
 * 10 s, so a browser that keeps losing its cookie is not caught in a reload loop. */
export function reloadForNewSession() {
  try {
    const last = Number(sessionStorage.getItem(RELOAD_KEY) || 0);
    if (Date.now() - last < MIN_RELOAD_INTERVAL_MS) return false;
    sessionStorage.setItem(RELOAD_KEY, String(Date.now()));
  } catch {
    return false;  // no storage: do not risk a loop
  }
  location.reload();
  return true;
}

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  if (pageToken()) headers["X-Page-Token"] = pageToken();
  let response;
  try {
    response = await fetch(path, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, "network", interpolate(gettext("Cannot reach the server (%(reason)s)."), { reason: err.message }));
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = data?.error ?? {};
    if (error.code === "session_changed") reloadForNewSession();
    throw new ApiError(response.status, error.code ?? "http_error",
      error.message ?? interpolate(gettext("%(method)s %(path)s failed with HTTP %(status)s."), { method, path, status: response.status }));
  }
  return data;
}

export const getJson = (path) => api("GET", path);
