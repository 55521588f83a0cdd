// abserve's dashboard: experiments, their statistics, and the live state of the one model that
// serves every variant. Plain DOM, no dependencies; data only from /v1 (with the API key the
// user entered, kept in sessionStorage). Text from the server goes into text nodes only.
'use strict';

const KEY = 'abserve-api-key';
const AUTOMATIC = ['latency_ms', 'ttft_ms', 'output_tokens', 'cost', 'error'];
const NS = 'http://www.w3.org/2000/svg';

// ---------- DOM helpers ----------
function build(el, attrs, kids) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'on') for (const [ev, f] of Object.entries(v)) el.addEventListener(ev, f);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}
const h = (tag, attrs, ...kids) => build(document.createElement(tag), attrs, kids);
const s = (tag, attrs, ...kids) => build(document.createElementNS(NS, tag), attrs, kids);

// ---------- numbers ----------
const finite = (x) => typeof x === 'number' && Number.isFinite(x);
function num(x, digits = 4) {
  if (!finite(x)) return '–';
  if (x !== 0 && (Math.abs(x) >= 1e6 || Math.abs(x) < 1e-3)) return x.toExponential(2);
  return Number(x.toPrecision(digits)).toString();
}
const pct = (x, digits = 3) => (finite(x) ? num(x * 100, digits) + '%' : '–');
const signed = (x, f = num) => (finite(x) && x > 0 ? '+' : '') + f(x);
function bytes(b) {
  if (!finite(b)) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + ' ' + u[i];
}
// a table cell holding a number: the raw value in data-value, the rounded one shown
const cell = (key, x, f = num) => h('td', { class: 'num', 'data-k': key, 'data-value': finite(x) ? x : '' }, f(x));

// ---------- API ----------
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
let config = { auth_required: false };
// the key's name and role (GET /v1/me), asked once per key: the page shows what the role may see
let who = null;
const isAdmin = () => who && who.role === 'admin';

async function api(path, opts = {}) {
  const headers = { Accept: 'application/json' };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = 'Bearer ' + key;
  if (opts.body !== undefined) headers['Content-Type'] = opts.type || 'application/json';
  const r = await fetch(path, { method: opts.method || 'GET', headers, body: opts.body });
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (r.status === 401) {
    sessionStorage.removeItem(KEY);
    who = null;
    showKeyForm('That API key was refused.');
    throw new ApiError(401, 'API key required');
  }
  if (!r.ok) throw new ApiError(r.status, (body && body.error && body.error.message) || text || r.statusText);
  return opts.text ? text : body;
}

function needKey() { return config.auth_required && !sessionStorage.getItem(KEY); }

function showKeyForm(message) {
  stopTimers();
  const input = h('input', { id: 'api-key', type: 'password', autocomplete: 'off', required: true, 'aria-label': 'API key' });
  const form = h('form', { class: 'card', id: 'key-form', on: { submit: (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    who = null;
    route();
  } } },
  h('h2', {}, 'API key'),
  h('p', { class: 'muted' }, 'This server asks for an API key (--api-key or --keys). What the page shows depends on the key\'s role. The key is kept in this browser tab only (sessionStorage).'),
  message ? h('p', { class: 'failure' }, message) : null,
  h('div', { class: 'row' }, input, h('button', { type: 'submit' }, 'Use key')));
  main().replaceChildren(form);
  input.focus();
}

const main = () => document.getElementById('main');

function failure(e) {
  if (e instanceof ApiError && e.status === 401) return;
  main().replaceChildren(h('p', { class: 'failure', role: 'alert' }, String(e.message || e)));
}

// ---------- live model state ----------
let last = null; // previous engine sample, for tokens/s
let engineState = null;
let timers = [];
function stopTimers() { timers.forEach(clearInterval); timers = []; }

function gauge(label, value, extra, id) {
  return h('div', { class: 'gauge', id }, label, h('b', {}, value), extra || null);
}

function bar(parts, total) {
  const b = h('div', { class: 'bar', role: 'img', 'aria-label': parts.map((p) => p[0] + ' ' + p[1]).join(', ') + ' of ' + total });
  for (const [cls, v] of parts) {
    if (total > 0 && v > 0) b.append(h('span', { class: cls, style: null }));
  }
  // widths through CSSOM (the page's CSP forbids inline style attributes)
  let i = 0;
  for (const [, v] of parts) {
    if (total > 0 && v > 0) b.children[i++].style.width = Math.min(100, (100 * v) / total) + '%';
  }
  return b;
}

async function refreshEngine() {
  if (needKey()) return;
  let e;
  try { e = await api('/v1/engine'); } catch (_) { return; }
  engineState = e;
  const now = performance.now();
  let tps = null;
  if (last && now > last.t) tps = ((e.generated_tokens - last.gen) * 1000) / (now - last.t);
  last = { t: now, gen: e.generated_tokens };
  const m = e.memory;
  const kv = e.kv;
  const el = document.getElementById('engine');
  el.replaceChildren(...[
    gauge('Model', e.model, h('span', {}, e.alive ? 'running' : 'STOPPED')),
    gauge('Memory (resident / plan)', bytes(m.resident_bytes) + ' / ' + bytes(m.planned_bytes),
      bar([[m.resident_bytes > m.budget_bytes ? 'over' : 'used', m.resident_bytes]], m.planned_bytes), 'g-memory'),
    gauge('KV cells used / cached / free', kv.used + ' / ' + kv.cached + ' / ' + kv.free,
      bar([['used', kv.used], ['cached', kv.cached]], kv.total), 'g-kv'),
    gauge('Sequences running / waiting', e.running + ' / ' + e.waiting, h('span', {}, 'queue limit ' + e.max_queue), 'g-seq'),
    gauge('Tokens/s', tps === null ? '–' : tps.toFixed(1), h('span', {}, e.generated_tokens + ' generated'), 'g-tps'),
    e.device ? gauge('Device ' + e.device.name, bytes(e.device.used_bytes) + ' / ' + bytes(e.device.total_bytes),
      bar([['used', e.device.used_bytes]], e.device.total_bytes), 'g-device') : null,
  ].filter(Boolean));
  el.querySelector('#g-kv b').setAttribute('data-used', kv.used);
  const share = document.getElementById('kv-share');
  if (share) share.replaceChildren(...kvShare(share.getAttribute('data-experiment'), parseFloat(share.getAttribute('data-share'))));
}

// An experiment's KV cells now against its quota (max_kv_share of all cells, from its
// definition: an experiment with nothing running has no entry in the engine's state).
function kvShare(name, share) {
  if (!engineState) return ['–'];
  const e = engineState.experiments.find((x) => x.name === name);
  const cells = e ? e.kv_cells : 0;
  const total = engineState.kv.total;
  const quota = finite(share) ? Math.floor(share * total) : null;
  return [
    h('b', { 'data-k': 'kv-cells', 'data-value': cells }, cells + ' of ' + total + ' KV cells (' + pct(total ? cells / total : 0) + ')'),
    ' ', quota !== null ? 'quota ' + quota + ' cells (max_kv_share ' + share + ')' : 'no quota (max_kv_share unset)',
    bar([[quota !== null && cells > quota ? 'over' : 'used', cells]], quota || total),
  ];
}

// ---------- experiments list ----------
async function listPage() {
  const list = await api('/v1/experiments');
  const rows = await Promise.all(list.data.map(async (e) => {
    let r = null;
    try { r = await api('/v1/experiments/' + encodeURIComponent(e.name) + '/results'); } catch (_) { r = null; }
    return [e, r];
  }));
  const table = h('table', { id: 'experiments' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Experiment'), h('th', {}, 'Status'), h('th', {}, 'Traffic split'),
      h('th', { class: 'num' }, 'Units'), h('th', {}, 'Sample ratio'))),
    h('tbody', {}, rows.map(([e, r]) => {
      const total = e.variants.reduce((a, v) => a + v.weight, 0) || 1;
      const units = r ? r.variants.reduce((a, v) => a + v.units, 0) : null;
      const srm = r && r.srm ? (r.srm.mismatch ? h('span', { class: 'mismatch' }, 'MISMATCH (p ' + num(r.srm.p_value) + ')') : h('span', { class: 'ok' }, 'ok')) : h('span', { class: 'muted' }, 'n/a');
      return h('tr', { 'data-experiment': e.name },
        h('td', {}, h('a', { href: '#/e/' + encodeURIComponent(e.name) }, e.name)),
        h('td', {}, h('span', { class: 'badge ' + e.status }, e.status)),
        h('td', {}, e.variants.map((v) => v.id + ' ' + pct(v.weight / total, 3)).join(' · ')),
        cell('units', units, (x) => (finite(x) ? String(x) : '–')),
        h('td', {}, srm));
    })));
  main().replaceChildren(
    h('h1', {}, 'Experiments'),
    list.data.length ? h('div', { class: 'card scroll' }, table)
      : h('p', { class: 'card' }, 'No experiments yet.', isAdmin() ? [' ', h('a', { href: '#/new' }, 'Create one'), '.'] : null));
}

// ---------- an experiment ----------
function pickMetric(results, wanted) {
  const metrics = Object.keys(results.variants[0] ? results.variants[0].metrics : {});
  if (wanted && metrics.includes(wanted)) return wanted;
  return metrics.find((m) => !AUTOMATIC.includes(m)) || metrics[0] || null;
}

// Per variant the metric's summary (a table), then per treatment its comparison with control
// (a card each: readable at phone width without scrolling).
function metricSection(r, metric) {
  const multi = r.comparisons > 1;
  const summary = h('table', { id: 'metric-table', 'data-metric': metric },
    h('thead', {}, h('tr', {}, ['Variant', 'Units', 'n', 'Mean', '95% CI'].map((t, i) => h('th', { class: i > 0 ? 'num' : null }, t)))),
    h('tbody', {}, r.variants.map((v) => {
      const m = v.metrics[metric];
      const sm = m ? m.summary : { n: 0 };
      return h('tr', { 'data-variant': v.id },
        h('td', {}, v.id, v.is_control ? h('span', { class: 'muted' }, ' (control)') : null),
        cell('units', v.units, String), cell('n', sm.n, String), cell('mean', sm.mean),
        h('td', { class: 'num', 'data-k': 'ci' }, '[' + num(sm.ci_low) + ', ' + num(sm.ci_high) + ']'));
    })));
  const stat = (label, key, value, text, cls) => [h('dt', {}, label),
    h('dd', { 'data-k': key, 'data-value': finite(value) ? value : '', class: cls || null }, text)];
  const cards = r.variants.filter((v) => !v.is_control).map((v) => {
    const m = v.metrics[metric];
    if (!m || !m.sequential) {
      return h('div', { class: 'compare', 'data-variant': v.id }, h('h3', {}, v.id + ' vs ' + r.control), h('p', { class: 'muted' }, 'Not enough data to compare yet.'));
    }
    const seq = m.sequential, fx = m.vs_control, b = m.bayesian, adj = m.adjusted, cu = m.cuped;
    // the metric's direction (`[[experiment.metrics]]`): where lower is better, lower wins
    const lower = m.definition && m.definition.direction === 'lower';
    const side = seq.ci_low > 0 ? 'higher' : seq.ci_high < 0 ? 'lower' : null;
    const called = side === null ? null : (side === 'lower') === !!lower ? 'win' : 'lose';
    const verdict = side === null ? 'no difference shown yet' : side + ' than control (' + (called === 'win' ? 'better' : 'worse') + (lower ? ', lower is better' : '') + ')';
    return h('div', { class: 'compare', 'data-variant': v.id },
      h('h3', {}, v.id + ' vs ' + r.control + ': ', h('span', { class: called || 'muted', 'data-k': 'verdict' }, verdict)),
      h('dl', {},
        stat('Δ (treatment − control)', 'diff', seq.diff, signed(seq.diff)),
        h('dt', {}, 'Sequential 95% (always valid)'),
        h('dd', { 'data-k': 'seq', 'data-low': seq.ci_low, 'data-high': seq.ci_high, class: called || null }, '[' + num(seq.ci_low) + ', ' + num(seq.ci_high) + ']'),
        stat('Always-valid p', 'seq-p', seq.p_value, num(seq.p_value)),
        fx ? stat('Fixed-horizon p (valid once)', 'p', fx.p_value, num(fx.p_value)) : null,
        fx ? h('dt', {}, 'Fixed-horizon 95% CI') : null,
        fx ? h('dd', { 'data-k': 'fixed-ci' }, '[' + num(fx.ci_low) + ', ' + num(fx.ci_high) + ']') : null,
        b ? stat('Chance to beat control', 'ctw', b.chance_to_beat_control, pct(b.chance_to_beat_control)) : null,
        b ? stat('Uplift [95% credible]', 'uplift', b.uplift, signed(b.uplift, pct) + ' [' + pct(b.ci_low) + ', ' + pct(b.ci_high) + ']') : null,
        b ? stat('Risk (expected loss)', 'risk', b.risk_treatment, pct(b.risk_treatment)) : null,
        // CUPED (a metric defined with cuped = true): the adjusted read-out beside the plain one
        cu && cu.vs_control ? h('dt', {}, 'CUPED 95% CI (fixed horizon)') : null,
        cu && cu.vs_control ? h('dd', { 'data-k': 'cuped-ci', 'data-low': cu.vs_control.ci_low, 'data-high': cu.vs_control.ci_high }, '[' + num(cu.vs_control.ci_low) + ', ' + num(cu.vs_control.ci_high) + '], p = ' + num(cu.vs_control.p_value)) : null,
        cu ? stat('CUPED variance reduction', 'cuped-reduction', cu.variance_reduction, pct(cu.variance_reduction) + ' (θ = ' + num(cu.theta) + ')') : null,
        multi && adj ? stat('Holm-adjusted p', 'holm', adj.holm, num(adj.holm)) : null,
        multi && adj ? stat('BH-adjusted p', 'bh', adj.bh, num(adj.bh)) : null));
  });
  return h('div', { id: 'metric' }, h('div', { class: 'scroll' }, summary), h('div', { class: 'compares' }, cards));
}

// What a variant runs under besides the default model: another model (by id), its LoRA
// adapters (file names with scales); and whether a guardrail stopped it.
function variantNote(v) {
  const notes = [];
  if (v.model) notes.push(h('span', { class: 'muted model' }, ' (model: ' + v.model + ')'));
  if (v.adapters && v.adapters.length) {
    const names = v.adapters.map((a) => a.path.split('/').pop() + (a.scale === 1 ? '' : ' ×' + a.scale));
    notes.push(h('span', { class: 'muted adapters' }, ' (adapters: ' + names.join(', ') + ')'));
  }
  // stopped by a guardrail: by which metric, at how many units, with which p-value
  if (v.state === 'stopped' && v.stopped) {
    const st = v.stopped;
    notes.push(h('span', { class: 'stopped lose', 'data-metric': st.metric },
      ' stopped by guardrail ' + st.metric + ' at ' + st.units + ' units (Δ ' + num(st.diff) + ', always-valid [' + num(st.ci_low) + ', ' + num(st.ci_high) + '], p = ' + num(st.p_value) + ')'));
  }
  return notes.length ? notes : null;
}

// A bandit's arms: the period-weighted estimate of the decision metric, the chance of being
// best and the weight now, and the cost per unit where answers have a price (a secondary
// read-out); its winner once named.
function banditTable(b) {
  const winner = b.winner
    ? h('p', { id: 'bandit-winner', class: 'win', 'data-variant': b.winner.variant }, 'Winner: ' + b.winner.variant + ' at ' + b.winner.units + ' units; every unit gets it now.')
    : h('p', { id: 'bandit-winner', class: 'muted' }, 'No winner yet (' + b.periods + ' weight updates).');
  const costed = b.arms.some((a) => a.cost);
  const heads = ['Variant', b.decision_metric + ' (period-weighted)', 'Units', 'Chance best', 'Weight'].concat(costed ? ['Cost per unit'] : []);
  return h('div', { id: 'bandit' }, winner, h('div', { class: 'scroll' }, h('table', {},
    h('thead', {}, h('tr', {}, heads.map((t) => h('th', {}, t)))),
    h('tbody', {}, b.arms.map((a) => h('tr', { 'data-variant': a.variant },
      h('td', {}, a.variant), h('td', { class: 'num' }, num(a.mean)), h('td', { class: 'num' }, String(a.units)),
      h('td', { class: 'num', 'data-k': 'chance-best' }, pct(a.chance_best)), h('td', { class: 'num', 'data-k': 'weight' }, pct(a.weight)),
      costed ? h('td', { class: 'num', 'data-k': 'cost' }, a.cost ? num(a.cost.mean, 6) : '—') : null))))));
}

// Per variant: the model it runs on (its `model`, a local one or one served elsewhere, else the
// default), then how it is served.
function performanceTable(r, e) {
  const mean = (v, k) => (v.metrics[k] ? v.metrics[k].summary.mean : null);
  const model = (id) => ((e.variants.find((x) => x.id === id) || {}).model || 'default');
  return h('table', { id: 'performance' },
    h('thead', {}, h('tr', {}, ['Variant', 'Model', 'Exposures', 'Latency ms (mean)', 'TTFT ms (mean)', 'Output tokens (mean)', 'Cost (mean)', 'Error rate']
      .map((t, i) => h('th', { class: i > 1 ? 'num' : null }, t)))),
    h('tbody', {}, r.variants.map((v) => h('tr', { 'data-variant': v.id },
      h('td', {}, v.id, variantNote(v)), h('td', { 'data-k': 'model' }, model(v.id)), cell('exposures', v.exposures, String), cell('latency', mean(v, 'latency_ms')),
      cell('ttft', mean(v, 'ttft_ms')), cell('tokens', mean(v, 'output_tokens')), cell('cost', mean(v, 'cost'), (x) => num(x, 6)),
      cell('errors', mean(v, 'error'), (x) => pct(x))))));
}

// The estimate of treatment − control over units, with its always-valid sequence (band) and
// the fixed-horizon interval (dashed), for one variant and metric.
function chart(history, metric, variant) {
  const pts = history.points.map((p) => {
    const v = p.results.variants.find((x) => x.id === variant);
    const m = v && v.metrics[metric];
    return { u: p.units, seq: m && m.sequential, fx: m && m.vs_control };
  }).filter((p) => p.seq);
  if (pts.length < 2) return h('p', { class: 'muted', id: 'chart' }, 'The chart appears once there are two points with data in both variants.');
  const W = Math.round(Math.max(320, Math.min(760, main().clientWidth - 40))), H = 260, L = 56, R = 12, T = 12, B = 34;
  const xs = pts.map((p) => p.u);
  // the y range of the later four fifths: the first looks' intervals are very wide and would
  // flatten the rest (what falls outside is clipped)
  const ys = pts.slice(Math.floor(pts.length / 5)).flatMap((p) => [p.seq.ci_low, p.seq.ci_high, p.fx ? p.fx.ci_low : p.seq.diff, p.fx ? p.fx.ci_high : p.seq.diff, 0]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const X = (u) => L + ((u - x0) / (x1 - x0 || 1)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const path = (f) => pts.map((p, i) => (i ? 'L' : 'M') + X(p.u).toFixed(1) + ' ' + Y(f(p)).toFixed(1)).join(' ');
  const band = path((p) => p.seq.ci_high) + ' ' + pts.slice().reverse().map((p) => 'L' + X(p.u).toFixed(1) + ' ' + Y(p.seq.ci_low).toFixed(1)).join(' ') + ' Z';
  const fixed = pts.filter((p) => p.fx);
  const fpath = (f) => fixed.map((p, i) => (i ? 'L' : 'M') + X(p.u).toFixed(1) + ' ' + Y(f(p)).toFixed(1)).join(' ');
  const ticks = [y0, (y0 + y1) / 2, y1];
  return h('figure', { id: 'chart' },
    s('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${metric}: ${variant} minus control over units` },
      s('defs', {}, s('clipPath', { id: 'plot' }, s('rect', { x: L, y: T, width: W - L - R, height: H - T - B }))),
      s('g', { 'clip-path': 'url(#plot)' },
        s('path', { class: 'band', d: band }),
        fixed.length > 1 ? s('path', { class: 'fixed', d: fpath((p) => p.fx.ci_low) }) : null,
        fixed.length > 1 ? s('path', { class: 'fixed', d: fpath((p) => p.fx.ci_high) }) : null,
        s('line', { class: 'zero', x1: L, x2: W - R, y1: Y(0), y2: Y(0) }),
        s('path', { class: 'est', d: path((p) => p.seq.diff) })),
      s('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B }),
      s('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }),
      ticks.map((t) => s('text', { x: L - 6, y: Y(t) + 4, 'text-anchor': 'end' }, num(t, 3))),
      [x0, x1].map((u) => s('text', { x: X(u), y: H - B + 16, 'text-anchor': 'middle' }, String(u))),
      s('text', { x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle' }, 'units')),
    h('figcaption', { class: 'legend' }, variant + ' − control, ' + metric + ':',
      h('i', { class: 'lg-est' }), 'estimate', h('i', { class: 'lg-band' }), 'sequential 95% (valid at every look)',
      h('i', { class: 'lg-fixed' }), 'fixed-horizon 95% (valid once)'));
}

function exposuresTable(list) {
  return h('table', { id: 'exposures' },
    h('thead', {}, h('tr', {}, ['Time', 'Unit', 'Variant', 'Class', 'Latency ms', 'TTFT ms', 'Tokens', 'Cost', 'Error'].map((t, i) => h('th', { class: i > 3 ? 'num' : null }, t)))),
    h('tbody', {}, list.map((x) => h('tr', {},
      h('td', {}, new Date(x.at * 1000).toLocaleTimeString()),
      h('td', {}, x.unit), h('td', {}, x.variant, x.forced ? h('span', { class: 'muted' }, ' (forced)') : null),
      h('td', { 'data-k': 'class' }, x.service_tier || '–'),
      cell('latency', x.latency_ms), cell('ttft', x.ttft_ms), cell('tokens', x.output_tokens, (t) => (finite(t) ? String(t) : '–')),
      cell('cost', x.cost, (c) => num(c, 6)),
      h('td', { class: 'num ' + (x.error ? 'error' : '') }, x.error || '')))));
}

async function setStatus(e, status) {
  const next = Object.assign({}, e, { status });
  await api('/v1/experiments/' + encodeURIComponent(e.name), { method: 'PUT', body: JSON.stringify(next) });
}

function weightsForm(e, onSaved) {
  const inputs = e.variants.map((v) => h('input', { type: 'number', min: '0', step: 'any', value: v.weight, 'aria-label': 'weight of ' + v.id, 'data-variant': v.id }));
  const msg = h('div', { role: 'status' }, flash ? h('p', { class: 'notice' }, flash) : null);
  flash = null;
  return h('form', { id: 'weights', on: { submit: async (ev) => {
    ev.preventDefault();
    const next = JSON.parse(JSON.stringify(e));
    next.variants.forEach((v, i) => { v.weight = Number(inputs[i].value); });
    try {
      await api('/v1/experiments/' + encodeURIComponent(e.name), { method: 'PUT', body: JSON.stringify(next) });
      flash = 'Weights saved.';
      onSaved();
    } catch (err) { msg.replaceChildren(h('p', { class: 'failure' }, err.message)); }
  } } },
  h('p', { class: 'notice' }, 'Changing weights mid-experiment biases results: units that arrive after the change ',
    'are split differently from those before, so time effects mix with variant effects, and the sample-ratio check ',
    'compares against the new weights. Prefer stopping this experiment and starting a new one.'),
  h('div', { class: 'row' }, e.variants.map((v, i) => h('label', {}, v.id + ' ', inputs[i])), h('button', { type: 'submit', class: 'secondary' }, 'Save weights')),
  msg);
}

let chosen = { metric: null, variant: null };
let flash = null; // a message for the next rendering of the page (e.g. after saving weights)

async function experimentPage(name) {
  const path = '/v1/experiments/' + encodeURIComponent(name);
  const [e, r, hist, exp] = await Promise.all([api(path), api(path + '/results'), api(path + '/history?points=30'), api(path + '/exposures?limit=20')]);
  const metric = pickMetric(r, chosen.metric);
  const treatments = r.variants.filter((v) => !v.is_control).map((v) => v.id);
  const variant = treatments.includes(chosen.variant) ? chosen.variant : treatments[0];
  const rerender = () => experimentPage(name).catch(failure);
  const metricSelect = h('select', { id: 'metric', 'aria-label': 'metric', on: { change: (ev) => { chosen.metric = ev.target.value; rerender(); } } },
    Object.keys(r.variants[0].metrics).map((m) => h('option', { value: m, selected: m === metric }, m)));
  const variantSelect = h('select', { id: 'chart-variant', 'aria-label': 'variant in the chart', on: { change: (ev) => { chosen.variant = ev.target.value; rerender(); } } },
    treatments.map((v) => h('option', { value: v, selected: v === variant }, v)));
  const actions = !isAdmin() ? null : h('div', { class: 'row', id: 'actions' },
    e.status !== 'running' ? h('button', { type: 'button', on: { click: () => setStatus(e, 'running').then(rerender, failure) } }, e.status === 'paused' ? 'Resume' : 'Restart') : null,
    e.status === 'running' ? h('button', { type: 'button', class: 'secondary', on: { click: () => setStatus(e, 'paused').then(rerender, failure) } }, 'Pause') : null,
    e.status !== 'stopped' ? h('button', { type: 'button', class: 'secondary', on: { click: () => setStatus(e, 'stopped').then(rerender, failure) } }, 'Stop') : null);
  const srm = r.srm ? h('p', { id: 'srm', class: r.srm.mismatch ? 'mismatch' : 'ok' },
    'Sample ratio check: χ² ' + num(r.srm.chi2) + ', p ' + num(r.srm.p_value) + (r.srm.mismatch ? ' — MISMATCH: the split differs from the weights; check assignment and logging before reading results.' : ' — ok'))
    : h('p', { id: 'srm', class: 'muted' }, 'Sample ratio check: not enough units yet.');
  main().replaceChildren(
    h('h1', {}, name, ' ', h('span', { class: 'badge ' + e.status, id: 'status' }, e.status),
      e.samples ? [' ', h('a', { href: '#/review/' + encodeURIComponent(name), id: 'review-link', class: 'muted' }, 'review samples')] : null),
    h('div', { class: 'card' }, actions, srm,
      h('p', { class: 'muted', id: 'analysis' }, 'Control: ' + r.control + '. One observation per ' + (r.analysis || 'unit') +
        (r.analysis === 'request' ? ' (requests of one unit are not independent: read with care)' : ' (a unit\'s latency, tokens and errors are the mean over its requests)') +
        '. Intervals at ' + pct(1 - r.alpha, 3) + '. Sequential intervals stay valid however often you look (tuning: ' + r.sequential_tuning + ' units). ' +
        (r.comparisons > 1 ? r.comparisons + ' comparisons: Holm and Benjamini–Hochberg adjusted p-values are shown.' : ''))),
    h('div', { class: 'card' }, h('h2', {}, 'Metric ', metricSelect), metricSection(r, metric),
      h('p', { class: 'muted' }, 'Chance to beat control, uplift and risk assume higher is better; for latency, errors or cost read them the other way.')),
    treatments.length ? h('div', { class: 'card' }, h('h2', {}, 'Over time ', variantSelect), chart(hist, metric, variant)) : null,
    r.bandit ? h('div', { class: 'card' }, h('h2', {}, 'Bandit'), banditTable(r.bandit)) : null,
    h('div', { class: 'card' }, h('h2', {}, 'Serving per variant'), h('div', { class: 'scroll' }, performanceTable(r, e))),
    h('div', { class: 'card' }, h('h2', {}, 'KV cache share'), h('p', { id: 'kv-share', 'data-experiment': name, 'data-share': e.max_kv_share }, kvShare(name, e.max_kv_share))),
    isAdmin() ? h('div', { class: 'card' }, h('h2', {}, 'Weights'), weightsForm(e, rerender)) : null,
    h('div', { class: 'card' }, h('h2', {}, 'Recent exposures'), h('p', { class: 'muted' }, e.samples ? 'Prompts and answers of sampled units are on the review page.' : 'Prompts and answers are not stored for this experiment (it has no [experiment.samples]).'),
      h('div', { class: 'scroll' }, exposuresTable(exp.exposures))));
}

// ---------- create ----------
function variantFields(i) {
  const f = (label, name, type, extra) => h('label', {}, label, h('input', Object.assign({ name: `v${i}.${name}`, type: type || 'text' }, extra || {})));
  return h('fieldset', { class: 'variant' }, h('legend', {}, 'Variant ' + (i + 1)),
    h('div', { class: 'grid2' },
      f('Id', 'id', 'text', { required: true, value: i === 0 ? 'control' : 'treatment' + (i > 1 ? i : '') }),
      f('Weight', 'weight', 'number', { min: '0', step: 'any', value: '1' }),
      f('System prompt', 'system'),
      f('Template (use {{ input }})', 'template', 'text', { value: '{{ input }}' }),
      f('Temperature', 'temperature', 'number', { min: '0', max: '2', step: 'any' }),
      f('Max tokens', 'max_tokens', 'number', { min: '1', step: '1' })));
}

function fromForm(form) {
  const d = new FormData(form);
  const e = { name: String(d.get('name') || '').trim(), variants: [] };
  if (d.get('max_kv_share')) e.max_kv_share = Number(d.get('max_kv_share'));
  for (let i = 0; d.has(`v${i}.id`); i++) {
    const v = { id: String(d.get(`v${i}.id`)).trim(), weight: Number(d.get(`v${i}.weight`) || 1) };
    if (d.get(`v${i}.system`)) v.system = String(d.get(`v${i}.system`));
    if (d.get(`v${i}.template`)) v.template = String(d.get(`v${i}.template`));
    if (d.get(`v${i}.temperature`)) v.temperature = Number(d.get(`v${i}.temperature`));
    if (d.get(`v${i}.max_tokens`)) v.max_tokens = Number(d.get(`v${i}.max_tokens`));
    e.variants.push(v);
  }
  return e;
}

async function create(def, msg, type) {
  try {
    const made = await api('/v1/experiments', { method: 'POST', body: type ? def : JSON.stringify(def), type });
    location.hash = '#/e/' + encodeURIComponent(made.name);
  } catch (err) { msg.replaceChildren(h('p', { class: 'failure', role: 'alert' }, err.message)); }
}

function newPage() {
  const msg = h('div', { id: 'create-result' });
  const variants = h('div', {}, variantFields(0), variantFields(1));
  const form = h('form', { id: 'create-form', class: 'card', on: { submit: (ev) => { ev.preventDefault(); create(fromForm(form), msg); } } },
    h('h2', {}, 'From a form'),
    h('div', { class: 'grid2' },
      h('label', {}, 'Name', h('input', { name: 'name', required: true, pattern: '[A-Za-z0-9._\\-]{1,64}', autocomplete: 'off' })),
      h('label', {}, 'Max KV share (optional, 0-1)', h('input', { name: 'max_kv_share', type: 'number', min: '0', max: '1', step: 'any' }))),
    variants,
    h('div', { class: 'row' },
      h('button', { type: 'button', class: 'secondary', on: { click: () => variants.append(variantFields(variants.children.length)) } }, 'Add variant'),
      h('button', { type: 'submit' }, 'Create experiment')));
  const text = h('textarea', { id: 'definition', 'aria-label': 'experiment definition, TOML or JSON', spellcheck: 'false' },
    'name = "my-experiment"\n\n[[variants]]\nid = "control"\nsystem = "Be brief."\n\n[[variants]]\nid = "friendly"\nsystem = "Be warm."\n');
  const pasted = h('form', { id: 'paste-form', class: 'card', on: { submit: (ev) => {
    ev.preventDefault();
    // JSON starts with '{'; anything else goes to the server as TOML, which checks it
    if (text.value.trim().startsWith('{')) {
      let def;
      try { def = JSON.parse(text.value); } catch (err) { msg.replaceChildren(h('p', { class: 'failure', role: 'alert' }, 'Not JSON: ' + err.message)); return; }
      create(def, msg);
    } else {
      create(text.value, msg, 'application/toml');
    }
  } } }, h('h2', {}, 'Or paste a definition (TOML as in experiments files, or JSON)'), text, h('button', { type: 'submit' }, 'Create from definition'));
  main().replaceChildren(h('h1', {}, 'New experiment'),
    h('p', { class: 'muted' }, 'Checked by the same rules as POST /v1/experiments: the server validates names, weights and templates.'),
    msg, form, pasted);
}

// ---------- routing ----------
// The page refreshes its data only while nothing in it has the focus, so a keyboard user's
// place (or a half-typed weight) is never thrown away.
function idle() {
  const a = document.activeElement;
  return !a || a === document.body || a === main() || !main().contains(a);
}

// Who the key is, shown in the header; the links and pages its role may not use are left out.
async function identify() {
  if (who) return;
  who = await api('/v1/me');
  const el = document.getElementById('who');
  el.replaceChildren(who ? h('span', { 'data-role': who.role }, who.name + ' (' + who.role + ')') : '',
    config.auth_required ? h('button', { type: 'button', class: 'secondary', id: 'change-key', on: { click: () => { sessionStorage.removeItem(KEY); who = null; showKeyForm(); } } }, 'Change key') : null);
  document.getElementById('new-link').hidden = !isAdmin();
}

function inferenceOnly() {
  main().replaceChildren(h('div', { class: 'card', id: 'no-access' }, h('h2', {}, 'Nothing to show for this key'),
    h('p', {}, 'The key ' + who.name + ' has the role inference: it may call models and post events, not read experiments. Use a reviewer or admin key.')));
}

async function route() {
  stopTimers();
  if (needKey()) { showKeyForm(); return; }
  const hash = location.hash || '#/';
  try {
    await identify();
    if (who && who.role === 'inference') { inferenceOnly(); return; }
    if (hash.startsWith('#/review/')) {
      await reviewPage(decodeURIComponent(hash.slice(9)));
    } else if (hash.startsWith('#/e/')) {
      const name = decodeURIComponent(hash.slice(4));
      await experimentPage(name);
      timers.push(setInterval(() => { if (idle()) experimentPage(name).catch(failure); }, 5000));
    } else if (hash === '#/new' && isAdmin()) {
      newPage();
    } else {
      await listPage();
      timers.push(setInterval(() => { if (idle()) listPage().catch(failure); }, 5000));
    }
  } catch (e) { failure(e); }
  timers.push(setInterval(refreshEngine, 1000));
  refreshEngine();
}

async function start() {
  try {
    const r = await fetch('/dashboard/config.json');
    config = await r.json();
  } catch (_) { config = { auth_required: false }; }
  window.addEventListener('hashchange', route);
  route();
}

// after every deferred script (review.js) has run
document.addEventListener('DOMContentLoaded', start);
