// One device (#/devices/<id>): its presence, and its commands from GET
// /v1/devices/{id}: in_flight (published, not yet final, oldest first) and
// queued (its serial commands not yet published, in the order they will
// go out). Each command links to its timeline and shows its status. Read
// again on this device's events and, at most once a second, on command
// events (a new submit, one ending): the event stream does not say which
// device a command is for.

import { get, enc } from './api.js';
import { h, pill, ago, throttle, clear, errorText } from './dom.js';

const STATUSES = 10; // commands of each list whose status is read

export class DeviceView {
  constructor(app, id) {
    this.app = app;
    this.id = id;
    this.reload = throttle(() => this.load(), 1000);
  }

  mount(root) {
    this.body = h('div');
    this.err = h('p', { class: 'error', role: 'alert' });
    root.append(h('section', { class: 'panel', id: 'device', dataset: { id: this.id } },
      h('div', { class: 'head' }, h('a', { href: '#/fleet' }, '‹ Fleet'), h('h1', { class: 'mono' }, this.id)),
      this.err, this.body));
    this.load();
  }

  unmount() {}

  onEvent(ev) {
    if (ev.kind === 'reset' || ev.kind === 'command' || (ev.kind === 'device' && ev.id === this.id)) this.reload();
  }

  async load() {
    let d;
    try {
      d = (await get('/v1/devices/' + enc(this.id))).data;
    } catch (e) {
      this.err.textContent = errorText(e);
      return;
    }
    const inFlight = d.in_flight || [];
    const queued = d.queued || [];
    // The statuses of the first commands of each list, read together.
    const ids = [...inFlight.slice(0, STATUSES), ...queued.slice(0, STATUSES)];
    const statuses = new Map(await Promise.all(ids.map(async (id) => {
      try { return [id, (await get('/v1/commands/' + enc(id))).data]; } catch { return [id, null]; }
    })));
    this.err.textContent = '';
    this.render(d, inFlight, queued, statuses);
  }

  render(d, inFlight, queued, statuses) {
    const caps = [d.capabilities.dedupe ? 'dedupe' : '', d.capabilities.query ? 'query' : ''].filter(Boolean).join(', ');
    const facts = [
      ['Presence', pill(d.online ? 'online' : 'offline')], ['Seen', d.seen ? 'yes' : 'never'],
      ['Confirmed', d.confirmed ? 'yes' : 'not yet'], ['Session', d.session],
      ['Capabilities', caps || '—'], ['Last seen', ago(d.last_seen_at)],
    ];
    clear(this.body).append(
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      h('h2', {}, 'In flight ', h('span', { class: 'stat', id: 'device-in-flight-count' }, String(inFlight.length))),
      h('p', { class: 'muted' }, 'published and not final, oldest first (needs_attention holds its device until a person resolves it)'),
      list('device-in-flight', inFlight, statuses, 'nothing in flight'),
      h('h2', {}, 'Queued ', h('span', { class: 'stat', id: 'device-queued-count' }, String(queued.length))),
      h('p', { class: 'muted' }, 'serial commands not yet published, in the order they go out: the first when nothing serial is in flight'),
      list('device-queued', queued, statuses, 'no serial command waits'));
  }
}

// list is an ordered list of command ids, each a link to its timeline with
// its status and reason when read.
function list(id, ids, statuses, empty) {
  if (!ids.length) return h('p', { class: 'muted', id: id + '-empty' }, empty);
  return h('ol', { class: 'queue', id }, ids.map((cid) => {
    const c = statuses.get(cid);
    return h('li', { dataset: { id: cid, status: c ? c.status : '' } },
      h('a', { class: 'mono', href: '#/commands/' + enc(cid) }, cid), ' ',
      c ? [pill(c.status), ' ', c.action, c.reason ? ' · ' + c.reason : ''] : '');
  }));
}
