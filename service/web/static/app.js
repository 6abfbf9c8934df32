// The service's pages: live progress from GET /sweeps/{id}/events (server-sent events, same origin,
// so the session cookie goes along), the cancel button, file upload into the spec editor.
// Served from /static/ (no inline scripts: the pages' Content-Security-Policy allows only this origin).
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content;

const FINAL = new Set(["succeeded", "failed", "cancelled"]);

const fmt = {
  lr: (x) => (x == null ? "–" : Number(x).toExponential(1)),
  loss: (x) => (x == null ? "–" : Number(x).toFixed(4)),
};

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function bar(done, total) {
  const frac = total ? Math.min(1, done / total) : 0;
  const b = el("span", { class: "bar" + (total && done >= total ? " done" : ""), title: `${done}/${total ?? "?"}` });
  const fill = el("i");
  fill.style.width = `${Math.round(frac * 100)}%`;
  b.append(fill);
  return b;
}

// One sweep's progress (the JSON of GET /sweeps/{id} and of its events) into its [data-progress] block.
function renderProgress(sweep) {
  for (const block of document.querySelectorAll(`[data-progress="${CSS.escape(sweep.id)}"]`)) {
    const p = sweep.progress;
    block.querySelector("[data-trials]").textContent = `${p.trials_done}/${p.trials_total} trials`;
    block.querySelector("[data-cells]").textContent = `${p.cells_done}/${p.cells_total} cells`;
    const head = el("tr", {}, ...["cell", "search", "", "seeds", "", "best lr", "search best", "confirmed mean", "running"].map((h) => el("th", {}, h)));
    const rows = p.cells.map((c) =>
      el("tr", { "data-cell": c.cell },
        // a search of the batch axis says why it tests the size (hover: its decision in words)
        el("td", c.why ? { title: c.why } : {}, `${c.optimizer ?? c.cell} B=${c.batch_size ?? "?"}` +
          (c.chosen && c.chosen !== "listed" ? ` (${c.chosen})` : "")),
        el("td", {}, bar(c.search_done, c.search_total)), el("td", {}, `${c.search_done}/${c.search_total ?? "?"}`),
        el("td", {}, bar(c.seeds_done, c.seeds_total)), el("td", {}, `${c.seeds_done}/${c.seeds_total ?? "?"}`),
        el("td", {}, fmt.lr(c.best_lr)), el("td", {}, fmt.loss(c.search_best_val_loss)),
        el("td", {}, fmt.loss(c.confirmed_val_loss_mean)), el("td", {}, c.finished ? "done" : String(c.running))));
    block.querySelector("[data-cells-table]").replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
  }
  drawCurves(sweep);
  for (const holder of document.querySelectorAll(`[data-sweep="${CSS.escape(sweep.id)}"]`)) {
    holder.dataset.status = sweep.status;
    const st = holder.querySelector("[data-status-text]");
    if (st) { st.textContent = sweep.status; st.className = `status ${sweep.status}`; }
  }
  const cancel = document.querySelector(`[data-cancel="${CSS.escape(sweep.id)}"]`);
  if (cancel && FINAL.has(sweep.status)) {
    cancel.remove(); // nothing left to cancel
    document.getElementById("cancel-note").textContent = "";
  }
}

// The live curves (a sweep's page while it runs): val loss against tokens of every trial so far, from
// GET /sweeps/{id}/curves, fetched again whenever the sweep's revision moved; plotly.js from this origin.
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const curves = { revision: null, busy: false, again: false };

async function drawCurves(sweep) {
  const holder = document.querySelector(`[data-curves="${CSS.escape(sweep.id)}"]`);
  if (!holder || typeof Plotly === "undefined" || sweep.revision === curves.revision) return;
  if (curves.busy) { curves.again = true; return; }
  curves.busy = true;
  try {
    const resp = await fetch(`/sweeps/${encodeURIComponent(sweep.id)}/curves`, { headers: { Accept: "application/json" } });
    if (!resp.ok) return;
    const data = await resp.json();
    curves.revision = data.revision;
    const cells = [...new Set(data.trials.map((t) => t.cell))];
    const traces = data.trials.filter((t) => t.points.length).map((t) => ({
      x: t.points.map((p) => p[0]), y: t.points.map((p) => p[1]), type: "scatter", mode: "lines+markers",
      name: `${t.cell} lr=${t.lr.toExponential(1)} seed=${t.seed}${t.status === "completed" ? "" : ` (${t.status})`}`,
      legendgroup: t.cell,
      line: { color: PALETTE[cells.indexOf(t.cell) % PALETTE.length], width: t.best ? 3.5 : 1.2,
        dash: t.status === "pruned" ? "dot" : t.status === "running" ? "dash" : "solid" },
      marker: { size: t.status === "diverged" ? 9 : 3, symbol: t.status === "diverged" ? "x" : "circle" },
    }));
    const layout = { height: 440, margin: { t: 10, r: 10 }, xaxis: { title: { text: "tokens" } },
      yaxis: { title: { text: "val loss" } }, legend: { font: { size: 10 } } };
    Plotly.react(holder.querySelector(".plot"), traces, layout, { displaylogo: false, responsive: true });
    holder.dataset.traces = String(traces.length);
    holder.dataset.points = String(traces.reduce((n, t) => n + t.x.length, 0));
    holder.dataset.updates = String(Number(holder.dataset.updates || 0) + 1);
  } finally {
    curves.busy = false;
    if (curves.again) { curves.again = false; curves.revision = null; drawCurves(sweep); }
  }
}

// Follow every sweep on the page that is not final; when one ends, load the page again (the list
// then shows its answer, the dashboard its figures).
function follow(sweeps) {
  for (const s of sweeps) {
    renderProgress(s);
    if (FINAL.has(s.status)) continue;
    const source = new EventSource(`/sweeps/${encodeURIComponent(s.id)}/events`);
    source.addEventListener("progress", (ev) => renderProgress(JSON.parse(ev.data)));
    source.addEventListener("end", (ev) => {
      source.close();
      renderProgress(JSON.parse(ev.data));
      setTimeout(() => location.reload(), 300);
    });
  }
}

// The list: a sweep submitted elsewhere (the CLI, another tab) shows up without a reload by hand.
// Signing out here stops the poll first, one in flight included (a poll the server answered after the
// sign-out would be a 401); signed out in another tab, the next poll's 401 reloads the page, which
// then shows the sign-in form.
function watchForNewSweeps() {
  const table = document.getElementById("sweeps");
  const newest = table ? table.dataset.newest : "";
  if (table && newest === "") return; // an older page of the list
  const stop = new AbortController();
  const timer = setInterval(async () => {
    let resp;
    try {
      resp = await fetch("/sweeps?limit=1", { headers: { Accept: "application/json" }, signal: stop.signal });
    } catch {
      return; // aborted by the sign-out, or the service is restarting: the next poll tries again
    }
    if (resp.status === 401) {
      clearInterval(timer);
      location.reload();
      return;
    }
    if (!resp.ok) return;
    const first = (await resp.json()).items[0];
    if (first && first.id !== newest) location.reload();
  }, 5000);
  document.getElementById("sign-out")?.form.addEventListener("submit", () => {
    clearInterval(timer);
    stop.abort();
  });
}

function cancelButton() {
  const button = document.getElementById("cancel");
  if (!button) return;
  button.addEventListener("click", async () => {
    button.disabled = true;
    button.textContent = "Cancelling…";
    const resp = await fetch(`/sweeps/${encodeURIComponent(button.dataset.cancel)}/cancel`, {
      method: "POST", headers: { "X-CSRF-Token": csrf(), Accept: "application/json" },
    });
    const note = document.getElementById("cancel-note");
    if (resp.ok) {
      note.textContent = "cancel requested: stopping its trials";
    } else {
      const body = await resp.json().catch(() => null);
      note.textContent = body?.error?.message ?? `cancel refused (${resp.status})`;
      button.disabled = resp.status === 409; // already finished: nothing left to cancel
      if (resp.status !== 409) button.textContent = "Cancel sweep";
    }
  });
}

function uploadIntoEditor() {
  const file = document.getElementById("file");
  const spec = document.getElementById("spec");
  if (!file || !spec) return;
  file.addEventListener("change", async () => {
    if (!file.files.length) return;
    spec.value = await file.files[0].text();
    file.value = ""; // the editor holds it now: what is sent is what is shown, edits included
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const data = document.getElementById("sweeps-data");
  if (data) follow(JSON.parse(data.textContent));
  if (document.getElementById("sweeps") || document.getElementById("empty")) watchForNewSweeps();
  cancelButton();
  uploadIntoEditor();
});
