// Nodes: every node's GPUs as a grid, which job holds each one, and how full each node is.
// The cluster view is the scheduler's operator view; a team member sees where their own
// team's running jobs are placed.

import { ApiError, get } from "../api.js";
import { card, errorMessage, h, jobLink, message, pageHeader, replace, stat, when } from "../ui.js";

const REFRESH_MS = 5000;

export async function render(view, _params, { me }) {
  const body = h("div");
  view.append(pageHeader("Nodes", "GPUs, who holds them, and how full each node is."), body);
  async function load() {
    try {
      const queue = await get("scheduler", "/v1/queue");
      replace(body, ...clusterNodes(queue));
      if (await learnJobs((queue.allocations || []).map((a) => a.job_id))) replace(body, ...clusterNodes(queue));
    } catch (error) {
      if (error instanceof ApiError && error.status === 403) replace(body, ...(await teamPlacement(me)));
      else replace(body, errorMessage(error, "the nodes"));
    }
  }
  await load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}

function hue(jobId) {
  let hash = 0;
  for (const ch of jobId) hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  return (190 + (hash % 200)) % 360; // blues to oranges: never the green of a free GPU
}

const jobInfo = new Map(); // job id -> {name, utilization, at}: the cells' details, kept 15 s
const INFO_MS = 15000;

/** Utilisation the runner sampled for the job (NVML, real GPUs only), as a percentage. */
function utilizationOf(job) {
  const metrics = job.metrics || {};
  const value = metrics.gpu_utilization ?? metrics.gpu_utilization_mean;
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function gpuCell(index, jobId, free, lost) {
  if (jobId) {
    const info = jobInfo.get(jobId);
    const utilization = info && info.utilization !== null ? `${Math.round(info.utilization)}% busy` : null;
    return h("div", { class: "gpu used", style: `--h:${hue(jobId)}`, title: `GPU ${index}: job ${jobId}`, dataset: { job: jobId } },
      h("span", { class: "gpu-index" }, `GPU ${index}`), jobLink(jobId),
      info && info.name ? h("span", { class: "gpu-job" }, info.name) : null,
      utilization ? h("span", { class: "gpu-util" }, utilization) : null);
  }
  return h("div", { class: `gpu ${lost ? "lost" : free ? "free" : "unavailable"}`, title: `GPU ${index}` },
    h("span", { class: "gpu-index" }, `GPU ${index}`), h("span", { class: "gpu-state" }, lost ? "lost" : free ? "free" : "—"));
}

/** The node's mean utilisation over its GPUs whose job reports one (NVML). */
function busy(node) {
  const samples = Object.values(node.used_gpus).map((id) => jobInfo.get(id)).filter((i) => i && i.utilization !== null);
  if (!samples.length) return null;
  const mean = samples.reduce((n, i) => n + i.utilization, 0) / samples.length;
  return ` · ${Math.round(mean)}% utilised (${samples.length} GPUs reporting)`;
}

function clusterNodes(queue) {
  const nodes = queue.nodes || [];
  const total = nodes.reduce((n, node) => n + node.gpu_count, 0);
  const used = nodes.reduce((n, node) => n + Object.keys(node.used_gpus).length, 0);
  const ready = nodes.filter((n) => n.status !== "LOST").length;
  const summary = h("div", { class: "stats" },
    stat("Nodes", `${ready} of ${nodes.length}`, "ready"),
    stat("GPUs in use", `${used} of ${total}`, total ? `${Math.round((100 * used) / total)}% allocated` : null),
    stat("Running allocations", (queue.allocations || []).length));
  if (!nodes.length) return [summary, message("info", "No node has reported yet.", "Start a runner: python -m trainyard_platform.services.runner.")];
  return [summary, h("div", { class: "node-grid" }, nodes.map((node) => {
    const lost = node.status === "LOST";
    const usedCount = Object.keys(node.used_gpus).length;
    const share = node.gpu_count ? usedCount / node.gpu_count : 0;
    return h("section", { class: `card node ${lost ? "node-lost" : ""}`, dataset: { node: node.node_id } },
      h("h2", {}, node.node_id, " ", h("span", { class: `badge ${lost ? "status-failed" : node.cordon ? "status-preempted" : "status-succeeded"}`, title: node.cordon ? `cordoned by ${node.cordon.by}: ${node.cordon.reason}` : null }, node.cordon && !lost ? "cordoned" : node.status.toLowerCase())),
      h("p", { class: "muted" }, `${node.hostname} · ${node.gpu_flavor} · ${node.topology || "no topology"} · heartbeat `, when(node.last_heartbeat)),
      h("div", { class: "meter", title: `${usedCount} of ${node.gpu_count} GPUs allocated` },
        h("span", { style: `width:${Math.round(share * 100)}%` })),
      h("p", { class: "muted" }, `${usedCount} of ${node.gpu_count} GPUs allocated (${Math.round(share * 100)}%)`, busy(node)),
      h("div", { class: "gpus" }, Array.from({ length: node.gpu_count }, (_, i) =>
        gpuCell(i, node.used_gpus[i] ?? node.used_gpus[String(i)], node.free_gpus.includes(i), lost))));
  }))];
}

/** Fetch the name and utilisation of jobs not seen for 15 s; true when something new came. */
async function learnJobs(ids) {
  const now = Date.now();
  const stale = [...new Set(ids)].filter((id) => !jobInfo.has(id) || now - jobInfo.get(id).at > INFO_MS).slice(0, 50);
  await Promise.all(stale.map(async (id) => {
    try {
      const job = await get("submission", `/v1/jobs/${encodeURIComponent(id)}`);
      jobInfo.set(id, { name: job.name, utilization: utilizationOf(job), at: now });
    } catch {
      jobInfo.set(id, { name: null, utilization: null, at: now });
    }
  }));
  return stale.length > 0;
}

async function teamPlacement(me) {
  let running = [];
  try {
    running = await get("submission", "/v1/jobs", { status: "RUNNING", limit: 100 });
  } catch (error) {
    return [errorMessage(error, "your running jobs")];
  }
  const byNode = new Map();
  for (const job of running) {
    if (!job.node) continue;
    if (!byNode.has(job.node)) byNode.set(job.node, []);
    byNode.get(job.node).push(job);
  }
  const parts = [message("info", "The whole cluster's nodes are shown to operators.", `Here: the GPUs team ${me.team}'s running jobs hold.`)];
  if (!byNode.size) parts.push(h("p", { class: "empty" }, "None of your team's jobs is running."));
  for (const [node, jobs] of byNode) {
    const full = await Promise.all(jobs.map((j) => get("submission", `/v1/jobs/${encodeURIComponent(j.id)}`).catch(() => ({ ...j, gpu_indices: [] }))));
    for (const job of full) jobInfo.set(job.id, { name: job.name, utilization: utilizationOf(job), at: Date.now() });
    parts.push(card(node, h("div", { class: "gpus" }, full.flatMap((job) =>
      (job.gpu_indices || []).map((i) => gpuCell(i, job.id, false, false))))));
  }
  return parts;
}
