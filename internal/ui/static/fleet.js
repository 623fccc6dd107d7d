// The fleet: one page of GET /v1/devices at a time (?limit=&after=, the
// total from X-Total-Count, the next page from Link rel="next"), so a fleet
// of 10,000 devices never loads whole. A device event refreshes its row
// when it is on the page, and the counts.

import { get, page, enc } from './api.js';
import { h, pill, ago, num, debounce, clear, errorText } from './dom.js';

export class FleetView {
  constructor(app) {
    this.app = app;
    this.limit = 100;
    this.online = '';
    this.cursors = ['']; // the after of each page read so far
    this.next = '';
    this.rows = new Map();
    this.pending = new Set();
    this.refreshRows = debounce(() => this.fetchRows(), 150);
    this.refreshCounts = debounce(() => this.counts(), 1000);
  }

  mount(root) {
    this.total = h('span', { id: 'fleet-total' }, '…');
    this.onlineCount = h('span', { id: 'fleet-online' }, '…');
    this.range = h('span', { class: 'muted', id: 'fleet-range' });
    this.tbody = h('tbody');
    this.err = h('p', { class: 'error', role: 'alert' });
    const filter = h('select', { id: 'fleet-filter', onchange: (e) => { this.online = e.target.value; this.first(); } },
      h('option', { value: '' }, 'all devices'), h('option', { value: 'true' }, 'online'),
      h('option', { value: 'false' }, 'offline'));
    filter.value = this.online;
    const size = h('select', { id: 'fleet-limit', onchange: (e) => { this.limit = Number(e.target.value); this.first(); } },
      [50, 100, 500, 1000].map((n) => h('option', { value: n }, n + ' per page')));
    size.value = String(this.limit);
    this.prevBtn = h('button', { type: 'button', onclick: () => this.prev() }, '‹ Prev');
    this.nextBtn = h('button', { type: 'button', id: 'fleet-next', onclick: () => this.forward() }, 'Next ›');
    root.append(h('section', { class: 'panel', id: 'fleet' },
      h('div', { class: 'head' },
        h('h1', {}, 'Fleet'),
        h('span', { class: 'stat' }, this.total, ' devices'),
        h('span', { class: 'stat' }, this.onlineCount, ' online'),
        h('span', { class: 'spacer' }),
        filter, size),
      this.err,
      h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['Device', 'Presence', 'Confirmed', 'Session', 'Clock skew', 'Last seen',
          'Capabilities', 'Stale presence'].map((c) => h('th', {}, c)))),
        this.tbody),
      h('div', { class: 'pager' },
        h('button', { type: 'button', onclick: () => this.first() }, '« First'), this.prevBtn, this.nextBtn, this.range)));
    this.load();
    this.counts();
  }

  unmount() {}

  path(after) {
    let p = '/v1/devices?limit=' + this.limit;
    if (after) p += '&after=' + enc(after);
    if (this.online) p += '&online=' + this.online;
    return p;
  }

  first() { this.cursors = ['']; this.load(); }
  prev() { if (this.cursors.length > 1) { this.cursors.pop(); this.load(); } }
  forward() { if (this.next) { this.cursors.push(this.next); this.load(); } }

  async load() {
    const after = this.cursors[this.cursors.length - 1];
    try {
      const p = await page(this.path(after));
      this.err.textContent = '';
      this.next = p.next ? new URL(p.next, location.origin).searchParams.get('after') || '' : '';
      this.total.textContent = this.online === '' ? num(p.total) : this.total.textContent;
      clear(this.tbody);
      this.rows.clear();
      for (const d of p.items) this.put(d);
      if (p.items.length === 0) this.tbody.append(h('tr', {}, h('td', { colspan: 8, class: 'muted' }, 'no devices')));
      const start = (this.cursors.length - 1) * this.limit;
      this.range.textContent = p.items.length
        ? `${num(start + 1)}–${num(start + p.items.length)} of ${num(p.total)}` : '';
      this.prevBtn.disabled = this.cursors.length <= 1;
      this.nextBtn.disabled = !this.next;
    } catch (e) {
      this.err.textContent = errorText(e);
    }
  }

  put(d) {
    const caps = [d.capabilities.dedupe ? 'dedupe' : '', d.capabilities.query ? 'query' : ''].filter(Boolean).join(', ');
    const row = h('tr', { dataset: { id: d.device_id, online: String(d.online) } },
      h('td', { class: 'mono' }, h('a', { href: '#/devices/' + enc(d.device_id) }, d.device_id)),
      h('td', {}, pill(d.online ? 'online' : 'offline')),
      h('td', {}, d.confirmed ? 'yes' : 'not yet'),
      h('td', { class: 'num' }, d.session),
      h('td', { class: 'num' }, skew(d.clock_skew_ms)),
      h('td', { title: d.last_seen_at || '' }, ago(d.last_seen_at)),
      h('td', {}, caps || '—'),
      h('td', { class: 'num' }, d.stale_presence ? `${d.stale_presence} (session ${d.last_stale_session})` : '0'));
    const old = this.rows.get(d.device_id);
    if (old) { old.replaceWith(row); row.classList.add('flash-row'); } else this.tbody.append(row);
    this.rows.set(d.device_id, row);
  }

  async counts() {
    try {
      const [all, on] = await Promise.all([page('/v1/devices?limit=1'), page('/v1/devices?limit=1&online=true')]);
      this.total.textContent = num(all.total);
      this.onlineCount.textContent = num(on.total);
    } catch (e) {
      this.err.textContent = errorText(e);
    }
  }

  onEvent(ev) {
    if (ev.kind === 'reset') { this.load(); this.counts(); return; }
    if (ev.kind !== 'device') return;
    this.refreshCounts();
    if (this.rows.has(ev.id)) { this.pending.add(ev.id); this.refreshRows(); }
  }

  async fetchRows() {
    const ids = [...this.pending];
    this.pending.clear();
    for (const id of ids) {
      try {
        const { data } = await get('/v1/devices/' + enc(id));
        if (this.rows.has(id)) this.put(data);
      } catch (e) {
        this.err.textContent = errorText(e);
      }
    }
  }
}

function skew(ms) {
  if (!ms) return '0 ms';
  const a = Math.abs(ms);
  const s = a >= 1000 ? (a / 1000).toFixed(1) + ' s' : a + ' ms';
  return (ms > 0 ? '+' : '−') + s;
}
