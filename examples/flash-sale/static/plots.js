// The operator's plots: every instance's last minutes, one sample a second
// (GET /api/stats/series), drawn by this script into the page's SVG elements, with no library.
// Each point is the five seconds before it: rates are averaged here, over the samples' counts,
// and the shop takes the lock wait percentiles over as long. The page keeps what it has and asks
// only for newer samples. A second without a sample is a gap in the line; an instance that
// stopped reporting is said to be unreachable, and a dashed mark shows where it went silent.
// Hovering a plot shows every instance's value at that second. Every value goes into the page
// as text or as an attribute, never as markup.
(() => {
  "use strict";
  const byId = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#1a73e8", "#e8710a", "#188038", "#a142f4", "#d01884", "#129eaf", "#9e6a03", "#5f6368"];
  // The time axis shows at least a minute, and at most the window the shop keeps.
  const MIN_SPAN = 60_000;
  // How far back each point's rate looks.
  const AVERAGE = 5_000;
  // Per second, at each sample: the count of `key` over the samples of the AVERAGE before it.
  const rate = (key) => (samples) => {
    const out = [];
    let [count, ms, first] = [0, 0, 0];
    for (const sample of samples) {
      count += sample[key];
      ms += sample.ms;
      while (samples[first].at_ms <= sample.at_ms - AVERAGE) {
        count -= samples[first][key];
        ms -= samples[first].ms;
        first += 1;
      }
      out.push(ms > 0 ? (count * 1000) / ms : null);
    }
    return out;
  };
  const each = (key) => (samples) => samples.map((s) => s[key]);
  const PANELS = [
    { id: "purchases", lines: [{ values: rate("purchases") }] },
    { id: "checkouts", lines: [{ values: rate("checkouts") }] },
    { id: "conflicts", lines: [{ values: rate("conflicts") }] },
    { id: "wait", log: true, lines: [{ values: each("wait_p99_ms"), cls: "p99", label: "p99" },
                                     { values: each("wait_p50_ms"), cls: "p50", label: "p50" }] },
    { id: "handovers", lines: [{ values: rate("handovers") }] },
    { id: "stale", lines: [{ values: rate("stale_refused") }] },
  ];
  const plots = { instances: new Map(), colours: new Map(), offset: 0, window: 300_000, step: 1000,
                  answeredBy: null, why: null, loaded: false, shown: null };
  // Per panel: what was drawn (for the hover readout), and where the pointer is.
  const drawn = new Map();
  const pointer = new Map();

  function svg(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const pad = (n) => String(n).padStart(2, "0");
  function clock(ms, seconds) {
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}${seconds ? `:${pad(d.getSeconds())}` : ""}`;
  }

  const perSecond = (v) => `${Number(v.toFixed(v < 10 ? 1 : 0)).toLocaleString()}/s`;
  const wait = (ms) => (ms >= 1000 ? `${Number((ms / 1000).toPrecision(3))} s` : `${Number(ms.toPrecision(3))} ms`);

  // A step of 1, 2, 2.5 or 5 times a power of ten, at least `raw`.
  function niceStep(raw) {
    const power = 10 ** Math.floor(Math.log10(raw));
    const f = raw / power;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * power;
  }

  function linearScale(values) {
    // Nothing but zeros still gets an axis from 0 to 1.
    const max = Math.max(0, ...values) || 1;
    const step = niceStep(max / 4);
    const top = Math.max(step, Math.ceil(max / step - 1e-9) * step);
    let digits = 0;
    while (digits < 4 && Math.abs(step * 10 ** digits - Math.round(step * 10 ** digits)) > 1e-9) digits += 1;
    const ticks = [];
    for (let i = 0; i * step <= top + step / 2; i++) ticks.push(i * step);
    return { ticks, at: (v) => v / top, label: (v) => `${Number(v.toFixed(digits)).toLocaleString()}/s` };
  }

  // Lock waits span a millisecond to seconds: decades, at least two of them.
  function logScale(values) {
    const positive = values.filter((v) => v > 0);
    let lo = positive.length ? Math.floor(Math.log10(Math.min(...positive))) : 0;
    let hi = positive.length ? Math.ceil(Math.log10(Math.max(...positive))) : 2;
    lo = Math.max(lo, -2);
    hi = Math.max(hi, lo + 2);
    const ticks = [];
    for (let e = lo; e <= hi; e++) ticks.push(10 ** e);
    return { ticks, at: (v) => (Math.log10(Math.max(v, 10 ** lo)) - lo) / (hi - lo), label: wait };
  }

  function timeTicks(left, right) {
    const span = right - left;
    const every = span <= 90_000 ? 15_000 : span <= 180_000 ? 30_000 : 60_000;
    const ticks = [];
    for (let t = Math.ceil(left / every) * every; t <= right; t += every) ticks.push(t);
    return { ticks, seconds: every < 60_000 };
  }

  function drawPanel(panel, left, right) {
    const node = byId(`plot-${panel.id}`);
    const box = node.getBoundingClientRect();
    const width = Math.max(200, Math.round(box.width));
    const height = Math.max(100, Math.round(box.height));
    const m = { l: 52, r: 10, t: 8, b: 20 };
    const w = width - m.l - m.r;
    const h = height - m.t - m.b;
    node.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const lines = [];
    for (const instance of plots.instances.values()) {
      for (const line of panel.lines) {
        const values = line.values(instance.samples);
        const points = instance.samples.map((s, i) => [s.at_ms, values[i]]).filter(([t]) => t >= left);
        lines.push({ instance, line, points });
      }
    }
    const values = lines.flatMap((l) => l.points.map((p) => p[1]).filter((v) => Number.isFinite(v)));
    const scale = panel.log ? logScale(values) : linearScale(values);
    const x = (t) => m.l + ((t - left) / (right - left)) * w;
    const y = (v) => m.t + h - scale.at(v) * h;
    const nodes = [];
    for (const tick of scale.ticks) {
      const at = y(tick).toFixed(1);
      nodes.push(svg("line", { class: "grid", x1: m.l, x2: m.l + w, y1: at, y2: at }));
      nodes.push(svg("text", { x: m.l - 6, y: at, "text-anchor": "end", "dominant-baseline": "middle" },
                     scale.label(tick)));
    }
    const time = timeTicks(left, right);
    // A label is left out where it would not fit inside the plot's width.
    const half = time.seconds ? 26 : 16;
    for (const t of time.ticks) {
      const at = x(t);
      nodes.push(svg("line", { class: "grid", x1: at.toFixed(1), x2: at.toFixed(1), y1: m.t, y2: m.t + h }));
      if (at - half > m.l - 10 && at + half < width) {
        nodes.push(svg("text", { x: at.toFixed(1), y: height - 5, "text-anchor": "middle" }, clock(t, time.seconds)));
      }
    }
    nodes.push(svg("line", { class: "axis", x1: m.l, x2: m.l + w, y1: m.t + h, y2: m.t + h }));
    nodes.push(svg("line", { class: "axis", x1: m.l, x2: m.l, y1: m.t, y2: m.t + h }));
    // Where an instance went silent: a dashed mark in its colour, behind the lines.
    for (const instance of plots.instances.values()) {
      if (instance.reporting || !instance.samples.length || instance.last < left) continue;
      const at = x(instance.last).toFixed(1);
      nodes.push(svg("line", { class: "silent", x1: at, x2: at, y1: m.t, y2: m.t + h,
                               stroke: plots.colours.get(instance.name), "data-instance": instance.name }));
    }
    for (const { instance, line, points } of lines) {
      let d = "";
      let previous = null;
      let count = 0;
      let segments = 0;
      for (const [t, v] of points) {
        if (!Number.isFinite(v)) {
          previous = null;
          continue;
        }
        const at = `${x(t).toFixed(1)} ${y(v).toFixed(1)}`;
        // A second without a sample (or without a value) breaks the line. A segment starts with
        // a line of no length, so that a lone point still shows, as a dot.
        if (previous === null || t - previous > plots.step * 2.5) {
          d += `M${at}l0 0`;
          segments += 1;
        } else {
          d += `L${at}`;
        }
        previous = t;
        count += 1;
      }
      nodes.push(svg("path", {
        class: `line ${line.cls || ""}`.trim(), d, stroke: plots.colours.get(instance.name),
        "data-instance": instance.name, "data-points": count, "data-segments": segments,
      }));
    }
    if (!values.length) {
      const why = !plots.loaded ? "loading…"
        : plots.instances.size === 0 ? "waiting for the first samples…"
        : panel.log ? "no request took a lock in this time" : "no data in this time";
      nodes.push(svg("text", { class: "empty", x: m.l + w / 2, y: m.t + h / 2, "text-anchor": "middle" }, why));
    }
    drawn.set(panel.id, { left, right, m, w, h, x, y, lines });
    const cursor = readout(panel, node);
    if (cursor) nodes.push(...cursor);
    node.replaceChildren(...nodes);
  }

  // The hover readout of `panel`: a cursor line and dots in its plot `node` (returned), and a box
  // beside the cursor with the time and each instance's value.
  function readout(panel, node) {
    const tip = byId(`tip-${panel.id}`);
    const at = pointer.get(panel.id);
    const plot = drawn.get(panel.id);
    if (at === undefined || !plot || at < plot.m.l || at > plot.m.l + plot.w) {
      tip.hidden = true;
      return null;
    }
    const t = plot.left + ((at - plot.m.l) / plot.w) * (plot.right - plot.left);
    const nodes = [svg("line", { class: "cursor", x1: at, x2: at, y1: plot.m.t, y2: plot.m.t + plot.h })];
    const rows = new Map();
    let when = null;
    for (const { instance, line, points } of plot.lines) {
      let best = null;
      for (const p of points) if (!best || Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p;
      const colour = plots.colours.get(instance.name);
      if (!rows.has(instance.name)) rows.set(instance.name, { colour, parts: [] });
      if (!best || Math.abs(best[0] - t) > plots.step || !Number.isFinite(best[1])) {
        rows.get(instance.name).parts.push(line.label ? `${line.label} –` : "no report");
        continue;
      }
      when = best[0];
      const value = panel.log ? wait(best[1]) : perSecond(best[1]);
      rows.get(instance.name).parts.push(line.label ? `${line.label} ${value}` : value);
      nodes.push(svg("circle", { class: "dot", cx: plot.x(best[0]).toFixed(1), cy: plot.y(best[1]).toFixed(1),
                                 r: 3, fill: colour }));
    }
    const title = document.createElement("b");
    title.textContent = clock(when ?? t, true);
    const items = [...rows].map(([name, row]) => {
      const div = document.createElement("div");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = row.colour;
      div.append(swatch, `${name}  ${[...new Set(row.parts)].join(" · ")}`);
      return div;
    });
    tip.replaceChildren(title, ...items);
    tip.hidden = false;
    // Beside the cursor, on the side with room; the box is placed in the plot's figure.
    const figure = tip.parentElement.getBoundingClientRect();
    const box = node.getBoundingClientRect();
    const x = box.left - figure.left + at;
    const onRight = at < plot.m.l + plot.w / 2;
    tip.style.left = onRight ? `${x + 12}px` : "";
    tip.style.right = onRight ? "" : `${figure.width - x + 12}px`;
    tip.style.top = `${box.top - figure.top + plot.m.t}px`;
    return nodes;
  }

  function ago(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    return s < 120 ? `${s} s` : `${Math.round(s / 60)} min`;
  }

  function drawLegend(right) {
    const items = [...plots.instances.values()].map((instance) => {
      const li = document.createElement("li");
      li.dataset.instance = instance.name;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = plots.colours.get(instance.name);
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = instance.name;
      const state = document.createElement("span");
      state.className = "state";
      if (plots.why) {
        li.dataset.state = "unknown";
        state.textContent = "unknown";
      } else if (instance.reporting) {
        li.dataset.state = "live";
        state.textContent = instance.name === plots.answeredBy ? "live, serves this page" : "live";
      } else {
        li.dataset.state = "down";
        li.classList.add("down");
        state.textContent = `unreachable: no report for ${ago(right - instance.last)}`;
      }
      li.append(swatch, name, state);
      return li;
    });
    byId("legend").replaceChildren(...items);
  }

  function drawPlots() {
    const right = Date.now() + plots.offset;
    for (const instance of plots.instances.values()) {
      while (instance.samples.length && instance.samples[0].at_ms < right - plots.window) instance.samples.shift();
    }
    const firsts = [...plots.instances.values()].filter((i) => i.samples.length).map((i) => i.samples[0].at_ms);
    const span = Math.min(plots.window, Math.max(MIN_SPAN, firsts.length ? right - Math.min(...firsts) : 0));
    plots.shown = [right - span, right];
    for (const panel of PANELS) drawPanel(panel, ...plots.shown);
    drawLegend(right);
    const state = byId("plots-state");
    state.classList.toggle("paused", Boolean(plots.why));
    // What is drawn while the shop can't be asked is faded: it may no longer be all there is.
    document.querySelector("#plots .panels").classList.toggle("paused", Boolean(plots.why));
    state.textContent = plots.why ? `Plots paused: ${plots.why}. Retrying…`
      : !plots.loaded ? "loading…"
      : `a point a second, each over the 5 s before it · last ${ago(span)}`;
  }

  function merge(series) {
    plots.offset = series.now_ms - Date.now();
    plots.window = series.window_ms;
    plots.step = series.step_ms;
    plots.answeredBy = series.answered_by;
    const listed = new Set();
    for (const item of series.instances) {
      listed.add(item.name);
      let instance = plots.instances.get(item.name);
      if (!instance) {
        instance = { name: item.name, samples: [] };
        plots.instances.set(item.name, instance);
      }
      if (!plots.colours.has(item.name)) plots.colours.set(item.name, COLOURS[plots.colours.size % COLOURS.length]);
      const newest = instance.samples.length ? instance.samples[instance.samples.length - 1].at_ms : -Infinity;
      instance.samples.push(...item.samples.filter((s) => s.at_ms > newest));
      instance.last = item.last_ms;
      instance.reporting = item.reporting === true;
    }
    // An instance no longer listed has been silent for the whole window.
    for (const name of [...plots.instances.keys()]) if (!listed.has(name)) plots.instances.delete(name);
  }

  // What to ask for: the samples after the oldest "newest sample" of the instances that report
  // (each instance writes its samples in order), or the whole window when one is new.
  function since() {
    const reporting = [...plots.instances.values()].filter((i) => i.reporting);
    if (!reporting.length || reporting.some((i) => !i.samples.length)) return null;
    return Math.min(...reporting.map((i) => i.samples[i.samples.length - 1].at_ms));
  }

  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    try {
      const after = since();
      const url = after === null ? "/api/stats/series" : `/api/stats/series?since_ms=${after}`;
      const response = await fetch(url, { cache: "no-store", signal: AbortSignal.timeout(5000) });
      const body = await response.json().catch(() => null);
      if (response.status === 401) {
        // The sign-in cookie expired, or the token changed: sign in again.
        location.assign("/operator/login");
        return;
      }
      if (!response.ok) {
        const detail = body && typeof body.detail === "string" ? body.detail : "";
        throw new Error(`the shop answered ${response.status}${detail ? ` (${detail})` : ""}`);
      }
      if (!body || !Array.isArray(body.instances)) throw new Error("the shop's answer is not a series");
      merge(body);
      plots.why = null;
      plots.loaded = true;
    } catch (err) {
      plots.why = err.name === "TimeoutError" ? "no answer within 5 s"
        : err instanceof TypeError ? "the shop can't be reached" : err.message;
    } finally {
      drawPlots();
      clearTimeout(timer);
      timer = setTimeout(refresh, plots.step);
    }
  }

  for (const panel of PANELS) {
    const node = byId(`plot-${panel.id}`);
    // Only this panel is drawn again as the pointer moves, over the same time as the others.
    node.addEventListener("pointermove", (event) => {
      pointer.set(panel.id, event.clientX - node.getBoundingClientRect().left);
      if (plots.shown) drawPanel(panel, ...plots.shown);
    });
    node.addEventListener("pointerleave", () => {
      pointer.delete(panel.id);
      if (plots.shown) drawPanel(panel, ...plots.shown);
    });
  }
  window.addEventListener("resize", drawPlots);
  // The time axis moves on between answers, and shows a silence as it grows.
  setInterval(drawPlots, 1000);
  refresh();
})();
