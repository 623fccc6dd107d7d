// Approvals: the tasks waiting for approval (GET /v1/tasks?status=
// waiting_approval, paged), each with its current plan; an approver approves
// the version shown (POST .../approvals {"version","plan_hash"}: a plan
// changed meanwhile is refused as stale_version, never approved unseen) or
// rejects it (POST .../rejections {"reason"}). Below, the tasks that changed
// since the page opened, as they go on.

import { post, page, enc } from './api.js';
import { h, pill, time, ago, json, debounce, clear, errorText } from './dom.js';

export class ApprovalsView {
  constructor(app) {
    this.app = app;
    this.cursors = [''];
    this.reload = debounce(() => this.load(), 250);
  }

  mount(root) {
    this.list = h('div', { class: 'tasks', id: 'waiting' });
    this.err = h('p', { class: 'error', role: 'alert' });
    this.count = h('span', { id: 'waiting-total' }, '…');
    this.recent = h('tbody');
    this.pager = h('div', { class: 'pager' });
    const can = this.app.can('approver');
    root.append(h('section', { class: 'panel', id: 'approvals' },
      h('div', { class: 'head' }, h('h1', {}, 'Waiting for approval'), h('span', { class: 'stat' }, this.count, ' tasks'),
        h('span', { class: 'spacer' }),
        can ? '' : h('span', { class: 'muted' }, 'you are not an approver: approve and reject are off')),
      this.err, this.list, this.pager),
    h('section', { class: 'panel' },
      h('div', { class: 'head' }, h('h2', {}, 'Tasks changed since this page opened')),
      h('table', { class: 'grid', id: 'task-changes' },
        h('thead', {}, h('tr', {}, ['Task', 'Status', 'Its states seen', 'Changed'].map((c) => h('th', {}, c)))), this.recent)));
    for (const t of this.app.tasks.values()) this.changed(t);
    this.load();
  }

  unmount() {}

  onEvent(ev) {
    if (ev.kind === 'reset' || ev.kind === 'task') this.reload();
  }

  changed(t) {
    const old = this.recent.querySelector(`tr[data-id="${CSS.escape(t.id)}"]`);
    if (old) old.remove();
    this.recent.prepend(h('tr', { dataset: { id: t.id, status: t.status } },
      h('td', { class: 'mono' }, t.id), h('td', {}, pill(t.status)),
      h('td', { class: 'trail' }, t.trail.map((s, i) => [i ? ' → ' : '', pill(s)])),
      h('td', { title: t.at }, ago(t.at))));
  }

  async load() {
    const after = this.cursors[this.cursors.length - 1];
    try {
      const p = await page('/v1/tasks?status=waiting_approval&limit=50' + (after ? '&after=' + enc(after) : ''));
      this.err.textContent = '';
      this.count.textContent = p.total;
      this.app.setWaiting(p.total);
      clear(this.list);
      for (const t of p.items) this.list.append(this.card(t));
      if (!p.items.length) this.list.append(h('p', { class: 'muted' }, 'nothing waits for approval'));
      const next = p.next ? new URL(p.next, location.origin).searchParams.get('after') : '';
      clear(this.pager).append(
        this.cursors.length > 1 ? h('button', { type: 'button', onclick: () => { this.cursors.pop(); this.load(); } }, '‹ Prev') : '',
        next ? h('button', { type: 'button', onclick: () => { this.cursors.push(next); this.load(); } }, 'Next ›') : '');
    } catch (e) {
      this.err.textContent = errorText(e);
    }
  }

  card(t) {
    const can = this.app.can('approver');
    const who = this.app.who;
    const own = who && who.auth && who.principal === t.author;
    const msg = h('p', { class: 'error', role: 'alert' });
    const reason = h('input', { class: 'reason', placeholder: 'reason for a rejection', spellcheck: 'false' });
    const buttons = [];
    const act = async (what, fn) => {
      buttons.forEach((b) => { b.disabled = true; });
      msg.textContent = '';
      try {
        await fn();
        this.app.flash(`${what} ${t.task_id} (version ${t.version})`);
        this.reload();
      } catch (e) {
        msg.textContent = errorText(e);
        buttons.forEach((b) => { b.disabled = !can; });
      }
    };
    const approve = h('button', { type: 'button', class: 'approve', disabled: !can,
      onclick: () => act('approved', () => post('/v1/tasks/' + enc(t.task_id) + '/approvals', { version: t.version, plan_hash: t.plan_hash })) },
    'Approve version ' + t.version);
    const reject = h('button', { type: 'button', class: 'reject danger', disabled: !can,
      onclick: () => act('rejected', () => post('/v1/tasks/' + enc(t.task_id) + '/rejections',
        { reason: reason.value.trim() || 'rejected on the dashboard' })) }, 'Reject');
    buttons.push(approve, reject);
    return h('article', { class: 'task', dataset: { id: t.task_id, version: t.version } },
      h('header', {}, h('h3', { class: 'mono' }, t.task_id), pill(t.status),
        h('span', { class: 'muted' }, `version ${t.version} by ${t.author} · plan ${t.plan_hash.slice(0, 12)} · created by ${t.created_by} ${ago(t.created_at)}`)),
      t.execute_after || t.execute_before
        ? h('p', { class: 'muted' }, `window ${time(t.execute_after)} → ${time(t.execute_before)}`) : '',
      h('table', { class: 'grid steps' },
        h('thead', {}, h('tr', {}, ['Step', 'Action', 'Target', 'Params'].map((c) => h('th', {}, c)))),
        h('tbody', {}, t.steps.map((s) => h('tr', {},
          h('td', { class: 'mono' }, s.step), h('td', {}, s.action), h('td', { class: 'mono' }, s.target),
          h('td', {}, h('code', {}, json(s.params))))))),
      own ? h('p', { class: 'muted' }, 'you wrote this version: four-eyes asks another approver') : '',
      h('div', { class: 'actions' }, approve, reason, reject),
      msg);
  }
}

// waitingCount is the number the navigation's badge shows.
export async function waitingCount() {
  const p = await page('/v1/tasks?status=waiting_approval&limit=1');
  return p.total;
}
