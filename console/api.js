// The only way the console touches the coordinator: its public API, with the token the user
// typed. Whatever the API refuses, the console cannot do.

const KEY = "idem.token";

export const session = {
  get token() {
    return sessionStorage.getItem(KEY);
  },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code || "";
  }
}

export async function call(method, path, { body, token = session.token } = {}) {
  const headers = { accept: "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (e) {
    throw new ApiError(0, "network", `the coordinator cannot be reached (${e.message})`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = data && data.error ? data.error : {};
    throw new ApiError(response.status, err.code, err.message || text.slice(0, 200));
  }
  return data;
}

export const get = (path, options) => call("GET", path, options);
export const post = (path, body, options) => call("POST", path, { ...options, body });

const enc = encodeURIComponent;

export function txPath(gid, op) {
  return `/api/v1/transactions/${enc(gid)}${op ? `/${op}` : ""}`;
}

// Only set filters are sent: the API refuses unknown or empty parameters.
export function listPath(filters, cursor) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v !== "" && v != null) q.set(k, v);
  if (cursor) q.set("cursor", cursor);
  const s = q.toString();
  return `/api/v1/transactions${s ? `?${s}` : ""}`;
}

// Who the token belongs to. An older coordinator without /whoami still shows the console:
// the token is checked against the list instead and the role taken as the least one, so no
// action is offered that the API might refuse.
export async function whoami(token) {
  try {
    return await get("/api/v1/whoami", { token });
  } catch (e) {
    if (e.status !== 404) throw e;
  }
  await get("/api/v1/transactions?limit=1", { token });
  return { tenant: "?", role: token ? "client" : "admin", auth: token ? "tokens" : "none" };
}

let config = null;
export async function consoleConfig() {
  if (config) return config;
  try {
    const r = await fetch("/ui/config.json", { cache: "no-store" });
    config = r.ok ? await r.json() : {};
  } catch {
    config = {};
  }
  return config;
}
