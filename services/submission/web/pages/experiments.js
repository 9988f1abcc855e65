// Experiments: the team's named groups of runs, and runs side by side (overlaid curves, the
// parameters that differ, final metrics, duration). Served by the registry's tracking API.

import { Unavailable, call, get, getEvery } from "../api.js";
import { PALETTE, lineChart } from "../chart.js";
import {
  card, duration, errorMessage, h, jobLink, message, metric, noSuch, pageHeader, replace,
  statusBadge, table, when,
} from "../ui.js";

const MAX_COMPARED = 8;
/** The registry's rule for a tag (its tracking_query.check_tag), checked before sending: a
 * tag holding "/" never reaches the registry's route, whose bare 404 would say nothing. */
const TAG = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/;
const TAG_RULE = "tag: must be 1 to 64 letters, digits, '_', '.', ':' or '-', not starting with one of the last four";
const MAX_CURVES = 3;

export async function render(view, params, ctx) {
  if (params.length) return renderOne(view, params[0], ctx.me);
  // The registry lists an operator every team's experiments (a member, their own team's).
  const operator = ctx.me.role === "operator";
  view.append(pageHeader("Experiments", `${operator ? "Every team" : `Team ${ctx.me.team}`}: runs grouped by the experiment their spec names.`));
  let answer;
  try {
    answer = await getEvery("registry", "/v1/experiments", "experiments", { limit: 500 });
  } catch (error) {
    view.append(unavailable(error, "Experiments"));
    return;
  }
  const experiments = answer.experiments || [];
  view.append(card(null, table([
    { title: "Experiment", cell: (e) => h("a", { href: `#/experiments/${e.id}`, class: "experiment-name", title: e.name }, e.name) },
    ...(operator ? [{ title: "Team", cell: (e) => e.team }] : []),
    { title: "Project", cell: (e) => e.project },
    { title: "Runs", align: "right", cell: (e) => e.runs },
    { title: "Running", align: "right", cell: (e) => e.running },
    { title: "Last run started", cell: (e) => when(e.last_started_at) },
    { title: "Created", cell: (e) => when(e.created_at) },
  ], experiments, { empty: "No experiments yet: name one in a job spec (\"experiment\": \"...\")." })));
}

function unavailable(error, what) {
  if (error instanceof Unavailable)
    return message("info", `${what} are not available on this server.`, "Its registry does not offer experiment tracking.");
  return errorMessage(error, what.toLowerCase());
}

async function renderOne(view, id, me) {
  // An experiment's id is a number: the registry has no route for anything else, and its
  // bare "Not Found" would read as a server without experiments.
  if (!/^[0-9]+$/.test(id)) { view.append(pageHeader("Experiment", id), noSuch("experiment")); return; }
  let data;
  try {
    data = await getEvery("registry", `/v1/experiments/${encodeURIComponent(id)}`, "runs");
  } catch (error) {
    view.append(pageHeader("Experiment", id), error instanceof Unavailable ? unavailable(error, "Experiments") : errorMessage(error, "experiment"));
    return;
  }
  const { experiment, runs } = data;
  const keys = [...new Set(runs.flatMap((r) => Object.keys(r.metrics || {})))].sort(byLossFirst);
  const chosen = new Set(runs.slice(0, MAX_COMPARED).map((r) => r.job_id));
  const compared = h("div", { id: "comparison" });
  const cells = new Map();

  view.append(pageHeader(experiment.name, `Team ${experiment.team} · project ${experiment.project} · ${experiment.runs} runs · ${experiment.running} running`));
  const checkbox = (run) => h("input", {
    type: "checkbox", checked: chosen.has(run.job_id), "aria-label": `compare ${run.name}`,
    onchange: (event) => {
      if (event.target.checked) chosen.add(run.job_id); else chosen.delete(run.job_id);
      compare();
    },
  });
  view.append(card("Runs", table([
    { title: "", cell: checkbox },
    { title: "Run", cell: (r) => h("span", {}, h("a", { href: `#/jobs/${r.job_id}`, class: "job-name", title: r.name }, r.name), " ", jobLink(r.job_id)) },
    { title: "Status", cell: (r) => statusBadge(r.status.toUpperCase()) },
    { title: "User", cell: (r) => r.user },
    { title: "Duration", align: "right", cell: (r) => duration(r.duration_seconds) },
    ...keys.slice(0, 4).map((key) => ({
      title: `${key} (final)`, align: "right", cell: (r) => (r.metrics[key] ? metric(r.metrics[key].final) : "—"),
    })),
    { title: "Tags", cell: (r) => annotations(r, me.role !== "viewer", cells).tags },
    { title: "Note", cell: (r) => annotations(r, me.role !== "viewer", cells).note },
  ], runs, { empty: "No runs yet." })), card("Comparison", compared));

  let request = 0;
  async function compare() {
    const mine = ++request;
    const jobs = [...chosen];
    if (!jobs.length) { replace(compared, h("p", { class: "empty" }, "Pick runs to compare.")); return; }
    replace(compared, h("div", { class: "loading" }, "Loading…"));
    let comparison;
    try {
      comparison = await get("registry", `/v1/experiments/${encodeURIComponent(id)}/compare`, {
        keys: keys.slice(0, MAX_CURVES).join(",") || undefined, jobs: jobs.join(","), max_points: 500,
      });
    } catch (error) {
      if (mine === request) replace(compared, errorMessage(error, "the comparison"));
      return;
    }
    if (mine !== request) return;
    replace(compared);
    const names = new Map(comparison.runs.map((r) => [r.job_id, r.name]));
    const label = (jobId) => `${names.get(jobId) || jobId.slice(0, 8)} (${jobId.slice(0, 8)})`;
    const charts = h("div", { class: "charts" });
    compared.append(charts);
    for (const [key, byJob] of Object.entries(comparison.curves || {}).sort(([a], [b]) => byLossFirst(a, b))) {
      lineChart(charts, key, Object.entries(byJob).map(([jobId, curve]) => ({ label: label(jobId), points: curve.points || [] })));
    }
    const runIds = comparison.runs.map((r) => r.job_id);
    const legend = (jobId, i) => h("span", { class: "swatch", style: `--c:${PALETTE[i % PALETTE.length]}`, title: label(jobId) },
      h("span", { class: "clip" }, label(jobId)));
    const params = Object.entries(comparison.differing_parameters || {});
    compared.append(h("h3", {}, "Parameters that differ"), params.length
      ? h("table", { class: "grid compare", id: "parameters" },
        h("thead", {}, h("tr", {}, h("th", {}, "parameter"), runIds.map((j, i) => h("th", {}, legend(j, i))))),
        h("tbody", {}, params.map(([name, values]) => h("tr", {}, h("th", {}, name),
          runIds.map((j) => h("td", { class: "num" }, values[j] === null || values[j] === undefined ? "—" : String(values[j])))))))
      : h("p", { class: "empty" }, "Every compared run has the same parameters."));
    const finals = Object.entries(comparison.final || {});
    if (finals.length) {
      compared.append(h("h3", {}, "Final metrics"), h("table", { class: "grid compare" },
        h("thead", {}, h("tr", {}, h("th", {}, "metric"), runIds.map((j, i) => h("th", {}, legend(j, i))))),
        h("tbody", {}, finals.map(([key, values]) => h("tr", {}, h("th", {}, key),
          runIds.map((j) => h("td", { class: "num" }, metric(values[j]))))))));
    }
  }
  await compare();
}

function byLossFirst(a, b) {
  const rank = (k) => (/loss/i.test(k) ? 0 : 1);
  return rank(a) - rank(b) || a.localeCompare(b);
}

/** A run's tags and note; members and above edit them in place (the registry's API). */
function annotations(run, editable, cache) {
  if (cache.has(run.job_id)) return cache.get(run.job_id);
  const tags = h("span", { class: "tags" });
  const note = h("span", { class: "note" });
  const status = h("small", { class: "inline-error", role: "alert" });
  const problem = (error) => replace(status, `Not saved: ${error.message}`);
  const path = `/v1/jobs/${encodeURIComponent(run.job_id)}`;
  function draw() {
    replace(tags, (run.tags || []).map((tag) => h("span", { class: "tag" }, tag,
      editable ? h("button", { class: "tag-remove", title: `remove ${tag}`, "aria-label": `remove tag ${tag}`, onclick: () => save("DELETE", `/tags/${encodeURIComponent(tag)}`) }, "×") : null)),
    editable ? h("input", {
      class: "tag-input", placeholder: "+ tag", "aria-label": `add a tag to ${run.name}`, size: 6,
      onkeydown: (event) => {
        const tag = event.target.value.trim();
        if (event.key !== "Enter" || !tag) return;
        if (TAG.test(tag)) save("PUT", `/tags/${encodeURIComponent(tag)}`);
        else problem({ message: TAG_RULE });
      },
    }) : null, status);
    const text = run.note || "";
    replace(note, h("span", { title: text }, text.length > 60 ? `${text.slice(0, 59)}…` : text),
      editable ? h("button", { class: "link-button", onclick: editNote }, text ? "edit" : "+ note") : null);
  }
  function editNote() {
    const input = h("input", { class: "note-input", value: run.note || "", "aria-label": `note of ${run.name}` });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") save("PUT", "/note", { note: input.value });
      if (event.key === "Escape") draw();
    });
    replace(note, input, h("small", { class: "muted" }, " Enter to save, Esc to cancel"));
    input.focus();
  }
  async function save(method, suffix, body) {
    try {
      const answer = await call("registry", path + suffix, { method, body });
      run.tags = answer.data.tags;
      run.note = answer.data.note;
      replace(status);
      draw();
    } catch (error) {
      problem(error);
    }
  }
  draw();
  const parts = { tags, note };
  cache.set(run.job_id, parts);
  return parts;
}
