// Package api is the controller's HTTP API (JSON under /v1), as the contract
// lists it. Handlers decode and validate, call the store, and map errors to
// stable codes in one function (toAPIError).
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

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/opid"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// MaxBody bounds every request body.
const MaxBody = 1 << 20

// MaxWait caps ?wait=.
const MaxWait = 60 * time.Second

// Config configures a Server.
type Config struct {
	Store      store.Store
	Instance   string
	Policy     func(action string) command.Policy
	LeaseTTL   time.Duration
	Failpoints *failpoint.Set
	Logger     *slog.Logger
	Now        func() time.Time
	// Submitted is told of each new command (the dispatcher's kick).
	Submitted func(commandID string)
	Metrics   http.Handler
	Auth      *Auth // nil: auth off
	FourEyes  bool
}

// Server serves the API.
type Server struct {
	cfg Config
	mux *http.ServeMux
	hub *Hub
}

// New builds the Server and its routes.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Submitted == nil {
		cfg.Submitted = func(string) {}
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), hub: NewHub()}
	s.mux.HandleFunc("POST /v1/operations", s.need(RoleOperator, s.handleSubmit))
	s.mux.HandleFunc("GET /v1/operations/{id}", s.need("", s.handleGetOperation))
	s.mux.HandleFunc("POST /v1/operations/{id}/compensations", s.need(RoleOperator, s.handleCompensate))
	s.mux.HandleFunc("GET /v1/commands/{id}", s.need("", s.handleGetCommand))
	s.mux.HandleFunc("POST /v1/commands/{id}/cancel", s.need(RoleOperator, s.handleCancel))
	s.mux.HandleFunc("POST /v1/commands/{id}/resolve", s.need(RoleOperator, s.handleResolve))
	s.mux.HandleFunc("GET /v1/devices", s.need("", s.handleListDevices))
	s.mux.HandleFunc("GET /v1/devices/{id}", s.need("", s.handleGetDevice))
	s.mux.HandleFunc("POST /v1/tasks", s.need(RoleOperator, s.handleCreateTask))
	s.mux.HandleFunc("GET /v1/tasks/{id}", s.need("", s.handleGetTask))
	s.mux.HandleFunc("PUT /v1/tasks/{id}/plan", s.need(RoleOperator, s.handlePlan))
	s.mux.HandleFunc("POST /v1/tasks/{id}/approvals", s.need(RoleApprover, s.handleApprove))
	s.mux.HandleFunc("POST /v1/tasks/{id}/rejections", s.need(RoleApprover, s.handleReject))
	s.mux.HandleFunc("POST /v1/grants", s.need(RoleAdmin, s.handleCreateGrant))
	s.mux.HandleFunc("GET /v1/grants", s.need("", s.handleListGrants))
	s.mux.HandleFunc("DELETE /v1/grants/{id}", s.need(RoleAdmin, s.handleRevokeGrant))
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

func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	op, created, err := s.submit(r.Context(), req, r.Header.Get("Idempotency-Key"), principal(r))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if err := s.cfg.Failpoints.HitContext(r.Context(), failpoint.SubmitAfterCommit); err != nil {
		writeError(w, s.cfg.Logger, err) // the commit stands: a retry gets 200 and the same command_id
		return
	}
	writeCreated(w, created, operationView(op))
}

// submit validates a direct submission and inserts it, or returns the
// stored record. key is the Idempotency-Key header ("" if absent).
func (s *Server) submit(ctx context.Context, req SubmitRequest, key, who string) (store.Operation, bool, error) {
	id, err := operationID(req, key)
	if err != nil {
		return store.Operation{}, false, err
	}
	if opid.Reserved(id) {
		return store.Operation{}, false, apiErr(http.StatusForbidden, "reserved_operation_id",
			"operation ids ending in :approval-v<N> belong to approved tasks")
	}
	n, err := s.NewOperation(ctx, id, req)
	if err != nil {
		return store.Operation{}, false, err
	}
	if err := s.authorizeDirect(ctx, who, req.Action, req.Target); err != nil {
		return store.Operation{}, false, err
	}
	return s.insert(ctx, n)
}

// authorizeDirect is what an operation outside a task needs: an action that
// does not require approval (403 approval_required) and a grant for it on
// the device (403 permission_denied).
func (s *Server) authorizeDirect(ctx context.Context, who, action, device string) error {
	if s.cfg.Policy(action).Approval == command.ApprovalRequired {
		return apiErr(http.StatusForbidden, "approval_required", "action "+action+" needs an approved task (POST /v1/tasks)")
	}
	return s.checkGrant(ctx, who, action, device)
}

func (s *Server) insert(ctx context.Context, n store.NewOperation) (store.Operation, bool, error) {
	res, err := s.cfg.Store.Submit(ctx, n, func() error { return s.cfg.Failpoints.HitContext(ctx, failpoint.SubmitBeforeCommit) })
	if err != nil {
		return store.Operation{}, false, err
	}
	if res.Created || res.Retried {
		s.cfg.Submitted(res.Operation.CommandID)
	}
	return res.Operation, res.Created, nil
}

// NewOperation validates target, action and params and builds the
// operation id's record: the request hash, a new command id (used only if
// the operation is new), the action's ttl, this instance's lease.
func (s *Server) NewOperation(ctx context.Context, id string, req SubmitRequest) (store.NewOperation, error) {
	if !wire.ValidDeviceID(req.Target) {
		return store.NewOperation{}, fmt.Errorf("%w: target %q is not a device id ([A-Za-z0-9._-]{1,64}, not controller-*)", opid.ErrInvalid, req.Target)
	}
	if err := opid.ValidateAction(req.Action); err != nil {
		return store.NewOperation{}, err
	}
	params, err := opid.CanonicalParams(req.Params)
	if err != nil {
		return store.NewOperation{}, err
	}
	hash, err := opid.RequestHash(req.Action, req.Target, params)
	if err != nil {
		return store.NewOperation{}, err
	}
	qos := 1
	if dev, err := s.cfg.Store.GetDevice(ctx, req.Target); err == nil && dev.Seen && !dev.Capabilities.Dedupe {
		qos = 0 // a device that cannot deduplicate gets each command at most once
	}
	return store.NewOperation{
		OperationID: id, Action: req.Action, Target: req.Target, Params: params, RequestHash: hash,
		TaskID: req.TaskID, Step: req.Step, BusinessVersion: req.BusinessVersion,
		CommandID: command.NewCommandID(s.cfg.Now()), CommandTTL: s.cfg.Policy(req.Action).TTL, QoS: qos,
		Owner: s.cfg.Instance, LeaseTTL: s.cfg.LeaseTTL,
	}, nil
}

// operationID picks the whole id (body, else header) or derives it from the
// parts; a header that differs from the body's id is refused.
func operationID(req SubmitRequest, key string) (string, error) {
	id := req.OperationID
	if id == "" && (req.TaskID != "" || req.Step != "" || req.BusinessVersion != "") {
		derived, err := opid.Derive(opid.Parts{TaskID: req.TaskID, Step: req.Step, Target: req.Target, BusinessVersion: req.BusinessVersion})
		if err != nil {
			return "", err
		}
		id = derived
	}
	switch {
	case key != "" && id != "" && key != id:
		return "", apiErr(http.StatusBadRequest, "idempotency_key_mismatch",
			fmt.Sprintf("Idempotency-Key %q differs from the operation_id %q", key, id))
	case id == "":
		id = key
	}
	if id == "" {
		return "", fmt.Errorf("%w: give operation_id (or an Idempotency-Key header), or task_id, step and business_version", opid.ErrInvalid)
	}
	if err := opid.ValidateWhole(id, 200); err != nil {
		return "", err
	}
	return id, nil
}

func (s *Server) handleGetOperation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > MaxWait {
			writeError(w, s.cfg.Logger, apiErr(http.StatusBadRequest, "invalid_wait", "wait takes a Go duration up to 60s, e.g. ?wait=30s"))
			return
		}
		wait = d
	}
	op, err := s.waitOperation(r.Context(), id, wait)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, operationView(op))
}

// waitOperation returns the operation once it leaves started, or when wait
// ends. It wakes on this instance's changes and polls for other instances'.
func (s *Server) waitOperation(ctx context.Context, id string, wait time.Duration) (store.Operation, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
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

func (s *Server) handleGetCommand(w http.ResponseWriter, r *http.Request) {
	s.writeCommand(w, r, r.PathValue("id"))
}

func (s *Server) writeCommand(w http.ResponseWriter, r *http.Request, id string) {
	c, err := s.cfg.Store.GetCommand(r.Context(), id)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	receipts, err := s.cfg.Store.Receipts(r.Context(), id)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	events, err := s.cfg.Store.Events(r.Context(), id)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, commandView(c, receipts, events))
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	if err := decodeOptionalBody(r, &struct{}{}); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	c, err := s.cfg.Store.Cancel(r.Context(), r.PathValue("id"), principal(r))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	s.Changed(c.OperationID)
	s.writeCommand(w, r, c.CommandID)
}

// ResolveRequest is the body of POST /v1/commands/{id}/resolve.
type ResolveRequest struct {
	Outcome string `json:"outcome"`
	Note    string `json:"note"`
}

func (s *Server) handleResolve(w http.ResponseWriter, r *http.Request) {
	var req ResolveRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if req.Outcome != string(fsm.CmdSucceeded) && req.Outcome != string(fsm.CmdFailed) {
		writeError(w, s.cfg.Logger, fmt.Errorf("%w: outcome must be succeeded or failed", opid.ErrInvalid))
		return
	}
	out, err := s.cfg.Store.Resolve(r.Context(), r.PathValue("id"), fsm.CommandState(req.Outcome), req.Note, principal(r))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if out.Lost {
		writeError(w, s.cfg.Logger, apiErr(http.StatusConflict, "illegal_state",
			"a final receipt settled this command first ("+string(out.Command.Status)+"); your resolve is kept as its late outcome"))
		return
	}
	s.Changed(out.Command.OperationID)
	s.writeCommand(w, r, out.Command.CommandID)
}

func decodeOptionalBody(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeBody(r, v)
}

func (s *Server) handleListDevices(w http.ResponseWriter, r *http.Request) {
	devs, err := s.cfg.Store.ListDevices(r.Context())
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	out := make([]Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, deviceView(d))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	d, err := s.cfg.Store.GetDevice(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) && wire.ValidDeviceID(id) {
		d, err = store.UnseenDevice(id), nil // never seen: offline, no capabilities
	}
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, deviceView(d))
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
