// The status page's live part (see status_page.rs): polls /status.json
// every 2 s, updates the tables in place and draws inline SVG charts of
// each shard's lag and records per second, each subscription's calls per
// second, each plugin version's records per second and share not acked,
// and each lane's calls per second. Rates are counter differences between
// polls. Plain DOM and SVG, no library: the host serves everything.
"use strict";
(() => {
  const KEEP = 150; // samples: 5 minutes at one every 2 s
  const history = new Map();
  const push = (key, value) => {
    const values = history.get(key) || [];
    values.push(value);
    if (values.length > KEEP) values.shift();
    history.set(key, values);
    return values;
  };
  // Per second since the previous poll of the counter `key` (null at the
  // first poll; 0 when the counter restarted, e.g. a shard read again).
  const previous = new Map();
  const rate = (key, t, count) => {
    const before = previous.get(key);
    previous.set(key, [t, count]);
    if (!before) return null;
    return Math.max(0, ((count - before[1]) * 1000) / Math.max(1, t - before[0]));
  };
  const svgNS = "http://www.w3.org/2000/svg";
  const spark = (values, colour = "#36c") => {
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
    line.setAttribute("stroke", colour);
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
  // A chart and the latest value in `cell`, once there is a rate.
  const chart = (cell, key, value, digits, colour) => {
    if (!cell || value == null) return;
    const rounded = Number(value.toFixed(digits));
    cell.replaceChildren(spark(push(key, rounded), colour), document.createTextNode(` ${value.toFixed(digits)}`));
  };
  const cell = (text) => {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  };
  const update = (snapshot) => {
    const t = snapshot.t;
    set(document, "#ready", `ready: ${snapshot.ready}`);
    for (const sub of snapshot.subscriptions) {
      const section = document.querySelector(`section[data-name="${CSS.escape(sub.name)}"]`);
      if (!section) return location.reload();
      if (section.querySelectorAll("tr.shard").length !== sub.shards.length) return location.reload();
      if (section.querySelectorAll("tr.version").length !== sub.versions.length) return location.reload();
      for (const shard of sub.shards) {
        const row = section.querySelector(`tr[data-shard="${CSS.escape(shard.id)}"]`);
        if (!row) return location.reload();
        set(row, ".owner", shard.owner ?? "");
        const checkpoint = shard.checkpoint ?? "";
        set(row, ".checkpoint", checkpoint.length > 20 ? `${checkpoint.slice(0, 6)}…${checkpoint.slice(-8)}` : checkpoint);
        row.querySelector(".checkpoint").title = checkpoint;
        set(row, ".behind", shard.behind_ms == null ? "" : String(shard.behind_ms));
        set(row, ".state", shard.state);
        const lag = push(`lag ${sub.name} ${shard.id}`, shard.behind_ms ?? 0);
        row.querySelector(".lag").replaceChildren(spark(lag));
        const key = `records ${sub.name} ${shard.id}`;
        chart(row.querySelector(".records"), key, rate(key, t, shard.records), 1);
      }
      for (const version of sub.versions) {
        const row = section.querySelector(`tr[data-role="${version.role}"]`);
        if (!row) return location.reload();
        for (const outcome of ["ack", "retry", "reject", "failed"]) set(row, `.${outcome}`, String(version[outcome]));
        const key = `version ${sub.name} ${version.role} ${version.digest} ${sub.canary ?? ""}`;
        const handled = version.ack + version.retry + version.reject + version.failed;
        const before = previous.get(key);
        chart(row.querySelector(".rate"), key, rate(key, t, handled), 1);
        const notAcked = handled - version.ack;
        const errKey = `${key} not acked`;
        const beforeErr = previous.get(errKey);
        previous.set(errKey, [t, notAcked]);
        if (before && beforeErr) {
          const all = handled - before[1];
          const share = all > 0 ? (100 * (notAcked - beforeErr[1])) / all : 0;
          chart(row.querySelector(".errors"), errKey, share, 1, "#c33");
          row.querySelector(".errors").append("%");
        }
      }
      let calls = 0;
      for (const lane of sub.lanes) {
        calls += lane.calls;
        const row = section.querySelector(`tr[data-lane="${lane.lane}"]`);
        if (!row) continue;
        set(row, ".calls", String(lane.calls));
        const key = `lane ${sub.name} ${lane.lane}`;
        chart(row.querySelector(".load"), key, rate(key, t, lane.calls), 1);
      }
      const callsKey = `calls ${sub.name}`;
      chart(section.querySelector(".calls-rate"), callsKey, rate(callsKey, t, calls), 1);
      const leases = section.querySelector("table.leases tbody");
      leases.replaceChildren(...sub.lease_changes.map((c) => {
        const row = document.createElement("tr");
        row.className = "lease-change";
        row.append(cell(new Date(c.at_ms).toISOString()), cell(c.shard), cell(c.from ?? "—"), cell(c.to ?? "—"));
        return row;
      }));
      set(section, ".version-problem", sub.version_problem ?? "");
      set(section, ".parked", sub.parked ?? "");
      const s = sub.shadow;
      set(section, ".shadow", s ? `shadow ${s.digest}: ${s.calls} calls compared, differing in outcome ${s.outcome}, output ${s.output}, state ${s.state}; ${s.dropped} dropped (behind)` : "");
      section.querySelector("table.history tbody").replaceChildren(...sub.history.map((c) => {
        const row = document.createElement("tr");
        row.className = "change";
        const version = cell(c.digest.slice(0, 19));
        version.title = c.digest;
        row.append(cell(new Date(c.at_ms).toISOString()), cell(c.action.replaceAll("_", "-")), version, cell(c.by), cell(c.note));
        return row;
      }));
    }
    set(document, "#updated", `updated ${new Date(t).toISOString()}`);
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
