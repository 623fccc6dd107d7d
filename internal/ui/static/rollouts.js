// Rollouts: GET /v1/rollouts (one page), and those the stream or a lookup
// names, each from GET /v1/rollouts/{id}: status, version, progress by
// device outcome (counts), the start rate now, every abort rule against the
// outcomes so far (abort_state), the window, the history. A controller
// without rollout routes answers 404: the page says so and goes on.
// A rollout is read again on its own events and on its devices' operation
// events ({rollout_id}:rollout:{device}:v{version}), at most twice a
// second, and every 5 s while it is active.

import { get, page, enc } from './api.js';
import { h, pill, time, num, json, clear, errorText, tone, ago } from './dom.js';

const ACTIVE = ['waiting_approval', 'scheduled', 'running', 'paused'];
const ORDER = ['succeeded', 'failed', 'timeout', 'rejected', 'needs_attention', 'cancelled', 'started', 'retry', 'pending'];
const UNFINISHED = ['pending', 'started', 'retry'];
// segTone colours a progress segment: pending ones are left empty.
const segTone = (k) => (k === 'pending' ? 'none' : k === 'started' || k === 'retry' ? 'busy' : tone(k));

export class RolloutsView {
  constructor(app) {
    this.app = app;
    this.cards = new Map();
    this.due = new Map(); // rollout id → timer of its next read
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

  unmount() {
    clearInterval(this.timer);
    for (const t of this.due.values()) clearTimeout(t);
  }

  async load() {
    try {
      const p = await page('/v1/rollouts?limit=50');
      this.note.textContent = num(p.total) + (p.total === 1 ? ' rollout' : ' rollouts') + (p.next ? ' (the first 50)' : '');
      for (const r of p.items) this.show(r.rollout_id, false);
    } catch (e) {
      this.note.textContent = e.status === 404 || e.status === 405
        ? 'This controller does not list rollouts (no GET /v1/rollouts); open one by its id, or watch them appear as they change.'
        : errorText(e);
    }
    for (const id of this.app.rollouts) this.show(id, false);
    if (!this.cards.size) this.list.append(h('p', { class: 'muted placeholder' }, 'no rollout to show'));
  }

  poll() {
    for (const [id, card] of this.cards) if (ACTIVE.includes(card.dataset.status)) this.soon(id);
  }

  onEvent(ev) {
    if (ev.kind === 'rollout') this.soon(ev.id);
    if (ev.kind === 'operation') {
      const i = ev.id.indexOf(':rollout:');
      if (i > 0) this.soon(ev.id.slice(0, i));
    }
    if (ev.kind === 'reset') { clear(this.list); this.cards.clear(); this.load(); }
  }

  // soon reads a rollout again within 500 ms, once however many events.
  soon(id) {
    if (this.due.has(id)) return;
    this.due.set(id, setTimeout(() => { this.due.delete(id); this.show(id, false); }, 500));
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
    const id = r.rollout_id;
    if (!id) return;
    const ph = this.list.querySelector('.placeholder');
    if (ph) ph.remove();
    const card = this.card(r, id);
    const old = this.cards.get(id);
    if (old) old.replaceWith(card); else this.list.prepend(card);
    this.cards.set(id, card);
  }

  card(r, id) {
    const counts = r.counts || {};
    const total = Number(r.devices_total || Object.values(counts).reduce((a, b) => a + Number(b || 0), 0));
    const keys = [...ORDER.filter((k) => counts[k]), ...Object.keys(counts).filter((k) => !ORDER.includes(k) && counts[k])];
    const finished = r.finished ?? keys.filter((k) => !UNFINISHED.includes(k)).reduce((a, k) => a + Number(counts[k] || 0), 0);
    const pct = total ? Math.floor((100 * finished) / total) : 0;
    const bar = h('div', { class: 'progress', title: `${finished} of ${total} finished` },
      keys.map((k) => h('span', { class: 'seg ' + segTone(k), dataset: { state: k },
        style: { width: `${total ? (100 * Number(counts[k] || 0)) / total : 0}%` }, title: `${k}: ${counts[k]}` })));
    const legend = h('ul', { class: 'legend' }, keys.map((k) => h('li', { dataset: { state: k } }, pill(k), ' ', num(counts[k]))));
    const rate = r.rate || {};
    const facts = [
      ['Action', [r.action, ' ', h('code', {}, json(r.params))]],
      ['Devices', [num(total), ' ', h('code', {}, json(r.devices))]],
      ['Finished', h('span', { class: 'finished' }, `${num(finished)} of ${num(total)} (${pct}%)`)],
      ['In flight', `${num(r.in_flight)}${r.max_in_flight ? ' (at most ' + num(r.max_in_flight) + ')' : ''}`],
      ['Rate now', `${num(Math.round(rate.allowed_per_minute || 0))}/min allowed (at most ${num(r.max_per_minute)}/min); `
        + `${num(rate.starts_last_minute)} started in the last minute, ${num(rate.starts)} in all`],
    ];
    if (r.ramp) facts.push(['Ramp', `from ${r.ramp.base_per_minute}/min, ×${r.ramp.factor} every ${r.ramp.every_succeeded} succeeded`]);
    if (r.retries) facts.push(['Retries', r.retries]);
    if (r.window && ACTIVE.includes(r.status)) {
      facts.push(['Window', r.window.open ? 'open' + (r.window.ends ? ' until ' + time(r.window.ends) : '')
        : 'closed' + (r.window.opens ? ', opens ' + time(r.window.opens) : '')]);
    }
    if (r.approval) facts.push(['Approved', `version ${r.approval.version} by ${r.approval.approver}`]);
    else if (r.approval_required) facts.push(['Approval', 'required, waiting']);
    facts.push(['Created', `by ${r.created_by} ${ago(r.created_at)}`]);
    if (r.ended_at) facts.push(['Ended', time(r.ended_at)]);

    const rules = r.abort_state && r.abort_state.length ? r.abort_state : (r.abort || []);
    const aborted = r.status === 'aborted' || r.status === 'cancelled';
    const history = r.history || [];
    return h('article', { class: 'rollout', dataset: { id, status: r.status } },
      h('header', {}, h('h3', { class: 'mono' }, id), pill(r.status), h('span', { class: 'muted' }, `version ${r.version}`),
        r.reason ? h('span', { class: 'muted' }, r.reason) : ''),
      aborted ? h('p', { class: 'banner bad abort' },
        `${r.status}${r.reason ? ': ' + r.reason : ''}. No device starts again; those already published run to their end.`) : '',
      bar, legend,
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      rules.length ? h('div', {}, h('h4', {}, 'Abort rules'), h('ul', { class: 'rules' }, rules.map((a) =>
        h('li', { class: a.tripped ? 'tripped' : '', dataset: { tripped: String(!!a.tripped) } },
          `${a.when} reaches ${a.percent}% once ${a.min_finished} have finished`,
          a.finished !== undefined ? ` — now ${a.matching} of ${a.finished} finished (${Number(a.share_percent || 0).toFixed(1)}%)` : '',
          a.tripped ? h('b', {}, ' — tripped') : '')))) : '',
      history.length ? h('details', {}, h('summary', {}, `History (${history.length})`),
        h('ol', { class: 'timeline' }, history.map((e) => h('li', { class: 'tl event' },
          h('span', { class: 'when' }, time(e.at)),
          h('span', { class: 'what' }, e.from ? pill(e.from) : '', e.from ? ' → ' : '', pill(e.to), ' ', e.action || '', ' ', e.reason || ''),
          h('span', { class: 'muted' }, e.principal || ''))))) : '');
  }
}
