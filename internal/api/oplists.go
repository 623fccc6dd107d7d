package api

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// The operators' lists, GET /v1/operations and GET /v1/commands, are newest
// first (by start, then id; store/oplists.go) and page by an opaque
// cursor: ?limit= (1 to store.MaxOperatorLimit, store.DefaultOperatorLimit
// by default), ?after= from the Link rel="next" of the previous page (the
// same filters follow in it), X-Total-Count the number that match. Filters
// are ANDed: status (repeatable, or comma-separated, any of them; "open"
// is every state that is not terminal), device, action, task_id
// (operations), operation_id (commands), submitted_by (operations), since
// (start >= since) and until (start < until), RFC 3339. A value that can
// match nothing by its form (an unknown state, a malformed time or id)
// is refused with 400 invalid_request naming it, never answered with an
// empty list.

// operatorQuery is an operator list's query, checked.
type operatorQuery struct {
	path   string
	page   store.StartPage
	values url.Values // the filters as given, for the next link
	order  []string
}

// repeatable marks a list filter that may be given more than once (in a
// route's query list; checkQuery reads it).
const repeatable = "*"

// parseOperatorList checks limit, after and the filters' forms; the route
// already refused unknown parameters (checkQuery).
func parseOperatorList(r *http.Request, filters ...string) (operatorQuery, error) {
	q := r.URL.Query()
	oq := operatorQuery{path: r.URL.EscapedPath(), page: store.StartPage{Limit: store.DefaultOperatorLimit},
		values: url.Values{}, order: filters}
	var err error
	if oq.page.Limit, err = parseLimit(q, store.DefaultOperatorLimit, store.MaxOperatorLimit); err != nil {
		return oq, err
	}
	if v, ok := q["after"]; ok && v[0] != "" {
		if _, err := store.ParseStartCursor(v[0]); err != nil {
			return oq, invalidParam("after", fmt.Sprintf("%q is not a cursor of this list: take it from the Link header of the previous page", shorten(v[0])))
		}
		oq.page.After = v[0]
	}
	for _, f := range filters {
		for _, v := range q[f] {
			if v == "" {
				return oq, invalidParam(f, "empty; leave it out to list every one")
			}
			oq.values.Add(f, v)
		}
	}
	return oq, nil
}

// one is a filter's value ("" when absent), checked by valid (nil: any).
func (oq operatorQuery) one(name string, valid func(string) bool, form string) (string, error) {
	v := oq.values.Get(name)
	if v != "" && valid != nil && !valid(v) {
		return "", invalidParam(name, fmt.Sprintf("%q is not %s", shorten(v), form))
	}
	return v, nil
}

// times reads since and until.
func (oq operatorQuery) times() (since, until time.Time, err error) {
	for _, name := range []string{"since", "until"} {
		v := oq.values.Get(name)
		if v == "" {
			continue
		}
		t, perr := time.Parse(time.RFC3339Nano, v)
		if perr != nil {
			return since, until, invalidParam(name, fmt.Sprintf("%q: an RFC 3339 time, e.g. 2026-12-05T21:00:00Z", shorten(v)))
		}
		if name == "since" {
			since = t
		} else {
			until = t
		}
	}
	return since, until, nil
}

// statuses reads the status filter against a machine's states: each value
// one of them or "open" (the states that are not terminal), comma lists
// allowed; the set without repeats, in the machine's order.
func statuses[S ~string](oq operatorQuery, states []S, terminal func(S) bool) ([]S, error) {
	want := map[S]bool{}
	for _, v := range oq.values["status"] {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			switch {
			case s == "open":
				for _, st := range states {
					if !terminal(st) {
						want[st] = true
					}
				}
			case slices.Contains(states, S(s)):
				want[S(s)] = true
			default:
				names := make([]string, len(states))
				for i, st := range states {
					names[i] = string(st)
				}
				return nil, invalidParam("status", fmt.Sprintf("%q is not a state: %s, or open", shorten(s), strings.Join(names, ", ")))
			}
		}
	}
	var out []S
	for _, st := range states {
		if want[st] {
			out = append(out, st)
		}
	}
	return out, nil
}

// answer builds one page's answer as every list's (answerList).
func (oq operatorQuery) answer(items any, total int64, next string) (int, any, error) {
	return answerList(listQuery{path: oq.path, page: store.Page{Limit: oq.page.Limit}, values: oq.values, order: oq.order}, items, total, next)
}

var (
	operationFilters = []string{"status", "device", "action", "task_id", "submitted_by", "since", "until"}
	commandFilters   = []string{"status", "device", "action", "operation_id", "since", "until"}
)

// operatorListQuery is the query a route of an operator list takes.
func operatorListQuery(filters []string) []string {
	out := []string{"limit", "after"}
	for _, f := range filters {
		if f == "status" {
			f += repeatable
		}
		out = append(out, f)
	}
	return out
}

func validAction(v string) bool { return domain.ValidateAction(v) == nil }

// validPart is a task id's form (an operation id's part).
func validPart(v string) bool { return wire.IDChars(v, 64, false) }

func validOperationID(v string) bool { return domain.ValidateOperationID(v, 400) == nil }

func validPrincipal(v string) bool {
	return len(v) <= 200 && !strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// handleListOperations answers one page of operations, newest first.
func (s *Server) handleListOperations(r *http.Request) (int, any, error) {
	oq, err := parseOperatorList(r, operationFilters...)
	if err != nil {
		return 0, nil, err
	}
	var f store.OperationFilter
	if f.Statuses, err = statuses(oq, fsm.Operation.States(), fsm.OperationState.Terminal); err != nil {
		return 0, nil, err
	}
	if f.Device, err = oq.one("device", wire.ValidDeviceID, "a device id"); err != nil {
		return 0, nil, err
	}
	if f.Action, err = oq.one("action", validAction, "an action name"); err != nil {
		return 0, nil, err
	}
	if f.TaskID, err = oq.one("task_id", validPart, "a task id ([A-Za-z0-9._-]{1,64})"); err != nil {
		return 0, nil, err
	}
	if f.SubmittedBy, err = oq.one("submitted_by", validPrincipal, "a principal"); err != nil {
		return 0, nil, err
	}
	if f.Since, f.Until, err = oq.times(); err != nil {
		return 0, nil, err
	}
	l, err := s.cfg.Store.ListOperations(r.Context(), f, oq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make(apiwire.Operations, 0, len(l.Items))
	for _, op := range l.Items {
		out = append(out, operationView(op))
	}
	return oq.answer(out, l.Total, l.Next)
}

// handleListCommands answers one page of commands, newest first, each as
// GET /v1/commands/{id} shows it (with its receipts and events).
func (s *Server) handleListCommands(r *http.Request) (int, any, error) {
	oq, err := parseOperatorList(r, commandFilters...)
	if err != nil {
		return 0, nil, err
	}
	var f store.CommandFilter
	if f.Statuses, err = statuses(oq, fsm.Command.States(), fsm.CommandState.Terminal); err != nil {
		return 0, nil, err
	}
	if f.Device, err = oq.one("device", wire.ValidDeviceID, "a device id"); err != nil {
		return 0, nil, err
	}
	if f.Action, err = oq.one("action", validAction, "an action name"); err != nil {
		return 0, nil, err
	}
	if f.OperationID, err = oq.one("operation_id", validOperationID, "an operation id"); err != nil {
		return 0, nil, err
	}
	if f.Since, f.Until, err = oq.times(); err != nil {
		return 0, nil, err
	}
	l, err := s.cfg.Store.ListCommands(r.Context(), f, oq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make([]apiwire.Command, 0, len(l.Items))
	for _, c := range l.Items {
		receipts, err := s.cfg.Store.Receipts(r.Context(), c.CommandID)
		if err != nil {
			return 0, nil, err
		}
		events, err := s.cfg.Store.Events(r.Context(), c.CommandID)
		if err != nil {
			return 0, nil, err
		}
		out = append(out, commandView(c, receipts, events))
	}
	return oq.answer(out, l.Total, l.Next)
}
