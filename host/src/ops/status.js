// The status page's live part (see status_page.rs): polls /status.json
// every 2 s, updates the tables in place and draws inline SVG charts of
// each shard's lag and each subscription's calls per second. Plain DOM and
// SVG, no library: the host serves everything.
"use strict";
(() => {
  const KEEP = 150; // samples: 5 minutes at one every 2 s
  const history = new Map();
  const lastCalls = new Map();
  const push = (key, value) => {
    const values = history.get(key) || [];
    values.push(value);
    if (values.length > KEEP) values.shift();
    history.set(key, values);
    return values;
  };
  const svgNS = "http://www.w3.org/2000/svg";
  const spark = (values) => {
    const w = 150, h = 24;
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", w);
    svg.setAttribute("height", h);
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    const max = Math.max(1, ...values);
    const step = values.length > 1 ? w / (values.length - 1) : 0;
    const line = document.createElementNS(svgNS, "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#36c");
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("points", values
      .map((v, i) => `${(i * step).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`)
      .join(" "));
    svg.appendChild(line);
    const title = document.createElementNS(svgNS, "title");
    title.textContent = `last ${values[values.length - 1]}, max ${max}`;
    svg.appendChild(title);
    return svg;
  };
  const set = (parent, selector, text) => {
    const el = parent.querySelector(selector);
    if (el && el.textContent !== text) el.textContent = text;
  };
  const update = (snapshot) => {
    set(document, "#ready", `ready: ${snapshot.ready}`);
    for (const sub of snapshot.subscriptions) {
      const section = document.querySelector(`section[data-name="${CSS.escape(sub.name)}"]`);
      if (!section) return location.reload();
      const rows = section.querySelectorAll("tr.shard");
      if (rows.length !== sub.shards.length) return location.reload();
      for (const shard of sub.shards) {
        const row = section.querySelector(`tr[data-shard="${CSS.escape(shard.id)}"]`);
        if (!row) return location.reload();
        set(row, ".owner", shard.owner ?? "");
        set(row, ".checkpoint", shard.checkpoint ?? "");
        set(row, ".behind", shard.behind_ms == null ? "" : String(shard.behind_ms));
        set(row, ".state", shard.state);
        const lag = push(`lag ${sub.name} ${shard.id}`, shard.behind_ms ?? 0);
        row.querySelector(".lag").replaceChildren(spark(lag));
      }
      let calls = 0;
      for (const lane of sub.lanes) {
        calls += lane.calls;
        const row = section.querySelector(`tr[data-lane="${lane.lane}"]`);
        if (row) set(row, ".calls", String(lane.calls));
      }
      const previous = lastCalls.get(sub.name);
      lastCalls.set(sub.name, [snapshot.t, calls]);
      if (previous) {
        const rate = ((calls - previous[1]) * 1000) / Math.max(1, snapshot.t - previous[0]);
        const rates = push(`rate ${sub.name}`, Math.round(rate * 10) / 10);
        const cell = section.querySelector(".rate");
        cell.replaceChildren(spark(rates), document.createTextNode(` ${rate.toFixed(1)}`));
      }
    }
    set(document, "#updated", `updated ${new Date(snapshot.t).toISOString()}`);
  };
  const refresh = async () => {
    try {
      const response = await fetch("/status.json", { cache: "no-store" });
      update(await response.json());
    } catch (e) {
      set(document, "#updated", `not updated: ${e}`);
    }
  };
  refresh();
  setInterval(refresh, 2000);
})();
