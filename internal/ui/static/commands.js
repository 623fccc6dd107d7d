// Commands: the ones this page has seen on the event stream (there is no
// list route for commands), newest first, each with its operation, device
// and action read once from GET /v1/commands/{id}; and one command's
// timeline: its events (from, to, reason, instance) and receipts (status,
// seq, effect) in time order, read again on each of its events.

import { get, enc, APIError } from './api.js';
import { h, pill, time, ago, json, debounce, clear, errorText } from './dom.js';

const KEEP = 500; // commands remembered
const SHOWN = 200; // rows shown

// CommandStore remembers the commands seen on the stream, and fills in
// their details with a few requests at a time.
export class CommandStore {
  constructor(onChange) {
    this.byId = new Map();
    this.queue = [];
    this.running = 0;
    this.onChange = onChange;
  }

  seen(ev) {
    let c = this.byId.get(ev.id);
    if (!c) {
      c = { id: ev.id, status: ev.status, at: ev.at, detail: null };
      this.byId.set(ev.id, c);
      this.want(c);
    } else {
      this.byId.delete(ev.id); // re-insert: the map keeps recency order
      this.byId.set(ev.id, c);
    }
    c.status = ev.status;
    c.at = ev.at;
    while (this.byId.size > KEEP) this.byId.delete(this.byId.keys().next().value);
    this.onChange(c);
  }

  want(c) {
    this.queue.push(c);
    if (this.queue.length > SHOWN) this.queue.shift(); // rows long gone from view
    this.pump();
  }

  pump() {
    while (this.running < 4 && this.queue.length) {
      const c = this.queue.shift();
      this.running++;
      get('/v1/commands/' + enc(c.id))
        .then(({ data }) => { c.detail = data; this.onChange(c); })
        .catch(() => {})
        .finally(() => { this.running--; this.pump(); });
    }
  }

  recent() { return [...this.byId.values()].reverse().slice(0, SHOWN); }
}

export class CommandsView {
  constructor(app) { this.app = app; this.rows = new Map(); }

  mount(root) {
    this.tbody = h('tbody');
    this.err = h('p', { class: 'error', role: 'alert' });
    const input = h('input', { id: 'lookup', placeholder: 'operation_id or command_id', spellcheck: 'false' });
    root.append(h('section', { class: 'panel', id: 'commands' },
      h('div', { class: 'head' },
        h('h1', {}, 'Commands'),
        h('span', { class: 'muted' }, 'as they change, live; newest first'),
        h('span', { class: 'spacer' }),
        h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); this.lookup(input.value.trim()); } },
          input, h('button', { type: 'submit' }, 'Open'))),
      this.err,
      h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['Command', 'Operation', 'Device', 'Action', 'Status', 'Changed']
          .map((c) => h('th', {}, c)))),
        this.tbody)));
    for (const c of this.app.commands.recent()) this.tbody.append(this.row(c));
    this.empty();
  }

  unmount() { this.rows.clear(); }

  empty() {
    if (this.rows.size === 0) {
      this.tbody.append(h('tr', { class: 'placeholder' },
        h('td', { colspan: 6, class: 'muted' }, 'no command has changed since this page opened')));
    }
  }

  row(c) {
    const d = c.detail || {};
    const r = h('tr', { class: 'click', dataset: { id: c.id, status: c.status },
      onclick: () => { location.hash = '#/commands/' + enc(c.id); } },
    h('td', { class: 'mono' }, h('a', { href: '#/commands/' + enc(c.id) }, c.id)),
    h('td', { class: 'mono' }, d.operation_id || '…'),
    h('td', { class: 'mono' }, d.device_id || '…'),
    h('td', {}, d.action || '…'),
    h('td', { class: 'status' }, pill(c.status)),
    h('td', { title: c.at }, ago(c.at)));
    this.rows.set(c.id, r);
    return r;
  }

  changed(c) {
    const old = this.rows.get(c.id);
    const r = this.row(c);
    const ph = this.tbody.querySelector('tr.placeholder');
    if (ph) ph.remove();
    if (old) old.remove();
    this.tbody.prepend(r);
    while (this.tbody.children.length > SHOWN) {
      const last = this.tbody.lastElementChild;
      this.rows.delete(last.dataset.id);
      last.remove();
    }
  }

  onEvent() {}

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
    if (ev.kind === 'reset' || (ev.kind === 'command' && ev.id === this.id) ||
        (ev.kind === 'operation' && this.op && ev.id === this.op.operation_id)) this.reload();
  }

  async load() {
    try {
      const { data: c } = await get('/v1/commands/' + enc(this.id));
      let op = null;
      try { op = (await get('/v1/operations/' + enc(c.operation_id))).data; } catch { op = null; }
      this.op = op;
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
      ['Device', h('a', { class: 'mono', href: '#/fleet' }, c.device_id)], ['Action', c.action],
      ['Params', h('code', {}, json(c.params))], ['Attempt', c.attempt], ['Queries', c.queries], ['QoS', c.qos],
      ['Issued', time(c.issued_at)], ['Expires', time(c.expires_at)], ['Last sent', time(c.last_sent_at)],
      ['Result', h('code', {}, json(c.result))],
    ];
    if (c.late_outcome) facts.push(['Late outcome', pill(c.late_outcome)], ['Late result', h('code', {}, json(c.late_result))]);
    if (c.late_conflict) facts.push(['Late conflict', 'yes: a later receipt contradicts the recorded outcome']);
    if (c.executed_as) facts.push(['Executed as', c.executed_as]);
    if (c.resolved_by) facts.push(['Resolved by', c.resolved_by]);
    if (op && op.command_ids && op.command_ids.length > 1) facts.push(['Commands of the operation', op.command_ids.join(', ')]);

    const items = [];
    for (const e of c.events) {
      items.push({ at: e.at, kind: e.refused ? 'refused' : 'event', e });
    }
    for (const r of c.receipts) items.push({ at: r.received_at, kind: 'receipt', r });
    items.sort((a, b) => new Date(a.at) - new Date(b.at));

    const line = (it) => {
      if (it.kind === 'receipt') {
        const r = it.r;
        return h('li', { class: 'tl receipt ' + r.effect, dataset: { status: r.status, effect: r.effect } },
          h('span', { class: 'when' }, time(r.received_at)),
          h('span', { class: 'what' }, 'receipt ', pill(r.status), ' seq ', r.seq, ' → ', h('b', {}, r.effect),
            r.query_id ? ` (answer to query ${r.query_id})` : '', r.error ? ` error ${r.error}` : ''),
          h('span', { class: 'muted' }, r.at ? 'device time ' + r.at : '', r.instance ? ' · ' + r.instance : ''));
      }
      const e = it.e;
      return h('li', { class: 'tl ' + it.kind, dataset: { to: e.to } },
        h('span', { class: 'when' }, time(e.at)),
        h('span', { class: 'what' }, it.kind === 'refused' ? 'refused ' : '', e.from ? pill(e.from) : '', e.from ? ' → ' : '',
          pill(e.to), ' ', e.reason),
        h('span', { class: 'muted' }, e.instance + (e.fencing_token ? ' · token ' + e.fencing_token : '')));
    };
    clear(this.body).append(
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      h('h2', {}, 'Timeline'),
      h('ol', { class: 'timeline', id: 'timeline' }, items.map(line)));
  }
}
