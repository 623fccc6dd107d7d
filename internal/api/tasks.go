package api

import (
	"errors"
	"net/http"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
)

func approvalView(a *domain.Approval) *apiwire.ApprovalV {
	if a == nil {
		return nil
	}
	return &apiwire.ApprovalV{TaskID: a.TaskID, Version: a.Version, Approver: a.Approver, ApprovedAt: a.ApprovedAt, PlanHash: a.PlanHash}
}

func taskView(k domain.Task) apiwire.TaskView {
	v := apiwire.TaskView{TaskID: k.TaskID, Status: string(k.Status), Reason: k.Reason, Version: k.Version, PlanHash: k.PlanHash,
		Requester: k.Requester(), CreatedBy: k.CreatedBy, ExecuteAfter: k.ExecuteAfter, ExecuteBefore: k.ExecuteBefore,
		Approval: approvalView(k.Approval), Steps: []apiwire.TaskStep{}, History: []apiwire.HistoryEv{}}
	for _, s := range k.Steps {
		ts := apiwire.TaskStep{Step: apiwire.Step(s)}
		if k.Approval != nil {
			id := domain.TaskStepOperationID(k.TaskID, s.Step, s.Target, k.Approval.Version)
			ts.OperationID = &id
		}
		v.Steps = append(v.Steps, ts)
	}
	for _, e := range k.History {
		v.History = append(v.History, apiwire.HistoryEv{At: e.At, Principal: e.Principal, Action: e.Action, From: e.From, To: e.To,
			Version: e.Version, Reason: e.Reason})
	}
	return v
}

// wireSteps and storeSteps convert a plan between its API and its store
// forms (the same fields).
func wireSteps(in []domain.Step) []apiwire.Step {
	if in == nil {
		return nil
	}
	out := make([]apiwire.Step, len(in))
	for i, st := range in {
		out[i] = apiwire.Step(st)
	}
	return out
}

func storeSteps(in []apiwire.Step) []domain.Step {
	if in == nil {
		return nil
	}
	out := make([]domain.Step, len(in))
	for i, st := range in {
		out[i] = domain.Step(st)
	}
	return out
}

func (s *Server) handleCreateTask(r *http.Request) (int, any, error) {
	var req apiwire.TaskRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := firstError(partID.check("task_id", req.TaskID, true), checkSteps(req.Steps)); err != nil {
		return 0, nil, err
	}
	task, isNew, err := s.cfg.Service.CreateTask(r.Context(), ops.TaskRequest{TaskID: req.TaskID,
		ExecuteAfter: req.ExecuteAfter, ExecuteBefore: req.ExecuteBefore, Steps: storeSteps(req.Steps)}, principal(r))
	if errors.Is(err, domain.ErrKeyReused) {
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
	var req apiwire.PlanRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := checkSteps(req.Steps); err != nil {
		return 0, nil, err
	}
	task, err := s.cfg.Service.UpdatePlan(r.Context(), r.PathValue("id"), storeSteps(req.Steps), req.BaseVersion, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, taskView(task), nil
}

func (s *Server) handleApprove(r *http.Request) (int, any, error) {
	var req apiwire.ApprovalRequest
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
	var req apiwire.RejectionRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	task, err := s.cfg.Service.Reject(r.Context(), r.PathValue("id"), req.Reason, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, taskView(task), nil
}

func grantView(g domain.Grant) apiwire.GrantView {
	return apiwire.GrantView{GrantID: g.GrantID, Principal: g.Principal, Action: g.Action, Devices: g.Devices,
		CreatedBy: g.CreatedBy, CreatedAt: g.CreatedAt, RevokedAt: g.RevokedAt}
}

func (s *Server) handleCreateGrant(r *http.Request) (int, any, error) {
	var req apiwire.GrantRequest
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
	out := make([]apiwire.GrantView, 0, len(gs.Items))
	for _, g := range gs.Items {
		out = append(out, grantView(g))
	}
	return answerList(lq, out, gs.Total, gs.Next)
}

func (s *Server) handleRevokeGrant(r *http.Request) (int, any, error) {
	g, err := s.cfg.Store.RevokeGrant(r.Context(), r.PathValue("id"), principal(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, grantView(g), nil
}

// handleCompensate creates {id}:compensate:{business_version}, a new
// operation on the original's target, once the original is final.
func (s *Server) handleCompensate(r *http.Request) (int, any, error) {
	var req apiwire.CompensationRequest
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
