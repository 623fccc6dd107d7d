package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
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
			id := ops.StepOperationID(k.TaskID, s, k.Approval.Version)
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

func (s *Server) handleCreateTask(r *http.Request) (int, any, error) {
	var req TaskRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := firstError(partID.check("task_id", req.TaskID, true), checkSteps(req.Steps)); err != nil {
		return 0, nil, err
	}
	task, isNew, err := s.cfg.Service.CreateTask(r.Context(), ops.TaskRequest(req), principal(r))
	if errors.Is(err, store.ErrKeyReused) {
		err = apiErr(http.StatusUnprocessableEntity, "idempotency_key_reused", "task "+req.TaskID+" exists with another plan or window")
	}
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), taskView(task), nil
}

func (s *Server) handleGetTask(r *http.Request) (int, any, error) {
	task, err := s.cfg.Store.GetTask(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, taskView(task), nil
}

func (s *Server) handlePlan(r *http.Request) (int, any, error) {
	var req PlanRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := checkSteps(req.Steps); err != nil {
		return 0, nil, err
	}
	task, err := s.cfg.Service.UpdatePlan(r.Context(), r.PathValue("id"), req.Steps, req.BaseVersion, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, taskView(task), nil
}

func (s *Server) handleApprove(r *http.Request) (int, any, error) {
	var req ApprovalRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	a, isNew, err := s.cfg.Service.Approve(r.Context(), r.PathValue("id"), req.Version, req.PlanHash, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), approvalView(&a), nil
}

func (s *Server) handleReject(r *http.Request) (int, any, error) {
	var req RejectionRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	task, err := s.cfg.Service.Reject(r.Context(), r.PathValue("id"), req.Reason, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, taskView(task), nil
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

func (s *Server) handleCreateGrant(r *http.Request) (int, any, error) {
	var req GrantRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	g, isNew, err := s.cfg.Service.CreateGrant(r.Context(), req.Principal, req.Action, req.Devices, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), grantView(g), nil
}

// handleListGrants answers one page of the live grants (?all=1: the revoked
// too), with ?limit= and ?after=.
func (s *Server) handleListGrants(r *http.Request) (int, any, error) {
	lq, err := parseList(r, "all")
	if err != nil {
		return 0, nil, err
	}
	all, err := lq.boolParam("all")
	if err != nil {
		return 0, nil, err
	}
	gs, err := s.cfg.Store.ListGrants(r.Context(), store.GrantFilter{Revoked: all != nil && *all}, lq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make([]GrantView, 0, len(gs.Items))
	for _, g := range gs.Items {
		out = append(out, grantView(g))
	}
	return answerList(lq, out, gs.Total, gs.Next)
}

func (s *Server) handleRevokeGrant(r *http.Request) (int, any, error) {
	g, err := s.cfg.Store.RevokeGrant(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, grantView(g), nil
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
func (s *Server) handleCompensate(r *http.Request) (int, any, error) {
	var req CompensationRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := firstError(
		partID.check("business_version", req.BusinessVersion, true),
		actionName.check("action", req.Action, true),
		checkParams("params", req.Params),
	); err != nil {
		return 0, nil, err
	}
	op, isNew, err := s.cfg.Service.Compensate(r.Context(), r.PathValue("id"), ops.Compensation(req), principal(r))
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), operationView(op), nil
}
