// The public HTTP API: bearer token for the tab, JSON calls, and the /v1/events stream.

const TOKEN_KEY = "neotask.token";
const EVENT_TYPES = ["message", "reply", "compaction", "inheritance", "reset", "lifecycle", "memory"];

export const auth = {
  required: document.documentElement.dataset.auth === "required",
  get token() { return sessionStorage.getItem(TOKEN_KEY) || ""; },
  set(token) { sessionStorage.setItem(TOKEN_KEY, token); },
  clear() { sessionStorage.removeItem(TOKEN_KEY); },
};

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.body = body;
  }
}

let unauthorized = () => {};
export function onUnauthorized(handler) { unauthorized = handler; }

export async function call(method, path, { query, body } = {}) {
  const headers = { Accept: "application/json" };
  if (auth.token) headers.Authorization = `Bearer ${auth.token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const url = withQuery(path, query);
  const response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { error: { message: text.slice(0, 200) } }; }
  }
  if (response.status === 401) unauthorized();
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const get = (path, query) => call("GET", path, { query });
export const post = (path, body = {}) => call("POST", path, { body });
export const patch = (path, body) => call("PATCH", path, { body });
export const del = (path) => call("DELETE", path);

/** A session key is ONE percent-encoded path segment (SPEC section 1). */
export const sessionPath = (key, tail = "") => `/v1/sessions/${encodeURIComponent(key)}${tail}`;
export const runPath = (id, tail = "") => `/v1/runs/${encodeURIComponent(id)}${tail}`;

function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) if (v !== null && v !== undefined && v !== "") params.set(k, v);
  const q = params.toString();
  return q ? `${path}?${q}` : path;
}

/** One EventSource on /v1/events for the whole page; views subscribe and unsubscribe. */
class Live {
  constructor() {
    this.handlers = new Set();
    this.stateHandlers = new Set();
    this.source = null;
    this.state = "off";
  }

  connect() {
    this.close();
    const url = auth.token ? withQuery("/v1/events", { access_token: auth.token }) : "/v1/events";
    const source = new EventSource(url);
    this.source = source;
    this.setState("connecting");
    source.onopen = () => this.setState("live");
    source.onerror = () => this.setState(source.readyState === EventSource.CLOSED ? "off" : "connecting");
    for (const type of EVENT_TYPES) {
      source.addEventListener(type, (message) => {
        let event;
        try { event = JSON.parse(message.data); } catch { return; }
        for (const handler of [...this.handlers]) handler(event);
      });
    }
  }

  close() {
    if (this.source) this.source.close();
    this.source = null;
    this.setState("off");
  }

  subscribe(handler) {
    this.handlers.add(handler);
    return () => this.handlers.delete(handler);
  }

  onState(handler) {
    this.stateHandlers.add(handler);
    handler(this.state);
  }

  setState(state) {
    this.state = state;
    for (const handler of this.stateHandlers) handler(state);
  }
}

export const live = new Live();
