// The API as the page calls it: the signed-in token (sessionStorage) as
// Authorization: Bearer on every request; a body always as
// Content-Type: application/json, to the page's own origin.

const KEY = 'fleetctl.token';

export function token() { return sessionStorage.getItem(KEY) || ''; }
export function setToken(t) { t ? sessionStorage.setItem(KEY, t) : sessionStorage.removeItem(KEY); }

export class APIError extends Error {
  constructor(status, code, message) {
    super(message || code);
    this.status = status;
    this.code = code;
  }
}

// api sends one request and returns {data, headers, status}; an error answer
// throws an APIError with the API's stable code.
export async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new APIError(0, 'unreachable', 'the controller did not answer: ' + e.message);
  }
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!resp.ok) {
    throw new APIError(resp.status, (data && data.error) || 'http_' + resp.status, (data && data.message) || text);
  }
  return { data, headers: resp.headers, status: resp.status };
}

export const get = (path) => api('GET', path);
export const post = (path, body) => api('POST', path, body);

// page reads one page of a list: its items, X-Total-Count and the next
// page's path from Link rel="next" ('' on the last page).
export async function page(path) {
  const { data, headers } = await get(path);
  const total = Number(headers.get('X-Total-Count') || (data || []).length);
  return { items: data || [], total, next: nextLink(headers.get('Link') || '') };
}

export function nextLink(link) {
  for (const part of link.split(',')) {
    const m = part.match(/<([^>]*)>\s*;(.*)/);
    if (m && /rel="?next"?/.test(m[2])) return m[1];
  }
  return '';
}

export const enc = encodeURIComponent;
