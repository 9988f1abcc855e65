// Line charts with uPlot (vendor/uPlot.esm.js, MIT): fast on 100,000-point series, small,
// no dependencies. Non-finite values (NaN, ±Infinity, as the APIs send them) are gaps.

import uPlot from "./vendor/uPlot.esm.js";
import { number } from "./api.js";
import { h } from "./ui.js";

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

/**
 * A chart of ``series`` ([{label, points: [{step, value}]}]) by step, in ``container``.
 * Returns the uPlot instance (or null when there is nothing to draw).
 */
export function lineChart(container, title, series, { height = 240, yLabel = "", note = null } = {}) {
  const steps = [...new Set(series.flatMap((s) => s.points.map((p) => Number(p.step))))].sort((a, b) => a - b);
  const wrapper = h("figure", { class: "chart", dataset: { metric: title } },
    h("figcaption", {}, h("span", { class: "chart-title", title }, title), note ? h("small", { class: "muted" }, ` · ${note}`) : null));
  container.append(wrapper);
  if (!steps.length) {
    wrapper.append(h("p", { class: "empty" }, "No points yet."));
    return null;
  }
  const index = new Map(steps.map((step, i) => [step, i]));
  const data = [steps];
  for (const s of series) {
    const values = new Array(steps.length).fill(null);
    for (const p of s.points) {
      const value = number(p.value);
      values[index.get(Number(p.step))] = Number.isFinite(value) ? value : null;
    }
    data.push(values);
  }
  const widthOf = () => Math.max(260, Math.floor(wrapper.getBoundingClientRect().width) || 600);
  const options = {
    width: widthOf(), height,
    legend: { show: true },
    scales: { x: { time: false } },
    axes: [{ label: "step" }, { label: yLabel, size: 60 }],
    series: [{ label: "step" }, ...series.map((s, i) => ({
      label: s.label, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: false,
      points: { show: s.points.length < 60 },
    }))],
  };
  const plot = new uPlot(options, data, wrapper);
  // A label too long for the chart is cut with "…" (style.css): the whole name is its tooltip.
  for (const label of plot.root.querySelectorAll(".u-legend .u-series .u-label")) label.title = label.textContent;
  // The figure's width comes from the page's grid (the plot is absolutely sized inside it).
  const observer = new ResizeObserver(() => {
    if (!wrapper.isConnected) { observer.disconnect(); return; }
    const next = widthOf();
    if (Math.abs(next - plot.width) > 4) plot.setSize({ width: next, height });
  });
  observer.observe(wrapper);
  return plot;
}
