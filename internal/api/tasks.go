package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/opid"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// TaskRequest is the body of POST /v1/tasks.
type TaskRequest struct {
	TaskID        string       `json:"task_id"`
	ExecuteAfter  *time.Time   `json:"execute_after,omitempty"`
	ExecuteBefore *time.Time   `json:"execute_before,omitempty"`
	Steps         []store.Step `json:"steps"`
}

// PlanRequest is the body of PUT /v1/tasks/{id}/plan.
type PlanRequest struct {
	Steps       []store.Step `json:"steps"`
	BaseVersion *int         `json:"base_version,omitempty"`
}

// ApprovalRequest is the body of POST /v1/tasks/{id}/approvals.
type ApprovalRequest struct {
	Version  int    `json:"version"`
	PlanHash string `json:"plan_hash,omitempty"`
}

// RejectionRequest is the body of POST /v1/tasks/{id}/rejections.
type RejectionRequest struct {
	Reason string `json:"reason"`
}

// TaskStep is a step as GET /v1/tasks shows it.
type TaskStep struct {
	store.Step
	OperationID *string `json:"operation_id"`
}

// TaskView is a task as the API shows it.
type TaskView struct {
	TaskID        string      `json:"task_id"`
	Status        string      `json:"status"`
	Reason        string      `json:"reason,omitempty"`
	Version       int         `json:"version"`
	PlanHash      string      `json:"plan_hash"`
	Requester     string      `json:"requester,omitempty"`
	CreatedBy     string      `json:"created_by"`
	ExecuteAfter  *time.Time  `json:"execute_after"`
	ExecuteBefore *time.Time  `json:"execute_before"`
	Approval      *ApprovalV  `json:"approval"`
	Steps         []TaskStep  `json:"steps"`
	History       []HistoryEv `json:"history"`
}

// ApprovalV is an approval as the API shows it.
type ApprovalV struct {
	TaskID     string    `json:"task_id"`
	Version    int       `json:"version"`
	Approver   string    `json:"approver"`
	ApprovedAt time.Time `json:"approved_at"`
	PlanHash   string    `json:"plan_hash"`
}

// HistoryEv is one line of a task's history.
type HistoryEv struct {
	At        time.Time `json:"at"`
	Principal string    `json:"principal"`
	Action    string    `json:"action"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Version   int       `json:"version"`
	Reason    string    `json:"reason,omitempty"`
}

// StepOperationID is {task_id}:{step}:{target}:approval-v{version}.
func StepOperationID(taskID string, s store.Step, version int) string {
	return fmt.Sprintf("%s:%s:%s:approval-v%d", taskID, s.Step, s.Target, version)
}

func approvalView(a *store.Approval) *ApprovalV {
	if a == nil {
		return nil
	}
	return &ApprovalV{TaskID: a.TaskID, Version: a.Version, Approver: a.Approver, ApprovedAt: a.ApprovedAt, PlanHash: a.PlanHash}
}

func taskView(k store.Task) TaskView {
	v := TaskView{TaskID: k.TaskID, Status: string(k.Status), Reason: k.Reason, Version: k.Version, PlanHash: k.PlanHash,
		Requester: k.Requester(), CreatedBy: k.CreatedBy, ExecuteAfter: k.ExecuteAfter, ExecuteBefore: k.ExecuteBefore,
		Approval: approvalView(k.Approval), Steps: []TaskStep{}, History: []HistoryEv{}}
	for _, s := range k.Steps {
		ts := TaskStep{Step: s}
		if k.Approval != nil {
			id := StepOperationID(k.TaskID, s, k.Approval.Version)
			ts.OperationID = &id
		}
		v.Steps = append(v.Steps, ts)
	}
	for _, e := range k.History {
		v.History = append(v.History, HistoryEv{At: e.At, Principal: e.Principal, Action: e.Action, From: e.From, To: e.To,
			Version: e.Version, Reason: e.Reason})
	}
	return v
}

func invalidPlan(format string, args ...any) error {
	return apiErr(http.StatusBadRequest, "invalid_plan", fmt.Sprintf(format, args...))
}

// canonicalSteps validates a plan and returns its canonical JSON and hash.
func (s *Server) canonicalSteps(r *http.Request, steps []store.Step) (json.RawMessage, string, error) {
	if len(steps) == 0 {
		return nil, "", invalidPlan("a plan needs at least one step")
	}
	seen := map[[2]string]bool{}
	for i := range steps {
		st := &steps[i]
		if _, err := opid.Derive(opid.Parts{TaskID: "t", Step: st.Step, Target: st.Target, BusinessVersion: "v"}); err != nil {
			return nil, "", invalidPlan("step %d: %v", i+1, err)
		}
		if !wire.ValidDeviceID(st.Target) {
			return nil, "", invalidPlan("step %d: target %q is not a device id", i+1, st.Target)
		}
		if err := opid.ValidateAction(st.Action); err != nil {
			return nil, "", invalidPlan("step %d: %v", i+1, err)
		}
		params, err := opid.CanonicalParams(st.Params)
		if err != nil {
			return nil, "", invalidPlan("step %d: %v", i+1, err)
		}
		st.Params = params
		key := [2]string{st.Step, st.Target}
		if seen[key] {
			return nil, "", invalidPlan("(step %q, target %q) appears twice", st.Step, st.Target)
		}
		seen[key] = true
		if err := s.checkGrant(r.Context(), principal(r), st.Action, st.Target); err != nil {
			return nil, "", err
		}
	}
	canon, err := jcs.Marshal(steps)
	if err != nil {
		return nil, "", err
	}
	return canon, sha(canon), nil
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (s *Server) handleCreateTask(w http.ResponseWriter, r *http.Request) {
	var req TaskRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if _, err := opid.Derive(opid.Parts{TaskID: req.TaskID, Step: "s", Target: "t", BusinessVersion: "v"}); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if req.ExecuteAfter != nil && req.ExecuteBefore != nil && !req.ExecuteBefore.After(*req.ExecuteAfter) {
		writeError(w, s.cfg.Logger, invalidPlan("execute_before must be after execute_after"))
		return
	}
	steps, planHash, err := s.canonicalSteps(r, req.Steps)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	createBody, err := jcs.Marshal(struct {
		Steps         json.RawMessage `json:"steps"`
		ExecuteAfter  *time.Time      `json:"execute_after"`
		ExecuteBefore *time.Time      `json:"execute_before"`
	}{steps, utc(req.ExecuteAfter), utc(req.ExecuteBefore)})
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	task, created, err := s.cfg.Store.CreateTask(r.Context(), store.NewTask{TaskID: req.TaskID, Steps: steps, PlanHash: planHash,
		CreateHash: sha(createBody), ExecuteAfter: req.ExecuteAfter, ExecuteBefore: req.ExecuteBefore, Author: principal(r)})
	if errors.Is(err, store.ErrKeyReused) {
		err = apiErr(http.StatusUnprocessableEntity, "idempotency_key_reused", "task "+req.TaskID+" exists with another plan or window")
	}
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeCreated(w, created, taskView(task))
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (s *Server) handleGetTask(w http.ResponseWriter, r *http.Request) {
	task, err := s.cfg.Store.GetTask(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, taskView(task))
}

func (s *Server) handlePlan(w http.ResponseWriter, r *http.Request) {
	var req PlanRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	id := r.PathValue("id")
	if _, err := s.cfg.Store.GetTask(r.Context(), id); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	steps, planHash, err := s.canonicalSteps(r, req.Steps)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	task, _, err := s.cfg.Store.UpdatePlan(r.Context(), id, steps, planHash, principal(r), req.BaseVersion)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, taskView(task))
}

func (s *Server) handleApprove(w http.ResponseWriter, r *http.Request) {
	var req ApprovalRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	fourEyes := s.cfg.FourEyes && s.cfg.Auth.Enabled()
	a, created, err := s.cfg.Store.Approve(r.Context(), r.PathValue("id"), req.Version, req.PlanHash, principal(r), fourEyes)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeCreated(w, created, approvalView(&a))
}

func (s *Server) handleReject(w http.ResponseWriter, r *http.Request) {
	var req RejectionRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	task, err := s.cfg.Store.Reject(r.Context(), r.PathValue("id"), req.Reason, principal(r))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, taskView(task))
}

// GrantRequest is the body of POST /v1/grants.
type GrantRequest struct {
	Principal string `json:"principal"`
	Action    string `json:"action"`
	Devices   string `json:"devices"`
}

// GrantView is a grant as the API shows it.
type GrantView struct {
	GrantID   string     `json:"grant_id"`
	Principal string     `json:"principal"`
	Action    string     `json:"action"`
	Devices   string     `json:"devices"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func grantView(g store.Grant) GrantView {
	return GrantView{GrantID: g.GrantID, Principal: g.Principal, Action: g.Action, Devices: g.Devices,
		CreatedBy: g.CreatedBy, CreatedAt: g.CreatedAt, RevokedAt: g.RevokedAt}
}

func (s *Server) handleCreateGrant(w http.ResponseWriter, r *http.Request) {
	var req GrantRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if req.Principal == "" || req.Action == "" || req.Devices == "" {
		writeError(w, s.cfg.Logger, fmt.Errorf("%w: principal, action and devices are required", opid.ErrInvalid))
		return
	}
	g, created, err := s.cfg.Store.CreateGrant(r.Context(), command.NewID("g-", s.cfg.Now()), req.Principal, req.Action, req.Devices, principal(r))
	if errors.Is(err, store.ErrIllegalState) {
		err = fmt.Errorf("%w: %v", opid.ErrInvalid, err)
	}
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeCreated(w, created, grantView(g))
}

func (s *Server) handleListGrants(w http.ResponseWriter, r *http.Request) {
	gs, err := s.cfg.Store.ListGrants(r.Context(), r.URL.Query().Get("all") == "1")
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	out := make([]GrantView, 0, len(gs))
	for _, g := range gs {
		out = append(out, grantView(g))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleRevokeGrant(w http.ResponseWriter, r *http.Request) {
	g, err := s.cfg.Store.RevokeGrant(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, grantView(g))
}

// CompensationRequest is the body of POST /v1/operations/{id}/compensations.
type CompensationRequest struct {
	Action          string          `json:"action"`
	Params          json.RawMessage `json:"params,omitempty"`
	Reason          string          `json:"reason"`
	BusinessVersion string          `json:"business_version"`
}

// handleCompensate creates {id}:compensate:{business_version}, a new
// operation on the original's target, once the original is final.
func (s *Server) handleCompensate(w http.ResponseWriter, r *http.Request) {
	var req CompensationRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	orig, err := s.cfg.Store.GetOperation(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if orig.Status != fsm.OpSucceeded && orig.Status != fsm.OpFailedFinal {
		writeError(w, s.cfg.Logger, apiErr(http.StatusConflict, "not_final",
			fmt.Sprintf("operation %s is %s: compensate once it is succeeded or failed_final", orig.OperationID, orig.Status)))
		return
	}
	if opid.ApprovalLike(req.BusinessVersion) {
		writeError(w, s.cfg.Logger, fmt.Errorf("%w: business_version %q looks like approval-v<N>", opid.ErrInvalid, req.BusinessVersion))
		return
	}
	if _, err := opid.Derive(opid.Parts{TaskID: "t", Step: "s", Target: "d", BusinessVersion: req.BusinessVersion}); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	id := orig.OperationID + ":compensate:" + req.BusinessVersion
	if err := opid.ValidateWhole(id, 400); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	n, err := s.NewOperation(r.Context(), id, SubmitRequest{Target: orig.Target, Action: req.Action, Params: req.Params,
		BusinessVersion: req.BusinessVersion})
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	if err := s.authorizeDirect(r.Context(), principal(r), req.Action, orig.Target); err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	n.Compensates = orig.OperationID
	op, created, err := s.insert(r.Context(), n)
	if err != nil {
		writeError(w, s.cfg.Logger, err)
		return
	}
	writeCreated(w, created, operationView(op))
}
