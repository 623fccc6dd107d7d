package api

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/store"
)

// GET /v1/audit?principal=&since=&until=&limit=&after= lists the changes
// people made, newest first (at, then id). It pages as the operators'
// lists page: ?limit= from 1 to auditMaxLimit (auditDefaultLimit by
// default), an opaque ?after= cursor taken from the Link rel="next" header,
// the total in X-Total-Count. since and until are RFC 3339 times bounding
// at (since inclusive, until exclusive).

// The audit list's page sizes (the contract's for the operators' lists).
const (
	auditDefaultLimit = 100
	auditMaxLimit     = 1000
)

// auditFilters are the list's filters, in the order its next link names them.
var auditFilters = []string{"principal", "since", "until"}

func (s *Server) handleListAudit(r *http.Request) (int, any, error) {
	q := r.URL.Query()
	lq := listQuery{path: r.URL.EscapedPath(), page: store.Page{Limit: auditDefaultLimit}, values: url.Values{}, order: auditFilters}
	var f store.AuditFilter
	var p store.AuditPage
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > auditMaxLimit {
			return 0, nil, invalidParam("limit", fmt.Sprintf("%q: an integer from 1 to %d (default %d)", v[0], auditMaxLimit, auditDefaultLimit))
		}
		lq.page.Limit = n
	}
	p.Limit = lq.page.Limit
	if v, ok := q["after"]; ok && v[0] != "" { // an empty after is the start
		c, err := decodeAuditCursor(v[0])
		if err != nil {
			return 0, nil, invalidParam("after", "not a cursor of this list (take it from the Link header)")
		}
		p.After = &c
	}
	if v, ok := q["principal"]; ok && v[0] != "" {
		if len(v[0]) > 200 {
			return 0, nil, invalidParam("principal", "at most 200 bytes")
		}
		f.Principal = v[0]
		lq.values.Set("principal", v[0])
	}
	for _, b := range []struct {
		name string
		into **time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		v, ok := q[b.name]
		if !ok || v[0] == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, v[0])
		if err != nil {
			return 0, nil, invalidParam(b.name, fmt.Sprintf("%q: an RFC 3339 time", shorten(v[0])))
		}
		*b.into = &at
		lq.values.Set(b.name, v[0])
	}
	l, err := s.cfg.Store.ListAudit(r.Context(), f, p)
	if err != nil {
		return 0, nil, err
	}
	out := make([]apiwire.AuditEntry, 0, len(l.Items))
	for _, e := range l.Items {
		out = append(out, apiwire.AuditEntry{At: e.At, Principal: e.Principal, Action: e.Action, Kind: e.Kind, ID: e.EntityID, Detail: e.Detail})
	}
	next := ""
	if l.Next != nil {
		next = encodeAuditCursor(*l.Next)
	}
	return answerList(lq, out, l.Total, next)
}

// An audit cursor is base64url (unpadded) of "<at in ms>.<id>": the last
// entry of the page before. Opaque to callers; only this server reads it.
func encodeAuditCursor(c store.AuditCursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.At.UnixMilli(), 10) + "." + strconv.FormatInt(c.ID, 10)))
}

func decodeAuditCursor(s string) (store.AuditCursor, error) {
	if len(s) > 64 {
		return store.AuditCursor{}, fmt.Errorf("cursor too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.AuditCursor{}, err
	}
	at, id, ok := strings.Cut(string(b), ".")
	if !ok {
		return store.AuditCursor{}, fmt.Errorf("cursor %q: no id", b)
	}
	ms, err := strconv.ParseInt(at, 10, 64)
	if err != nil || ms < 0 {
		return store.AuditCursor{}, fmt.Errorf("cursor %q: bad time", b)
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n < 1 {
		return store.AuditCursor{}, fmt.Errorf("cursor %q: bad id", b)
	}
	return store.AuditCursor{At: time.UnixMilli(ms).UTC(), ID: n}, nil
}
