// DOM helpers and formatters. Text always goes in as text (never as HTML): job names, log
// lines and reasons come from users.

import { Unavailable } from "./api.js";

export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") element.className = value;
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key === "style") setStyle(element, value);
    else if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else element.setAttribute(key, value === true ? "" : value);
  }
  append(element, children);
  return element;
}

/**
 * ``declarations`` ("width:40%;--c:#4e79a7") set one by one through the CSSOM: the content
 * policy allows no inline style attribute (``style-src 'self'``), and a property set so is
 * no attribute the policy judges.
 */
function setStyle(element, declarations) {
  for (const declaration of String(declarations).split(";")) {
    const at = declaration.indexOf(":");
    if (at > 0) element.style.setProperty(declaration.slice(0, at).trim(), declaration.slice(at + 1).trim());
  }
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function svg(tag, attrs = {}, ...children) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) element.setAttribute(key, value);
  append(element, children);
  return element;
}

/**
 * ``element``'s children become ``children``. Pages redraw parts of themselves every few
 * seconds: when the keyboard focus was inside ``element``, it moves to the redrawn element
 * that is the same control (same tag, id, target, label and text), so a person moving through
 * the page with Tab does not fall back to the top of the document at every refresh.
 */
export function replace(element, ...children) {
  const focused = document.activeElement;
  const key = focused && focused !== element && element.contains(focused) ? focusKey(focused) : null;
  element.replaceChildren();
  append(element, children);
  if (key !== null) {
    const same = [...element.querySelectorAll(focused.tagName)].find((e) => focusKey(e) === key);
    if (same) same.focus({ preventScroll: true });
  }
  return element;
}

function focusKey(element) {
  return [element.tagName, element.id, element.getAttribute("href"), element.getAttribute("aria-label"), element.textContent].join("\u0000");
}

export const STATUSES = ["QUEUED", "PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "PREEMPTED", "CANCELLED"];

export function statusBadge(status) {
  return h("span", { class: `badge status-${String(status).toLowerCase()}` }, status);
}

export function shortId(id) {
  return String(id).slice(0, 8);
}

export function jobLink(id, text) {
  return h("a", { href: `#/jobs/${encodeURIComponent(id)}`, class: "mono", title: id }, text || shortId(id));
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${String(seconds % 60).padStart(2, "0")}s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h ${String(minutes % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

/** Seconds a job has run: started to finished, or to now while it runs. */
export function runSeconds(job, now = Date.now()) {
  if (!job.started_at) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : now;
  return (end - Date.parse(job.started_at)) / 1000;
}

/**
 * A quantity as it is, never rounded to nothing: two decimals, and below 0.1 as many as two
 * significant digits take ("0.015", "0.000028"), down to a millionth (billing rounds each
 * amount to millionths); less than that but not 0 is "< 0.000001". A job of seconds at a
 * cent a GPU-hour costs 0.000028, which four fixed decimals wrote "0.0000", as if free.
 */
export function quantity(value) {
  value = Number(value);
  const magnitude = Math.abs(value);
  if (magnitude === 0 || magnitude >= 0.1 || !isFinite(magnitude)) return value.toFixed(2);
  if (magnitude < 1e-6) return value < 0 ? "> -0.000001" : "< 0.000001";
  const decimals = Math.min(6, 1 - Math.floor(Math.log10(magnitude)));
  return value.toFixed(decimals).replace(/(\.\d\d\d*?)0+$/, "$1");
}

/** An amount of money, everywhere the dashboard shows one (``quantity`` and the currency).
 * Every billed amount has its currency; no currency with nothing in it means nothing was
 * billed (a job that waits, a window with no spend): "—", never a bare "0.00". */
export function money(amount, currency) {
  if (amount === null || amount === undefined) return "—";
  if (!currency && Number(amount) === 0) return "—";
  const text = quantity(amount);
  return currency ? `${text} ${currency}` : text;
}

export function gpuHours(seconds) {
  return `${quantity(Number(seconds) / 3600)} GPU·h`;
}

/** A date and time in the reader's time zone, the zone named ("12/5/2026, 4:22:45 PM UTC"):
 * a link to a job is read in other zones, and the costs pages count whole UTC days. */
function local(date) {
  return date.toLocaleString(undefined, { timeZoneName: "short" });
}

export function when(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return h("time", { datetime: iso, title: local(date) }, relative(date));
}

export function relative(date, now = Date.now()) {
  const seconds = (date.getTime() - now) / 1000;
  const ahead = seconds > 0;
  const text = duration(Math.abs(seconds));
  return ahead ? `in ${text}` : `${text} ago`;
}

export function absolute(iso) {
  return iso ? local(new Date(iso)) : "—";
}

export function metric(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "string") return value;
  if (!isFinite(value)) return String(value);
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e6)) return value.toExponential(3);
  return Number(value.toPrecision(5)).toString();
}

export function table(columns, rows, { empty = "Nothing to show.", rowClass } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.align === "right" ? "num" : "" }, c.title)))),
    h("tbody", {}, rows.map((row) => h("tr", { class: rowClass ? rowClass(row) : "" },
      columns.map((c) => h("td", { class: c.align === "right" ? "num" : "" }, c.cell(row)))))));
}

export function card(title, ...children) {
  return h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...children);
}

export function stat(label, value, hint) {
  return h("div", { class: "stat" }, h("div", { class: "stat-label" }, label),
    h("div", { class: "stat-value" }, value), hint ? h("div", { class: "stat-hint" }, hint) : null);
}

export function message(kind, text, detail) {
  return h("div", { class: `message ${kind}`, role: kind === "error" ? "alert" : "status" },
    h("strong", {}, text), detail ? h("div", {}, detail) : null);
}

/** The answer to an id that names nothing ``what`` (singular: "job", "version") the reader
 * may see. */
export function noSuch(what) {
  return message("warn", `No such ${what}, or not one your team can see.`);
}

/** An error as a person reads it. */
export function errorMessage(error, what) {
  if (error instanceof Unavailable)
    return message("info", `${what[0].toUpperCase()}${what.slice(1)}: not available on this server.`, error.message);
  if (error && error.status === 403) return message("warn", `You may not see ${what}.`, error.message);
  if (error && error.status === 404) return noSuch(what);
  return message("error", `Could not load ${what}.`, error ? error.message : "");
}

export function loading() {
  return h("div", { class: "loading" }, "Loading…");
}

export function pageHeader(title, subtitle, ...actions) {
  return h("header", { class: "page-header" },
    h("div", {}, h("h1", {}, title), subtitle ? h("p", { class: "subtitle" }, subtitle) : null),
    h("div", { class: "actions" }, ...actions));
}

export function keyValues(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

const JOB_ID = /\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b/g;

/** ``text`` with every job id in it a link to that job (the text itself unchanged). */
export function withJobLinks(text) {
  const parts = [];
  let last = 0;
  for (const match of text.matchAll(JOB_ID)) {
    parts.push(text.slice(last, match.index), h("a", { href: `#/jobs/${match[0]}`, class: "mono" }, match[0]));
    last = match.index + match[0].length;
  }
  parts.push(text.slice(last));
  return parts;
}
