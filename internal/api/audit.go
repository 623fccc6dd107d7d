package api

import (
	"net/http"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/store"
)

// GET /v1/audit?principal=&since=&until=&limit=&after= lists the changes
// people made, newest first (at, then id). It pages and reads since and
// until as the operators' lists do (oplists.go): since inclusive, until
// exclusive, on the change's time.

// auditFilters are the list's filters, in the order its next link names them.
var auditFilters = []string{"principal", "since", "until"}

func (s *Server) handleListAudit(r *http.Request) (int, any, error) {
	oq, err := parseOperatorList(r, auditFilters...)
	if err != nil {
		return 0, nil, err
	}
	if oq.page.After != "" {
		if _, err := store.ParseAuditCursor(oq.page.After); err != nil {
			return 0, nil, invalidParam("after", "not a cursor of this list: take it from the Link header of the previous page")
		}
	}
	var f store.AuditFilter
	if f.Principal, err = oq.one("principal", validPrincipal, "a principal"); err != nil {
		return 0, nil, err
	}
	if f.Since, f.Until, err = oq.times(); err != nil {
		return 0, nil, err
	}
	l, err := s.cfg.Store.ListAudit(r.Context(), f, oq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make([]apiwire.AuditEntry, 0, len(l.Items))
	for _, e := range l.Items {
		out = append(out, apiwire.AuditEntry{At: e.At, Principal: e.Principal, Action: e.Action, Kind: e.Kind, ID: e.EntityID, Detail: e.Detail})
	}
	return oq.answer(out, l.Total, l.Next)
}
