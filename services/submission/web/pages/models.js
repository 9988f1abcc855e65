// Models: the team's registered models, each version's metrics, aliases, what it cost to make
// (its own job plus every job upstream of it, from the registry's `cost`), the teams a model is
// granted to, and its lineage (code, data, environment, the job, its checkpoints) as a graph.

import { ApiError, Unavailable, get, getEvery } from "../api.js";
import {
  absolute, card, errorMessage, h, jobLink, keyValues, message, metric, money, noSuch,
  pageHeader, replace, stat, svg, table, when,
} from "../ui.js";

const SCAN_JOBS = 40;
const MAX_COSTS = 20;

export async function render(view, params, ctx) {
  if (params.length >= 2) return renderModel(view, params[0], params[1], params[2], ctx.me);
  view.append(pageHeader("Models", `Team ${ctx.me.team}: versions registered by successful jobs, and the models other teams granted to it.`));
  const body = h("div", {}, h("div", { class: "loading" }, "Loading…"));
  view.append(body);
  let models;
  try {
    models = await listModels(ctx.me);
  } catch (error) {
    replace(body, errorMessage(error, "the models"));
    return;
  }
  replace(body, card(null, table([
    { title: "Model", cell: (m) => h("a", { href: `#/models/${encodeURIComponent(m.team)}/${encodeURIComponent(m.name)}`, class: "model-name", title: m.name, "data-team": m.team }, m.name) },
    { title: "Team", cell: (m) => m.team },
    { title: "Access", cell: (m) => access(m) },
    { title: "Project", cell: (m) => m.project || "—" },
    { title: "Versions", align: "right", cell: (m) => m.versions ?? "—" },
    { title: "Latest version", align: "right", cell: (m) => `v${m.latest}` },
    { title: "Aliases", cell: (m) => Object.entries(m.aliases).sort().map(([a, v]) => h("span", { class: "tag" }, `${a} → v${v}`)) },
    { title: "Created", cell: (m) => when(m.registered_at) },
  ], models, { empty: "No model yet: a job that succeeds with a checkpoint registers one." })));
}

/** Whose the model is to the reader: the team's own, or granted by its owner (read only). */
function access(model) {
  if (!model.granted) return h("span", { class: "tag access-own access", "data-access": "own" }, "own");
  return h("span", { class: "tag grant access", "data-access": "granted", title: `team ${model.team} lets your team read it` }, `granted by ${model.team}`);
}

/** Every page of ``GET /v1/models`` with ``query``, as the list's rows. */
async function allModels(query) {
  const models = [];
  let after;
  do {
    const page = await get("registry", "/v1/models", { ...query, limit: 500, ...(after ? { after } : {}) });
    models.push(...page.models);
    after = page.next;
  } while (after);
  return models.map((m) => ({ team: m.team, name: m.name, project: m.project, latest: m.latest_version, versions: m.versions, aliases: m.aliases || {}, registered_at: m.created_at, job_id: "", granted: false }));
}

/** The models other teams granted to ``me``'s team (``?granted=true``), marked granted. An
 * operator's token speaks for no team, so it has none; a registry without the parameter
 * refuses it (422 naming ``granted``) and lists none either. */
async function grantedModels(me) {
  if (me.role === "operator") return [];
  try {
    return (await allModels({ granted: "true" })).map((m) => ({ ...m, granted: true }));
  } catch (error) {
    if (error instanceof ApiError && error.status === 422 && /granted/.test(error.message)) return [];
    throw error;
  }
}

/** The team's models from the registry, then those other teams granted to it (as
 * ``trainyard model ls`` lists them); a server whose registry has no such list falls back to
 * the team's latest successful jobs (each job view names the model version it made). */
async function listModels(me) {
  try {
    const [own, granted] = await Promise.all([allModels({ team: me.team }), grantedModels(me)]);
    const seen = new Set(own.map((m) => `${m.team}/${m.name}`));
    return [...own, ...granted.filter((m) => !seen.has(`${m.team}/${m.name}`))];
  } catch (error) {
    if (!(error instanceof Unavailable)) throw error;
  }
  const jobs = await get("submission", "/v1/jobs", { status: "SUCCEEDED", limit: SCAN_JOBS });
  const views = await Promise.all(jobs.map((j) => get("submission", `/v1/jobs/${encodeURIComponent(j.id)}`).catch(() => null)));
  const byName = new Map();
  for (const job of views) {
    if (!job || !job.model) continue;
    const known = byName.get(job.model.name);
    if (!known || known.latest < job.model.version) {
      byName.set(job.model.name, { team: job.team, name: job.model.name, latest: job.model.version, aliases: {}, registered_at: job.finished_at, job_id: job.id, granted: false });
    }
  }
  return [...byName.values()].sort((a, b) => a.name.localeCompare(b.name));
}

async function renderModel(view, team, name, wanted, me) {
  // Another team's model is readable by a member only through a grant: shown read-only, and
  // the owner's jobs behind it stay the owner's (as the registry's lineage hides them).
  const grantee = me.role !== "operator" && team !== me.team;
  const job = (id) => (grantee ? ownerJob(team) : jobLink(id));
  const base = `/v1/models/${encodeURIComponent(team)}/${encodeURIComponent(name)}`;
  let list, model;
  const aliases = new Map();
  try {
    [model, list] = await Promise.all([get("registry", base), getEvery("registry", `${base}/versions`, "versions", { limit: 500 })]);
    for (const [alias, version] of Object.entries(model.aliases || {})) aliases.set(version, [...(aliases.get(version) || []), alias].sort());
  } catch (error) {
    view.append(pageHeader(name, `Model of team ${team}`), errorMessage(error, "model"));
    return;
  }
  view.append(pageHeader(name, h("span", {}, `Model of team ${team}`, model.project ? ` · project ${model.project}` : "", " · ", grantsLine(model, team)),
    grantee ? h("span", { class: "badge read-only", id: "read-only", title: "a grant lets your team read this model, not change it" }, "read-only") : null));
  const versions = list.versions || [];
  if (!versions.length) { view.append(message("info", "This model has no version yet.")); return; }
  // Each version's detail carries its cost to make (own job + upstream); the newest ones.
  const details = new Map();
  await Promise.all(versions.slice(-MAX_COSTS).map(async (v) => {
    try {
      details.set(v.version, await get("registry", `${base}/versions/${v.version}`));
    } catch { /* deleted meanwhile: the cost shows as unknown */ }
  }));
  // A version is a number (the registry has no route for anything else: see experiments.js).
  const selected = wanted === undefined ? versions[versions.length - 1].version : /^[0-9]+$/.test(wanted) ? Number(wanted) : null;
  const keys = [...new Set(versions.flatMap((v) => Object.keys(v.metrics || {})))].sort();
  const href = (v) => `#/models/${encodeURIComponent(team)}/${encodeURIComponent(name)}/${v}`;
  view.append(card("Versions", table([
    { title: "Version", cell: (v) => h("a", { href: href(v.version) }, `v${v.version}`) },
    { title: "Aliases", cell: (v) => (aliases.get(v.version) || []).map((a) => h("span", { class: "tag alias" }, a)) },
    { title: "Registered", cell: (v) => when(v.registered_at) },
    { title: "Job", cell: (v) => job(v.job_id) },
    ...keys.slice(0, 5).map((k) => ({ title: k, align: "right", cell: (v) => metric(v.metrics[k]) })),
    { title: "Cost to make", align: "right", cell: (v) => costCell(details.get(v.version)) },
  ], [...versions].reverse(), { rowClass: (v) => (v.version === selected ? "selected" : "") })));
  const detailBox = h("div", { id: "version" }, h("div", { class: "loading" }, "Loading…"));
  view.append(detailBox);
  if (selected === null) { replace(detailBox, noSuch("version")); return; }
  try {
    const detail = details.get(selected) || await get("registry", `${base}/versions/${selected}`);
    const lineage = detail.lineage || {};
    const env = lineage.environment || {};
    const upstream = h("div", { id: "upstream" }, h("div", { class: "loading" }, "Loading…"));
    replace(detailBox,
      costCard(detail, grantee ? me.team : null),
      card(`Lineage of v${selected}`, lineageGraph(detail, grantee ? team : null)),
      card(`Where v${selected} came from (the registry's lineage)`, upstream),
      h("div", { class: "columns" },
        card("Version", keyValues([
          ["Registered", absolute(detail.registered_at)],
          ["Job", grantee ? ownerJob(team) : jobLink(detail.job_id, detail.job_id)],
          ["Artifact", h("span", { class: "mono" }, detail.artifact.uri || "—")],
          ["sha256", h("span", { class: "mono" }, detail.artifact.sha256)],
          ["Step", detail.artifact.step],
          ...Object.entries(detail.metrics || {}).map(([k, v]) => [k, metric(v)]),
        ])),
        // The registry shows no lineage to a team the model is granted to (the owner's work).
        detail.lineage == null ? card("How to reproduce it", h("p", { class: "muted", id: "owner-work" }, `Made by a job of team ${team}: its code, data and environment are that team's, not shown to yours.`)) : card("How to reproduce it", keyValues([
          ["Code", h("span", { class: "mono" }, lineage.code_version || "—")],
          ["Dataset", lineage.dataset || "—"],
          ["Seed", lineage.seed ?? "—"],
          ["Attempts", lineage.attempts ?? "—"],
          ["Python / torch", `${env.python || "?"} / ${env.torch || "?"}`],
          ["Platform", env.platform || "—"],
          env.image ? ["Image", env.image] : null,
          ["Packages", (env.packages || []).length ? `${env.packages.length} pinned` : "—"],
        ]))));
    get("registry", `/v1/lineage/models/${encodeURIComponent(team)}/${encodeURIComponent(name)}/versions/${selected}/upstream`)
      .then((graph) => replace(upstream, lineageTree(graph)))
      .catch((error) => replace(upstream, errorMessage(error, "the lineage")));
  } catch (error) {
    replace(detailBox, errorMessage(error, "version"));
  }
}

/** The owning team's job behind a granted model, named by its team only. */
function ownerJob(team) {
  return h("span", { class: "muted owner-job", title: "the owning team's job: not shown to other teams" }, `a job of team ${team}`);
}

/** Who else may read the model: the teams it is granted to (the owner sees them; a grantee
 * gets null and is told the model is shared with it). */
function grantsLine(model, team) {
  if (model.grants === null || model.grants === undefined) return h("span", { id: "grants" }, `shared with your team by ${team}`);
  if (!model.grants.length) return h("span", { id: "grants", class: "muted" }, "not granted to other teams");
  return h("span", { id: "grants" }, "granted to ", [...model.grants].sort().map((g) => h("span", { class: "tag grant" }, g)));
}

/** A version's cost to make as one figure: the total in its currency, or each currency's
 * total when the billing currency changed. */
export function costText(cost) {
  if (!cost) return "—";
  if (cost.currency) return money(cost.total, cost.currency);
  if ((cost.by_currency || []).length) return cost.by_currency.map((c) => money(c.total, c.currency)).join(" + ");
  return money(0);
}

function costCell(detail) {
  if (!detail || !detail.cost) return "—";
  const cost = detail.cost;
  return h("span", { class: "version-cost", "data-version": String(detail.version) }, costText(cost),
    cost.complete ? null : h("span", { class: "badge pending-cost", title: "a job of its lineage still runs: billed when it ends" }, "so far"));
}

function part(cost, key) {
  if (cost.currency) return money(cost[key], cost.currency);
  return (cost.by_currency || []).map((c) => money(c[key], c.currency)).join(" + ") || money(0);
}

/** What the version cost to make: its own job and every job upstream of it, each job's
 * allocations billed (failed attempts and restarts included). For a ``reader`` team (a
 * granted model's), another team's job listed there is named by its team only. */
function costCard(detail, reader = null) {
  const cost = detail.cost;
  if (!cost) return card(`Cost to make v${detail.version}`, h("p", { class: "empty" }, "This server does not report what a version cost."));
  const jobs = cost.jobs || [];
  const theirs = (j) => reader !== null && j.team !== reader;
  const amounts = (j) => Object.entries(j.costs || {}).map(([currency, amount]) => money(amount, currency)).join(" + ") || money(0);
  return h("section", { class: "card", id: "model-cost" },
    h("h2", {}, `Cost to make v${detail.version}`,
      cost.complete
        ? h("span", { class: "badge status-succeeded", id: "cost-state" }, "complete")
        : h("span", { class: "badge status-running", id: "cost-state", title: "a job of its lineage still runs, or the lineage was cut at its limit" }, "so far")),
    h("div", { class: "stats" },
      stat("Total", h("span", { id: "version-cost-total" }, costText(cost)), "own job + upstream"),
      stat("Own job", h("span", { id: "version-cost-own" }, part(cost, "own_job")), "the job that made it"),
      stat("Upstream", h("span", { id: "version-cost-upstream" }, part(cost, "upstream")), "parent models' and datasets' jobs")),
    // Every job of a granted model's cost may be its owner's: then only the note says so.
    jobs.length || !cost.hidden_jobs ? table([
      { title: "Job", cell: (j) => (theirs(j) ? ownerJob(j.team) : jobLink(j.job_id)) },
      { title: "Name", cell: (j) => (theirs(j) ? "—" : j.name) },
      { title: "Made", cell: (j) => (j.relation === "own" ? "this version" : "upstream") },
      { title: "Status", cell: (j) => h("span", { class: `badge status-${j.status}` }, j.status) },
      { title: "Allocations", align: "right", cell: (j) => j.allocations },
      { title: "Cost", align: "right", cell: (j) => amounts(j) },
    ], jobs, { empty: "No job is recorded for this version." }) : null,
    hiddenJobs(cost.hidden_jobs));
}

/** The jobs of other teams a cost counts but does not list (a granted model's own job is
 * one of them, not only upstream ones), or nothing when there are none. */
function hiddenJobs(count) {
  if (!count) return null;
  const jobs = count === 1 ? "1 job" : `${count} jobs`;
  return h("p", { class: "muted", id: "cost-hidden" }, `${jobs} of other teams counted in the amounts above, not listed.`);
}


/** A node of the registry's lineage graph as a line of text. */
function nodeLabel(node) {
  if (node.kind === "job") return h("span", {}, "job ", jobLink(node.job_id), ` ${node.name || ""} (${node.status || "?"})`);
  if (node.kind === "dataset_version") return `dataset ${node.team}/${node.name}:${node.version}`;
  if (node.kind === "model_version") return `model ${node.team}/${node.name}:${node.version}${node.deleted ? " (deleted)" : ""}`;
  if (node.kind === "checkpoint") return h("span", { class: "mono" }, `checkpoint ${node.uri || node.id}`);
  return node.id;
}

/** Lines the dashboard's lineage tree lists at most; the rest are counted in a note ("N more
 * nodes not shown") that names the CLI command printing them all. A registry answer holds
 * up to 10,000 nodes: a page of that many nested items is unreadable, and slow to lay out. */
export const LINEAGE_LINES = 500;

/** Levels the lineage tree nests; deeper items stay at this level, their level written
 * ("(40) ..."), as the CLI's tree keeps its indent, so a long chain stays within the page. */
export const LINEAGE_LEVELS = 32;

/** The graph as nested lists from its root (each node's children: what it came from, for
 * upstream). A node reached twice is listed in full once, then named with "(see above)"
 * ("(cycle: see above)" when it is an ancestor of itself, which a well-formed lineage never
 * is). Walked from a stack, not a call per level: the registry answers chains of thousands
 * of nodes (a model fine-tuned from one fine-tuned from ...). At most ``maxLines`` items are
 * listed and ``maxLevels`` nested (``LINEAGE_LINES``, ``LINEAGE_LEVELS``). */
export function lineageTree(graph, { maxLines = LINEAGE_LINES, maxLevels = LINEAGE_LEVELS } = {}) {
  const nodes = new Map(graph.nodes.map((n) => [n.id, n]));
  const up = graph.direction === "upstream";
  const children = new Map();
  for (const e of graph.edges) {
    const [parent, child] = up ? [e.to, e.from] : [e.from, e.to];
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push([e.relation, child]);
  }
  for (const list of children.values()) list.sort();
  const seen = new Set();
  const path = [];  // the ids from the root to the item last listed, by depth
  const onPath = new Set();
  const top = h("ul", {});
  let lines = 0, unlisted = 0, repeats = 0;
  // [id, relation, depth, the list its item goes in]: pushed last child first, so popped in order.
  const stack = [[graph.root, "", 0, top]];
  while (stack.length) {
    const [id, relation, depth, list] = stack.pop();
    while (path.length > depth) onPath.delete(path.pop());
    const repeat = seen.has(id);
    if (lines >= maxLines) {
      // Past the cap the walk goes on only to count what it leaves out.
      if (repeat) repeats += 1;
      else {
        seen.add(id);
        unlisted += 1;
        const below = children.get(id) || [];
        for (let i = below.length - 1; i >= 0; i--) stack.push([below[i][1], below[i][0], depth + 1, list]);
      }
      continue;
    }
    lines += 1;
    const node = nodes.get(id) || { id };
    const label = h("span", { class: "lineage-node", "data-kind": node.kind || "" },
      depth > maxLevels ? h("small", { class: "muted lineage-level" }, `(${depth}) `) : null,
      relation ? h("small", { class: "muted" }, `${relation} `) : null, nodeLabel(node));
    if (repeat) {
      const cycle = onPath.has(id);
      list.append(h("li", { class: cycle ? "lineage-cycle" : null }, label, h("small", { class: "muted" }, cycle ? " (cycle: see above)" : " (see above)")));
      continue;
    }
    seen.add(id);
    path.push(id);
    onPath.add(id);
    const item = h("li", {}, label);
    list.append(item);
    const below = children.get(id) || [];
    if (!below.length) continue;
    let into = list;  // past maxLevels the children stay in this list, their level written
    if (depth < maxLevels) {
      into = h("ul", {});
      item.append(into);
    }
    for (let i = below.length - 1; i >= 0; i--) stack.push([below[i][1], below[i][0], depth + 1, into]);
  }
  const notes = [];
  if (graph.hidden) notes.push(`${graph.hidden} nodes of other teams hidden`);
  if (graph.truncated) notes.push("truncated at the registry's limit");
  return h("div", { class: "lineage-tree" }, top,
    notes.length ? h("p", { class: "muted" }, notes.join("; ")) : null,
    unlisted || repeats ? lineageMore(graph.root, up, maxLines, unlisted, repeats) : null);
}

/** The note under a lineage tree cut at ``shown`` lines: how many nodes (and repeats of
 * nodes listed) it leaves out, and the CLI command that prints the whole tree. */
function lineageMore(root, up, shown, unlisted, repeats) {
  const ref = String(root).slice(String(root).indexOf(":") + 1);
  const parts = [];
  if (unlisted) parts.push(`${unlisted.toLocaleString("en-US")} more ${unlisted === 1 ? "node" : "nodes"}`);
  if (repeats) parts.push(`${repeats.toLocaleString("en-US")} more ${repeats === 1 ? "mention" : "mentions"} of nodes listed above`);
  return h("p", { class: "muted lineage-more", id: "lineage-more" },
    `${parts.join(" and ")} not shown (the first ${shown.toLocaleString("en-US")} lines are); `,
    "the whole tree: ", h("code", {}, `trainyard lineage ${up ? "up" : "down"} ${ref}`));
}

/** Inputs (code, data, environment, parent checkpoints) -> job -> artifact -> version.
 * ``owner`` (a granted model's team) names the job by that team only, with no link. */
export function lineageGraph(detail, owner = null) {
  const lineage = detail.lineage || {};
  const env = lineage.environment || {};
  const short = (text, n = 22) => (String(text).length > n ? `${String(text).slice(0, n - 1)}…` : String(text));
  const columns = [
    [
      { kind: "code", title: "code", text: short(lineage.code_version || "—") },
      lineage.dataset ? { kind: "dataset", title: "dataset", text: short(lineage.dataset) } : null,
      { kind: "environment", title: "environment", text: short(`python ${env.python || "?"} · torch ${env.torch || "?"}`) },
      ...(lineage.parent_checkpoints || []).map((c) => ({ kind: "parent", title: "parent checkpoint", text: short(c.split("/").slice(-2).join("/")) })),
    ].filter(Boolean),
    [owner
      ? { kind: "job", title: "job", text: short(`a job of team ${owner}`) }
      : { kind: "job", title: `job · ${lineage.attempts ?? 1} attempt(s)`, text: short(`${detail.job_id.slice(0, 8)} · ${(lineage.spec && lineage.spec.name) || ""}`), href: `#/jobs/${detail.job_id}` }],
    [{ kind: "checkpoint", title: `checkpoint · step ${detail.artifact.step}`, text: short(detail.artifact.sha256, 16) }],
    [{ kind: "model", title: "model version", text: `${detail.model} v${detail.version}` }],
  ];
  const boxW = 190, boxH = 46, gapX = 70, gapY = 18, pad = 10;
  const rows = Math.max(...columns.map((c) => c.length));
  const height = pad * 2 + rows * boxH + (rows - 1) * gapY;
  const width = pad * 2 + columns.length * boxW + (columns.length - 1) * gapX;
  const place = columns.map((column, ci) => column.map((node, ri) => {
    const columnHeight = column.length * boxH + (column.length - 1) * gapY;
    return { ...node, x: pad + ci * (boxW + gapX), y: (height - columnHeight) / 2 + ri * (boxH + gapY) };
  }));
  const graph = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "lineage", id: "lineage", role: "img", "aria-label": "lineage graph", width, height });
  for (let ci = 0; ci + 1 < place.length; ci++) {
    for (const from of place[ci]) for (const to of place[ci + 1]) {
      const x1 = from.x + boxW, y1 = from.y + boxH / 2, x2 = to.x, y2 = to.y + boxH / 2, mid = (x1 + x2) / 2;
      graph.append(svg("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 6},${y2}`, class: "edge", "marker-end": "url(#arrow)" }));
    }
  }
  graph.prepend(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "8", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }))));
  for (const node of place.flat()) {
    const group = svg("g", { class: `node node-${node.kind}`, "data-kind": node.kind, transform: `translate(${node.x},${node.y})` },
      svg("rect", { width: boxW, height: boxH, rx: 8 }),
      svg("text", { x: 10, y: 18, class: "node-title" }, node.title),
      svg("text", { x: 10, y: 36, class: "node-text" }, node.text));
    if (node.href) {
      const link = svg("a", { href: node.href });
      link.append(group);
      graph.append(link);
    } else graph.append(group);
  }
  return h("div", { class: "lineage-wrap" }, graph);
}
