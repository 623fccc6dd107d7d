// The live feed: GET /v1/events through EventSource. EventSource cannot send
// headers, so the token goes as ?access_token= (this route alone takes it).
// On a dropped connection EventSource reconnects by itself with
// Last-Event-ID and the server replays what its buffer still holds; when the
// browser gives up (an error answer), the page reconnects after a pause with
// ?last_event_id=. An event of kind "reset" means events were missed: the
// page reads its lists again.

import { token, enc } from './api.js';

export class Live {
  constructor(onEvent, onState) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.lastId = '';
    this.count = 0;
    this.es = null;
    this.timer = 0;
  }

  start() {
    this.stop();
    const q = [];
    if (token()) q.push('access_token=' + enc(token()));
    if (this.lastId) q.push('last_event_id=' + enc(this.lastId));
    const es = new EventSource('/v1/events' + (q.length ? '?' + q.join('&') : ''));
    this.es = es;
    this.onState('connecting');
    es.onopen = () => this.onState('live');
    es.onmessage = (m) => {
      if (m.lastEventId) this.lastId = m.lastEventId;
      let ev;
      try { ev = JSON.parse(m.data); } catch { return; }
      this.count++;
      this.onEvent(ev);
    };
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) {
        this.onState('offline');
        this.timer = setTimeout(() => this.start(), 3000);
      } else {
        this.onState('reconnecting');
      }
    };
  }

  stop() {
    clearTimeout(this.timer);
    if (this.es) this.es.close();
    this.es = null;
  }
}
