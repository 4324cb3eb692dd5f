// Strata's page: a chat playground over /v1/chat/completions (streamed) and a live view of
// the engine over /v1/strata/events. Plain JavaScript, no dependencies, no build step.
"use strict";

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- chat playground

const chat = { history: [], abort: null, model: null };

// "a, b\, c\n" -> ["a", "b, c\n"]: commas separate stop strings, backslash escapes.
function parseStops(text) {
  const out = [];
  let cur = "";
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "\\" && i + 1 < text.length) {
      const n = text[++i];
      cur += n === "n" ? "\n" : n === "t" ? "\t" : n;
    } else if (c === ",") {
      out.push(cur.trim());
      cur = "";
    } else {
      cur += c;
    }
  }
  out.push(cur.trim());
  return out.filter((s) => s.length > 0);
}

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.dataset.role = role;
  el.textContent = text;
  $("messages").appendChild(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function showError(message) {
  const el = $("error");
  el.textContent = message;
  el.hidden = !message;
}

function numberField(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.history);
  const body = {
    model: chat.model || "default",
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  for (const k of ["temperature", "top_p", "max_tokens"]) {
    const v = numberField(k);
    if (v !== undefined) body[k] = v;
  }
  const stop = parseStops($("stop").value);
  if (stop.length) body.stop = stop;
  if ($("ignore_eos").checked) body.ignore_eos = true;
  return body;
}

// The message of an error body in OpenAI's shape, or the raw text.
function errorMessage(status, text) {
  try {
    const v = JSON.parse(text);
    if (v && v.error && v.error.message) return `${status}: ${v.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${status}: ${text || "request failed"}`;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("halt").disabled = !busy;
}

async function send(text) {
  showError("");
  chat.history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  out.classList.add("streaming");
  const started = performance.now();
  let first = null;
  let last = null;
  let usage = null;
  let finish = null;
  let reply = "";
  chat.abort = new AbortController();
  setBusy(true);
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(requestBody()),
      signal: chat.abort.signal,
    });
    if (!resp.ok) {
      throw new Error(errorMessage(resp.status, await resp.text()));
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "the server failed the request");
          if (chunk.usage) usage = chunk.usage;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            const now = performance.now();
            if (first === null) first = now;
            last = now;
            reply += piece;
            out.textContent = reply;
            out.scrollIntoView({ block: "end" });
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
    } else {
      showError(e.message);
    }
  } finally {
    out.classList.remove("streaming");
    setBusy(false);
    chat.abort = null;
  }
  if (reply) {
    chat.history.push({ role: "assistant", content: reply });
  } else {
    out.remove();
    if (finish !== "stopped" && !$("error").hidden) chat.history.pop();
  }
  $("stats").textContent = statsLine(usage, started, first, last, finish);
}

function statsLine(usage, started, first, last, finish) {
  const parts = [];
  if (usage) parts.push(`prompt ${usage.prompt_tokens} tok`, `reply ${usage.completion_tokens} tok`);
  if (first !== null) {
    parts.push(`first token ${Math.round(first - started)} ms`);
    const n = usage ? usage.completion_tokens : 0;
    if (n > 1 && last > first) parts.push(`${((n - 1) / ((last - first) / 1000)).toFixed(1)} tok/s`);
  }
  if (finish) parts.push(`finish: ${finish}`);
  return parts.join(" · ");
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.abort) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("halt").addEventListener("click", () => chat.abort && chat.abort.abort());
$("clear").addEventListener("click", () => {
  if (chat.abort) chat.abort.abort();
  chat.history = [];
  $("messages").replaceChildren();
  $("stats").textContent = "";
  showError("");
});

// ---------------------------------------------------------------- live view

const live = { layout: null, history: [], frame: null, hybrid: [], source: null, timer: null };

function setConn(state, text) {
  const el = $("conn");
  el.dataset.state = state;
  el.textContent = text;
}

function connect() {
  clearTimeout(live.timer);
  if (live.source) live.source.close();
  const es = new EventSource("/v1/strata/events");
  live.source = es;
  es.addEventListener("hello", (e) => {
    const hello = JSON.parse(e.data);
    live.layout = hello;
    live.history = hello.history;
    live.hybrid = [];
    chat.model = hello.model;
    $("model").textContent = hello.model;
    $("heat-note").textContent =
      `share of the tokens of the last ${hello.heat_seconds} s that each expert took, ` +
      `${hello.layers.length} MoE layers × ${hello.experts} experts, top ${hello.top_k}`;
    setConn("live", "live");
    drawThroughput();
  });
  es.addEventListener("tick", (e) => onFrame(JSON.parse(e.data)));
  es.onerror = () => {
    setConn("reconnecting", "reconnecting…");
    // The browser retries by itself unless the answer was not an event stream.
    if (es.readyState === EventSource.CLOSED) live.timer = setTimeout(connect, 1000);
  };
}

function onFrame(f) {
  live.frame = f;
  live.history.push(f.sample);
  const horizon = f.sample.t - 5 * 60 * 1000;
  while (live.history.length && live.history[0].t < horizon) live.history.shift();
  $("gen-tps").textContent = f.sample.gen_tps.toFixed(1);
  $("prompt-tps").textContent = f.sample.prompt_tps.toFixed(0);
  $("queued").textContent = f.sample.queued;
  $("active").textContent = f.sample.active;
  $("requests").textContent = f.requests;
  $("errors").textContent = f.errors;
  drawThroughput();
  drawHeat(f);
  showHybrid(f);
}

// A canvas sized to its box in device pixels.
function fit(canvas, cssHeight) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 640;
  canvas.style.height = `${cssHeight}px`;
  if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(cssHeight * ratio)) {
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(cssHeight * ratio);
  }
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, w, cssHeight);
  return { g, w, h: cssHeight };
}

function drawThroughput() {
  const { g, w, h } = fit($("throughput"), 130);
  const pts = live.history;
  const now = pts.length ? pts[pts.length - 1].t : Date.now();
  const x = (t) => w - ((now - t) / (5 * 60 * 1000)) * (w - 40) - 4;
  const maxTps = Math.max(1, ...pts.map((p) => p.gen_tps));
  const maxQ = Math.max(1, ...pts.map((p) => p.queued + p.active));
  g.fillStyle = "#e39b2d55";
  for (const p of pts) {
    const bh = ((p.queued + p.active) / maxQ) * (h - 20);
    g.fillRect(x(p.t) - 1, h - 4 - bh, 2, bh);
  }
  g.strokeStyle = "#2d6cdf";
  g.lineWidth = 1.5;
  g.beginPath();
  pts.forEach((p, i) => {
    const y = h - 4 - (p.gen_tps / maxTps) * (h - 20);
    if (i === 0) g.moveTo(x(p.t), y);
    else g.lineTo(x(p.t), y);
  });
  g.stroke();
  g.fillStyle = "#6b7480";
  g.font = "11px system-ui";
  g.fillText(`${maxTps.toFixed(0)} tok/s`, 4, 12);
  g.fillText(`${maxQ} seqs`, 4, 26);
}

// White through yellow and orange to dark red (ColorBrewer's YlOrRd): share 0 .. 1.
const RAMP = [[255, 255, 255], [254, 217, 118], [253, 141, 60], [227, 26, 28], [128, 0, 38]];
function heatColor(v) {
  const s = Math.min(1, Math.max(0, v)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(s));
  const t = s - i;
  const c = RAMP[i].map((a, k) => Math.round(a + (RAMP[i + 1][k] - a) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function drawHeat(f) {
  const canvas = $("heat");
  const L = live.layout ? live.layout.layers.length : f.heat.length;
  const E = live.layout ? live.layout.experts : (f.heat[0] || []).length;
  const rowH = Math.max(6, Math.min(18, Math.floor(360 / Math.max(1, L))));
  const { g, w } = fit(canvas, 24 + L * rowH);
  const left = 36;
  const cw = (w - left - 4) / Math.max(1, E);
  g.font = "10px system-ui";
  g.fillStyle = "#6b7480";
  for (let l = 0; l < L; l++) {
    const tokens = f.heat_tokens[l] || 0;
    g.fillStyle = "#6b7480";
    g.fillText(`L${live.layout ? live.layout.layers[l] : l}`, 2, 20 + l * rowH + rowH * 0.75);
    for (let e = 0; e < E; e++) {
      const share = tokens ? (f.heat[l][e] || 0) / tokens : 0;
      g.fillStyle = heatColor(share);
      g.fillRect(left + e * cw, 20 + l * rowH, Math.max(1, cw - 0.5), rowH - 1);
    }
  }
  // Experts the accelerator holds (--device hybrid): outlined.
  let resident = 0;
  g.strokeStyle = "#1b3a8c";
  g.lineWidth = 1.5;
  (f.resident || []).forEach((experts, l) => {
    if (l >= L) return;
    for (const e of experts) {
      if (e >= E) continue;
      g.strokeRect(left + e * cw + 0.75, 20 + l * rowH + 0.75, Math.max(1, cw - 2), rowH - 2.5);
      resident++;
    }
  });
  g.fillStyle = "#6b7480";
  for (let e = 0; e < E; e += Math.max(1, Math.ceil(E / 16))) g.fillText(`${e}`, left + e * cw, 12);
  canvas.dataset.resident = String(resident);
  canvas.dataset.updates = String(Number(canvas.dataset.updates) + 1);
  canvas.dataset.tokens = String(f.heat_tokens.reduce((a, b) => a + b, 0));
}

$("heat").addEventListener("mousemove", (e) => {
  const f = live.frame;
  if (!f || !live.layout) return;
  const r = e.target.getBoundingClientRect();
  const L = live.layout.layers.length;
  const E = live.layout.experts;
  const rowH = Math.max(6, Math.min(18, Math.floor(360 / Math.max(1, L))));
  const l = Math.floor((e.clientY - r.top - 20) / rowH);
  const ex = Math.floor((e.clientX - r.left - 36) / ((r.width - 40) / E));
  if (l < 0 || l >= L || ex < 0 || ex >= E) return;
  const tokens = f.heat_tokens[l] || 0;
  const n = f.heat[l][ex] || 0;
  const share = tokens ? ((100 * n) / tokens).toFixed(1) : "0";
  const held = f.resident && (f.resident[l] || []).includes(ex) ? ", resident on the accelerator" : "";
  $("heat-tip").textContent =
    `layer ${live.layout.layers[l]}, expert ${ex}: ${n} of ${tokens} recent tokens (${share}%)${held}`;
});

// The executor's counters (the hybrid executor's, or the SSD tier's), as rates over the
// last few seconds.
function showHybrid(f) {
  const now = new Map(f.hybrid || []);
  const keys = [...now.keys()];
  const hybrid = keys.some((k) => k.startsWith("strata_hybrid_"));
  const ssd = keys.some((k) => k.startsWith("strata_expert_cache_"));
  $("hybrid-none").hidden = hybrid;
  $("hybrid-live").hidden = !hybrid;
  $("ssd").hidden = !ssd;
  if (!f.hybrid) return;
  live.hybrid.push({ t: f.sample.t, m: now });
  while (live.hybrid.length > 11) live.hybrid.shift();
  const old = live.hybrid[0];
  const dt = Math.max(0.001, (f.sample.t - old.t) / 1000);
  const get = (m, k) => m.get(k) || 0;
  const rate = (k) => (get(now, k) - get(old.m, k)) / dt;
  if (ssd) showSsd(now, get, rate);
  if (!hybrid) return;
  const busy = ["gpu", "cpu"].map((d) => [d, rate(`strata_hybrid_busy_seconds_total{device="${d}"}`)]);
  $("busy").replaceChildren(...busy.map(([d, share]) => {
    const row = document.createElement("div");
    row.className = "bar";
    const pct = Math.min(100, 100 * share);
    row.innerHTML = `<span>${d} busy</span><div class="track"><div class="fill"></div></div><span>${pct.toFixed(0)}%</span>`;
    row.querySelector(".fill").style.width = `${pct}%`;
    return row;
  }));
  const hits = get(now, 'strata_hybrid_cache_lookups_total{result="hit"}');
  const misses = get(now, 'strata_hybrid_cache_lookups_total{result="miss"}');
  const rows = [
    ["cache hits / misses", `${hits} / ${misses} (${((100 * hits) / Math.max(1, hits + misses)).toFixed(1)}%)`],
    ["uploaded", `${(get(now, "strata_hybrid_upload_bytes_total") / 2 ** 20).toFixed(1)} MiB (${(rate("strata_hybrid_upload_bytes_total") / 2 ** 20).toFixed(2)} MiB/s)`],
    ["expert tasks gpu / cpu", `${get(now, 'strata_hybrid_experts_total{device="gpu"}')} / ${get(now, 'strata_hybrid_experts_total{device="cpu"}')}`],
    ["evictions", `${get(now, "strata_hybrid_evictions_total")}`],
    ["fallbacks to the cpu", `${get(now, "strata_hybrid_fallbacks_total")}`],
    ["deferred expert tasks", `${get(now, "strata_hybrid_deferred_experts_total")} (${rate("strata_hybrid_deferred_experts_total").toFixed(1)}/s)`],
    ["resident experts", `${get(now, "strata_hybrid_resident_experts")} (outlined in the heat map)`],
  ];
  // Counters this page does not know yet, as /metrics names them.
  const shown = /^strata_hybrid_((busy_seconds|cache_lookups|upload_bytes|experts|evictions|fallbacks|deferred_experts)_total|resident_experts)/;
  for (const [k, v] of now) {
    if (k.startsWith("strata_hybrid_") && !shown.test(k)) rows.push([k.replace(/^strata_hybrid_/, ""), `${v}`]);
  }
  fillTable("hybrid-table", rows);
}

// Rows of [name, value] into the table `id`.
function fillTable(id, rows) {
  $(id).tBodies[0].replaceChildren(...rows.map(([k, v]) => {
    const tr = document.createElement("tr");
    tr.innerHTML = "<td></td><td></td>";
    tr.cells[0].textContent = k;
    tr.cells[1].textContent = v;
    return tr;
  }));
}

// The SSD tier's cache: hits, reads, the guesses that read ahead, its pinned experts and,
// under three tiers, what the accelerator took from it.
function showSsd(now, get, rate) {
  const c = (r) => get(now, `strata_expert_cache_lookups_total{result="${r}"}`);
  const [hits, inFlight, misses] = [c("hit"), c("in_flight"), c("miss")];
  const lookups = Math.max(1, hits + inFlight + misses);
  const mib = (b) => (b / 2 ** 20).toFixed(1);
  const guessed = get(now, "strata_expert_cache_guessed_total");
  const guessable = Math.max(1, get(now, "strata_expert_cache_guess_lookups_total"));
  const rows = [
    ["hits / in flight / misses", `${hits} / ${inFlight} / ${misses} (${((100 * hits) / lookups).toFixed(1)}% hits)`],
    ["read from the file", `${mib(get(now, "strata_expert_cache_read_bytes_total"))} MiB (${mib(rate("strata_expert_cache_read_bytes_total"))} MiB/s)`],
    ["fetched ahead", `${get(now, "strata_expert_cache_prefetched_total")} (${((100 * guessed) / guessable).toFixed(1)}% of the experts used were guessed)`],
    ["waited for reads", `${get(now, "strata_expert_cache_wait_seconds_total").toFixed(2)} s`],
    ["cache", `${mib(get(now, "strata_expert_cache_bytes"))} MiB`],
  ];
  const pinned = get(now, "strata_expert_cache_pinned_experts");
  if (pinned > 0) rows.push(["pinned (read at start)", `${pinned} experts`]);
  // Three tiers: the accelerator's uploads read through this cache.
  const d = (s) => get(now, `strata_expert_cache_device_reads_total{source="${s}"}`);
  const toDevice = d("cache") + d("file");
  if (toDevice > 0) {
    rows.splice(3, 0, ["copied to the accelerator", `${toDevice} (${((100 * d("cache")) / toDevice).toFixed(1)}% from the cache, ${mib(get(now, "strata_expert_cache_device_read_bytes_total"))} MiB read for it)`]);
  }
  fillTable("ssd-table", rows);
}

window.addEventListener("resize", () => { drawThroughput(); if (live.frame) drawHeat(live.frame); });
// The model id for requests, in case the live view is slow to say it.
fetch("/v1/models")
  .then((r) => r.json())
  .then((v) => { if (!chat.model && v.data && v.data[0]) chat.model = v.data[0].id; })
  .catch(() => {});
connect();
