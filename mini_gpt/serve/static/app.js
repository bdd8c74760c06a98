// The mini-gpt playground: plain JavaScript, no libraries. Talks to /api/info, /api/generate (server-sent
// events over a POST), /api/attention, /api/lens and /api/heads; see mini_gpt/serve/app.py.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  info: null, ids: [], spans: [], tokens: [], controller: null, selected: null, attention: null, heads: null,
};

function probColor(p) {
  // unlikely (red) .. sure (green), light enough to read the text on
  const hue = 10 + 120 * Math.max(0, Math.min(1, p));
  return `hsl(${hue}, 70%, 82%)`;
}

function attentionColor(w) {
  return `rgba(35, 87, 217, ${Math.min(1, Math.sqrt(w)).toFixed(3)})`;
}

function visible(text) {
  return text.replace(/ /g, "\u2423").replace(/\n/g, "\\n").replace(/\t/g, "\\t") || "\u2205";
}

// fetch() with the server's API key (api_key=): asked for once, on the first 401, and kept for this tab
// (sessionStorage); asked again only if the server refuses it.
async function api(path, options = {}) {
  for (;;) {
    const key = sessionStorage.getItem("mini-gpt-api-key");
    const headers = { ...(options.headers || {}), ...(key ? { Authorization: `Bearer ${key}` } : {}) };
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    const entered = window.prompt(key ? "The server refused that API key. API key:" : "This server needs its API key:");
    if (!entered || !entered.trim()) return response;
    sessionStorage.setItem("mini-gpt-api-key", entered.trim());
  }
}

async function loadInfo() {
  const response = await api("/api/info");
  const info = await response.json();
  if (!response.ok) { $("model-info").textContent = `error: ${info.error.message}`; return; }
  state.info = info;
  $("model-info").textContent =
    `${info.model}: ${info.n_layer} layers x ${info.n_head} heads, n_embd ${info.n_embd}, ` +
    `block ${info.block_size}, ${info.tokenizer} (${info.vocab_size} tokens)`;
  $("max_tokens").max = info.max_tokens;
  const layer = $("att-layer");
  for (let l = 0; l < info.n_layer; l++) layer.add(new Option(`${l}`, `${l}`));
  const head = $("att-head");
  head.add(new Option("all heads", "all"));
  for (let h = 0; h < info.n_head; h++) head.add(new Option(`${h}`, `${h}`));
}

function numberOrNull(id, offValue) {
  const v = $(id).value.trim();
  if (v === "") return null;
  const n = Number(v);
  return n === offValue ? null : n;
}

// A group of token ids shown as one span (a UTF-8 character split over BPE tokens stays whole).
function addSpan(group, text, generated) {
  const span = document.createElement("span");
  span.className = generated ? "tok gen" : "tok prompt";
  span.textContent = text;
  const first = state.ids.length;
  for (const token of group) {
    state.ids.push(token.id);
    state.tokens.push(token);
  }
  span.dataset.first = first;
  span.dataset.last = state.ids.length - 1;
  if (generated) {
    const p = group[group.length - 1].prob;
    span.dataset.prob = p;
    span.style.background = probColor(p);
  }
  state.spans.push(span);
  $("output").appendChild(span);
}

function showTooltip(span, event) {
  const tip = $("tooltip");
  const first = Number(span.dataset.first), last = Number(span.dataset.last);
  let html = "";
  for (let i = first; i <= last; i++) {
    const t = state.tokens[i];
    html += `<div>token ${i} <b>${escapeHtml(visible(t.text))}</b>` +
      (t.prob != null ? ` p=${t.prob.toFixed(3)}` : " (prompt)") + "</div>";
    if (t.top && t.top.length) {
      html += "<table class='alternatives'>";
      for (const alt of t.top) {
        const chosen = alt.text === t.text ? " class='chosen'" : "";
        html += `<tr${chosen}><td>${escapeHtml(visible(alt.text))}</td><td>${alt.prob.toFixed(3)}</td></tr>`;
      }
      html += "</table>";
    }
  }
  tip.innerHTML = html;
  tip.hidden = false;
  moveTooltip(event);
}

function moveTooltip(event) {
  const tip = $("tooltip");
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 14}px`;
}

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function resetOutput() {
  state.ids = []; state.spans = []; state.tokens = []; state.selected = null; state.attention = null;
  $("output").textContent = "";
  $("attention").hidden = true;
  $("lens").hidden = true;
}

async function generate() {
  resetOutput();
  const body = {
    prompt: $("prompt").value,
    max_tokens: Number($("max_tokens").value),
    temperature: Number($("temperature").value),
    top_k: numberOrNull("top_k", 0),
    top_p: numberOrNull("top_p", 1),
    seed: numberOrNull("seed", NaN),
  };
  const controller = new AbortController();
  state.controller = controller;
  $("generate").disabled = true; $("stop").disabled = false;
  $("output").dataset.state = "streaming";
  $("status").textContent = "generating…";
  let count = 0, pending = [];
  const t0 = performance.now();
  try {
    const response = await api("/api/generate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) {
      const err = await response.json();
      throw new Error(err.error ? err.error.message : response.statusText);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        const ev = JSON.parse(line.slice(6));
        if (ev.type === "prompt") {
          for (const g of ev.groups) addSpan(g.ids.map((id, k) => ({ id, text: g.texts[k], prob: null, top: [] })), g.text, false);
        } else if (ev.type === "token") {
          if (ev.id >= 0) { pending.push({ id: ev.id, text: ev.text, prob: ev.prob, top: ev.top }); count++; }
          if (ev.piece) {
            if (pending.length) addSpan(pending, ev.piece, true);
            else $("output").appendChild(document.createTextNode(ev.piece));
            pending = [];
          }
        } else if (ev.type === "error") {
          throw new Error(ev.message);
        } else if (ev.type === "done") {
          const s = (performance.now() - t0) / 1000;
          $("status").textContent = `${count} tokens in ${s.toFixed(2)} s (${ev.finish_reason})`;
        }
      }
    }
    $("output").dataset.state = "done";
  } catch (err) {
    if (err.name === "AbortError") {
      $("status").textContent = `stopped after ${count} tokens`;
      $("output").dataset.state = "stopped";
    } else {
      $("status").textContent = `error: ${err.message}`;
      $("output").dataset.state = "error";
    }
  } finally {
    $("generate").disabled = false; $("stop").disabled = true;
    state.controller = null;
  }
}

async function showAttention(span) {
  const position = Number(span.dataset.last);
  for (const s of state.spans) s.classList.remove("selected");
  span.classList.add("selected");
  state.selected = span;
  const response = await api("/api/attention", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ids: state.ids.slice(0, position + 1), position }),
  });
  const data = await response.json();
  if (!response.ok) { $("status").textContent = `error: ${data.error.message}`; return; }
  state.attention = data;
  $("att-token").textContent = visible(state.tokens[position].text);
  $("att-pos").textContent = position;
  $("attention").hidden = false;
  drawAttention();
}

function drawAttention() {
  const data = state.attention;
  if (!data) return;
  const layer = Number($("att-layer").value || 0);
  const headChoice = $("att-head").value || "all";
  const heads = headChoice === "all" ? data.weights[layer].map((_, h) => h) : [Number(headChoice)];
  const weightsOf = (h) => data.weights[layer][h];
  const grid = $("att-grid");
  grid.textContent = "";
  for (const h of heads) {
    const panel = document.createElement("div");
    panel.className = heads.length === 1 ? "head-panel single" : "head-panel";
    panel.dataset.head = h;
    const title = document.createElement("div");
    title.className = "title";
    const w = weightsOf(h);
    const top = w.indexOf(Math.max(...w));
    title.textContent = `layer ${layer} head ${h}: most on ${visible(state.tokens[data.start + top].text)} (${w[top].toFixed(2)})`;
    const strip = document.createElement("div");
    strip.className = "strip";
    w.forEach((wj, j) => {
      const cell = document.createElement("span");
      cell.textContent = state.tokens[data.start + j].text.replace(/\n/g, "\u21b5");
      cell.title = `${visible(state.tokens[data.start + j].text)}: ${wj.toFixed(3)}`;
      cell.style.background = attentionColor(wj);
      if (wj > 0.45) cell.style.color = "#fff";
      strip.appendChild(cell);
    });
    panel.append(title, strip);
    grid.appendChild(panel);
  }
}

// The logit lens at `position`: the server reads the block_size tokens ending there (as for the attention
// view) and the token after it, when there is one, as the actual next token.
async function showLens(position) {
  const response = await api("/api/lens", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ids: state.ids.slice(0, position + 2), position, top_k: 5 }),
  });
  const data = await response.json();
  if (!response.ok) { $("status").textContent = `error: ${data.error.message}`; return; }
  const at = data.positions[0];
  $("lens-token").textContent = visible(at.text);
  $("lens-pos").textContent = position;
  $("lens-next").textContent = at.next ? visible(at.next.text) : "none yet";
  const table = $("lens-table");
  table.textContent = "";
  const head = table.insertRow();
  const k = at.layers[0].top.length;
  for (const label of ["depth", ...Array.from({ length: k }, (_, i) => `top ${i + 1}`), "p(next)"]) {
    const th = document.createElement("th");
    th.textContent = label;
    head.appendChild(th);
  }
  at.layers.forEach((layer, d) => {
    const row = table.insertRow();
    row.className = d === at.layers.length - 1 ? "depth final" : "depth";
    const th = document.createElement("th");
    th.textContent = d === at.layers.length - 1 ? `${data.depths[d]} (output)` : data.depths[d];
    row.appendChild(th);
    for (const t of layer.top) {
      const cell = row.insertCell();
      cell.textContent = `${visible(t.text)} ${t.prob.toFixed(3)}`;
      cell.title = `${data.depths[d]}: ${visible(t.text)} ${t.prob.toFixed(5)}`;
      cell.style.background = attentionColor(t.prob);
      if (t.prob > 0.45) cell.style.color = "#fff";
      if (at.next && t.id === at.next.id) cell.classList.add("next");
    }
    const next = row.insertCell();
    next.className = "next-prob";
    next.textContent = layer.next_prob == null ? "" : layer.next_prob.toFixed(3);
  });
  $("lens").hidden = false;
}

const ROLES = { previous_token: "previous-token", induction: "induction", duplicate_token: "duplicate-token" };

// The head-role heatmaps (layer x head): computed by the server once for the loaded model.
async function showHeads() {
  const box = $("heads");
  if (!box.hidden) { box.hidden = true; return; }
  box.hidden = false;
  box.scrollIntoView({ behavior: "smooth" });
  if (state.heads) return;
  $("heads-maps").textContent = "computing…";
  const response = await api("/api/heads");
  const data = await response.json();
  if (!response.ok) { $("heads-maps").textContent = `error: ${data.error.message}`; return; }
  state.heads = data;
  $("heads-on").textContent = `(${data.sequences} sequences of ${data.half} random tokens, each twice.)`;
  const maps = $("heads-maps");
  maps.textContent = "";
  for (const [role, label] of Object.entries(ROLES)) {
    const scores = data.roles[role];
    const map = document.createElement("div");
    map.className = "heatmap";
    map.dataset.role = role;
    let best = [0, 0];
    scores.forEach((row, l) => row.forEach((v, h) => { if (v > scores[best[0]][best[1]]) best = [l, h]; }));
    const title = document.createElement("div");
    title.className = "title";
    title.textContent = `${label}: highest layer ${best[0]} head ${best[1]} (${scores[best[0]][best[1]].toFixed(2)})`;
    const table = document.createElement("table");
    const head = table.insertRow();
    head.appendChild(document.createElement("th"));
    scores[0].forEach((_, h) => {
      const th = document.createElement("th");
      th.textContent = `head ${h}`;
      head.appendChild(th);
    });
    scores.forEach((row, l) => {
      const tr = table.insertRow();
      const th = document.createElement("th");
      th.textContent = `layer ${l}`;
      tr.appendChild(th);
      row.forEach((v, h) => {
        const cell = tr.insertCell();
        cell.className = "score";
        cell.textContent = v.toFixed(2);
        cell.title = `layer ${l} head ${h}: ${label} ${v.toFixed(3)}`;
        cell.style.background = attentionColor(v);
        if (v > 0.45) cell.style.color = "#fff";
      });
    });
    map.append(title, table);
    maps.appendChild(map);
  }
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate();
});
$("output").addEventListener("mouseover", (e) => {
  const span = e.target.closest(".tok");
  if (span) showTooltip(span, e);
});
$("output").addEventListener("mousemove", (e) => { if (!$("tooltip").hidden) moveTooltip(e); });
$("output").addEventListener("mouseout", (e) => {
  if (e.target.closest(".tok")) $("tooltip").hidden = true;
});
$("output").addEventListener("click", (e) => {
  const span = e.target.closest(".tok");
  if (span) { showLens(Number(span.dataset.last)); showAttention(span); }
});
$("heads-open").addEventListener("click", showHeads);
$("att-layer").addEventListener("change", drawAttention);
$("att-head").addEventListener("change", drawAttention);
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") { $("attention").hidden = true; $("lens").hidden = true; state.attention = null; }
});
loadInfo();
