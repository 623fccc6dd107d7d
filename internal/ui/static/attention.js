// Needs attention: the queue of commands a person must resolve (GET
// /v1/commands?status=needs_attention), oldest first, each with its
// evidence: its events, receipts and the queries asked with their answers
// (GET /v1/commands/{id}), and the device's presence and capabilities (GET
// /v1/devices/{id}). An operator resolves one with what they found out
// (POST /v1/commands/{id}/resolve {"outcome","note"}). The queue stays
// live: a command that leaves needs_attention leaves the page, one that
// enters it is read in.

import { get, post, page, enc } from './api.js';
import { h, pill, time, ago, json, throttle, clear, errorText } from './dom.js';
import { listPath, afterOf, timeline } from './commands.js';

const PAGES = 20; // pages of 100 read at most: the 2,000 newest waiting
const SHOWN = 200; // entries shown, the oldest of those read

export class AttentionView {
  constructor(app) {
    this.app = app;
    this.cards = new Map(); // command id → its card
    this.reload = throttle(() => this.load(), 1000);
  }

  mount(root) {
    this.list = h('div', { class: 'tasks', id: 'attention-queue' });
    this.err = h('p', { class: 'error', role: 'alert' });
    this.count = h('span', { id: 'attention-total' }, '…');
    this.more = h('p', { class: 'muted' });
    root.append(h('section', { class: 'panel', id: 'attention' },
      h('div', { class: 'head' }, h('h1', {}, 'Needs attention'),
        h('span', { class: 'stat' }, this.count, ' commands wait for a person'),
        h('span', { class: 'muted' }, 'oldest first'),
        h('span', { class: 'spacer' }),
        this.app.can('operator') ? '' : h('span', { class: 'muted' }, 'you are not an operator: resolve is off')),
      h('p', { class: 'muted' }, 'The controller could not learn whether these ran: the device cannot deduplicate, ' +
        'or its answers ran out. Find out on the device, then record what happened.'),
      this.err, this.list, this.more));
    this.load();
  }

  unmount() { this.cards.clear(); }

  onEvent(ev) {
    if (ev.kind === 'reset') { this.reload(); return; }
    if (ev.kind !== 'command') return;
    const card = this.cards.get(ev.id);
    if (card && ev.status !== 'needs_attention') { // resolved, here or elsewhere
      card.remove();
      this.cards.delete(ev.id);
      this.reload();
    } else if (!card && ev.status === 'needs_attention') {
      this.reload();
    }
  }

  async load() {
    const waiting = [];
    let total = 0;
    try {
      let path = listPath('/v1/commands', { status: 'needs_attention' }, 100, '');
      for (let n = 0; path && n < PAGES; n++) {
        const p = await page(path);
        total = p.total;
        waiting.push(...p.items);
        path = p.next ? listPath('/v1/commands', { status: 'needs_attention' }, 100, afterOf(p.next)) : '';
      }
    } catch (e) {
      this.err.textContent = errorText(e);
      return;
    }
    this.err.textContent = '';
    this.count.textContent = String(total);
    this.app.setAttention(total);
    const oldest = waiting.reverse().slice(0, SHOWN);
    const keep = new Set(oldest.map((c) => c.command_id));
    for (const [id, card] of this.cards) {
      if (!keep.has(id)) { card.remove(); this.cards.delete(id); }
    }
    for (const c of oldest) { // in order: an existing card keeps its evidence
      let card = this.cards.get(c.command_id);
      if (!card) {
        card = this.card(c);
        this.cards.set(c.command_id, card);
      }
      this.list.append(card);
    }
    if (!oldest.length) clear(this.list).append(h('p', { class: 'muted', id: 'attention-empty' }, 'nothing waits for a person'));
    else { const e = this.list.querySelector('#attention-empty'); if (e) e.remove(); }
    this.more.textContent = total > oldest.length
      ? `showing the ${oldest.length} oldest of ${total}; resolve these to see the rest` : '';
  }

  card(c) {
    const can = this.app.can('operator');
    const evidence = h('div', { class: 'evidence' }, h('p', { class: 'muted' }, 'reading its evidence…'));
    const msg = h('p', { class: 'error', role: 'alert' });
    const outcome = (v) => h('label', {}, h('input', { type: 'radio', name: 'outcome-' + c.command_id, value: v, class: 'outcome-' + v }), ' ' + v);
    const note = h('input', { class: 'note', placeholder: 'what you found on the device (required)', spellcheck: 'false', disabled: !can });
    const resolve = h('button', { type: 'submit', class: 'resolve', disabled: !can }, 'Resolve');
    const form = h('form', { class: 'actions resolve-form', onsubmit: async (e) => {
      e.preventDefault();
      const picked = form.querySelector('input[type=radio]:checked');
      msg.textContent = '';
      if (!picked) { msg.textContent = 'choose succeeded or failed'; return; }
      if (!note.value.trim()) { msg.textContent = 'say what you found: the note is kept with the resolve'; return; }
      resolve.disabled = true;
      try {
        await post('/v1/commands/' + enc(c.command_id) + '/resolve', { outcome: picked.value, note: note.value.trim() });
        this.app.flash(`resolved ${c.command_id} as ${picked.value}`);
        card.remove();
        this.cards.delete(c.command_id);
        this.reload();
      } catch (err) {
        msg.textContent = errorText(err);
        resolve.disabled = !can;
      }
    } }, 'Outcome:', outcome('succeeded'), outcome('failed'), note, resolve);
    const card = h('article', { class: 'task attention', dataset: { id: c.command_id, device: c.device_id } },
      h('header', {}, h('h3', {}, h('a', { class: 'mono', href: '#/commands/' + enc(c.command_id) }, c.command_id)), pill(c.status),
        h('span', { class: 'muted' }, `${c.action} on ${c.device_id} · operation ${c.operation_id} · issued ${time(c.issued_at)} (${ago(c.issued_at)})`)),
      c.reason ? h('p', {}, 'Why: ', h('b', {}, c.reason)) : '',
      evidence, form, msg);
    this.evidence(c, evidence);
    return card;
  }

  async evidence(c, el) {
    let cmd;
    let dev = null;
    try {
      [cmd, dev] = await Promise.all([
        get('/v1/commands/' + enc(c.command_id)).then((r) => r.data),
        get('/v1/devices/' + enc(c.device_id)).then((r) => r.data).catch(() => null),
      ]);
    } catch (e) {
      clear(el).append(h('p', { class: 'error' }, errorText(e)));
      return;
    }
    const answered = (cmd.query_log || []).filter((q) => q.answered_at).length;
    const facts = [
      ['Params', h('code', {}, json(cmd.params))],
      ['Published', `${cmd.attempt} time(s), QoS ${cmd.qos}, last ${time(cmd.last_sent_at)}`],
      ['Queries', `${cmd.queries} asked, ${answered} answered`],
      ['Receipts', String(cmd.receipts.length)],
      ['Device', dev
        ? h('span', { class: 'presence' }, pill(dev.online ? 'online' : 'offline'),
          ` session ${dev.session} · dedupe ${dev.capabilities.dedupe ? 'yes' : 'no'} · query ${dev.capabilities.query ? 'yes' : 'no'}` +
          ` · last seen ${time(dev.last_seen_at)}`)
        : 'not known to the controller'],
    ];
    clear(el).append(
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      h('ol', { class: 'timeline' }, timeline(cmd)));
  }
}

// attentionCount is the number the navigation's Needs attention badge shows.
export async function attentionCount() {
  const p = await page('/v1/commands?status=needs_attention&limit=1');
  return p.total;
}
