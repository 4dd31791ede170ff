// JSON over HTTP for the conversation records (docs/protocol.md, "HTTP JSON endpoints").
// Owns: CSRF header, JSON encoding, turning `{"error": {...}}` answers into ApiError.
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

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
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
    throw new ApiError(response.status, error.code ?? "http_error",
      error.message ?? interpolate(gettext("%(method)s %(path)s failed with HTTP %(status)s."), { method, path, status: response.status }));
  }
  return data;
}

export const getJson = (path) => api("GET", path);
