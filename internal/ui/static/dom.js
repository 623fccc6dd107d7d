// Small DOM helpers. Text from the API only ever goes in as text nodes or
// attribute values, never as HTML.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style') Object.assign(el.style, v); // CSSOM: allowed by the page's CSP, unlike style=
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// pill shows a state with its colour class.
export function pill(state) {
  return h('span', { class: 'pill ' + tone(state), dataset: { state: state || '' } }, state || '—');
}

const GOOD = ['succeeded', 'completed', 'online', 'approved', 'applied'];
const BAD = ['failed', 'failed_final', 'rejected', 'aborted', 'offline', 'timeout', 'mismatch',
  'completed_with_failures', 'expired'];
const IDLE = ['cancelled', 'pending'];
const WARN = ['needs_attention', 'failed_retryable', 'waiting_device', 'paused', 'late', 'stale', 'duplicate'];
const WAIT = ['waiting_approval', 'scheduled'];

export function tone(state) {
  if (GOOD.includes(state)) return 'good';
  if (BAD.includes(state)) return 'bad';
  if (WARN.includes(state)) return 'warn';
  if (WAIT.includes(state)) return 'wait';
  if (IDLE.includes(state)) return 'idle';
  return 'busy';
}

export function time(v) {
  if (!v) return '—';
  const d = new Date(v);
  if (isNaN(d)) return String(v);
  return d.toISOString().replace('T', ' ').replace(/\.(\d{3})\d*Z$/, '.$1Z');
}

export function ago(v) {
  if (!v) return '—';
  const s = (Date.now() - new Date(v).getTime()) / 1000;
  if (!isFinite(s)) return String(v);
  if (s < 1.5) return 'now';
  if (s < 90) return Math.round(s) + ' s ago';
  if (s < 5400) return Math.round(s / 60) + ' min ago';
  if (s < 129600) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' d ago';
}

export function num(n) { return Number(n || 0).toLocaleString('en-US'); }

export function json(v) {
  if (v === undefined || v === null) return '—';
  return JSON.stringify(v);
}

// debounce runs fn once, ms after the last call.
export function debounce(fn, ms) {
  let t = 0;
  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
}

// throttle runs fn at most once per ms: at once when idle, else once at the
// end of the interval however many calls came in it.
export function throttle(fn, ms) {
  let last = 0;
  let t = 0;
  return (...a) => {
    if (t) return;
    const wait = Math.max(0, last + ms - Date.now());
    t = setTimeout(() => { t = 0; last = Date.now(); fn(...a); }, wait);
  };
}

export function clear(el) { el.replaceChildren(); return el; }

export function errorText(e) {
  return e && e.code ? e.code + (e.message && e.message !== e.code ? ': ' + e.message : '') : String(e);
}
