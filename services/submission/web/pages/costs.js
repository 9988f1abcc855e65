// Costs: what GPU time cost over a window of whole UTC days (7, 30 or 90; 30 by default),
// from billing's ledger (GET /v1/costs): the spend per day stacked by project and by user
// (granularity=day), and the spend by team, project, user and job over the window (group_by).
// These are billing's exact amounts, not estimates; the page only reads. Users see their own
// team's; operators every team's.

import { get } from "../api.js";
import { PALETTE } from "../chart.js";
import {
  card, errorMessage, gpuHours, h, jobLink, money, pageHeader, stat, table,
} from "../ui.js";

const DAYS = 30;
export const RANGES = [7, 30, 90];
const TOP_JOBS = 20;
/** Series drawn in their own colour in a stacked chart; the rest share one ("others"). */
const STACKED = 8;
const OTHERS = "#9ca3af";

/** The report's window: whole UTC days, the last ``days`` of them up to the end of today. */
export function window(now = new Date(), days = DAYS) {
  const end = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1));
  const start = new Date(end.getTime() - days * 86400000);
  const iso = (d) => d.toISOString().replace(/\.\d{3}Z$/, "Z");
  return { from: iso(start), to: iso(end), start, days };
}

/** The window a route asks for (``#/costs/7``); anything else is the default 30 days. */
export function daysOf(params) {
  const days = Number(params[0]);
  return RANGES.includes(days) ? days : DAYS;
}

export async function render(view, params, { me }) {
  const range = window(new Date(), daysOf(params));
  const whose = me.role === "operator" ? "Every team's" : `Team ${me.team}'s`;
  view.append(pageHeader("Costs", `${whose} GPU time and spend, last ${range.days} days (UTC).`,
    h("nav", { class: "range", id: "cost-range", "aria-label": "window" }, RANGES.map((d) =>
      h("a", { href: `#/costs/${d}`, class: d === range.days ? "button active" : "button", "data-days": String(d) }, `${d} days`))),
    h("a", { href: "#/budgets", class: "button", id: "budgets-link" }, "Budgets →"),
    h("a", { href: "#/waste", class: "button", id: "waste-link" }, "Waste and success rate →")));
  const report = (extra) => get("billing", "/v1/costs", { from: range.from, to: range.to, ...extra });
  let dayProject, dayUser, byTeam, byUser, byProject, byJob;
  try {
    [dayProject, dayUser, byTeam, byUser, byProject, byJob] = await Promise.all([
      report({ granularity: "day", group_by: "project" }),
      report({ granularity: "day", group_by: "team,user" }),
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
  const project = (r) => r.project || "(none)";
  const user = (r) => (teams.size > 1 ? `${r.user} (${r.team})` : r.user);
  view.append(h("div", { class: "stats" },
    stat("Total cost", h("span", { id: "total-cost", "data-cost": String(total) }, money(total, currency)), totals.length > 1 ? "several currencies" : null),
    stat("GPU time", gpuHours(seconds)),
    stat("Projects", byProject.rows.length),
    stat("Users", byUser.rows.length),
    stat("Jobs billed", byJob.truncated ? `${TOP_JOBS}+` : byJob.rows.length)));

  view.append(card("Spend per day by project (UTC)", stackedDaily("daily-spend", dayProject, project, range, currency)));
  view.append(card("Spend per day by user (UTC)", stackedDaily("daily-by-user", dayUser, user, range, currency)));
  view.append(h("div", { class: "columns" },
    card("By project", breakdown("by-project", "Project", byProject.rows, project, total)),
    card("By user", breakdown("by-user", "User", byUser.rows, user, total))));
  view.append(card("By team", bars(byTeam.rows.map((t) => ({ label: t.team, value: Number(t.cost), hint: gpuHours(t.gpu_seconds) })), currency)));
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

/** One row per project (or user) of billing's report over the window, most expensive first:
 * its GPU time, its cost as billing states it (``data-cost``: billing's decimal, unrounded),
 * and its share of the window's total. */
function breakdown(id, title, rows, label, total) {
  const sorted = [...rows].sort((a, b) => Number(b.cost) - Number(a.cost));
  const share = (r) => (total > 0 ? (100 * Number(r.cost)) / total : 0);
  return h("div", { id }, table([
    { title, cell: (r) => h("span", { class: "breakdown-key", title: label(r) }, label(r)) },
    { title: "GPU time", align: "right", cell: (r) => gpuHours(r.gpu_seconds) },
    { title: "Cost", align: "right", cell: (r) => h("span", { class: "breakdown-cost", "data-cost": String(r.cost) }, money(r.cost, r.currency)) },
    { title: "Share", cell: (r) => h("span", { class: "share" },
      h("span", { class: "hbar-track" }, h("span", { class: "hbar-fill", style: `width:${share(r)}%` })),
      h("small", {}, `${share(r).toFixed(1)} %`)) },
  ], sorted, { empty: "Nothing billed yet." }));
}

/** One column per UTC day of the window, its height the day's spend, stacked by ``keyOf`` of
 * billing's day rows: the most expensive series in their own colours, the rest as "others".
 * Each column carries its day and total (``data-day``, ``data-cost``), each piece its series
 * and amount (``data-key``, ``data-cost``), so the chart can be read back exactly. */
function stackedDaily(id, report, keyOf, range, currency) {
  const days = new Map();
  for (let i = 0; i < range.days; i++) days.set(new Date(range.start.getTime() + i * 86400000).toISOString().slice(0, 10), new Map());
  const sums = new Map();
  for (const row of report.rows) {
    const day = days.get(String(row.bucket).slice(0, 10));
    if (!day) continue;
    const key = keyOf(row);
    day.set(key, (day.get(key) || 0) + Number(row.cost));
    sums.set(key, (sums.get(key) || 0) + Number(row.cost));
  }
  const ranked = [...sums.entries()].sort((a, b) => b[1] - a[1]).map(([key]) => key);
  const colour = new Map(ranked.map((key, i) => [key, i < STACKED ? PALETTE[i % PALETTE.length] : OTHERS]));
  const dayTotal = (pieces) => [...pieces.values()].reduce((n, c) => n + c, 0);
  const top = Math.max(...[...days.values()].map(dayTotal), 1e-12);
  // About seven dates under the columns, whatever the window: 30 or 90 dates, each cut to
  // the width of its column, read "1 1 1 …" in a phone-wide window.
  const every = Math.ceil(range.days / 7);
  const chart = h("div", { class: "columns-chart", id, role: "img", "aria-label": `cost per day, last ${range.days} days` },
    [...days.entries()].map(([day, pieces], i) => {
      const cost = dayTotal(pieces);
      const order = ranked.filter((key) => pieces.has(key)).reverse(); // the largest at the bottom
      return h("div", { class: "col", "data-day": day, "data-cost": String(cost), title: `${day}: ${money(cost, currency)}` },
        h("span", { class: "col-stack", style: `height:${(100 * cost) / top}%` }, order.map((key) =>
          h("span", { class: "seg", "data-key": key, "data-cost": String(pieces.get(key)), title: `${day} · ${key}: ${money(pieces.get(key), currency)}`,
            style: `height:${(100 * pieces.get(key)) / cost}%;background:${colour.get(key)}` }))),
        h("span", { class: "col-label" }, i % every === 0 ? day.slice(5) : "\u00a0"));
    }));
  const named = ranked.slice(0, STACKED);
  const others = ranked.slice(STACKED).reduce((n, key) => n + sums.get(key), 0);
  const legend = h("div", { class: "legend" },
    named.map((key) => h("span", { class: "swatch", style: `--c:${colour.get(key)}` }, `${key} ${money(sums.get(key), currency)}`)),
    ranked.length > STACKED ? h("span", { class: "swatch", style: `--c:${OTHERS}` }, `${ranked.length - STACKED} others ${money(others, currency)}`) : null);
  return h("div", {}, chart, ranked.length ? legend : h("p", { class: "empty" }, "Nothing billed in the window."),
    report.truncated ? h("p", { class: "muted" }, "Billing cut the report at its row limit: the days are incomplete.") : null);
}
