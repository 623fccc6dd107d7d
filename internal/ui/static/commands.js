// Commands: the list from the database (GET /v1/commands, newest first),
// filtered by status, device and action, a page at a time; it stays live:
// a command event updates its row in place, and the first page is read
// again (at most once a second) so new commands appear on top. And one
// command's timeline: its events (from, to, reason, instance), receipts
// (status, seq, effect) and the queries asked about it, read again on each
// of its events.

import { get, page, enc, APIError } from './api.js';
import { h, pill, time, ago, json, debounce, throttle, clear, errorText } from './dom.js';

const PAGE = 50; // rows a page shows

// COMMAND_STATES are the states a command can be in, for the filter.
export const COMMAND_STATES = ['pending', 'waiting_device', 'sent', 'received', 'executing',
  'succeeded', 'failed', 'timeout', 'cancelled', 'needs_attention'];

// listPath builds a list's path from its filters (empty ones left out), its
// page size and the cursor of the page.
export function listPath(base, filters, limit, after) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
  q.set('limit', String(limit));
  if (after) q.set('after', after);
  return base + '?' + q.toString();
}

// afterOf is the cursor a Link rel="next" path carries.
export function afterOf(next) {
  return next ? new URL(next, location.origin).searchParams.get('after') || '' : '';
}

export class CommandsView {
  constructor(app, query) {
    this.app = app;
    const q = new URLSearchParams(query || '');
    this.filters = { status: q.get('status') || '', device: q.get('device') || '', action: q.get('action') || '' };
    this.cursors = ['']; // the after of each page up to the one shown
    this.rows = new Map();
    this.reload = throttle(() => this.load(), 1000);
  }

  mount(root) {
    this.tbody = h('tbody');
    this.err = h('p', { class: 'error', role: 'alert' });
    this.total = h('span', { id: 'commands-total' }, '…');
    this.pager = h('div', { class: 'pager' });
    const status = h('select', { id: 'filter-status', name: 'status' },
      h('option', { value: '' }, 'any status'), h('option', { value: 'open' }, 'open (not final)'),
      COMMAND_STATES.map((s) => h('option', { value: s }, s)));
    status.value = this.filters.status;
    const device = h('input', { id: 'filter-device', name: 'device', placeholder: 'device', spellcheck: 'false', value: this.filters.device });
    const action = h('input', { id: 'filter-action', name: 'action', placeholder: 'action', spellcheck: 'false', value: this.filters.action });
    const input = h('input', { id: 'lookup', placeholder: 'operation_id or command_id', spellcheck: 'false' });
    root.append(h('section', { class: 'panel', id: 'commands' },
      h('div', { class: 'head' },
        h('h1', {}, 'Commands'),
        h('span', { class: 'stat' }, this.total, ' commands'),
        h('span', { class: 'muted' }, 'newest first, live'),
        h('span', { class: 'spacer' }),
        h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); this.lookup(input.value.trim()); } },
          input, h('button', { type: 'submit' }, 'Open'))),
      h('form', { class: 'inline filters', id: 'commands-filter', onsubmit: (e) => {
        e.preventDefault();
        this.filter({ status: status.value, device: device.value.trim(), action: action.value.trim() });
      } }, status, device, action, h('button', { type: 'submit' }, 'Filter')),
      this.err,
      h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['Command', 'Operation', 'Device', 'Action', 'Status', 'Issued']
          .map((c) => h('th', {}, c)))),
        this.tbody),
      this.pager));
    this.load();
  }

  unmount() { this.rows.clear(); }

  // filter shows the first page of another filter, and keeps it in the
  // address so a reload or a shared link shows the same list.
  filter(f) {
    this.filters = f;
    this.cursors = [''];
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
    history.replaceState(null, '', '#/commands' + (q.toString() ? '?' + q.toString() : ''));
    this.load();
  }

  async load() {
    const after = this.cursors[this.cursors.length - 1];
    let p;
    try {
      p = await page(listPath('/v1/commands', this.filters, PAGE, after));
    } catch (e) {
      this.err.textContent = errorText(e);
      return;
    }
    this.err.textContent = '';
    this.total.textContent = String(p.total);
    this.rows.clear();
    clear(this.tbody);
    for (const c of p.items) this.tbody.append(this.row(c));
    if (!p.items.length) {
      this.tbody.append(h('tr', { class: 'placeholder' },
        h('td', { colspan: 6, class: 'muted' }, 'no command matches')));
    }
    const next = afterOf(p.next);
    clear(this.pager).append(
      this.cursors.length > 1 ? h('button', { type: 'button', class: 'prev', onclick: () => { this.cursors.pop(); this.load(); } }, '‹ Newer') : '',
      next ? h('button', { type: 'button', class: 'next', onclick: () => { this.cursors.push(next); this.load(); } }, 'Older ›') : '');
  }

  row(c) {
    const r = h('tr', { class: 'click', dataset: { id: c.command_id, status: c.status },
      onclick: () => { location.hash = '#/commands/' + enc(c.command_id); } },
    h('td', { class: 'mono' }, h('a', { href: '#/commands/' + enc(c.command_id) }, c.command_id)),
    h('td', { class: 'mono' }, c.operation_id),
    h('td', { class: 'mono' }, c.device_id),
    h('td', {}, c.action),
    h('td', { class: 'status' }, pill(c.status)),
    h('td', { title: c.issued_at }, ago(c.issued_at)));
    this.rows.set(c.command_id, r);
    return r;
  }

  onEvent(ev) {
    if (ev.kind === 'reset') { this.reload(); return; }
    if (ev.kind !== 'command') return;
    const r = this.rows.get(ev.id);
    if (r) { // its new state at once; whether it still matches, at the next read
      r.dataset.status = ev.status;
      r.querySelector('td.status').replaceChildren(pill(ev.status));
    }
    if (this.cursors.length === 1) this.reload();
  }

  async lookup(id) {
    if (!id) return;
    try {
      await get('/v1/commands/' + enc(id));
      location.hash = '#/commands/' + enc(id);
    } catch (e) {
      if (!(e instanceof APIError) || e.status !== 404) { this.err.textContent = errorText(e); return; }
      try {
        const { data } = await get('/v1/operations/' + enc(id));
        location.hash = '#/commands/' + enc(data.command_id);
      } catch (e2) {
        this.err.textContent = e2.status === 404 ? `no command or operation ${id}` : errorText(e2);
      }
    }
  }
}

// CommandView is one command's timeline.
export class CommandView {
  constructor(app, id) {
    this.app = app;
    this.id = id;
    this.reload = debounce(() => this.load(), 150);
  }

  mount(root) {
    this.body = h('div');
    this.err = h('p', { class: 'error', role: 'alert' });
    root.append(h('section', { class: 'panel', id: 'command', dataset: { id: this.id } },
      h('div', { class: 'head' }, h('a', { href: '#/commands' }, '‹ Commands'), h('h1', { class: 'mono' }, this.id)),
      this.err, this.body));
    this.load();
  }

  unmount() {}

  onEvent(ev) {
    // The command ahead of it ending moves it up its device's queue.
    if (ev.kind === 'reset' || (ev.kind === 'command' && (ev.id === this.id || ev.id === this.behind)) ||
        (ev.kind === 'operation' && this.op && ev.id === this.op.operation_id)) this.reload();
  }

  async load() {
    try {
      const { data: c } = await get('/v1/commands/' + enc(this.id));
      let op = null;
      try { op = (await get('/v1/operations/' + enc(c.operation_id))).data; } catch { op = null; }
      this.op = op;
      this.behind = c.queued_behind || '';
      this.err.textContent = '';
      this.render(c, op);
    } catch (e) {
      this.err.textContent = e.status === 404 ? `no command ${this.id}` : errorText(e);
    }
  }

  render(c, op) {
    const facts = [
      ['Status', pill(c.status)], ['Reason', c.reason || '—'],
      ['Operation', h('span', { class: 'mono' }, c.operation_id)],
      ['Operation status', op ? pill(op.status) : '—'],
      ['Device', h('a', { class: 'mono', href: '#/devices/' + enc(c.device_id) }, c.device_id)], ['Action', c.action],
      ['Params', h('code', {}, json(c.params))], ['Attempt', c.attempt], ['Queries', c.queries], ['QoS', c.qos],
      ['Issued', time(c.issued_at)], ['Expires', time(c.expires_at)], ['Last sent', time(c.last_sent_at)],
      ['Result', h('code', {}, json(c.result))],
    ];
    if (c.late_outcome) facts.push(['Late outcome', pill(c.late_outcome)], ['Late result', h('code', {}, json(c.late_result))]);
    if (c.late_conflict) facts.push(['Late conflict', 'yes: a later receipt contradicts the recorded outcome']);
    if (c.executed_as) facts.push(['Executed as', c.executed_as]);
    if (c.resolved_by) facts.push(['Resolved by', c.resolved_by]);
    if (c.serial_seq) facts.push(['Serial', h('span', { id: 'serial-seq' }, 'number ' + c.serial_seq + ' in its device\'s queue')]);
    if (c.queued_behind) {
      facts.push(['Queued behind', h('a', { class: 'mono', id: 'queued-behind', href: '#/commands/' + enc(c.queued_behind) }, c.queued_behind)]);
    }
    if (op && op.command_ids && op.command_ids.length > 1) facts.push(['Commands of the operation', op.command_ids.join(', ')]);

    clear(this.body).append(
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      h('h2', {}, 'Timeline'),
      h('ol', { class: 'timeline', id: 'timeline' }, timeline(c)));
  }
}

// timeline is a command's evidence in time order, as list items: its
// events (refused ones too), its receipts with their effect, and the
// queries asked about it with their answers.
export function timeline(c) {
  const items = [];
  for (const e of c.events) items.push({ at: e.at, kind: e.refused ? 'refused' : 'event', e });
  for (const r of c.receipts) items.push({ at: r.received_at, kind: 'receipt', r });
  for (const q of c.query_log || []) items.push({ at: q.sent_at, kind: 'query', q });
  items.sort((a, b) => new Date(a.at) - new Date(b.at));
  return items.map((it) => {
    if (it.kind === 'receipt') return receiptLine(it.r);
    if (it.kind === 'query') return queryLine(it.q);
    const e = it.e;
    return h('li', { class: 'tl ' + it.kind, dataset: { to: e.to } },
      h('span', { class: 'when' }, time(e.at)),
      h('span', { class: 'what' }, it.kind === 'refused' ? 'refused ' : '', e.from ? pill(e.from) : '', e.from ? ' → ' : '',
        pill(e.to), ' ', e.reason, e.principal ? ' by ' + e.principal : ''),
      h('span', { class: 'muted' }, e.instance + (e.fencing_token ? ' · token ' + e.fencing_token : '')));
  });
}

function receiptLine(r) {
  return h('li', { class: 'tl receipt ' + r.effect, dataset: { status: r.status, effect: r.effect } },
    h('span', { class: 'when' }, time(r.received_at)),
    h('span', { class: 'what' }, 'receipt ', pill(r.status), ' seq ', r.seq, ' → ', h('b', {}, r.effect),
      r.query_id ? ` (answer to query ${r.query_id})` : '', r.error ? ` error ${r.error}` : ''),
    h('span', { class: 'muted' }, r.at ? 'device time ' + r.at : '', r.instance ? ' · ' + r.instance : ''));
}

// queryLine is one query asked about a command, with its answer if one came.
export function queryLine(q) {
  return h('li', { class: 'tl query', dataset: { query: q.query_id, answer: q.answer || '' } },
    h('span', { class: 'when' }, time(q.sent_at)),
    h('span', { class: 'what' }, 'query ', h('span', { class: 'mono' }, q.query_id), ' → ',
      q.answered_at ? ['answered ', pill(q.answer), ' at ', time(q.answered_at)] : h('b', {}, 'no answer')),
    h('span', { class: 'muted' }, q.instance));
}
