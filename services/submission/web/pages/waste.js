// Waste: where GPU money went without doing work, over the same 30 UTC days as the costs
// page, from billing's GET /v1/waste: the six figures priced by the price book, the job
// success rate, and the jobs that wasted most. Users see their own team's figures; operators
// every team's and the unallocated GPUs (they belong to no team).

import { get } from "../api.js";
import { card, duration, errorMessage, gpuHours, h, jobLink, money, pageHeader, stat, table } from "../ui.js";
import { window } from "./costs.js";

const TOP_JOBS = 20;

/** The figures in the order a person reads them, each with what it means. */
export const FIGURES = [
  ["idle_gpus", "Idle GPUs", "Allocated GPU time of runs whose mean utilisation stayed under the idle threshold."],
  ["unallocated_gpus", "Unallocated GPUs", "GPUs no job held while a job of their flavor waited."],
  ["queueing", "Queueing", "GPUs × the time jobs waited for them, restarts' back-off included."],
  ["failed_attempts", "Failed attempts", "GPU time of attempts that failed or whose node was lost."],
  ["platform_failure", "Platform failures", "GPU time of attempts that failed through the platform: charged to the platform, not the team."],
  ["lost_work", "Lost work", "GPU time since the last checkpoint of attempts that failed, were lost or preempted."],
  ["input_bound", "Input-bound", "GPU time spent waiting for data in the training loop."],
  ["low_priority_holding", "Low priority holding", "GPUs a lower-priority job held while a higher-priority one waited."],
];
const UNMEASURED = { idle_gpus: "idle_gpus_unmeasured", input_bound: "input_bound_unmeasured" };
const LABEL = Object.fromEntries(FIGURES.map(([key, label]) => [key, label]));

export async function render(view, _params, { me }) {
  const operator = me.role === "operator";
  view.append(pageHeader("Waste",
    operator ? "Every team's GPU time that did no work, last 30 days." : `Team ${me.team}'s GPU time that did no work, last 30 days.`,
    h("a", { href: "#/costs", class: "button" }, "← Costs")));
  const range = window();
  let report;
  try {
    report = await get("billing", "/v1/waste", { from: range.from, to: range.to, group_by: "job", limit: TOP_JOBS });
  } catch (error) {
    view.append(errorMessage(error, "the waste report"));
    return;
  }
  const totals = new Map();
  for (const t of [...(report.totals || []), ...(operator ? report.unallocated || [] : [])]) {
    const list = totals.get(t.figure) || [];
    const same = list.find((x) => x.currency === t.currency);
    if (same && t.figure === "unallocated_gpus") {
      for (const k of ["gpu_seconds", "cost", "unpriced_gpu_seconds", "seconds"]) same[k] = String(Number(same[k]) + Number(t[k]));
      same.count += t.count;
    } else list.push({ ...t });
    totals.set(t.figure, list);
  }
  const ledger = (report.unattributed || [])[0];
  const success = report.success || [];
  const ended = success.reduce((n, s) => n + s.ended, 0);
  const succeeded = success.reduce((n, s) => n + s.succeeded, 0);
  const rate = ended ? succeeded / ended : null;

  view.append(h("div", { class: "stats" },
    stat("Job success rate", h("span", { id: "success-rate", class: rate === null ? "" : rate >= 0.9 ? "rate-good" : rate < 0.5 ? "rate-bad" : "" },
      rate === null ? "—" : `${(100 * rate).toFixed(1)} %`), ended ? `${succeeded} of ${ended} jobs that ended succeeded` : "no job ended in the window"),
    stat("Spend in the window", ledger ? money(ledger.ledger_cost, ledger.currency) : "—", ledger ? gpuHours(ledger.ledger_gpu_seconds) : null),
    stat("Unattributed spend", h("span", { id: "waste-unattributed" }, ledger ? money(ledger.cost, ledger.currency) : "—"), "spend with no team, user or job: should be 0")));

  view.append(h("div", { class: "waste-grid", id: "waste-figures" },
    FIGURES.filter(([key]) => operator || key !== "unallocated_gpus").map(([key, label, meaning]) => tile(key, label, meaning, totals, ledger && ledger.currency))));

  view.append(card("Success rate per day (UTC)", table([
    { title: "Day", cell: (s) => String(s.day).slice(0, 10) },
    ...(operator ? [{ title: "Team", cell: (s) => s.team || "—" }] : []),
    { title: "Queue", cell: (s) => s.queue || "(none)" },
    { title: "Ended", align: "right", cell: (s) => s.ended },
    { title: "Succeeded", align: "right", cell: (s) => s.succeeded },
    { title: "Failed", align: "right", cell: (s) => s.failed },
    { title: "Cancelled", align: "right", cell: (s) => s.cancelled },
    { title: "Success rate", align: "right", cell: (s) => `${(100 * Number(s.success_rate)).toFixed(1)} %` },
  ], [...success].sort((a, b) => String(b.day).localeCompare(String(a.day))), { empty: "No job ended in the window." })));

  view.append(card("Jobs that wasted most", table([
    { title: "Job", cell: (r) => (r.job ? jobLink(r.job) : "—") },
    { title: "Figure", cell: (r) => LABEL[r.figure] || r.figure.replaceAll("_", " ") },
    { title: "GPU time", align: "right", cell: (r) => gpuHours(r.gpu_seconds) },
    { title: "Wall time", align: "right", cell: (r) => duration(Number(r.seconds)) },
    { title: "Cost", align: "right", cell: (r) => money(r.cost, r.currency) },
  ], (report.rows || []).filter((r) => !r.figure.endsWith("_unmeasured")), { empty: "Nothing wasted in the window." }),
  report.truncated ? h("p", { class: "muted" }, `The ${TOP_JOBS} most expensive; the figures above count every job.`) : null));
}

function tile(key, label, meaning, totals, currency) {
  const list = totals.get(key) || [];
  const cost = list.length ? list.map((t) => money(t.cost, t.currency)).join(" + ") : money(0, currency);
  const seconds = list.reduce((n, t) => n + Number(t.gpu_seconds), 0);
  const count = list.reduce((n, t) => n + t.count, 0);
  const unmeasured = (totals.get(UNMEASURED[key]) || []).reduce((n, t) => n + Number(t.gpu_seconds), 0);
  const unpriced = list.reduce((n, t) => n + Number(t.unpriced_gpu_seconds), 0);
  return h("div", { class: `waste-tile${seconds ? "" : " zero"}`, "data-figure": key },
    h("div", { class: "stat-label" }, label),
    h("div", { class: "stat-value", id: `waste-${key}` }, cost),
    h("div", { class: "stat-hint" }, `${gpuHours(seconds)} · ${count} ${key === "queueing" ? "waits" : "intervals"}`),
    h("p", {}, meaning),
    unpriced ? h("p", { class: "waste-note" }, `${gpuHours(unpriced)} of a flavor without a price, not in the cost.`) : null,
    unmeasured ? h("p", { class: "waste-note" }, `${gpuHours(unmeasured)} not measured (no utilisation or data-wait report): neither counted nor cleared.`) : null);
}
