// Queues: per team, its quota, what it uses and borrows per flavor, and its waiting line with
// the scheduler's reasons. Operators see the whole cluster (GET /v1/queue on the scheduler);
// a team member sees their own team's queue and waiting jobs.

import { ApiError, call, get } from "../api.js";
import {
  absolute, card, errorMessage, h, jobLink, message, pageHeader, relative, replace, statusBadge,
  table, when, withJobLinks,
} from "../ui.js";

const REFRESH_MS = 5000;
const MAX_WAITING_DETAILS = 25;

export async function render(view, _params, { me }) {
  const body = h("div");
  view.append(pageHeader("Queues", me.role === "operator" ? "Every team's queue, in the cluster's order." : `Team ${me.team}'s queue and waiting line.`), body);
  async function load() {
    try {
      const queue = await get("scheduler", "/v1/queue");
      replace(body, ...clusterQueues(queue));
    } catch (error) {
      if (error instanceof ApiError && error.status === 403) replace(body, ...(await teamQueue(me)));
      else replace(body, errorMessage(error, "the queues"));
    }
  }
  await load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}

export function quotaBar(used, nominal, borrowed) {
  const limit = nominal === null || nominal === undefined ? Math.max(used, 1) : Math.max(nominal, used, 1);
  const own = Math.max(0, used - borrowed);
  return h("div", { class: "bar", title: `${used} used of ${nominal ?? "∞"} nominal, ${borrowed} borrowed` },
    h("span", { class: "bar-own", style: `width:${(100 * own) / limit}%` }),
    h("span", { class: "bar-borrowed", style: `width:${(100 * borrowed) / limit}%` }),
    nominal !== null && nominal !== undefined && nominal < limit
      ? h("span", { class: "bar-nominal", style: `left:${(100 * nominal) / limit}%` }) : null);
}

function quotaTable(quotas) {
  return table([
    { title: "Flavor", cell: (q) => q.flavor },
    { title: "Use", cell: (q) => quotaBar(q.used, q.nominal, q.borrowed) },
    { title: "Used", align: "right", cell: (q) => q.used },
    { title: "Nominal", align: "right", cell: (q) => q.nominal ?? "cluster" },
    { title: "Borrowed", align: "right", cell: (q) => q.borrowed },
    { title: "Borrow limit", align: "right", cell: (q) => q.borrowing_limit ?? "none" },
    { title: "Lend limit", align: "right", cell: (q) => q.lending_limit ?? "none" },
  ], quotas, { empty: "No quota: the queue may use what the cluster has." });
}

function waitingTable(pending) {
  return table([
    { title: "#", align: "right", cell: (p) => p.position ?? "—" },
    { title: "Job", cell: (p) => jobLink(p.job_id) },
    { title: "GPUs", cell: (p) => `${p.gpus} × ${p.gpu_flavor}` },
    { title: "Priority", cell: (p) => p.priority },
    { title: "Reason", cell: (p) => h("span", { class: "reason" }, withJobLinks(p.reason || "waiting for the next pass")) },
    { title: "Blocked by", cell: (p) => (p.blocking ? withJobLinks(p.blocking) : "—") },
    { title: "Suggestion", cell: (p) => p.suggestion || "—" },
    { title: "Estimated start", cell: (p) => (p.estimated_start ? when(p.estimated_start) : "unknown") },
  ], pending, { empty: "Nobody waits." });
}

function clusterQueues(queue) {
  const cohorts = (queue.cohorts || []).map((c) => card(`Cohort ${c.name}`,
    h("p", { class: "muted" }, `Queues: ${c.queues.join(", ")}`),
    table([
      { title: "Flavor", cell: (p) => p.flavor },
      { title: "Shared pool", cell: (p) => quotaBar(p.used, p.size, 0) },
      { title: "In use", align: "right", cell: (p) => `${p.used} of ${p.size}` },
    ], c.pools)));
  const queues = (queue.queues || []).map((q) => h("section", { class: "card queue", dataset: { queue: q.name } },
    h("h2", {}, q.name, " ", h("span", { class: "muted" }, `team ${q.team}${q.cohort ? ` · cohort ${q.cohort}` : ""} · weight ${q.weight}${q.implicit ? " · implicit" : ""}`)),
    quotaTable(q.quotas),
    h("h3", {}, `Running (${q.running.length})`),
    table([
      { title: "Job", cell: (r) => jobLink(r.job_id) },
      { title: "GPUs", cell: (r) => `${r.gpus} × ${r.gpu_flavor}` },
      { title: "Where", cell: (r) => Object.entries(r.nodes).map(([n, g]) => `${n} [${g.join(",")}]`).join("; ") },
      { title: "Priority", cell: (r) => r.priority },
      { title: "Since", cell: (r) => when(r.started_at || r.granted_at) },
      { title: "Borrowed", cell: (r) => (r.borrowed ? "yes" : "no") },
      { title: "Notice", cell: (r) => (r.notice_at ? `${r.notice_reason || "revoked"} ${relative(new Date(r.notice_at))}` : "—") },
    ], q.running, { empty: "Nothing running." }),
    h("h3", {}, `Waiting (${q.waiting ?? q.pending.length})`),
    // The scheduler answers the head of a line of any length (GET /v1/queue/{name}/pending has all).
    q.waiting > q.pending.length ? h("p", { class: "muted" }, `The first ${q.pending.length} of ${q.waiting} in line.`) : null,
    waitingTable(q.pending)));
  return [...queues, ...cohorts];
}

/** Every page of ``GET /v1/admin/queues`` (the next named by its Link header). */
async function everyQueue() {
  const queues = [];
  let after;
  do {
    const page = await call("scheduler", "/v1/admin/queues", { query: { limit: 500, after } });
    queues.push(...page.data);
    after = page.next;
  } while (after);
  return queues;
}

async function teamQueue(me) {
  const parts = [];
  try {
    const configs = await everyQueue();
    // Only the user's own team: other teams' queues are theirs to look at.
    const mine = configs.filter((q) => q.team === me.team);
    parts.push(...mine.map((q) => card(`Queue ${q.name}`,
      h("p", { class: "muted" }, `${q.cohort ? `cohort ${q.cohort} · ` : ""}weight ${q.weight}${q.implicit ? " · implicit: no limit but the cluster" : ""}`),
      table([
        { title: "Flavor", cell: ([f]) => f },
        { title: "Nominal", align: "right", cell: ([, v]) => v.nominal },
        { title: "Borrow limit", align: "right", cell: ([, v]) => v.borrowing_limit ?? "none" },
        { title: "Lend limit", align: "right", cell: ([, v]) => v.lending_limit ?? "none" },
      ], Object.entries(q.quotas), { empty: "No quota: the queue may use what the cluster has." }))));
    if (!mine.length) parts.push(message("info", "Your team has no queue yet.", "One is made on its first submission."));
  } catch (error) {
    parts.push(errorMessage(error, "the queue configuration"));
  }
  const waiting = [];
  try {
    for (const status of ["PENDING", "QUEUED", "PREEMPTED"]) {
      waiting.push(...(await get("submission", "/v1/jobs", { status, limit: 100 })));
    }
  } catch (error) {
    parts.push(errorMessage(error, "the waiting jobs"));
  }
  waiting.sort((a, b) => Date.parse(a.submitted_at) - Date.parse(b.submitted_at));
  const detailed = await Promise.all(waiting.slice(0, MAX_WAITING_DETAILS).map(async (job) => {
    try {
      const full = await get("submission", `/v1/jobs/${encodeURIComponent(job.id)}`);
      return { ...full.pending, job_id: job.id, name: job.name, status: job.status, gpus: job.gpus, gpu_flavor: job.gpu_flavor, priority: full.spec.priority, submitted_at: job.submitted_at };
    } catch {
      return { job_id: job.id, name: job.name, status: job.status, gpus: job.gpus, gpu_flavor: job.gpu_flavor, submitted_at: job.submitted_at };
    }
  }));
  detailed.sort((a, b) => (a.position ?? 1e9) - (b.position ?? 1e9));
  parts.push(card(`Waiting (${waiting.length})`,
    table([
      { title: "#", align: "right", cell: (p) => p.position ?? "—" },
      { title: "Job", cell: (p) => h("span", {}, h("a", { href: `#/jobs/${p.job_id}`, class: "job-name", title: p.name }, p.name), " ", jobLink(p.job_id)) },
      { title: "Status", cell: (p) => statusBadge(p.status) },
      { title: "GPUs", cell: (p) => `${p.gpus} × ${p.gpu_flavor}` },
      { title: "Reason", cell: (p) => h("span", { class: "reason" }, withJobLinks(p.reason || "waiting for the next pass")) },
      { title: "Blocked by", cell: (p) => (p.blocking ? withJobLinks(p.blocking) : "—") },
      { title: "Suggestion", cell: (p) => p.suggestion || "—" },
      { title: "Estimated start", cell: (p) => (p.estimated_start ? absolute(p.estimated_start) : "unknown") },
    ], detailed, { empty: "None of your team's jobs waits." }),
    h("p", { class: "muted" }, "The whole cluster's queues are shown to operators.")));
  return parts;
}
