// Package api is the controller's HTTP API (JSON under /v1), as the contract
// lists it. Handlers decode, call the domain service (internal/ops) for
// changes or the store for reads, and return; one adapter writes the answer
// and maps every error to its status and stable code (toAPIError).
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// MaxBody bounds every request body.
const MaxBody = 1 << 20

// MaxWait caps ?wait=.
const MaxWait = 60 * time.Second

// Config configures a Server.
type Config struct {
	// Service applies the domain rules of every change; reads go to Store.
	Service  *ops.Service
	Store    store.Store
	Instance string
	Logger   *slog.Logger
	Metrics  http.Handler
	Auth     *Auth // nil: auth off
	// Failpoints: submit-after-commit, between the commit and the answer.
	Failpoints *failpoint.Set
	// Rollouts applies the domain rules of rollouts.
	Rollouts *rollout.Service
	// WaitPoll is how often the ?wait= callers look, in one read for all,
	// for changes no wake-up announced (another instance's); 250 ms by
	// default.
	WaitPoll time.Duration
	// Hosts are the Host values the API answers to (the browser rules,
	// browser.go); nil: any (no Host check, and an Origin must equal the
	// request's Host).
	Hosts *HostPolicy
	// Refused counts each request refused by a limit or rule, by reason
	// (controller_inputs_refused_total{source="http"}); nil counts nothing.
	Refused func(reason string)
	// Events feeds GET /v1/events (events.go); nil: no stream.
	Events *events.Bus
	// UI serves the dashboard under /ui/ (internal/ui); nil: none.
	UI http.Handler
	// Health is nil while the instance can serve, else why it cannot
	// (store.DB.Err: a file of the SQLite database left its path): /healthz
	// then answers 503 with that reason. nil: always healthy.
	Health func() error
}

// Server serves the API.
type Server struct {
	cfg Config
	mux *routeMux
	hub *Hub
}

// handler is one route: it returns the status and body to write, or an
// error that writeError maps to its status and code, in one place.
type handler func(r *http.Request) (int, any, error)

// New builds the Server and its routes.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.WaitPoll <= 0 {
		cfg.WaitPoll = 250 * time.Millisecond
	}
	var ended func(ctx context.Context, ids []string) ([]string, error)
	if cfg.Store != nil {
		ended = cfg.Store.Ended
	}
	s := &Server{cfg: cfg, mux: newRouteMux(), hub: NewHub(cfg.WaitPoll, ended, cfg.Logger)}
	// Each route's {id} is checked against its rule (400 invalid_request,
	// bad_id), and its query string against the parameters it takes (400
	// invalid_request: any other, or one given twice), before the handler
	// runs.
	wait, list := []string{"wait"}, func(filters ...string) []string { return append([]string{"limit", "after"}, filters...) }
	routes := []struct {
		pattern, role string
		id            *idRule
		query         []string
		h             handler
	}{
		{"POST /v1/operations", RoleOperator, nil, nil, s.handleSubmit},
		{"GET /v1/operations/{id}", "", &anyOpID, wait, s.handleGetOperation},
		{"POST /v1/operations/{id}/compensations", RoleOperator, &anyOpID, nil, s.handleCompensate},
		{"GET /v1/operations", "", nil, operatorListQuery(operationFilters), s.handleListOperations},
		{"GET /v1/commands", "", nil, operatorListQuery(commandFilters), s.handleListCommands},
		{"GET /v1/commands/{id}", "", &plainID, nil, s.handleGetCommand},
		{"POST /v1/commands/{id}/cancel", RoleOperator, &plainID, nil, s.handleCancel},
		{"POST /v1/commands/{id}/resolve", RoleOperator, &plainID, nil, s.handleResolve},
		{"GET /v1/devices", "", nil, list("online"), s.handleListDevices},
		{"GET /v1/devices/{id}", "", &deviceID, nil, s.handleGetDevice},
		{"POST /v1/devices/{id}/presence/reset", RoleAdmin, &deviceID, nil, s.handleResetPresence},
		{"POST /v1/tasks", RoleOperator, nil, nil, s.handleCreateTask},
		{"GET /v1/tasks/{id}", "", &partID, nil, s.handleGetTask},
		{"PUT /v1/tasks/{id}/plan", RoleOperator, &partID, nil, s.handlePlan},
		{"POST /v1/tasks/{id}/approvals", RoleApprover, &partID, nil, s.handleApprove},
		{"POST /v1/tasks/{id}/rejections", RoleApprover, &partID, nil, s.handleReject},
		{"POST /v1/grants", RoleAdmin, nil, nil, s.handleCreateGrant},
		{"GET /v1/grants", "", nil, list("all"), s.handleListGrants},
		{"DELETE /v1/grants/{id}", RoleAdmin, &plainID, nil, s.handleRevokeGrant},
		{"GET /v1/instances", "", nil, list("all"), s.handleListInstances},
		{"POST /v1/rollouts", RoleOperator, nil, nil, s.handleCreateRollout},
		{"GET /v1/rollouts", "", nil, list("status"), s.handleListRollouts},
		{"GET /v1/rollouts/{id}", "", &partID, nil, s.handleGetRollout},
		{"GET /v1/rollouts/{id}/devices", "", &partID, list("status"), s.handleListRolloutDevices},
		{"POST /v1/rollouts/{id}/pause", RoleOperator, &partID, nil, s.rolloutMove(store.RolloutPause)},
		{"POST /v1/rollouts/{id}/resume", RoleOperator, &partID, nil, s.rolloutMove(store.RolloutResume)},
		{"POST /v1/rollouts/{id}/cancel", RoleOperator, &partID, nil, s.rolloutMove(store.RolloutCancel)},
		{"POST /v1/rollouts/{id}/approvals", RoleApprover, &partID, nil, s.handleApproveRollout},
		{"GET /v1/audit", "", nil, list(auditFilters...), s.handleListAudit}, // audit.go
	}
	for _, rt := range routes {
		h := withQuery(rt.query, rt.h)
		if rt.id != nil {
			h = withID(*rt.id, h)
		}
		s.mux.HandleFunc(rt.pattern, s.need(rt.role, s.serve(h)))
	}
	s.dashboardRoutes() // events.go: the event stream, the task list, whoami, /ui/
	// openapi.go: the document of every route, served without a token.
	s.mux.HandleFunc("GET /v1/openapi.json", s.serve(withQuery(nil, s.handleOpenAPI)))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if cfg.Health != nil {
			if err := cfg.Health(); err != nil {
				writeJSON(w, http.StatusServiceUnavailable,
					map[string]string{"status": "failing", "instance": cfg.Instance, "reason": err.Error()})
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "instance": cfg.Instance})
	})
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := s.allowed(r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			s.writeError(w, apiErr(http.StatusMethodNotAllowed, "method_not_allowed",
				shorten(r.URL.Path)+" takes "+strings.Join(allow, ", ")+", not "+shorten(r.Method)))
			return
		}
		s.writeError(w, apiErr(http.StatusNotFound, "not_found", "no route "+shorten(r.Method)+" "+shorten(r.URL.Path)))
	})
	return s
}

// methods are those a route may serve, in the order Allow lists them.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// allowed lists the methods that a route other than the catch-all serves at
// r's path (a GET route serves HEAD too), for the 405 of a request whose
// method none does: the catch-all keeps net/http's own 405 from answering.
func (s *Server) allowed(r *http.Request) []string {
	var out []string
	for _, m := range methods {
		probe := r.WithContext(r.Context()) // a shallow copy
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
			out = append(out, m)
		}
	}
	return out
}

// withQuery refuses a query parameter the route does not take, or one
// given twice (400 invalid_request, naming it), before h runs: one rule
// for every route, so that a misspelt ?wiat= is not silently ignored.
func withQuery(takes []string, h handler) handler {
	return func(r *http.Request) (int, any, error) {
		if err := checkQuery(r.URL.Query(), "route", takes); err != nil {
			return 0, nil, err
		}
		return h(r)
	}
}

// withID checks the route's {id} before h runs.
func withID(rule idRule, h handler) handler {
	return func(r *http.Request) (int, any, error) {
		if err := rule.check("id", r.PathValue("id"), true); err != nil {
			return 0, nil, err
		}
		return h(r)
	}
}

// serve adapts a handler to net/http: the one place that writes its answer
// or its error.
func (s *Server) serve(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		status, body, err := h(r)
		if err != nil {
			s.writeError(w, err)
			return
		}
		if l, ok := body.(listed); ok {
			for k, v := range l.header {
				w.Header()[k] = v
			}
			body = l.body
		}
		writeJSON(w, status, body)
	}
}

// MountMCP serves the agent interface (internal/mcpserver) at /mcp behind
// the same bearer tokens: any valid one gets in, and each tool call is a
// request to the routes here, which check its role. The handler calls this
// Server, so it is built after it and mounted before the Server serves.
func (s *Server) MountMCP(h http.Handler) {
	s.mux.Handle("/mcp", s.need("", h.ServeHTTP))
}

// Started is told of an operation this instance's store committed as
// started: until its end is told (Changed), a ?wait= request for it waits
// without reading it first.
func (s *Server) Started(operationID string) { s.hub.Started(operationID) }

// Changed wakes the ?wait= requests of an operation that left started:
// with committed, the operation as its change committed it, they answer
// with it; with nil, they read it again.
func (s *Server) Changed(operationID string, committed *domain.Operation) {
	s.hub.Notify(operationID, committed)
}

// Reset is told that facts were lost: no operation is known started.
func (s *Server) Reset() { s.hub.Reset() }

// ServeHTTP implements http.Handler: the browser rules first (browser.go),
// then the body limit, then the routes (auth, then the handler).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := s.checkBrowser(r); err != nil {
		s.writeError(w, err)
		return
	}
	if r.ContentLength > MaxBody {
		// Refused before a byte of it is read; the connection is closed
		// rather than drained.
		w.Header().Set("Connection", "close")
		s.writeError(w, refusal(http.StatusRequestEntityTooLarge, "too_large", wire.ReasonTooLarge,
			fmt.Sprintf("request body of %d bytes exceeds 1 MiB", r.ContentLength)))
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
	}
	s.mux.ServeHTTP(w, r)
}

// nulField names the first string of v holding a NUL character, or "".
// PostgreSQL's text cannot store one: a reason, note or grant pattern with
// it would fail in the store (503, retried in vain) instead of being
// refused. Params are raw JSON, where a NUL stays the escape \u0000.
func nulField(v reflect.Value, path string) string {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			return nulField(v.Elem(), path)
		}
	case reflect.String:
		if strings.IndexByte(v.String(), 0) >= 0 {
			return path
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.Uint8 { // json.RawMessage is raw JSON
			for i := range v.Len() {
				if f := nulField(v.Index(i), fmt.Sprintf("%s[%d]", path, i)); f != "" {
					return f
				}
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if sf := v.Type().Field(i); sf.IsExported() {
				name := jsonName(sf)
				if path != "" {
					name = path + "." + name
				}
				if f := nulField(v.Field(i), name); f != "" {
					return f
				}
			}
		}
	}
	return ""
}

// inexactName returns the first member name in the value dec reads that
// encoding/json would match to a field of t only case-insensitively
// ("Target", "OPERATION_ID"), at any depth where t is a struct, or "".
// Field names are exact: beside the exact one, such a name would be a
// duplicate silently resolved (the last wins) instead of refused. Names that
// match no field are left to DisallowUnknownFields, syntax errors to the
// decoder (ok false: the walk stopped there).
func inexactName(dec *json.Decoder, t reflect.Type) (name string, ok bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return "", false
	}
	d, _ := tok.(json.Delim)
	selfDecoding := reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) // RawMessage, time.Time
	switch {
	case d == '{' && t.Kind() == reflect.Struct && !selfDecoding:
		for dec.More() {
			tok, err := dec.Token()
			name, isName := tok.(string)
			if err != nil || !isName {
				return "", false
			}
			var field reflect.Type
			for i := range t.NumField() {
				if jsonName(t.Field(i)) == name {
					field = t.Field(i).Type
				}
			}
			if field == nil {
				for i := range t.NumField() {
					if strings.EqualFold(jsonName(t.Field(i)), name) { // as encoding/json folds
						return name, true
					}
				}
				return "", false // no field at all: DisallowUnknownFields refuses it
			}
			if bad, ok := inexactName(dec, field); bad != "" || !ok {
				return bad, ok
			}
		}
	case d == '[' && t.Kind() == reflect.Slice && !selfDecoding:
		for dec.More() {
			if bad, ok := inexactName(dec, t.Elem()); bad != "" || !ok {
				return bad, ok
			}
		}
	case d == '{' || d == '[':
		for depth := 1; depth > 0; { // a value of its own (params, times): skipped whole
			tok, err := dec.Token()
			if err != nil {
				return "", false
			}
			switch tok {
			case json.Delim('{'), json.Delim('['):
				depth++
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
		}
		return "", true
	default:
		return "", true
	}
	_, err = dec.Token() // the closing '}' or ']'
	return "", err == nil
}

// jsonName is the member name encoding/json gives a struct field.
func jsonName(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
		return name
	}
	return f.Name
}

// created is 201 for something new, 200 for what already existed.
func created(c bool) int {
	if c {
		return http.StatusCreated
	}
	return http.StatusOK
}

func (s *Server) handleSubmit(r *http.Request) (int, any, error) {
	var req apiwire.SubmitRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := checkSubmit(req, r.Header.Get("Idempotency-Key")); err != nil {
		return 0, nil, err
	}
	via, err := channel(r)
	if err != nil {
		return 0, nil, err
	}
	op, isNew, err := s.cfg.Service.SubmitVia(r.Context(), ops.Intent(req), r.Header.Get("Idempotency-Key"), principal(r), via)
	if err != nil {
		return 0, nil, err
	}
	if err := s.cfg.Failpoints.HitContext(r.Context(), failpoint.SubmitAfterCommit); err != nil {
		return 0, nil, err // the commit stands: a retry gets 200 and the same command_id
	}
	return created(isNew), operationView(op), nil
}

func (s *Server) handleGetOperation(r *http.Request) (int, any, error) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > MaxWait {
			return 0, nil, apiErr(http.StatusBadRequest, "invalid_wait", "wait takes a Go duration up to 60s, e.g. ?wait=30s")
		}
		wait = d
	}
	op, err := s.waitOperation(r.Context(), r.PathValue("id"), wait)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, operationView(op), nil
}

// waitOperation returns the operation once it leaves started, or when wait
// ends. It wakes on this instance's changes, answered with the operation
// as the change committed it, and (read again) on other instances': by the
// store's wake-ups, and for changes no wake-up reached, by the hub's poll,
// one read every Config.WaitPoll for all the callers waiting that long. It
// reads the operation first, unless this instance committed it as started
// and has not seen it end (the hub's hint).
func (s *Server) waitOperation(ctx context.Context, id string, wait time.Duration) (domain.Operation, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for first := true; ; first = false {
		ch, started := s.hub.Watch(id)
		if !first || !started || wait == 0 {
			op, err := s.cfg.Store.GetOperation(ctx, id)
			if err != nil || op.Status != fsm.OpStarted || wait == 0 {
				s.hub.Unwatch(id, ch)
				return op, err
			}
		}
		select {
		case committed := <-ch:
			if committed != nil {
				s.hub.Unwatch(id, ch)
				return *committed, nil
			}
		case <-deadline.C:
			s.hub.Unwatch(id, ch)
			return s.cfg.Store.GetOperation(ctx, id)
		case <-ctx.Done():
			s.hub.Unwatch(id, ch)
			return domain.Operation{}, ctx.Err()
		}
		s.hub.Unwatch(id, ch)
	}
}

func (s *Server) handleGetCommand(r *http.Request) (int, any, error) {
	return s.command(r.Context(), r.PathValue("id"))
}

// command answers with a command, its receipt log and its events.
func (s *Server) command(ctx context.Context, id string) (int, any, error) {
	c, err := s.cfg.Store.GetCommand(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	receipts, err := s.cfg.Store.Receipts(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	events, err := s.cfg.Store.Events(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	queries, err := s.cfg.Store.Queries(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	if c.QueuedBehind, err = s.cfg.Store.QueuedBehind(ctx, c); err != nil {
		return 0, nil, err
	}
	v := commandView(c, receipts, events)
	for _, q := range queries {
		v.QueryLog = append(v.QueryLog, apiwire.Query{QueryID: q.QueryID, SentAt: q.SentAt, Instance: q.Instance,
			AnsweredAt: q.AnsweredAt, Answer: q.Answer})
	}
	return http.StatusOK, v, nil
}

func (s *Server) handleCancel(r *http.Request) (int, any, error) {
	if err := decodeOptionalBody(r, &struct{}{}); err != nil {
		return 0, nil, err
	}
	c, err := s.cfg.Service.Cancel(r.Context(), r.PathValue("id"), principal(r))
	if err != nil {
		return 0, nil, err
	}
	return s.command(r.Context(), c.CommandID)
}

func (s *Server) handleResolve(r *http.Request) (int, any, error) {
	var req apiwire.ResolveRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	c, err := s.cfg.Service.Resolve(r.Context(), r.PathValue("id"), req.Outcome, req.Note, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return s.command(r.Context(), c.CommandID)
}

// handleListDevices answers one page of devices: ?limit=, ?after=,
// ?online=true|false.
func (s *Server) handleListDevices(r *http.Request) (int, any, error) {
	lq, err := parseList(r, "online")
	if err != nil {
		return 0, nil, err
	}
	online, err := lq.boolParam("online")
	if err != nil {
		return 0, nil, err
	}
	devs, err := s.cfg.Store.ListDevices(r.Context(), store.DeviceFilter{Online: online}, lq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make([]apiwire.Device, 0, len(devs.Items))
	for _, d := range devs.Items {
		out = append(out, deviceView(d))
	}
	return answerList(lq, out, devs.Total, devs.Next)
}

func (s *Server) handleGetDevice(r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	d, err := s.cfg.Store.GetDevice(r.Context(), id)
	if errors.Is(err, domain.ErrNotFound) && wire.ValidDeviceID(id) {
		d, err = store.UnseenDevice(id), nil // never seen: offline, no capabilities
	}
	if err != nil {
		return 0, nil, err
	}
	q, err := s.cfg.Store.DeviceQueue(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, apiwire.DeviceDetail{Device: deviceView(d), InFlight: q.InFlight, Queued: q.Queued}, nil
}

func (s *Server) handleResetPresence(r *http.Request) (int, any, error) {
	if err := decodeOptionalBody(r, &struct{}{}); err != nil {
		return 0, nil, err
	}
	d, err := s.cfg.Service.ResetPresence(r.Context(), r.PathValue("id"), principal(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, deviceView(d), nil
}

// Hub wakes waiters on an operation's change, with the operation as
// committed when the change had it (nil: read it again). It also knows
// which operations this instance's store committed as started and has not
// yet told ended: a hint that spares a waiter its first read, never an
// answer (a lost end costs a poll).
//
// With ended, it also looks for the changes no wake-up announced (another
// instance's, on an SQLite file shared without notifications): every
// interval, while anyone waits, one read names the operations waited for
// at least that long that are no longer started, and their waiters read
// them again.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan *domain.Operation]struct{}
	since   map[string]time.Time // when the oldest current waiter of an id began
	started map[string]struct{}

	every   time.Duration
	ended   func(ctx context.Context, ids []string) ([]string, error)
	log     *slog.Logger
	polling chan struct{} // closed to stop the running poll; nil: none runs
}

// maxStarted bounds the hint: beyond it (ends told elsewhere, on an SQLite
// file shared without wake-ups) it starts again empty.
const maxStarted = 1 << 16

// NewHub builds an empty Hub that looks every interval, while anyone
// waits, for the operations waited for that are no longer started (ended,
// one read for all of them; nil: it never looks); a failed read wakes
// their waiters, who read for themselves.
func NewHub(every time.Duration, ended func(ctx context.Context, ids []string) ([]string, error), log *slog.Logger) *Hub {
	return &Hub{waiters: map[string]map[chan *domain.Operation]struct{}{}, since: map[string]time.Time{},
		started: map[string]struct{}{}, every: every, ended: ended, log: log}
}

// poll is the running poll: it stops once stop is closed, when the last
// waiter left.
func (h *Hub) poll(stop chan struct{}) {
	t := time.NewTimer(h.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		cutoff := time.Now().Add(-h.every)
		var ids []string
		for id, at := range h.since {
			if !at.After(cutoff) {
				ids = append(ids, id)
			}
		}
		h.mu.Unlock()
		if len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
			ended, err := h.ended(ctx, ids)
			cancel()
			if err != nil {
				h.log.Warn("?wait= poll failed; its callers read for themselves", "operations", len(ids), "err", err)
				ended = ids
			}
			for _, id := range ended {
				h.Notify(id, nil)
			}
		}
		t.Reset(h.every)
	}
}

// pollTimeout bounds one poll's read.
const pollTimeout = 10 * time.Second

// Watch returns a channel that is given the next Notify of id, and whether
// id is known started, both under one lock: an end told after it reaches
// the channel.
func (h *Hub) Watch(id string) (chan *domain.Operation, bool) {
	ch := make(chan *domain.Operation, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[id] == nil {
		h.waiters[id] = map[chan *domain.Operation]struct{}{}
		h.since[id] = time.Now()
	}
	h.waiters[id][ch] = struct{}{}
	if h.ended != nil && h.polling == nil {
		h.polling = make(chan struct{})
		go h.poll(h.polling)
	}
	_, started := h.started[id]
	return ch, started
}

// Unwatch forgets a channel from Watch.
func (h *Hub) Unwatch(id string, ch chan *domain.Operation) {
	h.mu.Lock()
	delete(h.waiters[id], ch)
	if len(h.waiters[id]) == 0 {
		delete(h.waiters, id)
		delete(h.since, id)
	}
	if len(h.waiters) == 0 && h.polling != nil {
		close(h.polling)
		h.polling = nil
	}
	h.mu.Unlock()
}

// Started notes id as committed started.
func (h *Hub) Started(id string) {
	h.mu.Lock()
	if len(h.started) >= maxStarted {
		clear(h.started)
	}
	h.started[id] = struct{}{}
	h.mu.Unlock()
}

// Reset forgets every operation known started.
func (h *Hub) Reset() {
	h.mu.Lock()
	clear(h.started)
	h.mu.Unlock()
}

// Notify gives committed (nil: read it again) to every watcher of id; the
// watchers share it and only read it. id is no longer known started.
func (h *Hub) Notify(id string, committed *domain.Operation) {
	h.mu.Lock()
	delete(h.started, id)
	for ch := range h.waiters[id] {
		select {
		case ch <- committed:
		default:
		}
	}
	h.mu.Unlock()
}
