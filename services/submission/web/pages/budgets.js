// Budgets: what each team (or a team's project) may spend this UTC month, what it has spent
// against that, and what the platform does with its next job once it is spent, from
// billing's GET /v1/budgets (every page of it). These are billing's exact amounts; the page
// only reads. Users see their own team's budgets; operators every team's (billing decides).

import { call } from "../api.js";
import { absolute, card, errorMessage, h, message, money, pageHeader, table } from "../ui.js";

/** A budget spent to this share (percent) or more, not yet all of it, is marked near. */
export const NEAR = 80;
/** The most rows billing answers a page (its ``BUDGETS_PAGE_MAX``). */
const PAGE = 500;

/** What submission does with a new job of the team (or project) once the budget is spent,
 * by the budget's ``policy`` (docs/billing.md, "Budgets"). */
export const ACTIONS = {
  refuse: "new jobs are refused",
  deprioritize: "new jobs run at low priority",
  warn: "new jobs are let in with a warning",
};

/** "exhausted" (billing's ``exhausted``: spent reached the limit), "near" (``NEAR`` % or
 * more spent) or "ok". */
export function standing(budget) {
  if (budget.exhausted) return "exhausted";
  return Number(budget.percent_spent) >= NEAR ? "near" : "ok";
}

const MARK = { exhausted: "exhausted", near: "near the limit", ok: "within" };

/** Every budget the caller may read: billing's pages, followed by their ``Link`` cursor. */
async function everyBudget() {
  const budgets = [];
  let after = null;
  do {
    const { data, next } = await call("billing", "/v1/budgets", { query: { limit: PAGE, after } });
    budgets.push(...(data || []));
    after = next;
  } while (after);
  return budgets;
}

export async function render(view, _params, { me }) {
  const operator = me.role === "operator";
  view.append(pageHeader("Budgets",
    operator ? "Every team's budgets for this UTC month." : `Team ${me.team}'s budgets for this UTC month.`,
    h("a", { href: "#/costs", class: "button" }, "← Costs")));
  let budgets;
  try {
    budgets = await everyBudget();
  } catch (error) {
    view.append(errorMessage(error, "the budgets"));
    return;
  }
  if (!budgets.length) {
    view.append(card(null, h("p", { class: "empty", id: "no-budget" },
      operator ? "No budget set for any team." : `No budget set for team ${me.team}.`),
      h("p", { class: "muted" }, "Spending is then not limited. A team's admin or an operator sets a budget with billing's PUT /v1/budgets/{team} (or /{team}/{project}).")));
    return;
  }
  const exhausted = budgets.filter((b) => b.exhausted);
  if (exhausted.length) {
    view.append(message("warn", `${exhausted.length === 1 ? "A budget is" : `${exhausted.length} budgets are`} spent for this month.`,
      exhausted.map((b) => `${scope(b)}: ${b.policy}, ${ACTIONS[b.policy] || "as billing says"}.`).join(" ")));
  }
  if (!operator && !budgets.some((b) => b.team === me.team && !b.project)) {
    view.append(h("p", { class: "muted", id: "no-team-budget" }, `No budget set for team ${me.team} as a whole; only for the projects below.`));
  }
  view.append(card(`Month ${budgets[0].month} (UTC)`, h("div", { id: "budgets" }, table([
    { title: "Team", cell: (b) => h("span", { class: "breakdown-key", title: b.team }, b.team) },
    { title: "Project", cell: (b) => (b.project ? h("span", { class: "breakdown-key", title: b.project }, b.project) : h("span", { class: "muted clip" }, "whole team")) },
    { title: "Limit", align: "right", cell: (b) => h("span", { class: "budget-limit", "data-amount": b.amount }, money(b.amount, b.currency)) },
    { title: "Spent", align: "right", cell: (b) => h("span", { class: "budget-spent", "data-amount": b.spent }, money(b.spent, b.currency)) },
    { title: "Remaining", align: "right", cell: (b) => h("span", { class: "budget-remaining", "data-amount": b.remaining }, money(b.remaining, b.currency)) },
    { title: "Share spent", cell: share },
    { title: "Status", cell: (b) => h("span", { class: `badge budget-${standing(b)}`, "data-standing": standing(b) }, MARK[standing(b)]) },
    { title: "When spent", cell: (b) => h("span", { class: "budget-action" }, h("code", { class: "budget-policy" }, b.policy), ACTIONS[b.policy] ? ` — ${ACTIONS[b.policy]}` : "") },
    { title: "Forecast", cell: (b) => h("span", { class: "budget-forecast", title: b.runs_out_at ? absolute(b.runs_out_at) : "" }, b.forecast) },
  ], budgets, { rowClass: (b) => `budget-row standing-${standing(b)}` }))));
  view.append(h("p", { class: "muted" },
    `Spent counts every bill of the month and what running jobs have used so far. Marked near the limit from ${NEAR} % spent; billing alerts at each budget's thresholds.`));
}

function scope(budget) {
  return budget.project ? `project ${budget.project} of team ${budget.team}` : `team ${budget.team}`;
}

/** The share of the limit spent, as a bar (full at the limit) and billing's percent, with the
 * budget's alert thresholds in the tooltip. */
function share(budget) {
  const percent = Number(budget.percent_spent);
  const width = Math.max(0, Math.min(100, percent));
  return h("span", { class: "share", title: `alerts at ${budget.thresholds.join(", ")} %` },
    h("span", { class: "hbar-track" }, h("span", { class: `hbar-fill budget-fill-${standing(budget)}`, style: `width:${width}%` })),
    h("small", { class: "budget-percent" }, `${budget.percent_spent} %`));
}
