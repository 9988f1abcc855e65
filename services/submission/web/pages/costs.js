// Costs: what GPU time cost, by team, project, user and job, and day by day (billing's
// usage). Users see their own team's; operators every team's.

import { get } from "../api.js";
import {
  card, errorMessage, gpuHours, h, jobLink, money, pageHeader, replace, stat, table,
} from "../ui.js";

const DAYS = 30;
const PROJECT_JOBS = 50;

export async function render(view, _params, { me }) {
  view.append(pageHeader("Costs", me.role === "operator" ? "Every team's GPU time and spend." : `Team ${me.team}'s GPU time and spend.`));
  let usage;
  try {
    usage = await get("billing", "/v1/usage");
  } catch (error) {
    view.append(errorMessage(error, "the costs"));
    return;
  }
  const currency = (usage.teams[0] && usage.teams[0].currency) || (usage.jobs[0] && usage.jobs[0].currency) || "";
  const total = usage.teams.reduce((n, t) => n + Number(t.cost), 0);
  const seconds = usage.teams.reduce((n, t) => n + Number(t.gpu_seconds), 0);
  const allocations = usage.teams.reduce((n, t) => n + t.allocations, 0);
  view.append(h("div", { class: "stats" },
    stat("Total cost", h("span", { id: "total-cost" }, money(total, currency))),
    stat("GPU time", gpuHours(seconds)),
    stat("Jobs billed", usage.jobs.length, `${allocations} allocations`)));

  view.append(card("Over time (by the day each job's last allocation ended)", daily(usage.jobs, currency)));
  const projects = h("div", {}, h("div", { class: "loading" }, "Loading…"));
  view.append(h("div", { class: "columns" },
    card("By team", bars(usage.teams.map((t) => ({ label: t.team, value: Number(t.cost), hint: gpuHours(t.gpu_seconds) })), currency)),
    card("By user", bars(usage.users.map((u) => ({ label: usage.teams.length > 1 ? `${u.user} (${u.team})` : u.user, value: Number(u.cost), hint: gpuHours(u.gpu_seconds) })), currency))),
  card("By project", projects));
  const jobs = [...usage.jobs].sort((a, b) => Number(b.cost) - Number(a.cost));
  view.append(card("Most expensive jobs", table([
    { title: "Job", cell: (j) => jobLink(j.job_id) },
    { title: "Team", cell: (j) => j.team },
    { title: "User", cell: (j) => j.user },
    { title: "Flavor", cell: (j) => j.gpu_flavor },
    { title: "GPU time", align: "right", cell: (j) => gpuHours(j.gpu_seconds) },
    { title: "Cost", align: "right", cell: (j) => money(j.cost, j.currency) },
  ], jobs.slice(0, 20), { empty: "Nothing billed yet." })));
  replace(projects, await byProject(jobs.slice(0, PROJECT_JOBS), currency));
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

function daily(jobs, currency) {
  const days = new Map();
  const today = new Date();
  today.setHours(0, 0, 0, 0);
  for (let i = DAYS - 1; i >= 0; i--) {
    const day = new Date(today.getTime() - i * 86400000);
    days.set(day.toISOString().slice(0, 10), 0);
  }
  for (const job of jobs) {
    const key = new Date(job.last_ended_at);
    key.setHours(0, 0, 0, 0);
    const iso = new Date(key.getTime()).toISOString().slice(0, 10);
    if (days.has(iso)) days.set(iso, days.get(iso) + Number(job.cost));
  }
  const top = Math.max(...days.values(), 1e-12);
  return h("div", { class: "columns-chart", role: "img", "aria-label": `cost per day, last ${DAYS} days` },
    [...days.entries()].map(([day, cost]) => h("div", { class: "col", title: `${day}: ${money(cost, currency)}` },
      h("span", { class: "col-fill", style: `height:${(100 * cost) / top}%` }),
      h("span", { class: "col-label" }, day.slice(5)))));
}

async function byProject(jobs, currency) {
  const totals = new Map();
  await Promise.all(jobs.map(async (usage) => {
    let project = "unknown";
    try {
      const job = await get("submission", `/v1/jobs/${encodeURIComponent(usage.job_id)}`);
      project = (job.spec && job.spec.project) || "default";
    } catch { /* a job the caller cannot see any more */ }
    totals.set(project, (totals.get(project) || 0) + Number(usage.cost));
  }));
  const note = jobs.length >= PROJECT_JOBS ? h("p", { class: "muted" }, `From the ${PROJECT_JOBS} most expensive jobs.`) : null;
  return h("div", {}, bars([...totals.entries()].map(([label, value]) => ({ label, value })), currency), note);
}
