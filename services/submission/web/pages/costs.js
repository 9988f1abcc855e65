// Costs: what GPU time cost over the last 30 days, from billing's ledger (GET /v1/costs):
// the daily spend (granularity=day) and the spend by team, user, project and job (group_by).
// These are billing's exact amounts, not estimates. Users see their own team's; operators
// every team's.

import { get } from "../api.js";
import {
  card, errorMessage, gpuHours, h, jobLink, money, pageHeader, stat, table,
} from "../ui.js";

const DAYS = 30;
const TOP_JOBS = 20;

/** The report's window: whole UTC days, the last DAYS of them up to the end of today. */
export function window(now = new Date()) {
  const end = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1));
  const start = new Date(end.getTime() - DAYS * 86400000);
  const iso = (d) => d.toISOString().replace(/\.\d{3}Z$/, "Z");
  return { from: iso(start), to: iso(end), start };
}

export async function render(view, _params, { me }) {
  view.append(pageHeader("Costs", me.role === "operator" ? "Every team's GPU time and spend, last 30 days." : `Team ${me.team}'s GPU time and spend, last 30 days.`,
    h("a", { href: "#/waste", class: "button", id: "waste-link" }, "Waste and success rate →")));
  const range = window();
  const report = (extra) => get("billing", "/v1/costs", { from: range.from, to: range.to, ...extra });
  let byDay, byTeam, byUser, byProject, byJob;
  try {
    [byDay, byTeam, byUser, byProject, byJob] = await Promise.all([
      report({ granularity: "day" }),
      report({ group_by: "team" }),
      report({ group_by: "team,user" }),
      report({ group_by: "project" }),
      report({ group_by: "job,team,user,flavor", limit: TOP_JOBS }),
    ]);
  } catch (error) {
    view.append(errorMessage(error, "the costs"));
    return;
  }
  const totals = byTeam.totals || [];
  const currency = (totals[0] && totals[0].currency) || "";
  const total = totals.reduce((n, t) => n + Number(t.cost), 0);
  const seconds = totals.reduce((n, t) => n + Number(t.gpu_seconds), 0);
  const teams = new Set(byTeam.rows.map((r) => r.team));
  view.append(h("div", { class: "stats" },
    stat("Total cost", h("span", { id: "total-cost" }, money(total, currency)), totals.length > 1 ? "several currencies" : null),
    stat("GPU time", gpuHours(seconds)),
    stat("Jobs billed", byJob.truncated ? `${TOP_JOBS}+` : byJob.rows.length)));

  view.append(card("Spend per day (UTC)", daily(byDay.rows, range.start, currency)));
  view.append(h("div", { class: "columns" },
    card("By team", bars(byTeam.rows.map((t) => ({ label: t.team, value: Number(t.cost), hint: gpuHours(t.gpu_seconds) })), currency)),
    card("By user", bars(byUser.rows.map((u) => ({ label: teams.size > 1 ? `${u.user} (${u.team})` : u.user, value: Number(u.cost), hint: gpuHours(u.gpu_seconds) })), currency))),
  h("div", { id: "by-project" }, card("By project", bars(byProject.rows.map((p) => ({ label: p.project || "(none)", value: Number(p.cost), hint: gpuHours(p.gpu_seconds) })), currency))));
  view.append(card("Most expensive jobs", table([
    { title: "Job", cell: (j) => jobLink(j.job) },
    { title: "Team", cell: (j) => j.team },
    { title: "User", cell: (j) => j.user },
    { title: "Flavor", cell: (j) => j.flavor },
    { title: "GPU time", align: "right", cell: (j) => gpuHours(j.gpu_seconds) },
    { title: "Cost", align: "right", cell: (j) => money(j.cost, j.currency) },
  ], byJob.rows, { empty: "Nothing billed yet." })));
}

function bars(items, currency) {
  if (!items.length) return h("p", { class: "empty" }, "Nothing billed yet.");
  const top = Math.max(...items.map((i) => i.value), 1e-12);
  items.sort((a, b) => b.value - a.value);
  return h("div", { class: "hbars" }, items.map((item) => h("div", { class: "hbar" },
    h("span", { class: "hbar-label" }, item.label),
    h("span", { class: "hbar-track" }, h("span", { class: "hbar-fill", style: `width:${(100 * item.value) / top}%` })),
    h("span", { class: "hbar-value" }, money(item.value, currency), item.hint ? h("small", {}, ` ${item.hint}`) : null))));
}

/** One column per UTC day of the window; billing's day buckets give the heights. */
function daily(rows, start, currency) {
  const days = new Map();
  for (let i = 0; i < DAYS; i++) days.set(new Date(start.getTime() + i * 86400000).toISOString().slice(0, 10), 0);
  for (const row of rows) {
    const day = String(row.bucket).slice(0, 10);
    if (days.has(day)) days.set(day, days.get(day) + Number(row.cost));
  }
  const top = Math.max(...days.values(), 1e-12);
  return h("div", { class: "columns-chart", id: "daily-spend", role: "img", "aria-label": `cost per day, last ${DAYS} days` },
    [...days.entries()].map(([day, cost]) => h("div", { class: "col", "data-day": day, "data-cost": String(cost), title: `${day}: ${money(cost, currency)}` },
      h("span", { class: "col-fill", style: `height:${(100 * cost) / top}%` }),
      h("span", { class: "col-label" }, day.slice(5)))));
}
