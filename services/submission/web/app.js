// The dashboard's shell: sign-in with a token, navigation, and the page router (#/page/...).
// Each page module exports render(view, params, ctx) and may return a cleanup function.

import { ApiError, get, loadConfig, token, tokenProblem } from "./api.js";
import { h, message, replace } from "./ui.js";

const PAGES = {
  jobs: () => import("./pages/jobs.js"),
  experiments: () => import("./pages/experiments.js"),
  queues: () => import("./pages/queues.js"),
  nodes: () => import("./pages/nodes.js"),
  models: () => import("./pages/models.js"),
  costs: () => import("./pages/costs.js"),
  budgets: () => import("./pages/budgets.js"),
  waste: () => import("./pages/waste.js"),
};

const view = document.getElementById("view");
const whoami = document.getElementById("whoami");
let me = null;
let cleanup = null;
let generation = 0;

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("?")[0].split("/").filter(Boolean).map(decoded);
  // Its own key only: "constructor" or "toString" is in every object, and is no page.
  const page = Object.hasOwn(PAGES, parts[0] ?? "") ? parts[0] : "jobs";
  return { page, params: parts.slice(1) };
}

/** A part of the route as typed: a link mangled in a chat (``%E0%A4%A``) is not valid
 * percent-encoding; it is then taken as it is, so the page says there is no such thing. */
function decoded(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

async function show() {
  if (!token.get() || !me) { signIn(); return; }
  const current = ++generation;
  if (cleanup) { try { cleanup(); } catch { /* a page's own teardown */ } cleanup = null; }
  const { page, params } = route();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
    // What the highlight says to the eye, said to a screen reader.
    if (link.dataset.page === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.body.dataset.page = page;
  replace(view, h("div", { class: "loading" }, "Loading…"));
  try {
    const module = await PAGES[page]();
    if (current !== generation) return;
    const content = h("div", { class: "page" });
    // Below what the page has drawn so far, until it has drawn everything it waits for.
    const waiting = h("div", { class: "loading" }, "Loading…");
    replace(view, content, waiting);
    let done;
    try {
      done = await module.render(content, params, { me });
    } finally {
      waiting.remove();
    }
    if (current === generation) cleanup = typeof done === "function" ? done : null;
    else if (typeof done === "function") done();
  } catch (error) {
    if (current !== generation) return;
    replace(view, message("error", "This page could not be shown.", error.message || String(error)));
  }
}

function signIn(notice) {
  generation++; // a page still loading must not draw over the form
  if (cleanup) { try { cleanup(); } catch { /* a page's own teardown */ } cleanup = null; }
  document.body.dataset.page = "login";
  replace(whoami);
  const input = h("input", {
    type: "password", id: "token", name: "token", autocomplete: "off", spellcheck: "false",
    placeholder: "ty_…", required: true,
  });
  const status = h("div", { class: "login-status" });
  const form = h("form", { class: "login-card", id: "login" },
    h("h1", {}, "Sign in to Trainyard"),
    h("p", { class: "subtitle" }, "Paste an API token (trainyard token create, or the one dev.py up printed). It stays in this tab only."),
    h("label", { for: "token" }, "Token"), input,
    h("button", { type: "submit", class: "primary" }, "Sign in"), status);
  if (notice) status.append(message("warn", notice));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    const problem = tokenProblem(value);
    if (problem) { replace(status, message("error", "That is not a token.", problem)); return; }
    replace(status, h("div", { class: "loading" }, "Checking…"));
    token.set(value);
    let accepted = false;
    try {
      accepted = await identify();
    } catch (error) {
      // Not a verdict on the token: the platform did not answer (down, overloaded).
      token.clear();
      replace(status, message("error", "Could not sign in: the platform did not answer.", error.message || String(error)));
      return;
    }
    if (accepted) show();
    else { token.clear(); replace(status, message("error", "That token was not accepted.", "It may be wrong, revoked or expired.")); }
  });
  replace(view, h("div", { class: "login" }, form));
  input.focus();
}

async function identify() {
  try {
    me = await get("submission", "/v1/me");
  } catch (error) {
    me = null;
    if (error instanceof ApiError && error.status === 401) return false;
    throw error;
  }
  replace(whoami,
    h("div", { class: "who" }, h("span", { class: "user" }, me.user), h("span", { class: "team" }, `${me.team} · ${me.role}`)),
    h("button", { class: "link", id: "logout", onclick: () => { token.clear(); me = null; signIn(); } }, "Sign out"));
  return true;
}

const ENDED = "Your session ended (the token was revoked or expired). Sign in again.";

window.addEventListener("trainyard:unauthorized", () => {
  // Only a session can end: a token refused at sign-in (mistyped, never valid) is answered
  // by the form ("not accepted"), and a request still in flight after "Sign out" ended none.
  if (!me) return;
  token.clear();
  me = null;
  signIn(ENDED);
});
window.addEventListener("hashchange", show);

(async () => {
  try {
    await loadConfig();
    // A tab reloaded after its token was revoked or expired: said as when it happens mid-session.
    if (token.get() && !(await identify())) { token.clear(); signIn(ENDED); return; }
  } catch (error) {
    replace(view, message("error", "The platform cannot be reached.", error.message));
    return;
  }
  show();
})();
