// The platform's APIs, called with the user's token. Nothing here decides what a user may
// see: every answer is what the token's own role and team allow.

const TOKEN_KEY = "trainyard.token";

export class ApiError extends Error {
  constructor(status, message, service) {
    super(message);
    this.status = status;
    this.service = service;
  }
}

/** A service this server does not offer (no public URL configured, or no such endpoint). */
export class Unavailable extends ApiError {}

/** How long an answer may take. A service that hangs (overloaded, stopped with SIGSTOP, a
 * network that drops packets) gets a message naming it instead of a page that waits for ever. */
export const ANSWER_S = 30;

let config = null;

export async function loadConfig() {
  if (config) return config;
  const answer = await fetch("config.json", { cache: "no-store" });
  if (!answer.ok) throw new ApiError(answer.status, "the dashboard's configuration is unavailable", "submission");
  config = await answer.json();
  return config;
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

const MAX_TOKEN_LENGTH = 1024;
const TOKEN68 = /^[A-Za-z0-9\-._~+/]+=*$/;

/**
 * Why no Trainyard API would take ``value`` as a token (RFC 6750's ``b64token``: ASCII
 * letters, digits and ``-._~+/``, then ``=`` padding; at most 1024 characters), or null; as
 * the CLI says it, naming the first wrong character's position and code point, never the
 * token. A browser cannot even send a header holding a character beyond Latin-1 (a pasted
 * "…" or curly quote).
 */
export function tokenProblem(value) {
  if (!value) return "it is empty";
  if (value.length > MAX_TOKEN_LENGTH) return `it has ${value.length} characters, more than a token's ${MAX_TOKEN_LENGTH}`;
  if (TOKEN68.test(value)) return null;
  const at = /^[A-Za-z0-9\-._~+/]*/.exec(value)[0].length;
  const point = value.codePointAt(at);
  const what = point === 0x20 ? "a space" : `U+${point.toString(16).toUpperCase().padStart(4, "0")}`;
  return `character ${at + 1} is ${what}; a token holds only ASCII letters, digits and -._~+/, then = padding`;
}

function baseOf(service) {
  if (service === "submission") return "";
  const url = config && config[`${service}_url`];
  if (!url) throw new Unavailable(0, `this server does not offer the ${service} API to the dashboard`, service);
  return url.replace(/\/$/, "");
}

function detailOf(body, status) {
  if (body && typeof body.detail === "string") {
    const fields = (body.errors || []).map((e) => `${e.field}: ${e.message}`).join("; ");
    return fields ? `${body.detail} (${fields})` : body.detail;
  }
  return `HTTP ${status}`;
}

/**
 * GET (or another method) ``path`` of ``service`` with the token; returns {data, next} where
 * ``next`` is the cursor of the next page (from the Link header) or null.
 * Throws ApiError (401 logs the user out: see app.js), Unavailable for a missing service.
 */
export async function call(service, path, { method = "GET", query, body, signal, retries = 2 } = {}) {
  const url = new URL(baseOf(service) + path, location.href);
  for (const [key, value] of Object.entries(query || {})) {
    if (value === undefined || value === null || value === "") continue;
    for (const item of [].concat(value)) url.searchParams.append(key, item);
  }
  const headers = { Authorization: `Bearer ${token.get() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const late = AbortSignal.timeout(ANSWER_S * 1000);
  let answer, text;
  try {
    answer = await fetch(url, {
      method, headers, cache: "no-store",
      signal: signal ? AbortSignal.any([signal, late]) : late,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    text = await answer.text();
  } catch (error) {
    if (late.aborted) throw new ApiError(0, `the ${service} service did not answer within ${ANSWER_S} s`, service);
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, `the ${service} service cannot be reached`, service);
  }
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (answer.status === 429 && method === "GET" && retries > 0) {
    // Over the per-user read rate (a page that fans out): wait as told, then ask again.
    const wait = Math.min(5, Number(answer.headers.get("Retry-After")) || 1);
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    return call(service, path, { method, query, body, signal, retries: retries - 1 });
  }
  if (!answer.ok) {
    const message = detailOf(data, answer.status);
    if (answer.status === 404 && (data === null || data.detail === "Not Found")) throw new Unavailable(404, message, service);
    if (answer.status === 405) throw new Unavailable(405, message, service);
    const error = new ApiError(answer.status, message, service);
    if (answer.status === 401) window.dispatchEvent(new CustomEvent("trainyard:unauthorized"));
    throw error;
  }
  return { data, next: nextCursor(answer.headers.get("Link")) };
}

/** ``data`` of ``call``. */
export async function get(service, path, query, signal) {
  return (await call(service, path, { query, signal })).data;
}

/**
 * The answer of a paged list ``path`` (the registry's and billing's: rows in ``field`` and
 * the cursor of the next page in the body's ``next``) with every page's rows in ``field``:
 * follows ``next`` as ``after`` to the last page.
 */
export async function getEvery(service, path, field, query, signal) {
  const first = await get(service, path, query, signal);
  const rows = [...(first[field] || [])];
  let page = first;
  while (page.next) {
    page = await get(service, path, { ...query, after: page.next }, signal);
    rows.push(...(page[field] || []));
  }
  return { ...first, [field]: rows, next: null };
}

function nextCursor(link) {
  if (!link) return null;
  const match = /<([^>]+)>\s*;\s*rel="next"/.exec(link);
  if (!match) return null;
  return new URL(match[1], location.href).searchParams.get("after");
}

/** A metric value as the APIs encode it: numbers, or "NaN"/"Infinity"/"-Infinity". */
export function number(value) {
  if (typeof value === "number") return value;
  if (value === "NaN") return NaN;
  if (value === "Infinity") return Infinity;
  if (value === "-Infinity") return -Infinity;
  return value === null || value === undefined ? null : Number(value);
}
