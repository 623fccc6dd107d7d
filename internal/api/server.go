// Package api is the controller's HTTP API (JSON under /v1), as the contract
// lists it. Handlers decode, call the domain service (internal/ops) for
// changes or the store for reads, and return; one adapter writes the answer
// and maps every error to its status and stable code (toAPIError).
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/opid"
	"github.com/fleetctl/fleetctl/internal/ops"
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
	// WaitPoll is how often a ?wait= call re-reads its operation for
	// changes no wake-up announced (another instance's); 250 ms by default.
	WaitPoll time.Duration
	// Events feeds GET /v1/events (events.go); nil: no stream.
	Events *events.Bus
	// UI serves the dashboard under /ui/ (internal/ui); nil: none.
	UI http.Handler
	// MCP, if set, serves the agent interface (internal/mcpserver) at
	// /mcp behind the same bearer tokens: any valid one gets in, and each
	// tool call is a request to the routes here, which check its role.
	MCP http.Handler
}

// Server serves the API.
type Server struct {
	cfg Config
	mux *http.ServeMux
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
	s := &Server{cfg: cfg, mux: http.NewServeMux(), hub: NewHub()}
	routes := []struct {
		pattern, role string
		h             handler
	}{
		{"POST /v1/operations", RoleOperator, s.handleSubmit},
		{"GET /v1/operations/{id}", "", s.handleGetOperation},
		{"POST /v1/operations/{id}/compensations", RoleOperator, s.handleCompensate},
		{"GET /v1/commands/{id}", "", s.handleGetCommand},
		{"POST /v1/commands/{id}/cancel", RoleOperator, s.handleCancel},
		{"POST /v1/commands/{id}/resolve", RoleOperator, s.handleResolve},
		{"GET /v1/devices", "", s.handleListDevices},
		{"GET /v1/devices/{id}", "", s.handleGetDevice},
		{"POST /v1/devices/{id}/presence/reset", RoleAdmin, s.handleResetPresence},
		{"POST /v1/tasks", RoleOperator, s.handleCreateTask},
		{"GET /v1/tasks/{id}", "", s.handleGetTask},
		{"PUT /v1/tasks/{id}/plan", RoleOperator, s.handlePlan},
		{"POST /v1/tasks/{id}/approvals", RoleApprover, s.handleApprove},
		{"POST /v1/tasks/{id}/rejections", RoleApprover, s.handleReject},
		{"POST /v1/grants", RoleAdmin, s.handleCreateGrant},
		{"GET /v1/grants", "", s.handleListGrants},
		{"DELETE /v1/grants/{id}", RoleAdmin, s.handleRevokeGrant},
		{"GET /v1/instances", "", s.handleListInstances},
	}
	for _, rt := range routes {
		s.mux.HandleFunc(rt.pattern, s.need(rt.role, s.serve(rt.h)))
	}
	s.dashboardRoutes() // events.go: the event stream, the task list, whoami, /ui/
	if cfg.MCP != nil {
		s.mux.Handle("/mcp", s.need("", cfg.MCP.ServeHTTP))
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "instance": cfg.Instance})
	})
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, s.cfg.Logger, apiErr(http.StatusNotFound, "not_found", "no route "+r.Method+" "+r.URL.Path))
	})
	return s
}

// serve adapts a handler to net/http: the one place that writes its answer
// or its error.
func (s *Server) serve(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		status, body, err := h(r)
		if err != nil {
			writeError(w, s.cfg.Logger, err)
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

// Changed wakes the ?wait= requests of an operation.
func (s *Server) Changed(operationID string) { s.hub.Notify(operationID) }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
	}
	s.mux.ServeHTTP(w, r)
}

func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	// I-JSON (RFC 7493) first: a duplicate key, anywhere, or a number that
	// would change on its way to the device is refused, never resolved.
	if err := jcs.CheckIJSON(body); err != nil {
		return fmt.Errorf("%w: request body: %v", opid.ErrInvalid, err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiErr(http.StatusBadRequest, "invalid_json", "request body: "+err.Error())
	}
	if dec.More() {
		return apiErr(http.StatusBadRequest, "invalid_json", "request body: trailing data after the JSON object")
	}
	return nil
}

func decodeOptionalBody(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeBody(r, v)
}

// created is 201 for something new, 200 for what already existed.
func created(c bool) int {
	if c {
		return http.StatusCreated
	}
	return http.StatusOK
}

func (s *Server) handleSubmit(r *http.Request) (int, any, error) {
	var req SubmitRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	op, isNew, err := s.cfg.Service.Submit(r.Context(), ops.Intent(req), r.Header.Get("Idempotency-Key"), principal(r))
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
// ends. It wakes on this instance's changes (and, through the store's
// wake-ups, on other instances'), and polls every Config.WaitPoll for the
// changes of other instances that no wake-up reached.
func (s *Server) waitOperation(ctx context.Context, id string, wait time.Duration) (store.Operation, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(s.cfg.WaitPoll)
	defer poll.Stop()
	for {
		ch := s.hub.Watch(id)
		op, err := s.cfg.Store.GetOperation(ctx, id)
		if err != nil || op.Status != fsm.OpStarted || wait == 0 {
			s.hub.Unwatch(id, ch)
			return op, err
		}
		select {
		case <-ch:
		case <-poll.C:
		case <-deadline.C:
			s.hub.Unwatch(id, ch)
			return s.cfg.Store.GetOperation(ctx, id)
		case <-ctx.Done():
			s.hub.Unwatch(id, ch)
			return store.Operation{}, ctx.Err()
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
	return http.StatusOK, commandView(c, receipts, events), nil
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

// ResolveRequest is the body of POST /v1/commands/{id}/resolve.
type ResolveRequest struct {
	Outcome string `json:"outcome"`
	Note    string `json:"note"`
}

func (s *Server) handleResolve(r *http.Request) (int, any, error) {
	var req ResolveRequest
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
	out := make([]Device, 0, len(devs.Items))
	for _, d := range devs.Items {
		out = append(out, deviceView(d))
	}
	return answerList(lq, out, devs.Total, devs.Next)
}

func (s *Server) handleGetDevice(r *http.Request) (int, any, error) {
	id := r.PathValue("id")
	d, err := s.cfg.Store.GetDevice(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) && wire.ValidDeviceID(id) {
		d, err = store.UnseenDevice(id), nil // never seen: offline, no capabilities
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, deviceView(d), nil
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

// Hub wakes waiters on an operation's change.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// NewHub builds an empty Hub.
func NewHub() *Hub { return &Hub{waiters: map[string]map[chan struct{}]struct{}{}} }

// Watch returns a channel that is signalled at the next Notify of id.
func (h *Hub) Watch(id string) chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.waiters[id] == nil {
		h.waiters[id] = map[chan struct{}]struct{}{}
	}
	h.waiters[id][ch] = struct{}{}
	h.mu.Unlock()
	return ch
}

// Unwatch forgets a channel from Watch.
func (h *Hub) Unwatch(id string, ch chan struct{}) {
	h.mu.Lock()
	delete(h.waiters[id], ch)
	if len(h.waiters[id]) == 0 {
		delete(h.waiters, id)
	}
	h.mu.Unlock()
}

// Notify signals every watcher of id.
func (h *Hub) Notify(id string) {
	h.mu.Lock()
	for ch := range h.waiters[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
}
