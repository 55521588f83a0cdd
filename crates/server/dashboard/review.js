// abserve's review page: an experiment's sampled conversations (GET /v1/experiments/NAME/samples),
// filtered by variant, error, finish reason, guardrail stop, review state, an event metric's value
// and text; fan-out inputs side by side, one column per variant (promptfoo's matrix); a rating
// (thumbs, 1-5, a label, a comment) posted to .../samples/ID/review, which records it as events of
// the sample's unit. Keyboard: j / k next / previous, u / d thumbs up / down, 1-5 score,
// l label, c comment, / search. "Evaluate" replays the samples the filters select over every
// variant in the server (POST .../evals, judged pairwise by a model of the registry when one is
// chosen) and lists the runs with their HTML reports. Uses app.js's helpers (h, api, main,
// failure); text nodes only.
'use strict';

const reviewFilters = { variant: '', error: '', finish_reason: '', reviewed: '', q: '', metric: '', min: '', max: '', stopped: false, matrix: false };
let reviewName = null;
let evalTimer = null;

function reviewQuery() {
  const p = new URLSearchParams({ limit: '200' });
  for (const k of ['variant', 'error', 'finish_reason', 'reviewed', 'q', 'metric', 'min', 'max']) {
    if (reviewFilters[k] !== '') p.set(k, reviewFilters[k]);
  }
  return p.toString();
}

function reviewText(r) {
  if (!r) return 'not rated';
  const parts = [];
  if (r.thumbs === true) parts.push('▲ up');
  if (r.thumbs === false) parts.push('▼ down');
  if (r.score) parts.push(r.score + '/5');
  if (r.label) parts.push(r.label);
  if (r.comment) parts.push('“' + r.comment + '”');
  return parts.join(' · ') + (r.by ? ' — ' + r.by : '');
}

// One rating change (the server keeps the rest of the review); a sample's changes are sent one
// after another, in the order they were made.
function rate(s, body, card) {
  s.pending = (s.pending || Promise.resolve()).then(() => send(s, body, card));
  return s.pending;
}

async function send(s, body, card) {
  const path = '/v1/experiments/' + encodeURIComponent(reviewName) + '/samples/' + s.id + '/review';
  try {
    const saved = await api(path, { method: 'POST', body: JSON.stringify(body) });
    s.review = saved.review;
    const out = card.querySelector('[data-k=review]');
    out.textContent = reviewText(saved.review);
    out.dataset.value = JSON.stringify(saved.review);
  } catch (e) {
    card.querySelector('[data-k=review]').textContent = 'not saved: ' + e.message;
  }
}

function conversation(s) {
  const msgs = (s.request && s.request.messages) || [];
  const lines = msgs.map((m) => h('div', { class: 'msg ' + m.role }, h('b', {}, m.role), ' ', m.content));
  if (s.request && s.request.prompt !== undefined) lines.push(h('div', { class: 'msg user' }, h('b', {}, 'prompt'), ' ', s.request.prompt));
  lines.push(h('div', { class: 'msg answer' }, h('b', {}, 'answer'), ' ', (s.response && s.response.text) || '',
    s.response && s.response.tool_calls ? h('code', {}, ' ' + JSON.stringify(s.response.tool_calls)) : null));
  return h('div', { class: 'conversation' }, lines);
}

function ratingControls(s, card, labels) {
  const score = [1, 2, 3, 4, 5].map((n) => h('button', { type: 'button', class: 'secondary', 'aria-label': 'score ' + n, on: { click: () => rate(s, { score: n }, card) } }, String(n)));
  const label = h('select', { 'aria-label': 'label', 'data-k': 'label', on: { change: (ev) => rate(s, { label: ev.target.value }, card) } },
    h('option', { value: '' }, 'label…'), labels.map((l) => h('option', { value: l, selected: s.review && s.review.label === l }, l)));
  const comment = h('input', { type: 'text', 'aria-label': 'comment', 'data-k': 'comment', placeholder: 'comment (Enter saves)', value: (s.review && s.review.comment) || '',
    on: { keydown: (ev) => { if (ev.key === 'Enter') { ev.preventDefault(); rate(s, { comment: ev.target.value }, card); ev.target.blur(); } } } });
  return h('div', { class: 'row rating' },
    h('button', { type: 'button', class: 'secondary', 'aria-label': 'thumbs up', on: { click: () => rate(s, { thumbs: true }, card) } }, '▲'),
    h('button', { type: 'button', class: 'secondary', 'aria-label': 'thumbs down', on: { click: () => rate(s, { thumbs: false }, card) } }, '▼'),
    score, labels.length ? label : null, comment,
    h('span', { 'data-k': 'review', class: 'muted', 'data-value': s.review ? JSON.stringify(s.review) : '' }, reviewText(s.review)));
}

function sampleCard(s, labels) {
  const card = h('article', { class: 'card sample', tabindex: '0', 'data-id': s.id, 'data-unit': s.unit, 'data-variant': s.variant });
  card.sample = s;
  build(card, {}, [
    h('div', { class: 'row muted' }, h('span', { class: 'badge' }, s.variant),
      [s.unit ? 'unit ' + s.unit : 'fan-out input', new Date(s.at * 1000).toLocaleString(), 'finish: ' + (s.finish_reason || '–'),
        (s.output_tokens ?? '–') + ' tokens', finite(s.latency_ms) ? num(s.latency_ms) + ' ms' : null].filter(Boolean).map((t) => h('span', {}, t)),
      s.error ? h('span', { class: 'error' }, s.error) : null),
    conversation(s), ratingControls(s, card, labels)]);
  return card;
}

function matrix(samples, variants) {
  const inputs = new Map();
  for (const s of samples) {
    if (!s.input_id) continue;
    if (!inputs.has(s.input_id)) inputs.set(s.input_id, { input: (s.request && s.request.input) || '', by: {} });
    inputs.get(s.input_id).by[s.variant] = s;
  }
  if (!inputs.size) return h('p', { class: 'muted' }, 'No fan-out inputs sampled yet.');
  return h('div', { class: 'scroll' }, h('table', { id: 'matrix' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Input'), variants.map((v) => h('th', { 'data-variant': v }, v)))),
    h('tbody', {}, [...inputs.entries()].map(([id, row]) => h('tr', { 'data-input': id },
      h('td', { class: 'wrap' }, row.input),
      variants.map((v) => {
        const s = row.by[v];
        if (!s) return h('td', { class: 'muted' }, '–');
        const cell = h('td', { class: 'wrap', 'data-variant': v });
        build(cell, {}, [(s.response && s.response.text) || h('span', { class: 'error' }, s.error || ''),
          h('div', { class: 'row' },
            h('button', { type: 'button', class: 'secondary', 'aria-label': 'thumbs up for ' + v, on: { click: () => rate(s, { thumbs: true }, cell) } }, '▲'),
            h('button', { type: 'button', class: 'secondary', 'aria-label': 'thumbs down for ' + v, on: { click: () => rate(s, { thumbs: false }, cell) } }, '▼'),
            h('span', { 'data-k': 'review', class: 'muted' }, reviewText(s.review)))]);
        return cell;
      }))))));
}

function reviewForm(e, rerender) {
  const f = reviewFilters;
  const sel = (key, label, options) => h('label', {}, label, h('select', { name: key }, options.map(([v, t]) => h('option', { value: v, selected: f[key] === v }, t))));
  const text = (key, label, extra) => h('label', {}, label, h('input', Object.assign({ name: key, value: f[key] }, extra || {})));
  const check = (key, label) => h('label', { class: 'check' }, h('input', { type: 'checkbox', name: key, checked: f[key] }), ' ' + label);
  const form = h('form', { id: 'review-filters', class: 'card', on: { submit: (ev) => {
    ev.preventDefault();
    const d = new FormData(form);
    for (const k of ['variant', 'error', 'finish_reason', 'reviewed', 'q', 'metric', 'min', 'max']) f[k] = String(d.get(k) || '');
    f.stopped = d.get('stopped') === 'on';
    f.matrix = d.get('matrix') === 'on';
    rerender();
  } } },
  h('div', { class: 'grid2' },
    sel('variant', 'Variant', [['', 'any'], ...e.variants.map((v) => [v.id, v.id + (v.stopped ? ' (stopped by a guardrail)' : '')])]),
    sel('error', 'Error', [['', 'any'], ['true', 'errors only'], ['false', 'no error']]),
    sel('finish_reason', 'Finish reason', [['', 'any'], ['stop', 'stop'], ['length', 'length'], ['tool_calls', 'tool_calls']]),
    sel('reviewed', 'Reviewed', [['', 'any'], ['false', 'not yet'], ['true', 'rated']]),
    text('q', 'Text contains', { type: 'search', id: 'review-q' }),
    text('metric', 'Unit metric (e.g. thumbs_up)'),
    text('min', 'Metric at least', { type: 'number', step: 'any' }),
    text('max', 'Metric at most', { type: 'number', step: 'any' })),
  h('div', { class: 'row' }, check('stopped', 'Variants stopped by a guardrail only'), check('matrix', 'Fan-out inputs side by side'),
    h('button', { type: 'submit' }, 'Filter')));
  return form;
}

// the review filters the server applies (the stopped-variants box is the page's own)
function evalFilter(limit) {
  const f = { limit: Number(limit) };
  for (const k of ['variant', 'finish_reason', 'q', 'metric']) if (reviewFilters[k] !== '') f[k] = reviewFilters[k];
  for (const k of ['error', 'reviewed']) if (reviewFilters[k] !== '') f[k] = reviewFilters[k] === 'true';
  for (const k of ['min', 'max']) if (reviewFilters[k] !== '') f[k] = Number(reviewFilters[k]);
  return f;
}

async function openReport(path) {
  const html = await api(path, { text: true });
  window.open(URL.createObjectURL(new Blob([html], { type: 'text/html' })), '_blank');
}

function runRow(name, r) {
  const s = r.summary;
  const variants = s ? s.variants.map((v) => v.id + ': ' + v.answered + ' answered' + (v.errors ? ', ' + v.errors + ' failed' : '')).join('; ') : '';
  const judge = s && s.judge_agreement != null ? 'judge agreed with itself across orders on ' + num(100 * s.judge_agreement) + '% of pairs' : '';
  const report = '/v1/experiments/' + encodeURIComponent(name) + '/evals/' + r.id + '/report';
  return h('tr', { 'data-run': r.id, 'data-status': r.status },
    h('td', {}, '#' + r.id), h('td', { 'data-k': 'status' }, r.status), h('td', { class: 'num' }, r.rows),
    h('td', {}, r.who), h('td', { class: 'wrap' }, [variants, judge, r.error].filter(Boolean).join(' · ')),
    h('td', {}, r.status === 'done' ? h('button', { type: 'button', class: 'secondary', on: { click: () => openReport(report).catch(failure) } }, 'report') : ''));
}

async function evalRuns(name, el) {
  const runs = await api('/v1/experiments/' + encodeURIComponent(name) + '/evals?limit=10');
  el.replaceChildren(runs.data.length ? h('table', { id: 'eval-runs' },
    h('thead', {}, h('tr', {}, ['run', 'status', 'rows', 'by', 'outcome', ''].map((t) => h('th', {}, t)))),
    h('tbody', {}, runs.data.map((r) => runRow(name, r)))) : h('p', { class: 'muted' }, 'No eval run yet.'));
  return runs.data.some((r) => r.status === 'running');
}

function evalCard(name, models) {
  const out = h('div', { id: 'eval-list' });
  const note = h('p', { class: 'muted', id: 'eval-note' });
  // while a run is running its row is refreshed every second (only on this page)
  const poll = async () => {
    clearInterval(evalTimer);
    if (!(await evalRuns(name, out))) return;
    evalTimer = setInterval(async () => {
      const here = location.hash === '#/review/' + encodeURIComponent(name) && document.body.contains(out);
      if (!here || !(await evalRuns(name, out).catch(() => false))) clearInterval(evalTimer);
    }, 1000);
  };
  const form = h('form', { id: 'eval-form', class: 'row', on: { submit: async (ev) => {
    ev.preventDefault();
    const d = new FormData(form);
    const body = { filter: evalFilter(d.get('limit')) };
    if (d.get('judge')) body.judge = String(d.get('judge'));
    body.answers = String(d.get('answers'));
    try {
      const run = await api('/v1/experiments/' + encodeURIComponent(name) + '/evals', { method: 'POST', body: JSON.stringify(body) });
      note.textContent = 'Run #' + run.id + ' started over ' + run.rows + ' samples.';
      await poll();
    } catch (e) { note.textContent = 'Not started: ' + e.message; }
  } } },
  h('label', {}, 'Newest samples ', h('input', { name: 'limit', type: 'number', min: 1, max: 500, value: 50 })),
  h('label', {}, 'Answers ', h('select', { name: 'answers' }, h('option', { value: 'replay' }, 'every variant answers now'), h('option', { value: 'stored' }, 'stored (fan-out inputs)'))),
  h('label', {}, 'Judge ', h('select', { name: 'judge' }, h('option', { value: '' }, 'none'), models.map((m) => h('option', { value: m }, m)))),
  h('button', { type: 'submit' }, 'Evaluate'));
  poll().catch(failure);
  return h('div', { class: 'card', id: 'eval' }, h('h2', {}, 'Replay over every variant'),
    h('p', { class: 'muted' }, 'Runs the samples the filters above select (their inputs as the clients sent them) through every variant on this server, behind live traffic — or takes the answers the variants already gave a fan-out input; a judge compares each variant with the control in both orders and counts a verdict only when both agree.'),
    form, note, out);
}

async function reviewPage(name) {
  reviewName = name;
  const path = '/v1/experiments/' + encodeURIComponent(name);
  const [e, page, models] = await Promise.all([api(path), api(path + '/samples?' + reviewQuery()), api('/v1/models')]);
  let samples = page.data;
  if (reviewFilters.stopped) {
    const stopped = new Set(e.variants.filter((v) => v.stopped).map((v) => v.id));
    samples = samples.filter((s) => stopped.has(s.variant));
  }
  const labels = (e.samples && e.samples.labels) || [];
  const rerender = () => reviewPage(name).catch(failure);
  const body = !e.samples
    ? h('p', { class: 'card' }, 'This experiment keeps no samples: add [experiment.samples] (rate, retention_days, redact, labels) to its definition.')
    : reviewFilters.matrix ? matrix(samples, e.variants.map((v) => v.id))
      : samples.length ? h('div', { id: 'samples' }, samples.map((s) => sampleCard(s, labels)))
        : h('p', { class: 'card muted' }, 'No samples match.');
  main().replaceChildren(
    h('h1', {}, 'Review: ', name, ' ', h('a', { href: '#/e/' + encodeURIComponent(name), class: 'muted' }, 'results')),
    h('p', { class: 'muted', id: 'review-help' }, samples.length + ' samples. Keys: j / k next / previous, u / d thumbs up / down, 1-5 score, l label, c comment, / search. Ratings are events of the unit (review_thumbs_up, review_score, review_label_…) and show in the results.'),
    reviewForm(e, rerender), e.samples ? evalCard(name, models.data.map((m) => m.id)) : null, body);
}

// keyboard review: only on the review page, never while typing
document.addEventListener('keydown', (ev) => {
  if (!location.hash.startsWith('#/review/') || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const t = ev.target;
  if (t && ['INPUT', 'SELECT', 'TEXTAREA'].includes(t.tagName)) return;
  const cards = [...document.querySelectorAll('article.sample')];
  const at = cards.indexOf(document.activeElement && document.activeElement.closest ? document.activeElement.closest('article.sample') : null);
  const card = at >= 0 ? cards[at] : null;
  const go = (i) => { if (cards[i]) { cards[i].focus(); cards[i].scrollIntoView({ block: 'nearest' }); } };
  if (ev.key === 'j') go(at < 0 ? 0 : Math.min(at + 1, cards.length - 1));
  else if (ev.key === 'k') go(Math.max(at - 1, 0));
  else if (ev.key === '/') document.getElementById('review-q').focus();
  else if (!card) return;
  else if (ev.key === 'u') rate(card.sample, { thumbs: true }, card);
  else if (ev.key === 'd') rate(card.sample, { thumbs: false }, card);
  else if (/^[1-5]$/.test(ev.key)) rate(card.sample, { score: Number(ev.key) }, card);
  else if (ev.key === 'l' && card.querySelector('[data-k=label]')) card.querySelector('[data-k=label]').focus();
  else if (ev.key === 'c') card.querySelector('[data-k=comment]').focus();
  else return;
  ev.preventDefault();
});
