/* loomrl report: draws the plots and runs the trajectory browser (no dependencies but
   the inlined plotly.js). Data comes from three <script type="application/json"> blocks:
   #figures, #trajectories (a summary of every trajectory, column by column) and #texts
   (the embedded trajectories' text, parsed on first use). */
(function () {
  "use strict";
  const PAGE = 50;
  const byId = (id) => document.getElementById(id);
  const json = (id) => JSON.parse(byId(id).textContent);
  const el = (tag, attrs, text) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  };

  function drawPlots() {
    for (const fig of json("figures")) {
      Plotly.newPlot("fig-" + fig.id, fig.data, fig.layout,
        { displaylogo: false, responsive: true });
    }
  }

  // ---- trajectory browser ---------------------------------------------------------------
  const T = json("trajectories");
  const C = T.cols;
  const N = C.step.length;
  let texts = null; // parsed on first open
  let shown = [];
  let page = 0;
  let opened = -1;

  function options(select, names) {
    select.append(el("option", { value: "" }, "all"));
    names.forEach((name, i) => select.append(el("option", { value: String(i) }, name)));
  }

  function num(id) {
    const v = byId(id).value;
    return v === "" ? null : Number(v);
  }

  function applyFilters() {
    const run = byId("f-run").value, env = byId("f-env").value, st = byId("f-status").value;
    const s0 = num("f-step-min"), s1 = num("f-step-max");
    const r0 = num("f-reward-min"), r1 = num("f-reward-max");
    const l0 = num("f-len-min"), l1 = num("f-len-max");
    const textOnly = byId("f-text").checked;
    shown = [];
    for (let i = 0; i < N; i++) {
      if (run !== "" && C.run[i] !== +run) continue;
      if (env !== "" && C.env[i] !== +env) continue;
      if (st !== "" && C.status[i] !== +st) continue;
      if (s0 !== null && C.step[i] < s0) continue;
      if (s1 !== null && C.step[i] > s1) continue;
      if (r0 !== null && !(C.reward[i] >= r0)) continue;
      if (r1 !== null && !(C.reward[i] <= r1)) continue;
      if (l0 !== null && C.len[i] < l0) continue;
      if (l1 !== null && C.len[i] > l1) continue;
      if (textOnly && T.text_of[i] < 0) continue;
      shown.push(i);
    }
    const [key, dir] = byId("f-sort").value.split(":");
    if (key) shown.sort((a, b) => (C[key][a] - C[key][b]) * (dir === "desc" ? -1 : 1) || a - b);
    page = 0;
    drawList();
  }

  function drawList() {
    const body = byId("list").tBodies[0];
    body.replaceChildren();
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    page = Math.min(page, pages - 1);
    for (const i of shown.slice(page * PAGE, (page + 1) * PAGE)) {
      const tr = el("tr", { "data-i": String(i) });
      if (T.text_of[i] < 0) tr.className = "notext";
      if (i === opened) tr.classList.add("open");
      const status = T.statuses[C.status[i]];
      const cells = [T.runs[C.run[i]], C.step[i], T.envs[C.env[i]], status,
        C.reward[i] === null ? "-" : C.reward[i].toFixed(3), C.len[i], C.turns[i],
        C.group[i] + "/" + C.sample[i], "v" + C.version[i], T.text_of[i] < 0 ? "" : "✓"];
      cells.forEach((c, k) => {
        const td = el("td", k === 0 || k === 2 || k === 3 ? { class: "l" } : {}, String(c));
        if (k === 3) td.classList.add("st-" + status);
        tr.append(td);
      });
      tr.addEventListener("click", () => openTrajectory(i));
      body.append(tr);
    }
    byId("count").textContent = `${shown.length} of ${N} trajectories match · page ${page + 1} of ${pages}`;
  }

  function lpColour(lp) {
    // 0 (certain) -> white, -1 -> yellow, <= -5 -> red
    const t = Math.min(1, -lp / 5);
    const g = Math.round(255 - 155 * t), b = Math.round(255 - 255 * Math.min(1, t * 3));
    return `rgb(255,${g},${b})`;
  }

  function segment(kind, who, body) {
    const div = el("div", { class: "seg " + kind });
    div.append(el("span", { class: "who" }, who));
    if (typeof body === "string") div.append(document.createTextNode(body));
    else div.append(body);
    return div;
  }

  function modelText(seg, colour) {
    const [, pieces, lps] = seg;
    if (!colour || !lps) return pieces.join("");
    const frag = document.createDocumentFragment();
    pieces.forEach((p, k) => {
      const span = el("span", { class: "tok", title: `logprob ${(lps[k] / 100).toFixed(2)}` }, p);
      span.style.background = lpColour(lps[k] / 100);
      frag.append(span);
    });
    return frag;
  }

  function openTrajectory(i) {
    opened = i;
    if (texts === null) texts = json("texts");
    for (const tr of byId("list").tBodies[0].rows) tr.classList.toggle("open", +tr.dataset.i === i);
    const box = byId("detail");
    box.replaceChildren();
    const status = T.statuses[C.status[i]];
    const meta = el("div", { class: "meta" });
    const facts = [["run", T.runs[C.run[i]]], ["step", C.step[i]], ["task", T.envs[C.env[i]]],
      ["status", status], ["reward", C.reward[i]], ["example", C.example[i]],
      ["group/sample", C.group[i] + "/" + C.sample[i]], ["turns", C.turns[i]],
      ["model tokens", C.len[i]], ["env tokens", C.env_len[i]], ["policy version", C.version[i]]];
    for (const [k, v] of facts) meta.append(el("span", {}, `${k}: ${v}`));
    box.append(el("h3", {}, `Trajectory ${i}`), meta);
    const t = T.text_of[i] < 0 ? null : texts[T.text_of[i]];
    if (t === null) {
      box.append(el("p", { class: "note" }, `Text not embedded: this page carries the text of ` +
        `${texts.length} of ${N} trajectories (whole groups spread over the run; ` +
        "`loomrl report --max-texts N` embeds more)."));
      return;
    }
    const comps = Object.entries(t.x || {});
    if (comps.length) {
      const p = el("p", { class: "components" }, "reward components: ");
      for (const [k, v] of comps) p.append(el("span", { class: "badge" }, `${k} ${(+v).toFixed(3)}`));
      box.append(p);
    }
    if ((t.r || []).some((v) => v !== null)) {
      const turns = t.r.map((v, i) => `${i + 1}: ${v === null ? "-" : (+v).toFixed(3)}`);
      box.append(el("p", { class: "note" }, "per-turn rewards: " + turns.join(", ")));
    }
    const counted = Object.entries(t.m || {});
    if (counted.length) {
      const p = el("p", { class: "components" }, "env counted: ");
      for (const [k, v] of counted) p.append(el("span", { class: "badge" }, `${k} ${+(+v).toFixed(3)}`));
      box.append(p);
    }
    if (t.e) box.append(el("p", { class: "st-error" }, "error: " + t.e));
    if (t.f && t.f.length) box.append(el("p", { class: "note" }, "span finish reasons: " + t.f.join(", ")));
    const colour = byId("f-colour").checked;
    const prompt = el("details", {});
    prompt.append(el("summary", {}, "prompt"), segment("prompt", "prompt", t.p));
    box.append(prompt);
    let turn = 0;
    for (const seg of t.s) {
      if (seg[0] === 1) {
        turn += 1;
        const versions = seg[3] && seg[3].length ? " · policy v" + [...new Set(seg[3])].join("→v") : "";
        box.append(segment("model", `model · turn ${turn}${versions}`, modelText(seg, colour)));
      } else {
        box.append(segment("env", "env (mask 0)", seg[1]));
      }
    }
    if (!T.tokenized[C.run[i]]) {
      box.append(el("p", { class: "note" }, "The run's tokenizer was not found: text from its chat messages, no per-token logprobs."));
    }
  }

  function initBrowser() {
    options(byId("f-run"), T.runs);
    options(byId("f-env"), T.envs);
    options(byId("f-status"), T.statuses);
    for (const node of byId("filters").querySelectorAll("input, select")) {
      if (node.id === "f-colour") node.addEventListener("change", () => opened >= 0 && openTrajectory(opened));
      else node.addEventListener("change", applyFilters);
    }
    byId("prev").addEventListener("click", () => { page = Math.max(0, page - 1); drawList(); });
    byId("next").addEventListener("click", () => { page += 1; drawList(); });
    applyFilters();
  }

  initBrowser();
  // Plots after the first paint: the page shows its header and browser at once.
  requestAnimationFrame(() => setTimeout(() => {
    drawPlots();
    document.body.dataset.ready = "1";
  }, 0));
})();
