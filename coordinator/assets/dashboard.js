// charm dashboard: draws /api/state once, then follows /api/events (SSE,
// read with fetch so the API key can travel in a header). Plain JS, no build.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "charm-api-key";

// Colours of where experts live; brightness shows routing heat.
const PLACES = {
  ram: { rgb: [79, 195, 161], label: "in-process worker · RAM (memory-mapped)" },
  disk: { rgb: [224, 160, 64], label: "in-process worker · disk store (RAM cache in front)" },
  remote: { rgb: [91, 141, 239], label: "cluster workers (not placed yet)" },
  dense: { rgb: [60, 66, 76], label: "dense layer (no routed experts)" },
};
// Profile phases: [key, label, colour].
const PHASES = [
  ["queue", "queue", "#5b6573"],
  ["attention", "attention", "#5b8def"],
  ["routing", "routing", "#a77bea"],
  ["expert", "expert compute", "#4fc3a1"],
  ["disk", "disk wait", "#e0a040"],
  ["network", "network", "#e06060"],
  ["combine", "combine", "#7cc7e8"],
  ["head", "head", "#d98ac9"],
  ["sample", "sample", "#c9c96b"],
  ["other", "other", "#3a4350"],
];

// One colour per cluster worker (the grid shows which worker owns each expert).
const WORKER_RGB = [
  [91, 141, 239],
  [224, 160, 64],
  [79, 195, 161],
  [217, 138, 201],
  [201, 201, 107],
  [224, 96, 96],
  [124, 199, 232],
  [167, 123, 234],
];
const UNPLACED_RGB = [110, 116, 126];

const state = {
  model: null,
  heat: [],
  owners: null, // cluster mode: each cell's owner, an index into workers (-1: none)
  workers: [],
  flash: new Map(), // cell index -> time it was routed
  recent: [],
  lastDisk: new Map(), // worker address -> [bytes, time] for disk read/s
  routedTotal: 0,
  history: [], // chat messages
};

function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const k = apiKey();
  if (k) {
    h["Authorization"] = "Bearer " + k;
  }
  return h;
}

function needKey() {
  $("keybar").hidden = false;
  setConn("needs API key", "down");
}

function setConn(text, cls) {
  const c = $("conn");
  c.textContent = text;
  c.className = "pill " + (cls || "");
}

function bytes(n) {
  if (n == null) return "n/a";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  while (n >= 1024 && u < units.length - 1) {
    n /= 1024;
    u++;
  }
  return (u ? n.toFixed(1) : n) + " " + units[u];
}

function ms(x) {
  return x == null ? "n/a" : x < 10 ? x.toFixed(1) + " ms" : Math.round(x) + " ms";
}

// ---- server-sent events over fetch -------------------------------------

async function readSse(resp, onEvent) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of frame.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

// ---- cluster -------------------------------------------------------------

// One row per worker: the in-process one of --local, or each cluster worker
// (lost ones stay, "down"). Rows are keyed by address and kept in order.
function drawWorkers(workers, queue, prefix) {
  const now = performance.now();
  const remote = state.model && state.model.placement === "remote";
  const tbody = $("workers").querySelector("tbody");
  const seen = new Set();
  workers.forEach((w, n) => {
    seen.add(w.address);
    let rate = "n/a";
    const last = state.lastDisk.get(w.address);
    if (last) {
      const [b0, t0] = last;
      const dt = (now - t0) / 1000;
      if (dt > 0) rate = bytes(Math.max(0, w.disk_bytes_read - b0) / dt) + "/s";
    }
    state.lastDisk.set(w.address, [w.disk_bytes_read, now]);
    const cache = remote
      ? w.cache_bytes == null ? "n/a" : bytes(w.cache_bytes)
      : w.cache_budget_bytes == null
        ? "all experts mapped"
        : bytes(w.cache_bytes) + " / " + bytes(w.cache_budget_bytes);
    const hit = w.hit_rate == null ? "n/a" : (100 * w.hit_rate).toFixed(1) + " %";
    const count = (x) => (x == null ? "n/a" : String(x));
    const net = (x) => (x == null ? "n/a" : bytes(x));
    const cells = [
      w.address,
      w.status,
      String(w.experts_owned),
      cache,
      hit,
      w.rtt_ms == null ? "n/a" : ms(w.rtt_ms),
      rate,
      count(w.experts_served),
      count(w.round_trips),
      net(w.network_bytes_sent) + " / " + net(w.network_bytes_received),
      count(w.failures),
      count(w.failovers) + " / " + count(w.hedges),
    ];
    let row = Array.from(tbody.children).find((r) => r.dataset.address === w.address);
    if (!row) {
      row = document.createElement("tr");
      row.className = "worker";
      row.dataset.address = w.address;
      for (let i = 0; i < cells.length; i++) row.appendChild(document.createElement("td"));
    }
    if (tbody.children[n] !== row) tbody.insertBefore(row, tbody.children[n] || null);
    cells.forEach((c, i) => (row.children[i].textContent = c));
    // In cluster mode the address wears the worker's grid colour.
    row.children[0].style.borderLeft = state.owners
      ? `6px solid rgb(${WORKER_RGB[n % WORKER_RGB.length].join(",")})`
      : "";
    row.children[1].className = w.status === "up" ? "up" : "down";
  });
  for (const r of Array.from(tbody.children)) {
    if (!seen.has(r.dataset.address)) r.remove();
  }
  const reuse =
    prefix && prefix.budget_bytes
      ? ` · prefix cache ${prefix.entries} entries, ${bytes(prefix.bytes)}, ${prefix.hits}/${prefix.lookups} hits, ${prefix.reused_tokens} tokens reused`
      : "";
  $("queue").textContent = `queue ${queue.queued}/${queue.capacity} · running ${queue.running}/${queue.max_batch}${reuse}`;
}

function drawActive(running) {
  const line = (a) =>
    `${a.id} (${a.api}): ${a.prompt_tokens} prompt tokens` +
    (a.cached_tokens ? ` (${a.cached_tokens} cached)` : "") +
    `, ${a.tokens} generated, ${ms(a.elapsed_ms)}`;
  $("active").textContent =
    running && running.length ? `generating ${running.length}: ` + running.map(line).join(" · ") : "idle";
}

// ---- expert grid -----------------------------------------------------------

// The grid fits its panel: the longer of layers and experts runs across
// (a 30 × 4 model is 4 rows of 30 layers, a 48 × 128 one 48 rows of 128
// experts), at most a third of the window high, cells square.
function gridGeometry() {
  const m = state.model;
  const canvas = $("grid");
  const width = (canvas.parentElement && canvas.parentElement.clientWidth) || 600;
  const height = Math.max(120, Math.floor(window.innerHeight / 3));
  const across = m.layers > m.experts; // layers as columns
  const cols = across ? m.layers : m.experts;
  const rows = across ? m.experts : m.layers;
  const cell = Math.max(1, Math.min(32, Math.floor(Math.min(width / cols, height / rows))));
  return { cell, across, cols, rows, w: cell * cols, h: cell * rows };
}

// The cell at (layer, expert) in the canvas.
function cellAt(g, l, e) {
  return g.across ? [l * g.cell, e * g.cell] : [e * g.cell, l * g.cell];
}

function cellColour(l, e) {
  const m = state.model;
  if (!m.moe_layers[l]) return PLACES.dense.rgb;
  if (state.owners) {
    const w = state.owners[l * m.experts + e];
    return w >= 0 ? WORKER_RGB[w % WORKER_RGB.length] : UNPLACED_RGB;
  }
  return (PLACES[m.placement] || PLACES.ram).rgb;
}

function drawGrid() {
  const m = state.model;
  if (!m) return;
  const canvas = $("grid");
  const g = gridGeometry();
  if (canvas.width !== g.w || canvas.height !== g.h) {
    canvas.width = g.w;
    canvas.height = g.h;
    canvas.style.height = g.h + "px";
    canvas.style.width = g.w + "px";
  }
  const ctx = canvas.getContext("2d");
  const max = Math.max(1, ...state.heat);
  const now = performance.now();
  const gap = g.cell > 4 ? 1 : 0;
  for (let l = 0; l < m.layers; l++) {
    for (let e = 0; e < m.experts; e++) {
      const i = l * m.experts + e;
      const heat = state.heat[i] || 0;
      // Brightness: log-scaled routing heat, with a floor so cold cells show their colour.
      const b = m.moe_layers[l] ? 0.18 + 0.82 * (Math.log1p(heat) / Math.log1p(max)) : 0.5;
      let [r, gr, bl] = cellColour(l, e).map((c) => Math.round(c * b));
      const t = state.flash.get(i);
      if (t !== undefined) {
        const f = Math.max(0, 1 - (now - t) / 700);
        if (f === 0) state.flash.delete(i);
        r = Math.round(r + (255 - r) * f);
        gr = Math.round(gr + (255 - gr) * f);
        bl = Math.round(bl + (255 - bl) * f);
      }
      ctx.fillStyle = `rgb(${r},${gr},${bl})`;
      const [x, y] = cellAt(g, l, e);
      ctx.fillRect(x, y, g.cell - gap, g.cell - gap);
    }
  }
  if (state.flash.size) requestAnimationFrame(drawGrid);
}

// Hovering a cell names it: layer, expert, rows routed, owner.
function gridHover(ev) {
  const m = state.model;
  if (!m) return;
  const g = gridGeometry();
  const rect = $("grid").getBoundingClientRect();
  const c = Math.floor((ev.clientX - rect.left) / g.cell);
  const r = Math.floor((ev.clientY - rect.top) / g.cell);
  const [l, e] = g.across ? [c, r] : [r, c];
  if (l < 0 || e < 0 || l >= m.layers || e >= m.experts) return;
  const i = l * m.experts + e;
  let who = "";
  if (state.owners) {
    const w = state.owners[i];
    who = w >= 0 && state.workers[w] ? ` · ${state.workers[w].address}` : " · not placed";
  }
  $("grid").title = m.moe_layers[l]
    ? `layer ${l}, expert ${e}: ${state.heat[i] || 0} rows routed${who}`
    : `layer ${l}: dense`;
}

function drawGridLegend() {
  const m = state.model;
  $("grid-legend").innerHTML = "";
  const swatch = (rgb, label) => {
    const span = document.createElement("span");
    const i = document.createElement("i");
    i.style.background = `rgb(${rgb.join(",")})`;
    span.appendChild(i);
    span.appendChild(document.createTextNode(label));
    $("grid-legend").appendChild(span);
  };
  if (state.owners) {
    state.workers.forEach((w, n) => swatch(WORKER_RGB[n % WORKER_RGB.length], w.address));
    if (state.owners.some((w) => w < 0)) swatch(UNPLACED_RGB, "not placed yet");
  } else {
    swatch(PLACES[m.placement].rgb, PLACES[m.placement].label);
  }
  if (!m.moe_layers.every(Boolean)) swatch(PLACES.dense.rgb, PLACES.dense.label);
  const g = gridGeometry();
  const note = document.createElement("span");
  note.textContent =
    (g.across ? "columns = layers, rows = experts" : "rows = layers, columns = experts") +
    " · brightness = rows routed · white flash = routed just now";
  $("grid-legend").appendChild(note);
  $("grid-dims").textContent = `${m.layers} layers × ${m.experts} experts, top-${m.top_k}`;
}

function applyHeat(delta) {
  const now = performance.now();
  for (const [i, d] of delta) {
    state.heat[i] = (state.heat[i] || 0) + d;
    state.routedTotal += d;
    state.flash.set(i, now);
  }
  showTotal();
  if (delta.length) requestAnimationFrame(drawGrid);
}

function showTotal() {
  const t = $("grid-total");
  t.dataset.routed = String(state.routedTotal);
  t.textContent = state.routedTotal ? `${state.routedTotal} expert rows routed since start` : "no routing yet";
}

// ---- profile ---------------------------------------------------------------

function phases(r) {
  const s = r.stats;
  const out = { queue: r.queue_ms };
  if (s) {
    const p = s.profile;
    const disk = Math.min(s.io_wait_ms || 0, p.experts_ms);
    Object.assign(out, {
      attention: p.attention_ms,
      routing: p.routing_ms,
      expert: p.experts_ms - disk,
      disk: disk,
      network: 0,
      combine: p.combine_ms,
      head: p.head_ms,
      sample: p.sample_ms,
    });
  }
  const known = Object.values(out).reduce((a, b) => a + b, 0);
  out.other = Math.max(0, r.total_ms - known);
  return out;
}

function drawProfile() {
  const list = state.recent.slice(-12).reverse();
  const box = $("profile");
  box.innerHTML = "";
  if (!list.length) {
    box.textContent = "no requests yet";
  }
  const longest = Math.max(1, ...list.map((r) => r.total_ms));
  for (const r of list) {
    const row = document.createElement("div");
    row.className = "req";
    row.title = r.id;
    const name = document.createElement("span");
    name.textContent = `${r.api} · ${r.finish}`;
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = Math.max(2, (100 * r.total_ms) / longest) + "%";
    const ph = phases(r);
    for (const [key, label, colour] of PHASES) {
      const v = ph[key] || 0;
      if (v <= 0) continue;
      const seg = document.createElement("span");
      seg.style.width = (100 * v) / r.total_ms + "%";
      seg.style.background = colour;
      seg.title = `${label}: ${ms(v)}`;
      bar.appendChild(seg);
    }
    const rate = r.stats && r.stats.decode_tok_s ? r.stats.decode_tok_s.toFixed(1) + " tok/s" : "";
    const info = document.createElement("span");
    info.textContent = `${ms(r.total_ms)} · ${r.completion_tokens} tok ${rate}`;
    row.append(name, bar, info);
    box.appendChild(row);
  }
  drawTrend();
}

function drawProfileLegend() {
  const box = $("profile-legend");
  for (const [, label, colour] of PHASES) {
    const span = document.createElement("span");
    const i = document.createElement("i");
    i.style.background = colour;
    span.append(i, document.createTextNode(label === "network" ? "network (0: in-process)" : label));
    box.appendChild(span);
  }
}

function drawTrend() {
  const canvas = $("trend");
  const ctx = canvas.getContext("2d");
  const w = (canvas.width = canvas.clientWidth || 600);
  const h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const ran = state.recent.filter((r) => r.stats);
  if (ran.length < 1) {
    $("trend-note").textContent = "";
    return;
  }
  const series = [
    [ran.map((r) => r.stats.decode_tok_s), "#4fc3a1", "decode tok/s"],
    [ran.map((r) => r.ttft_ms || 0), "#e0a040", "TTFT ms"],
  ];
  for (const [vals, colour] of series) {
    const max = Math.max(1e-9, ...vals);
    const pts = vals.map((v, i) => [
      vals.length === 1 ? w / 2 : (i * (w - 8)) / (vals.length - 1) + 4,
      h - 4 - (v / max) * (h - 8),
    ]);
    ctx.strokeStyle = ctx.fillStyle = colour;
    ctx.lineWidth = 2;
    ctx.beginPath();
    pts.forEach(([x, y], i) => (i === 0 ? ctx.moveTo(x, y) : ctx.lineTo(x, y)));
    ctx.stroke();
    for (const [x, y] of pts) {
      ctx.beginPath();
      ctx.arc(x, y, 3, 0, 2 * Math.PI);
      ctx.fill();
    }
  }
  const last = ran[ran.length - 1];
  $("trend-note").textContent =
    `green: decode tok/s (last ${last.stats.decode_tok_s.toFixed(1)}), ` +
    `amber: TTFT (last ${ms(last.ttft_ms)}), over the last ${ran.length} requests`;
}

// ---- state and live feed ---------------------------------------------------

function applyLive(f) {
  state.workers = f.workers || [f.worker];
  drawWorkers(state.workers, f.queue, f.prefix_cache);
  drawActive(f.active);
  if (f.owners !== undefined) {
    state.owners = f.owners;
    drawGridLegend();
    requestAnimationFrame(drawGrid);
  }
}

async function loadState() {
  const resp = await fetch("/api/state", { headers: headers() });
  if (resp.status === 401) {
    needKey();
    return false;
  }
  showState(await resp.json());
  return true;
}

// Draws a whole `/api/state` snapshot (the tests hand it synthetic ones).
function showState(s) {
  state.model = s.model;
  state.heat = s.heat;
  state.owners = s.owners || null;
  state.workers = s.workers || [s.worker];
  state.routedTotal = s.heat.reduce((a, b) => a + b, 0);
  state.recent = s.recent;
  $("model-name").textContent = `${s.model.id} · ${s.model.family} · context ${s.model.context}`;
  drawGridLegend();
  drawGrid();
  showTotal();
  drawProfile();
  applyLive(Object.assign({}, s, { owners: undefined }));
}
window.charmShow = showState;

async function follow() {
  for (;;) {
    try {
      if (!state.model && !(await loadState())) return;
      const resp = await fetch("/api/events", { headers: headers() });
      if (resp.status === 401) return needKey();
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      setConn("live", "up");
      await readSse(resp, (name, data) => {
        if (name !== "tick") return;
        const f = JSON.parse(data);
        applyLive(f);
        applyHeat(f.heat_delta);
        if (f.finished.length) {
          state.recent = state.recent.concat(f.finished).slice(-50);
          drawProfile();
        }
      });
    } catch (e) {
      console.warn("live feed:", e);
    }
    setConn("reconnecting", "down");
    await new Promise((r) => setTimeout(r, 1000));
    state.model = null;
  }
}

// ---- chat ------------------------------------------------------------------

function addMsg(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("chat-log").appendChild(div);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return div;
}

/// The tools typed into the chat's tools box (an empty box: none).
function chatTools() {
  const raw = $("chat-tools").value.trim();
  if (!raw) return null;
  const tools = JSON.parse(raw);
  if (!Array.isArray(tools)) throw new Error("tools must be a JSON list");
  return tools;
}

async function sendChat(ev) {
  ev.preventDefault();
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  state.history.push({ role: "user", content: text });
  addMsg("user", text);
  $("chat-send").disabled = true;
  const t0 = performance.now();
  let first = null;
  let usage = null;
  let reply = "";
  let thought = "";
  let out = null; // the answer's text element, made when text comes
  let thinking = null; // the reasoning element, made when reasoning comes
  const calls = []; // streamed tool calls by index: {id, name, arguments, el}
  try {
    const body = {
      model: state.model ? state.model.id : undefined,
      messages: state.history,
      max_tokens: Number($("chat-max").value) || 64,
      temperature: Number($("chat-temp").value) || 0,
      stream: true,
      stream_options: { include_usage: true },
    };
    const tools = chatTools();
    if (tools) {
      body.tools = tools;
      body.tool_choice = $("chat-tool-choice").value;
    }
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
    if (!resp.ok) {
      const err = await resp.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || "HTTP " + resp.status);
    }
    await readSse(resp, (_name, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices || []) {
        const d = c.delta || {};
        if (d.reasoning_content || d.content || d.tool_calls) {
          if (first === null) first = performance.now();
        }
        if (d.reasoning_content) {
          thought += d.reasoning_content;
          if (!thinking) thinking = addMsg("reasoning", "");
          thinking.textContent = thought;
        }
        if (d.content) {
          reply += d.content;
          if (!out) out = addMsg("assistant", "");
          out.textContent = reply;
        }
        for (const t of d.tool_calls || []) {
          let call = calls[t.index];
          if (!call) {
            call = calls[t.index] = { id: t.id, name: "", arguments: "", el: addMsg("call", "") };
          }
          if (t.function && t.function.name) call.name += t.function.name;
          if (t.function && t.function.arguments) call.arguments += t.function.arguments;
          call.el.textContent = `${call.name}(${call.arguments})`;
        }
      }
    });
    if (!out && !calls.length) out = addMsg("assistant", "");
    const turn = { role: "assistant", content: reply };
    if (thought) turn.reasoning_content = thought;
    if (calls.length) {
      turn.tool_calls = calls.map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.name, arguments: c.arguments },
      }));
    }
    state.history.push(turn);
    const end = performance.now();
    const n = usage ? usage.completion_tokens : 0;
    const rate = first !== null && n > 1 && end > first ? ((n - 1) * 1000) / (end - first) : null;
    $("chat-stats").textContent =
      `TTFT ${ms(first === null ? null : first - t0)} · ` +
      `${rate === null ? "n/a" : rate.toFixed(1)} tok/s · ${n} tokens`;
    $("chat-stats").dataset.done = "1";
  } catch (e) {
    addMsg("error", "error: " + e.message);
    state.history.pop();
  } finally {
    $("chat-send").disabled = false;
  }
}

function setup() {
  $("chat-form").addEventListener("submit", sendChat);
  $("chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("chat-reset").addEventListener("click", () => {
    state.history = [];
    $("chat-log").innerHTML = "";
    $("chat-stats").textContent = "";
  });
  $("key-save").addEventListener("click", () => {
    localStorage.setItem(KEY_STORE, $("key-input").value.trim());
    $("keybar").hidden = true;
    follow();
  });
  window.addEventListener("resize", () => drawGrid());
  $("grid").addEventListener("mousemove", gridHover);
  drawProfileLegend();
  follow();
}

setup();
