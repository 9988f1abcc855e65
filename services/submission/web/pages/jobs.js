// Jobs: the team's jobs, newest first, a page of 50 at a time (the API's keyset cursor), so
// 10,000 jobs cost the same as 50; filterable by status. An operator sees every team's
// (the API's all_teams=true) with a Team column, and a team filter (the API's team).

import { call } from "../api.js";
import {
  STATUSES, duration, errorMessage, h, jobLink, money, pageHeader, replace, runSeconds,
  statusBadge, table, when,
} from "../ui.js";

const PAGE = 50;
const REFRESH_MS = 5000;

export async function render(view, params, ctx) {
  if (params.length) return (await import("./job.js")).render(view, params, ctx);
  return renderList(view, ctx);
}

async function renderList(view, { me }) {
  const query = new URLSearchParams(location.hash.split("?")[1] || "");
  // A link typed by hand says "running" as often as "RUNNING" (the CLI takes either); one
  // naming no status lists them all, as the filter then shows.
  let status = (query.get("status") || "").toUpperCase();
  if (!STATUSES.includes(status)) status = "";
  const operator = me.role === "operator";
  // Members list their own team's jobs whatever the link says: the API would refuse another.
  let team = operator ? (query.get("team") || "").trim() : "";
  let rows = [];
  let cursor = null;
  let timer = null;

  const select = h("select", { id: "status-filter", "aria-label": "Status" },
    h("option", { value: "" }, "All statuses"),
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s.toLowerCase())));
  const teamFilter = operator
    ? h("input", { id: "team-filter", type: "search", value: team, placeholder: "every team", "aria-label": "Team", size: 12 })
    : null;
  const refresh = h("button", { class: "secondary", onclick: () => load(true) }, "Refresh");
  const body = h("div", { id: "jobs" });
  const more = h("button", { class: "secondary", id: "more", onclick: () => load(false) }, "Load more");
  const footer = h("div", { class: "table-footer" });
  const subtitle = () => (operator && !team ? "Every team: newest first." : `Team ${team || me.team}: newest first.`);
  const header = pageHeader("Jobs", subtitle(), ...(teamFilter ? [teamFilter] : []), select, refresh);
  view.append(header, body, footer);

  // The filters as the page's link, so a reload or a shared link shows the same list.
  function remember() {
    const shown = new URLSearchParams();
    if (team) shown.set("team", team);
    if (status) shown.set("status", status);
    history.replaceState(null, "", shown.toString() ? `#/jobs?${shown}` : "#/jobs");
  }

  select.addEventListener("change", () => {
    status = select.value;
    remember();
    load(true);
  });
  teamFilter?.addEventListener("change", () => {
    team = teamFilter.value.trim();
    header.querySelector(".subtitle").textContent = subtitle();
    remember();
    load(true);
  });

  async function load(first) {
    try {
      const answer = await call("submission", "/v1/jobs", {
        query: {
          limit: PAGE,
          status: status || undefined,
          team: team || undefined,
          all_teams: operator && !team ? "true" : undefined,
          after: first ? undefined : cursor,
        },
      });
      rows = first ? answer.data : rows.concat(answer.data);
      cursor = answer.next;
      draw();
    } catch (error) {
      replace(body, errorMessage(error, "the jobs"));
    }
  }

  function draw() {
    replace(body, table([
      ...(operator ? [{ title: "Team", cell: (j) => j.team }] : []),
      { title: "Status", cell: (j) => statusBadge(j.status) },
      { title: "Name", cell: (j) => h("a", { href: `#/jobs/${j.id}`, class: "job-name", title: j.name }, j.name) },
      { title: "Id", cell: (j) => jobLink(j.id) },
      { title: "User", cell: (j) => j.user },
      { title: "GPUs", cell: (j) => `${j.gpus} × ${j.gpu_flavor}` },
      { title: "Submitted", cell: (j) => when(j.submitted_at) },
      { title: "Duration", align: "right", cell: (j) => duration(runSeconds(j)) },
      { title: "Step", align: "right", cell: (j) => (j.step ?? "—") },
      { title: "Cost", align: "right", cell: (j) => (j.currency ? money(j.cost, j.currency) : h("span", { title: "nothing billed yet" }, money(j.cost, j.currency))) },
      // Why it waits or failed, when the server's list gives it.
      ...(rows.some((j) => j.reason) ? [{ title: "Reason", cell: (j) => (j.reason ? h("span", { class: "muted", title: j.reason }, j.reason.length > 80 ? `${j.reason.slice(0, 79)}…` : j.reason) : "") }] : []),
    ], rows, { empty: status ? `No ${status.toLowerCase()} jobs.` : "No jobs yet: submit one with trainyard submit." }));
    replace(footer, h("span", { class: "muted" }, `${rows.length} shown`), cursor ? more : null);
  }

  await load(true);
  // Only the first page refreshes itself: pages already loaded further down stay put.
  timer = setInterval(() => { if (!cursor || rows.length <= PAGE) load(true); }, REFRESH_MS);
  return () => clearInterval(timer);
}
