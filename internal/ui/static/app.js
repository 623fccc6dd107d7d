// The dashboard: sign-in when the API has --tokens, the live feed, and the
// views behind the hash routes #/fleet, #/devices/<id>,
// #/commands[?filters|/<id>], #/attention, #/approvals, #/rollouts.

import { get, token, setToken, APIError } from './api.js';
import { clear, debounce, throttle, errorText } from './dom.js';
import { Live } from './live.js';
import { FleetView } from './fleet.js';
import { DeviceView } from './devices.js';
import { CommandsView, CommandView } from './commands.js';
import { AttentionView, attentionCount } from './attention.js';
import { ApprovalsView, waitingCount } from './tasks.js';
import { RolloutsView } from './rollouts.js';

const $ = (id) => document.getElementById(id);

class App {
  constructor() {
    this.who = null;
    this.view = null;
    this.tasks = new Map(); // task events seen: id → {id, status, at}
    this.rollouts = new Set(); // rollout ids seen
    this.live = new Live((ev) => this.event(ev), (state) => this.liveState(state));
    this.refreshWaiting = debounce(() => this.waiting(), 500);
    this.refreshAttention = throttle(() => this.attention(), 1000);
    this.fleet = null;
  }

  async start() {
    $('login-form').addEventListener('submit', (e) => { e.preventDefault(); this.signIn($('token').value.trim()); });
    $('signout').addEventListener('click', () => { setToken(''); location.reload(); });
    window.addEventListener('hashchange', () => this.route());
    await this.check();
  }

  async check() {
    try {
      const { data } = await get('/v1/whoami');
      this.who = data;
    } catch (e) {
      if (e instanceof APIError && e.status === 401) { this.showLogin(token() ? 'that token is not valid' : ''); return; }
      this.showLogin(errorText(e));
      return;
    }
    $('login').hidden = true;
    $('nav').hidden = false;
    $('who').textContent = this.who.auth
      ? `${this.who.principal} (${this.who.roles.join(', ') || 'read only'})`
      : 'no tokens: every caller is anonymous with every role';
    $('who').dataset.principal = this.who.principal;
    $('signout').hidden = !this.who.auth;
    this.live.start();
    this.waiting();
    this.attention();
    this.route();
  }

  showLogin(msg) {
    $('nav').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = msg || '';
    $('token').value = '';
    clear($('view'));
    $('token').focus();
  }

  async signIn(t) {
    setToken(t);
    await this.check();
  }

  can(role) {
    const r = (this.who && this.who.roles) || [];
    return r.includes(role) || r.includes('admin');
  }

  route() {
    if (!this.who) return;
    const hash = (location.hash || '#/fleet').slice(2);
    const q = hash.indexOf('?');
    const parts = (q < 0 ? hash : hash.slice(0, q)).split('/');
    const query = q < 0 ? '' : hash.slice(q + 1);
    const name = parts[0] || 'fleet';
    if (this.view && this.view.unmount) this.view.unmount();
    const root = clear($('view'));
    switch (name) {
      case 'commands':
        this.view = parts[1] ? new CommandView(this, decodeURIComponent(parts.slice(1).join('/'))) : new CommandsView(this, query);
        break;
      case 'devices':
        this.view = parts[1] ? new DeviceView(this, decodeURIComponent(parts.slice(1).join('/'))) : new FleetView(this);
        break;
      case 'attention': this.view = new AttentionView(this); break;
      case 'approvals': this.view = new ApprovalsView(this); break;
      case 'rollouts': this.view = new RolloutsView(this); break;
      default: this.view = new FleetView(this);
    }
    const tab = name === 'devices' ? 'fleet' : name || 'fleet';
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === tab);
    document.body.dataset.view = name;
    this.view.mount(root);
  }

  event(ev) {
    switch (ev.kind) {
      case 'command': this.refreshAttention(); break;
      case 'task': {
        const t = this.tasks.get(ev.id) || { id: ev.id, trail: [] };
        if (t.trail[t.trail.length - 1] !== ev.status) t.trail.push(ev.status);
        t.status = ev.status;
        t.at = ev.at;
        this.tasks.delete(ev.id); // re-insert: newest last
        this.tasks.set(ev.id, t);
        if (this.view instanceof ApprovalsView) this.view.changed(t);
        this.refreshWaiting();
        break;
      }
      case 'rollout': this.rollouts.add(ev.id); break;
      case 'reset': this.refreshWaiting(); this.refreshAttention(); break;
    }
    if (this.view) this.view.onEvent(ev);
    $('live').dataset.events = String(this.live.count);
    $('live').dataset.last = this.live.lastId;
  }

  liveState(state) {
    const el = $('live');
    el.dataset.state = state;
    el.textContent = { live: 'live', connecting: 'connecting…', reconnecting: 'reconnecting…', offline: 'offline' }[state] || state;
  }

  async waiting() {
    try { this.setWaiting(await waitingCount()); } catch { /* the badge waits for the next event */ }
  }

  async attention() {
    try { this.setAttention(await attentionCount()); } catch { /* the badge waits for the next event */ }
  }

  setAttention(n) {
    const b = $('attention-badge');
    b.textContent = String(n);
    b.hidden = !n;
  }

  setWaiting(n) {
    const b = $('waiting-badge');
    b.textContent = String(n);
    b.hidden = !n;
  }

  flash(msg) {
    const f = $('flash');
    f.textContent = msg;
    f.hidden = false;
    clearTimeout(this.flashTimer);
    this.flashTimer = setTimeout(() => { f.hidden = true; }, 6000);
  }
}

new App().start();
