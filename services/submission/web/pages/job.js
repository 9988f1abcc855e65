// One job: what it is doing, why it waits, what it cost, its curves, checkpoints and output,
// its reproducibility record (code, data, environment, hardware) and, for a reproduction, the
// registry's verdict naming what differed from the original.
// While the job lives the page follows it (view every 3 s, logs every 2 s, charts every 10 s).

import { ApiError, Unavailable, call, get, getEvery } from "../api.js";
import { lineChart } from "../chart.js";
import {
  absolute, card, duration, errorMessage, gpuHours, h, jobLink, keyValues, message, metric, money,
  pageHeader, relative, replace, runSeconds, stat, statusBadge, table, when, withJobLinks,
} from "../ui.js";

const VIEW_MS = 3000;
const LOG_MS = 2000;
const CHART_MS = 10000;
const MAX_CHARTS = 6;
const MAX_POINTS = 1000;
const LOG_KEEP_CHARS = 200_000;
const AFTER_END_TRIES = 20; // the record's outcome and the verdict follow a job's end by the bus

export async function render(view, [jobId], { me }) {
  let job;
  try {
    job = await get("submission", `/v1/jobs/${encodeURIComponent(jobId)}`);
  } catch (error) {
    view.append(pageHeader("Job", jobId), errorMessage(error, "job"));
    return;
  }
  const timers = [];
  const header = h("div");
  // What became of an action (a cancel refused): below the header, which redraws every 3 s.
  const notice = h("div", { id: "job-notice" });
  const stats = h("div", { class: "stats", id: "job-stats" });
  const pending = h("div", { id: "pending" });
  const failure = h("div", { id: "failure" });
  const charts = h("div", { class: "charts", id: "charts" });
  const timeline = h("div", { id: "timeline" });
  const checkpoints = h("div", { id: "checkpoints" });
  const model = h("div", { id: "model" });
  const details = h("div", { id: "details" });
  const verdictBox = h("div", { id: "verdict" });
  const recordBox = h("div", { id: "record" });
  const logBox = h("pre", { class: "logs", id: "logs", tabindex: "0" });
  const logState = h("span", { class: "muted", id: "log-state" });

  view.append(header, notice, stats, pending, failure, verdictBox,
    card("Metrics", charts),
    h("div", { class: "columns" }, card("Timeline", timeline), card("Checkpoints", checkpoints)),
    model,
    card("Reproducibility", recordBox),
    card("Logs", h("div", { class: "card-tools" }, logState), logBox),
    card("Details", details));

  function draw() {
    const cancellable = !job.terminal && !job.cancel_requested && me.role !== "viewer";
    replace(header, pageHeader(
      h("span", {}, job.name, " ", statusBadge(job.status),
        (job.spec || {}).reproduces ? h("span", { class: "badge", title: `reproduces job ${job.spec.reproduces}` }, "reproduction") : null),
      h("span", { class: "mono", id: "job-id" }, job.id),
      cancellable ? h("button", { class: "danger", onclick: cancel }, "Cancel job") : null,
      job.cancel_requested && !job.terminal ? h("span", { class: "badge status-cancelled" }, "cancelling") : null));
    const cost = job.cost || {};
    replace(stats,
      stat("Status", statusBadge(job.status), job.attempt !== null ? `attempt ${job.attempt + 1}` : null),
      stat("Duration", duration(runSeconds(job)), job.started_at ? `started ${absolute(job.started_at)}` : "not started"),
      stat("Cost", h("span", { id: "job-cost" }, money(cost.cost, cost.currency)),
        cost.currency ? `${gpuHours(cost.gpu_seconds || 0)}${cost.final ? "" : " · so far"}` : "nothing billed yet"),
      stat("GPUs", `${job.spec.gpus} × ${job.spec.gpu_flavor}`,
        job.node ? `${job.node} [${job.gpu_indices.join(", ")}]` : "no node yet"),
      stat("Step", job.step ?? "—", job.spec.priority ? `priority ${job.spec.priority}` : null));
    drawPending();
    drawFailure();
    drawTimeline();
    drawCheckpoints();
    drawModel();
    drawDetails();
  }

  function drawPending() {
    const p = job.pending;
    if (job.terminal || !p || !["QUEUED", "PENDING", "PREEMPTED"].includes(job.status)) { replace(pending); return; }
    replace(pending, h("section", { class: "card waiting" },
      h("h2", {}, "Why it waits"),
      h("p", { class: "reason", id: "pending-reason" }, withJobLinks(p.reason || "Waiting for the scheduler's next pass.")),
      keyValues([
        ["Place in queue", p.position ?? "—"],
        p.blocking ? ["Blocked by", h("span", { id: "pending-blocking" }, withJobLinks(p.blocking))] : null,
        p.suggestion ? ["Suggestion", h("span", { id: "pending-suggestion" }, p.suggestion)] : null,
        ["Estimated start", h("span", { id: "estimated-start" },
          p.estimated_start ? `${absolute(p.estimated_start)} (${relative(new Date(p.estimated_start))})` : "unknown")],
      ])));
  }

  function drawFailure() {
    const f = job.failure;
    if (!f) { replace(failure); return; }
    replace(failure, h("section", { class: "card failed" }, h("h2", {}, job.terminal ? "Why it failed" : "Last failed attempt"),
      h("p", { class: "reason" }, f.reason),
      keyValues([
        f.failure_kind ? ["Kind", f.failure_kind] : null,
        f.exit_code !== null && f.exit_code !== undefined ? ["Exit code", f.exit_code] : null,
        f.attempt !== null && f.attempt !== undefined ? ["Attempt", f.attempt + 1] : null,
      ]),
      f.log_tail ? h("pre", { class: "logs short" }, f.log_tail) : null));
  }

  function drawTimeline() {
    const entries = job.history || [];
    replace(timeline, h("ol", { class: "timeline" }, entries.map((entry, i) => {
      const next = entries[i + 1];
      // The status a living job is in has lasted until now: how long it has waited is what
      // a person opening a pending job asks first.
      const until = next ? Date.parse(next.at) : job.terminal ? null : Date.now();
      const lasted = until === null ? null : (until - Date.parse(entry.at)) / 1000;
      return h("li", { class: `tl-${entry.status.toLowerCase()}` },
        h("div", { class: "tl-head" }, statusBadge(entry.status), h("span", { class: "muted" }, absolute(entry.at)),
          lasted !== null ? h("span", { class: "muted" }, ` · ${duration(lasted)}${next ? "" : " so far"}`) : null),
        entry.reason ? h("div", { class: "tl-reason" }, entry.reason) : null);
    })));
  }

  function drawCheckpoints() {
    replace(checkpoints, table([
      { title: "Step", align: "right", cell: (c) => c.step },
      { title: "Saved", cell: (c) => when(c.saved_at) },
      { title: "Size", align: "right", cell: (c) => bytes(c.size_bytes) },
      { title: "sha256", cell: (c) => h("span", { class: "mono", title: c.sha256 }, c.sha256.slice(0, 12)) },
    ], [...(job.checkpoints || [])].reverse(), { empty: "No checkpoint yet." }));
  }

  function drawModel() {
    const m = job.model;
    if (!m) { replace(model); return; }
    const href = `#/models/${encodeURIComponent(job.team)}/${encodeURIComponent(m.name)}/${m.version}`;
    replace(model, card("Model",
      h("p", {}, "Registered as ", h("a", { href, id: "model-link" }, `${m.name} v${m.version}`), "."),
      keyValues(Object.entries(m.metrics || {}).map(([k, v]) => [k, metric(v)]))));
  }

  function drawDetails() {
    const spec = job.spec || {};
    const program = spec.command && spec.command.length ? spec.command.join(" ") : `${spec.entrypoint || ""} ${(spec.args || []).join(" ")}`;
    replace(details, keyValues([
      ["Submitted", `${absolute(job.submitted_at)} by ${job.user}`],
      spec.project ? ["Project", spec.project] : null,
      spec.experiment ? ["Experiment", h("a", { href: experimentHref, id: "experiment-link" }, spec.experiment)] : null,
      Object.keys(spec.labels || {}).length ? ["Labels", Object.entries(spec.labels).map(([k, v]) => h("span", { class: "tag" }, `${k}=${v}`))] : null,
      ["Program", h("span", { class: "mono" }, program.trim() || "—")],
      spec.code ? ["Code", h("span", { class: "mono" }, spec.code.kind === "git" ? `${spec.code.repository} @ ${spec.code.commit.slice(0, 12)}` : `bundle ${String(spec.code.sha256).slice(0, 12)}`)] : null,
      spec.requirements && spec.requirements.length ? ["Requirements", spec.requirements.join(", ")] : null,
      spec.dataset ? ["Dataset", spec.dataset] : null,
      ["Seed", spec.seed ?? "—"],
      ["Max runtime", duration(spec.max_runtime_seconds)],
      ["Restarts allowed", spec.max_restarts ?? "—"],
      ["Trace id", h("span", { class: "mono", id: "trace-id" }, job.trace_id || "none: its trace was not sampled (or tracing was off)")],
    ]),
    Object.keys(spec.hyperparameters || {}).length
      ? h("div", {}, h("h3", {}, "Hyper-parameters"), keyValues(Object.entries(spec.hyperparameters).map(([k, v]) => [k, String(v)])))
      : null);
  }

  async function cancel() {
    if (!confirm(`Cancel job ${job.name}?`)) return;
    replace(notice);
    try {
      job = (await call("submission", `/v1/jobs/${encodeURIComponent(job.id)}/cancel`, { method: "POST" })).data;
      draw();
    } catch (error) {
      replace(notice, message("error", "The job was not cancelled.", error.message || String(error)));
    }
  }

  // --- metrics ---------------------------------------------------------------------------
  async function drawCharts() {
    let keys;
    try {
      const summaries = await get("registry", `/v1/jobs/${encodeURIComponent(job.id)}/metrics`);
      keys = summaryKeys(summaries);
    } catch (error) {
      if (error instanceof Unavailable) { latestOnly(true); return; }
      if (error instanceof ApiError && error.status === 404) { latestOnly(false); return; }
      replace(charts, errorMessage(error, "the metrics"));
      return;
    }
    if (!keys.length) { latestOnly(false); return; }
    const series = await Promise.all(keys.slice(0, MAX_CHARTS).map(async (key) => {
      try {
        const answer = await get("registry", `/v1/jobs/${encodeURIComponent(job.id)}/metrics/${encodeURIComponent(key)}`, { max_points: MAX_POINTS });
        return { key, points: pointsOf(answer), total: answer && answer.total, downsampled: answer && answer.downsampled };
      } catch {
        return { key, points: [] };
      }
    }));
    replace(charts);
    // The loss first: it is what people look for.
    series.sort((a, b) => rank(a.key) - rank(b.key) || a.key.localeCompare(b.key));
    for (const s of series) {
      lineChart(charts, s.key, [{ label: s.key, points: s.points }],
        { note: s.downsampled ? `${s.points.length} of ${s.total} points (min and max kept)` : null });
    }
  }

  function latestOnly(noHistory) {
    const entries = Object.entries(job.metrics || {});
    replace(charts,
      entries.length ? keyValues(entries.map(([k, v]) => [k, metric(v)])) : h("p", { class: "empty" }, "No metrics reported yet."),
      noHistory && entries.length ? h("p", { class: "muted" }, "Latest values: this server keeps no metric history.") : null);
  }

  // --- logs ------------------------------------------------------------------------------
  let logCursor = "";
  let lastStream = null;
  let logsDone = false;
  let logsReading = false;
  // One read at a time: a read that takes longer than LOG_MS (a slow network, a page of
  // megabytes) would otherwise be joined by the next, from the same cursor, and both would
  // add the same lines.
  async function pollLogs() {
    if (logsDone || logsReading) return;
    logsReading = true;
    try {
      for (let pages = 0; pages < 20; pages++) {
        const page = await get("submission", `/v1/jobs/${encodeURIComponent(job.id)}/logs`, { after: logCursor || undefined, limit: 50 });
        let text = "";
        for (const chunk of page.chunks) {
          // A new attempt (or node) of the job: say so, since its lines follow the last one's.
          if (lastStream !== null && chunk.stream !== lastStream) text += `\n── ${streamName(chunk.stream)} ──\n`;
          lastStream = chunk.stream;
          text += chunk.text;
        }
        if (text) {
          const follow = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 8;
          logBox.textContent = (logBox.textContent + text).slice(-LOG_KEEP_CHARS);
          if (follow) logBox.scrollTop = logBox.scrollHeight;
        }
        logCursor = page.cursor;
        if (page.streams_complete && page.job_terminal) { logsDone = true; break; }
        if (!page.chunks.length) break;
      }
      replace(logState, logsDone ? "complete" : "following…");
      if (!logBox.textContent) logBox.textContent = logsDone ? "(no output)" : "";
    } catch (error) {
      replace(logState, error.message);
    } finally {
      logsReading = false;
    }
  }

  async function findExperiment() {
    const spec = job.spec || {};
    if (!spec.experiment) return;
    try {
      const { experiments } = await getEvery("registry", "/v1/experiments", "experiments", { project: spec.project || undefined, limit: 500 });
      const found = (experiments || []).find((e) => e.name === spec.experiment);
      if (found) { experimentHref = `#/experiments/${found.id}`; drawDetails(); }
    } catch { /* the plain list link stays */ }
  }

  async function refreshJob() {
    try {
      job = await get("submission", `/v1/jobs/${encodeURIComponent(job.id)}`);
      draw();
    } catch { /* shown on the next success; the page keeps what it had */ }
  }

  // --- reproducibility -------------------------------------------------------------------
  // The record exists once the job started; its outcome once it ended: asked for until it
  // exists, then once more when the job ends. The verdict: when the reproduction has ended.
  let record = "none"; // "none" | "living" (recorded, job not ended) | "final"
  let recordTries = 0;
  async function drawRecord() {
    if (record === "final" || (record === "living" && !job.terminal)) return;
    const ended = job.terminal;
    try {
      const answer = await get("registry", `/v1/jobs/${encodeURIComponent(job.id)}/record`);
      replace(recordBox, reproducibility(answer));
      // Ended: the outcome lands when the registry has the job's end; ask a few more times.
      record = ended && (answer.outcome || ++recordTries > AFTER_END_TRIES) ? "final" : "living";
    } catch (error) {
      if (error instanceof ApiError && error.status === 404 && !(error instanceof Unavailable)) {
        replace(recordBox, h("p", { class: "empty" }, "Recorded when the job starts: what code, data, environment and hardware it ran with."));
        if (ended && ++recordTries > AFTER_END_TRIES) record = "final"; // it never started
      } else {
        replace(recordBox, errorMessage(error, "the reproducibility record"));
        record = "final";
      }
    }
  }

  let verdict = "none"; // "none" | "waiting" (asked before the job ended) | "final"
  let verdictTries = 0;
  async function drawVerdict() {
    if (!(job.spec || {}).reproduces || verdict === "final" || (verdict === "waiting" && !job.terminal)) return;
    const ended = job.terminal;
    try {
      const answer = await get("registry", `/v1/jobs/${encodeURIComponent(job.id)}/reproduction`);
      replace(verdictBox, verdictCard(answer, job.spec.reproduces));
      verdict = answer.verdict || (ended && ++verdictTries > AFTER_END_TRIES) ? "final" : ended ? "none" : "waiting";
    } catch (error) {
      if (error instanceof ApiError && error.status === 404 && !(error instanceof Unavailable)) {
        replace(verdictBox, verdictCard({ verdict: null, original_job_id: job.spec.reproduces }, job.spec.reproduces));
        verdict = ended && ++verdictTries > AFTER_END_TRIES ? "final" : ended ? "none" : "waiting";
      } else {
        replace(verdictBox, errorMessage(error, "the reproduction's verdict"));
        verdict = "final";
      }
    }
  }

  let experimentHref = "#/experiments";
  draw();
  await Promise.all([drawCharts(), pollLogs(), findExperiment(), drawRecord(), drawVerdict()]);
  timers.push(setInterval(() => { if (!job.terminal) refreshJob(); }, VIEW_MS));
  // The record appears when the job starts; the verdict when the reproduction has ended and
  // the registry compared it.
  timers.push(setInterval(() => { drawRecord(); drawVerdict(); }, VIEW_MS));
  timers.push(setInterval(pollLogs, LOG_MS));
  let chartsFinal = job.terminal;
  timers.push(setInterval(() => {
    if (chartsFinal) return;
    chartsFinal = job.terminal; // one last drawing once it has ended
    drawCharts();
  }, CHART_MS));
  return () => timers.forEach(clearInterval);
}

function rank(key) {
  return /loss/i.test(key) ? 0 : 1;
}

/** Metric keys from GET /v1/jobs/{id}/metrics, in whichever shape it answers. */
export function summaryKeys(summaries) {
  const list = Array.isArray(summaries) ? summaries : (summaries && (summaries.metrics || summaries.keys || summaries.series)) || summaries;
  if (Array.isArray(list)) return list.map((s) => (typeof s === "string" ? s : s.key || s.name)).filter(Boolean);
  if (list && typeof list === "object") return Object.keys(list).filter((k) => !["job_id", "team"].includes(k));
  return [];
}

export function pointsOf(answer) {
  if (Array.isArray(answer)) return answer;
  return (answer && (answer.points || answer.values)) || [];
}

/** ``a0001-node-7`` -> "attempt 2 on node-7". */
function streamName(stream) {
  const match = /^a(\d+)-(.+)$/.exec(stream);
  return match ? `attempt ${Number(match[1]) + 1} on ${match[2]}` : stream;
}

function bytes(size) {
  if (size < 1024) return `${size} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = size / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return `${value.toFixed(1)} ${units[unit]}`;
}

// --- reproducibility (registry: GET /v1/jobs/{id}/record and /reproduction) ---------------

const VERDICTS = {
  identical: ["identical", "status-succeeded", "Every final metric and the weights are exactly the original's."],
  within_tolerance: ["within tolerance", "status-running", "The final metrics agree within the relative tolerance."],
  different: ["different", "status-failed", "Something differs from the original: listed below."],
};

function short(text, n = 16) {
  if (text === null || text === undefined || text === "") return "—";
  const value = String(text);
  return value.length > n ? `${value.slice(0, n)}…` : value;
}

function mono(text, n) {
  return h("span", { class: "mono", title: text === null || text === undefined ? "" : String(text) }, short(text, n));
}

/** The record as four compact columns: code, data, environment, hardware; then how it ended
 * and the reproductions made of it. */
export function reproducibility(answer) {
  const record = answer.record || {};
  const code = record.code || {};
  const data = record.data || {};
  const env = record.environment || {};
  const hw = record.hardware || {};
  const source = code.source || {};
  const datasets = data.datasets || [];
  const outcome = answer.outcome;
  const versions = [
    ["Python", env.python], ["torch", env.torch], ["CUDA", env.cuda], ["cuDNN", env.cudnn], ["NCCL", env.nccl], ["Driver", env.driver],
  ].filter(([, v]) => v);
  const reproductions = answer.reproductions || [];
  return h("div", {},
    h("div", { class: "record" },
      h("div", { class: "record-part", id: "record-code" }, h("h3", {}, "Code"), keyValues([
        ["Version", mono(code.version, 40)],
        source.kind === "git" ? ["Git", h("span", { class: "mono" }, `${source.repository} @ ${short(source.commit, 12)}`)] : null,
        code.bundle_sha256 ? ["Bundle", mono(code.bundle_sha256, 12)] : null,
        ["Working tree", code.diff_sha256 ? h("span", { title: code.diff_sha256 }, "uncommitted changes (hashed)") : "clean or not git"],
      ])),
      h("div", { class: "record-part", id: "record-data" }, h("h3", {}, "Data"), keyValues([
        ...datasets.map((d) => [d.reference, h("span", { title: `${d.uri} · sha256 ${d.sha256}` }, mono(d.sha256, 12), d.feature_version ? ` · features ${d.feature_version}` : "")]),
        !datasets.length ? ["Datasets", "none from the registry"] : null,
        data.dataset ? ["Named", data.dataset] : null,
        ["Seed", record.seed ?? "—"],
        ["Hyper-parameters", Object.keys(record.hyperparameters || {}).length
          ? Object.entries(record.hyperparameters).map(([k, v]) => h("span", { class: "tag" }, `${k}=${v}`)) : "—"],
      ])),
      h("div", { class: "record-part", id: "record-environment" }, h("h3", {}, "Environment"), keyValues([
        ...versions.map(([k, v]) => [k, v]),
        ["Platform", env.platform || "—"],
        env.image ? ["Image", h("span", { class: "mono" }, env.image)] : null,
        env.image_digest ? ["Digest", mono(env.image_digest, 19)] : null,
        ["Packages", (env.packages || []).length ? h("span", { title: `sha256 ${env.packages_sha256 || ""}` }, `${env.packages.length} pinned · `, mono(env.packages_sha256, 12)) : "—"],
      ])),
      h("div", { class: "record-part", id: "record-hardware" }, h("h3", {}, "Hardware"), keyValues([
        ["GPUs", `${hw.gpu_count ?? "?"} × ${hw.gpu_flavor || "?"}`],
        (hw.gpu_models || []).length ? ["Models", [...new Set(hw.gpu_models)].join(", ")] : null,
        ["Node", hw.node_id || "—"],
        hw.hostname && hw.hostname !== hw.node_id ? ["Host", hw.hostname] : null,
      ]))),
    outcome ? h("p", { class: "muted record-outcome" }, `Ended ${outcome.status}`,
      outcome.checkpoint_sha256 ? h("span", {}, " · final checkpoint ", mono(outcome.checkpoint_sha256, 12)) : " · no final checkpoint",
      Object.keys(outcome.metrics || {}).length ? ` · ${Object.entries(outcome.metrics).map(([k, v]) => `${k} ${metric(v)}`).join(", ")}` : "") : null,
    reproductions.length ? h("div", { id: "reproductions" }, h("h3", {}, "Reproductions of this job"),
      h("ul", { class: "plain" }, reproductions.map((r) => h("li", {}, jobLink(r.job_id), " ", verdictBadge(r.verdict), " ", h("span", { class: "muted" }, absolute(r.decided_at)))))) : null);
}

function verdictBadge(verdict) {
  const [text, kind] = VERDICTS[verdict] || ["not decided", "status-pending"];
  return h("span", { class: `badge verdict ${kind}`, "data-verdict": verdict || "" }, text);
}

function value(v) {
  if (v === null || v === undefined) return h("span", { class: "muted" }, "none");
  if (Array.isArray(v)) return v.length ? v.map((item) => h("div", { class: "mono" }, short(typeof item === "string" ? item : JSON.stringify(item), 48))) : h("span", { class: "muted" }, "none");
  if (typeof v === "number") return metric(v);
  if (typeof v === "object") return h("span", { class: "mono" }, short(Object.entries(v).map(([k, x]) => `${k}=${typeof x === "object" ? "…" : x}`).join(", "), 60));
  return h("span", { class: "mono", title: String(v) }, short(v, 48));
}

/** The verdict on a reproduction: the word, its original, every difference named, the final
 * metrics side by side and the weights. */
export function verdictCard(answer, original) {
  const tone = answer.verdict === "different" ? "failed" : answer.verdict ? "reproduced" : "waiting";
  const metrics = Object.entries(answer.metrics || {});
  const weights = answer.weights || {};
  return h("section", { class: `card ${tone}` },
    h("h2", {}, "Reproduction of ", jobLink(answer.original_job_id || original), " ", h("span", { id: "verdict-word" }, verdictBadge(answer.verdict))),
    h("p", { class: "reason" }, answer.verdict ? VERDICTS[answer.verdict][2] : "The verdict comes when this job has ended and the registry has compared it with the original."),
    (answer.differences || []).length ? h("div", { id: "differences" }, h("h3", {}, "What differed"), table([
      { title: "Field", cell: (d) => h("strong", { class: "mono difference-field" }, d.field) },
      { title: "Original", cell: (d) => value(d.original) },
      { title: "This reproduction", cell: (d) => value(d.reproduction) },
    ], answer.differences)) : null,
    metrics.length ? h("div", {}, h("h3", {}, "Final metrics"), table([
      { title: "Metric", cell: ([k]) => k },
      { title: "Original", align: "right", cell: ([, m]) => value(m.original) },
      { title: "This reproduction", align: "right", cell: ([, m]) => value(m.reproduction) },
      { title: "Relative difference", align: "right", cell: ([, m]) => (m.compared === false ? h("span", { class: "muted" }, "a timing: not compared") : value(m.relative_difference)) },
    ], metrics)) : null,
    answer.verdict ? keyValues([
      ["Weights", !weights.compared ? "not compared (a final checkpoint is missing on a side)"
        : weights.equal ? "identical bytes" : `different${weights.deterministic ? "" : " (GPU kernels need not be deterministic)"}`],
      ["Tolerance", answer.relative_tolerance !== null && answer.relative_tolerance !== undefined ? `relative ${answer.relative_tolerance}` : "—"],
      ["Decided", absolute(answer.decided_at)],
    ]) : null);
}
