// hamid web view: draws /api/events' document (nodes, GPUs, tenants, health) and runs the what-if box.
// Plain JavaScript, no library, nothing loaded from elsewhere. Every string from the daemon is escaped.
"use strict";

const $ = (id) => document.getElementById(id);
const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESC[c]);
const pct = (used, total) => (total > 0 ? Math.min(100, Math.round((100 * used) / total)) : 0);
const gib = (mib) => (mib >= 1024 ? (mib / 1024).toFixed(mib % 1024 ? 1 : 0) + " GiB" : mib + " MiB");

let doc = null;
let rendered = false;
const openNodes = new Set();
let closedByUser = new Set();
const prevUse = new Map(); // owner|uuid -> {t, throttle, gpu}

function bar(kind, used, total, label) {
  return `<div class="row"><span>${label}</span><div><div class="bar ${kind}" aria-hidden="true">` +
    `<span data-w="${pct(used, total)}"></span></div></div></div>`;
}

function slices(g) {
  const n = g.mig_slices || 0;
  if (!n) return "";
  const byStart = new Map(g.mig_instances.map((m) => [m.start, m]));
  let out = "";
  for (let i = 0; i < n; ) {
    const m = byStart.get(i);
    if (m) {
      out += `<span class="used" data-flex="${m.size}" title="${esc(m.profile)} at ${m.start}:${m.size}">${esc(m.profile)}</span>`;
      i += m.size;
    } else {
      out += `<span title="free slice ${i}"></span>`;
      i += 1;
    }
  }
  const list = g.mig_instances.map((m) => `${esc(m.profile)} at slice ${m.start}` + (m.size > 1 ? `-${m.start + m.size - 1}` : "")).join(", ");
  return `<div class="slices" data-slices="${n}" aria-hidden="true">${out}</div>` +
    `<div class="row"><span></span><span class="mig-list">${list || "no MIG instance"}</span></div>`;
}

function gpuCard(node, g) {
  const chips = [];
  chips.push(g.healthy ? '<span class="chip ok">healthy</span>' : '<span class="chip bad">UNHEALTHY</span>');
  if (g.cordoned) chips.push('<span class="chip warn">cordoned</span>');
  if (g.filtered) chips.push('<span class="chip warn">filtered</span>');
  if (g.exclusive) chips.push('<span class="chip info">exclusive</span>');
  if (g.mode === "mig") chips.push('<span class="chip info">MIG</span>');
  if (g.share_mode === "mps") chips.push(`<span class="chip info">MPS${g.mps_shares ? ` (${g.mps_shares})` : ""}</span>`);
  const usedSlices = (g.mig_instances || []).reduce((a, m) => a + m.size, 0);
  const mig = g.mode === "mig" && g.mig_slices;
  const memText = mig ? `${usedSlices}/${g.mig_slices} memory slices` : `${g.memory_used_mib}/${g.memory_total_mib} MiB`;
  // a MIG GPU's compute is its instances' compute slices: its cores figure is never booked
  const coreText = mig ? `${g.mig_compute_used || 0}/${g.mig_compute_slices} compute slices` : `${g.cores_used}/${g.cores_total}%`;
  return `<div class="gpu" data-gpu="${esc(g.uuid)}" data-node="${esc(node)}" data-index="${g.index}" ` +
    `data-mem-used="${g.memory_used_mib}" data-mem-total="${g.memory_total_mib}" data-cores-used="${g.cores_used}">` +
    `<div class="head"><strong>GPU ${g.index} <span class="model">${esc(g.name)}</span></strong><span>${chips.join(" ")}</span></div>` +
    (mig ? bar("mem", usedSlices, g.mig_slices, "memory") : bar("mem", g.memory_used_mib, g.memory_total_mib, "memory")) + `<div class="row"><span></span><span class="mem">${memText} booked</span></div>` +
    (mig ? bar("core", g.mig_compute_used || 0, g.mig_compute_slices, "compute") : bar("core", g.cores_used, g.cores_total, "compute")) + `<div class="row"><span></span><span class="cores">${coreText} booked, ${g.shares_used}/${g.shares_total} tenants</span></div>` +
    slices(g) + `</div>`;
}

// The page's CSP forbids style attributes in markup; sizes are set through the CSSOM instead.
function applySizes(root) {
  for (const el of root.querySelectorAll("[data-w]")) el.style.width = el.dataset.w + "%";
  for (const el of root.querySelectorAll("[data-flex]")) el.style.flex = el.dataset.flex;
}

function stateChip(s) {
  const cls = s === "alive" ? "ok" : s === "suspect" ? "warn" : "bad";
  return `<span class="chip ${cls} state">${esc(s)}</span>`;
}

// The nodes the filter box lets through (by name or GPU model); null when it is empty.
function shownNodes() {
  const filter = $("node-filter").value.trim().toLowerCase();
  if (!filter) return null;
  return new Set(doc.members.filter((m) => m.name.toLowerCase().includes(filter) ||
    m.gpus.some((g) => g.name.toLowerCase().includes(filter))).map((m) => m.name));
}

const plural = (n, what) => `${n} ${what}${n === 1 ? "" : "s"}`;

function renderNodes() {
  const shown = shownNodes();
  const members = shown ? doc.members.filter((m) => shown.has(m.name)) : doc.members;
  const gpus = (ms) => ms.reduce((a, m) => a + m.gpus.length, 0);
  $("nodes-count").textContent = shown
    ? `(${members.length} of ${plural(doc.members.length, "node")} shown, ${plural(gpus(members), "GPU")})`
    : `(${plural(doc.members.length, "node")}, ${plural(gpus(doc.members), "GPU")})`;
  const few = doc.members.length <= 12;
  const html = members.map((m) => {
    const s = m.summary;
    const open = openNodes.has(m.name) || (few && !closedByUser.has(m.name)) || m.self;
    const sum = s ? `${s.gpus} GPUs, ${gib(s.memory_free_mib)} of ${gib(s.memory_total_mib)} free, ${s.cores_used}/${s.cores_total}% cores booked` : "no capacity known";
    return `<details class="node" data-node="${esc(m.name)}" data-state="${esc(m.state)}"${open ? " open" : ""}>` +
      `<summary><h3>${esc(m.name)}${m.self ? ' <span class="muted">(this node)</span>' : ""}</h3>${stateChip(m.state)}` +
      `<span class="muted hide-narrow">${esc(m.addr || "")}</span><span class="summary">${sum}</span></summary>` +
      `<div class="gpus">${m.gpus.map((g) => gpuCard(m.name, g)).join("")}</div></details>`;
  }).join("");
  $("nodes-body").innerHTML = html || '<p class="muted">No node matches.</p>';
  applySizes($("nodes-body"));
}

function asked(a) {
  if (!a) return "no GPU";
  const parts = [];
  parts.push(a.count == null ? "listed GPUs" : `${a.count} GPU${a.count === 1 ? "" : "s"}`);
  if (a.mode) parts.push(`mode=${a.mode}`);
  if (a.mig_profile) parts.push(`MIG ${a.mig_profile}`);
  else if (a.mem_mib != null) parts.push(`${a.mem_mib} MiB`);
  else if (a.mem_percent != null) parts.push(`${a.mem_percent}% memory`);
  if (a.cores) parts.push(`${a.cores}% cores`);
  if (a.types && a.types.length) parts.push(`type ${a.types.join("|")}`);
  return parts.join(", ");
}

function given(d) {
  if (d.mig_profile) return `GPU ${d.index}: MIG ${esc(d.mig_profile)} at ${d.mig_placement.start}:${d.mig_placement.size}`;
  return `GPU ${d.index}: ${d.mem_mib} MiB, ${d.cores}% cores`;
}

function live(t, c, now) {
  const cells = c.given.map((d) => {
    const u = c.live[d.uuid];
    if (!u) return t.node === doc.node ? '<span class="muted">no region yet</span>' : '<span class="muted">on its node\'s page</span>';
    const key = `${t.owner}|${c.name}|${d.uuid}`;
    const prev = prevUse.get(key);
    let thr = `${u.throttle_s.toFixed(1)} s throttled`;
    if (prev && now > prev.t) {
      const rate = (u.throttle_s - prev.throttle) / ((now - prev.t) / 1000);
      thr = `throttled ${Math.max(0, Math.round(100 * rate))}% now, ${u.throttle_s.toFixed(1)} s total`;
    }
    prevUse.set(key, { t: now, throttle: u.throttle_s, gpu: u.gpu_time_s });
    const lim = u.limit_mib ? `${u.used_mib}/${u.limit_mib} MiB` : `${u.used_mib} MiB`;
    return `<span class="use">${lim}</span>${u.sm_limit ? `, SM limit ${u.sm_limit}%` : ""}; ${thr}` +
      (u.oom_refusals ? `; <strong>${u.oom_refusals} allocation(s) refused</strong>` : "");
  });
  return cells.join("<br>") || '<span class="muted">-</span>';
}

function renderTenants() {
  const now = Date.now();
  const rows = [];
  const shown = shownNodes();
  const tenants = shown ? doc.tenants.filter((t) => shown.has(t.node)) : doc.tenants;
  for (const t of tenants) {
    for (const c of t.containers) {
      rows.push(`<tr data-owner="${esc(t.owner)}" data-name="${esc(t.name)}"><td data-label="Node">${esc(t.node)}</td>` +
        `<td data-label="Namespace">${esc(t.namespace)}</td><td class="name" data-label="Name">${esc(t.name)}</td>` +
        `<td data-label="Kind">${esc(t.kind === "pod" ? "pod" : "container")}${t.kind === "pod" ? ` / ${esc(c.name)}` : ""}</td>` +
        `<td data-label="State">${esc(t.state)}</td><td data-label="Asked">${esc(asked(c.asked))}</td>` +
        `<td data-label="Given">${c.given.map(given).join("<br>") || "-"}</td>` +
        `<td data-label="Live use">${live(t, c, now)}</td></tr>`);
    }
  }
  const unknown = doc.tenants_unknown || [];
  const nodes = new Set(tenants.map((t) => t.node)).size;
  $("tenants-count").textContent = `(${tenants.length} on ${plural(nodes, "node")}` +
    (shown ? `, of ${doc.tenants.length} in all: filtered by node)` : ")");
  const note = unknown.length
    ? `<p class="muted" id="tenants-unknown">Not listed: the tenants of ${unknown.length} node(s) this daemon cannot ask ` +
      `(no peer API address in their gossip, no key, or no answer): ${unknown.slice(0, 10).map(esc).join(", ")}${unknown.length > 10 ? ", …" : ""}. ` +
      "Their own pages list them.</p>"
    : "";
  $("tenants-body").innerHTML = note + (rows.length
    ? `<table><caption class="muted">Live use and throttling are read by the node that runs the tenant: shown for ${esc(doc.node)}'s own.</caption>` +
      `<thead><tr><th scope="col">Node</th><th scope="col">Namespace</th><th scope="col">Name</th><th scope="col">Kind</th>` +
      `<th scope="col">State</th><th scope="col">Asked</th><th scope="col">Given</th><th scope="col">Live use, throttling</th></tr></thead>` +
      `<tbody>${rows.join("")}</tbody></table>`
    : `<p class="muted" id="no-tenants">${shown ? "No tenant on the nodes the filter shows." : "No tenant."}</p>`);
}

function renderHealth() {
  const g = doc.gossip;
  const cards = [];
  if (g.enabled) {
    const states = Object.entries(g.members_by_state).map(([s, n]) => `${n} ${esc(s)}`).join(", ");
    const st = g.stats || {};
    const probes = st.probes ? Object.entries(st.probes).map(([k, v]) => `${esc(k)} ${v}`).join(", ") : "";
    cards.push(`<div class="card" id="gossip-card"><h3>Gossip</h3><p>Members: <span id="members-by-state">${states}</span></p>` +
      `<p>Local health: ${g.health === 0 ? '<span class="chip ok">0 (good)</span>' : `<span class="chip warn">${g.health}</span>`}` +
      ` · ${g.encrypted ? "encrypted" : "<strong>NOT encrypted</strong>"}</p>` +
      `<p class="muted">${esc(g.addr)}, incarnation ${g.incarnation}${probes ? `; probes: ${probes}` : ""}` +
      `${st.suspicions != null ? `; suspicions ${st.suspicions}, refutations ${st.refutations}` : ""}</p></div>`);
  } else {
    cards.push('<div class="card" id="gossip-card"><h3>Gossip</h3><p>Off on this daemon (gossipListen): only this node is shown.</p></div>');
  }
  const l = doc.leader;
  cards.push(`<div class="card" id="leader-card"><h3>Leader</h3>` + (l
    ? `<p>${l.holder ? `<strong>${esc(l.holder)}</strong>` : "none right now"} (${esc(l.mode)} mode)</p>`
    : "<p>None: outside Kubernetes each node decides for its own GPUs.</p>") + "</div>");
  cards.push(`<div class="card"><h3>This daemon</h3><p>${esc(doc.node)}</p><p class="muted">${esc(doc.backend)}</p></div>`);
  $("health-body").innerHTML = cards.join("");
}

function render() {
  $("seen-from").textContent = `· seen from ${doc.node}`;
  renderHealth();
  renderNodes();
  renderTenants();
  if (!rendered) {
    rendered = true;
    performance.mark("hamid-rendered");
    document.body.dataset.rendered = "1";
  }
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

function connect() {
  const live = $("live");
  const es = new EventSource("/api/events");
  es.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  es.onmessage = (ev) => {
    doc = JSON.parse(ev.data);
    render();
    live.textContent = `live · ${new Date().toLocaleTimeString()}`;
    live.className = "live on";
  };
  es.onerror = () => {
    live.className = "live off";
    live.textContent = "reconnecting…";
    if (es.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
  };
}

function renderWhatIf(body) {
  const out = [];
  out.push(`<p class="muted">Placed on the live view of ${body.nodes} node(s), as <code>hamid plan --live</code> does.</p>`);
  for (const r of body.results) {
    if (r.error && !r.reasons) {
      out.push(`<div class="nofit" data-result="error"><p><strong>${esc(r.error)}</strong></p></div>`);
      continue;
    }
    const others = Object.entries(r.nodes || {}).filter(([n]) => n !== r.node).map(([n, nd]) => {
      const why = nd.gpus.filter((g) => g.unfit).map((g) => `GPU ${g.index}: ${esc(g.unfit)}`);
      const fits = nd.gpus.some((g) => g.score !== null);
      return `<li data-node="${esc(n)}"><strong>${esc(n)}</strong>: ` +
        (fits && !r.error ? `could take it too, ranked lower (node score ${nd.score})` : (why.join("; ") || ((r.reasons || {})[n] || []).map(esc).join("; ") || "does not fit")) + "</li>";
    });
    if (r.error) {
      out.push(`<div class="nofit" data-result="nofit"><p><strong>${esc(r.name)}: fits nowhere now.</strong></p>` +
        `<ul>${Object.entries(r.reasons || {}).map(([n, w]) => `<li data-node="${esc(n)}"><strong>${esc(n)}</strong>: ${w.map(esc).join("; ")}</li>`).join("")}</ul></div>`);
    } else {
      const gpus = r.containers.flatMap((c) => c.devices.map((d) => given(d))).join("; ");
      out.push(`<div class="fit" data-result="fit" data-node="${esc(r.node)}"><p><strong>${esc(r.name)}</strong> fits on ` +
        `<strong class="fit-node">${esc(r.node)}</strong>: ${gpus}</p>` +
        (others.length ? `<p>Elsewhere:</p><ul>${others.join("")}</ul>` : "") + "</div>");
    }
  }
  $("whatif-out").innerHTML = out.join("");
}

async function whatIf(ev) {
  ev.preventDefault();
  const out = $("whatif-out");
  out.textContent = "placing…";
  try {
    const resp = await fetch("/api/whatif", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ text: $("whatif-text").value }),
    });
    const body = await resp.json();
    if (!resp.ok) {
      out.innerHTML = `<div class="nofit" data-result="error"><p><strong>${esc(body.error)}</strong></p></div>`;
      return;
    }
    renderWhatIf(body);
  } catch (e) {
    out.textContent = `The daemon did not answer: ${e}`;
  }
}

function setupTheme() {
  const btn = $("theme");
  const order = ["auto", "light", "dark"];
  let mode = localStorage.getItem("hamid-theme") || "auto";
  const apply = () => {
    if (mode === "auto") delete document.documentElement.dataset.theme;
    else document.documentElement.dataset.theme = mode;
    btn.textContent = `Theme: ${mode}`;
    btn.setAttribute("aria-pressed", mode === "auto" ? "false" : "true");
  };
  btn.addEventListener("click", () => {
    mode = order[(order.indexOf(mode) + 1) % order.length];
    localStorage.setItem("hamid-theme", mode);
    apply();
  });
  apply();
}

document.addEventListener("DOMContentLoaded", () => {
  setupTheme();
  $("whatif-form").addEventListener("submit", whatIf);
  $("node-filter").addEventListener("input", () => { if (doc) { renderNodes(); renderTenants(); } });
  $("nodes-body").addEventListener("toggle", (ev) => {
    const d = ev.target;
    if (!(d instanceof HTMLDetailsElement)) return;
    const name = d.dataset.node;
    if (d.open) { openNodes.add(name); closedByUser.delete(name); } else { openNodes.delete(name); closedByUser.add(name); }
  }, true);
  connect();
});
