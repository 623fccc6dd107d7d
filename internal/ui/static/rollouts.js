// Rollouts: GET /v1/rollouts (when this controller lists them) and the
// rollouts the stream or a lookup named, each from GET /v1/rollouts/{id}:
// status, version, progress by device outcome, rate, abort rules and state,
// history. A controller without rollout routes answers 404: the page says
// so and goes on. Active rollouts are read again on their events, and every
// 5 s as well.

import { get, page, enc } from './api.js';
import { h, pill, time, num, json, clear, errorText, tone } from './dom.js';

const ACTIVE = ['waiting_approval', 'scheduled', 'running', 'paused'];
// segTone colours a progress segment: pending ones are left grey.
const segTone = (k) => (k === 'pending' ? 'idle' : k === 'started' || k === 'retry' ? 'busy' : tone(k));
const ORDER = ['succeeded', 'failed', 'timeout', 'rejected', 'needs_attention', 'cancelled', 'started', 'retry', 'pending'];

export class RolloutsView {
  constructor(app) {
    this.app = app;
    this.cards = new Map();
    this.timer = 0;
  }

  mount(root) {
    this.list = h('div', { class: 'rollouts', id: 'rollout-list' });
    this.note = h('p', { class: 'muted', id: 'rollouts-note' });
    this.err = h('p', { class: 'error', role: 'alert' });
    const input = h('input', { id: 'rollout-lookup', placeholder: 'rollout_id', spellcheck: 'false' });
    root.append(h('section', { class: 'panel', id: 'rollouts' },
      h('div', { class: 'head' }, h('h1', {}, 'Rollouts'), h('span', { class: 'spacer' }),
        h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); this.show(input.value.trim(), true); } },
          input, h('button', { type: 'submit' }, 'Open'))),
      this.note, this.err, this.list));
    this.load();
    this.timer = setInterval(() => this.poll(), 5000);
  }

  unmount() { clearInterval(this.timer); }

  async load() {
    for (const id of this.app.rollouts) this.show(id, false);
    try {
      const p = await page('/v1/rollouts?limit=50');
      this.note.textContent = num(p.total) + ' rollouts';
      for (const r of p.items) this.render(r);
    } catch (e) {
      this.note.textContent = e.status === 404 || e.status === 405
        ? 'This controller does not list rollouts (no GET /v1/rollouts); open one by its id, or watch them appear as they change.'
        : errorText(e);
    }
    if (!this.cards.size) this.list.append(h('p', { class: 'muted placeholder' }, 'no rollout to show'));
  }

  poll() {
    for (const [id, card] of this.cards) if (ACTIVE.includes(card.dataset.status)) this.show(id, false);
  }

  onEvent(ev) {
    if (ev.kind === 'rollout') this.show(ev.id, false);
    if (ev.kind === 'reset') { clear(this.list); this.cards.clear(); this.load(); }
  }

  async show(id, asked) {
    if (!id) return;
    try {
      const { data } = await get('/v1/rollouts/' + enc(id));
      this.err.textContent = '';
      this.app.rollouts.add(id);
      this.render(data);
    } catch (e) {
      if (asked) this.err.textContent = e.status === 404 ? `no rollout ${id} (or no rollout routes on this controller)` : errorText(e);
    }
  }

  render(r) {
    const id = r.rollout_id || r.id;
    if (!id) return;
    const ph = this.list.querySelector('.placeholder');
    if (ph) ph.remove();
    const card = this.card(r, id);
    const old = this.cards.get(id);
    if (old) old.replaceWith(card); else this.list.prepend(card);
    this.cards.set(id, card);
  }

  card(r, id) {
    const counts = r.counts || r.device_counts || {};
    const total = Number(r.devices_total || Object.values(counts).reduce((a, b) => a + Number(b || 0), 0));
    const keys = [...ORDER.filter((k) => k in counts), ...Object.keys(counts).filter((k) => !ORDER.includes(k))];
    const finished = keys.filter((k) => !['pending', 'started', 'retry'].includes(k))
      .reduce((a, k) => a + Number(counts[k] || 0), 0);
    const bar = h('div', { class: 'progress', title: `${finished} of ${total} finished` },
      keys.map((k) => h('span', { class: 'seg ' + segTone(k) + ' ' + k,
        style: { width: `${total ? (100 * Number(counts[k] || 0)) / total : 0}%` }, title: `${k}: ${counts[k]}` })));
    const legend = h('ul', { class: 'legend' }, keys.map((k) => h('li', {}, pill(k), ' ', num(counts[k]))));
    const facts = [['Version', r.version], ['Action', r.action], ['Params', h('code', {}, json(r.params))],
      ['Devices', num(total)], ['Finished', `${num(finished)} (${total ? Math.floor((100 * finished) / total) : 0}%)`]];
    for (const [k, v] of Object.entries(r)) {
      if (/rate|in_flight|per_minute/.test(k) && (typeof v === 'number' || typeof v === 'string')) facts.push([k.replaceAll('_', ' '), v]);
    }
    if (r.execute_after || r.execute_before) facts.push(['Window', `${time(r.execute_after)} → ${time(r.execute_before)}`]);
    const abort = r.abort || (r.spec && r.spec.abort) || [];
    const aborted = r.status === 'aborted' || r.status === 'cancelled';
    const history = r.history || [];
    return h('article', { class: 'rollout', dataset: { id, status: r.status } },
      h('header', {}, h('h3', { class: 'mono' }, id), pill(r.status), r.reason ? h('span', { class: 'muted' }, r.reason) : ''),
      aborted ? h('p', { class: 'banner bad' }, `${r.status}${r.reason ? ': ' + r.reason : ''}: no device starts again; those published run to their end`) : '',
      bar, legend,
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      abort.length ? h('div', {}, h('h4', {}, 'Abort rules'), h('ul', { class: 'rules' }, abort.map((a) =>
        h('li', {}, `abort when ${a.when} reaches ${a.percent}% of at least ${a.min_finished} finished`)))) : '',
      history.length ? h('details', {}, h('summary', {}, `History (${history.length})`),
        h('ol', { class: 'timeline' }, history.map((e) => h('li', { class: 'tl event' },
          h('span', { class: 'when' }, time(e.at)),
          h('span', { class: 'what' }, e.from ? pill(e.from) : '', e.from ? ' → ' : '', pill(e.to || e.status), ' ', e.action || '', ' ', e.reason || ''),
          h('span', { class: 'muted' }, e.principal || ''))))) : '');
  }
}
