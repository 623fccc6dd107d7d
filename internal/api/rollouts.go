package api

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
)

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func rolloutView(r domain.Rollout, now time.Time, history bool) apiwire.RolloutView {
	spec, _ := rollout.ParseSpec(r.Spec)
	v := apiwire.RolloutView{RolloutID: r.RolloutID, Status: string(r.Status), Reason: r.Reason, Version: r.Version, Action: r.Action,
		Params: r.Params, Devices: r.Selector, DevicesTotal: r.DevicesTotal, RolloutSpec: apiwire.RolloutSpec(spec), ApprovalRequired: r.ApprovalRequired,
		CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, EndedAt: r.EndedAt,
		Counts: map[string]int{}, Finished: rollout.Finished(r.Counts), InFlight: r.Counts[fsm.DevStarted],
		Scheduler:  apiwire.RolloutLeaseV{Owner: r.Owner, FencingToken: r.FencingToken, LeaseExpiresAt: r.LeaseExpiresAt},
		AbortState: []apiwire.RolloutAbort{}}
	if r.Approver != "" {
		v.Approval = &apiwire.RolloutApprV{Version: r.ApprovedVersion, Approver: r.Approver, ApprovedAt: r.ApprovedAt}
	}
	for st, n := range r.Counts {
		v.Counts[string(st)] = n
	}
	rate := spec.Rate(r.Counts[fsm.DevSucceeded])
	v.Rate = apiwire.RolloutRate{AllowedPerMinute: rate, IntervalMS: rollout.Interval(rate).Milliseconds(),
		StartsLastMinute: r.StartsLastMinute, StartsLast10s: r.StartsLast10s, Starts: r.Starts, LastStartAt: r.LastStartAt}
	for _, a := range spec.AbortStates(r.Counts) {
		v.AbortState = append(v.AbortState, apiwire.RolloutAbort{AbortRule: a.Rule, Finished: a.Finished, Matching: a.Matching,
			SharePercent: a.Share, Tripped: a.Tripped})
	}
	if !r.Status.Terminal() {
		w := spec.WindowAt(now)
		v.Window = apiwire.RolloutWindow{Open: w.Open, Ends: timePtr(w.Ends), Opens: timePtr(w.Opens)}
	}
	if history {
		v.History = []apiwire.HistoryEv{}
		for _, e := range r.History {
			v.History = append(v.History, apiwire.HistoryEv{At: e.At, Principal: e.Principal, Action: e.Action, From: e.From, To: e.To,
				Version: e.Version, Reason: e.Reason})
		}
	}
	return v
}

func (s *Server) handleCreateRollout(r *http.Request) (int, any, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return 0, nil, err // a MaxBytesError is 413 too_large
	}
	var req apiwire.RolloutRequest
	if err := decodeJSON(body, &req); err != nil {
		return 0, nil, err
	}
	if err := firstError(
		partID.check("rollout_id", req.RolloutID, true),
		actionName.check("action", req.Action, true),
		checkParams("params", req.Params),
		rollout.CheckGivenLimits(body), // 0 given is refused; absent is the default
	); err != nil {
		return 0, nil, err
	}
	ro, isNew, err := s.cfg.Rollouts.Create(r.Context(), req, principal(r))
	if errors.Is(err, domain.ErrKeyReused) {
		err = apiErr(http.StatusUnprocessableEntity, "idempotency_key_reused", "rollout "+req.RolloutID+" exists with other content; use a new rollout_id for a new rollout")
	}
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), rolloutView(ro, time.Now(), true), nil
}

func (s *Server) handleGetRollout(r *http.Request) (int, any, error) {
	ro, err := s.cfg.Store.GetRollout(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, rolloutView(ro, time.Now(), true), nil
}

// handleListRollouts answers one page of rollouts by id: ?limit=, ?after=,
// ?status=.
func (s *Server) handleListRollouts(r *http.Request) (int, any, error) {
	lq, err := parseList(r, "status")
	if err != nil {
		return 0, nil, err
	}
	status := lq.values.Get("status")
	if status != "" && !fsm.Rollout.Valid(fsm.RolloutState(status)) {
		return 0, nil, invalidParam("status", "not a rollout status")
	}
	page, err := s.cfg.Store.ListRollouts(r.Context(), store.RolloutFilter{Status: status}, lq.page)
	if err != nil {
		return 0, nil, err
	}
	now := time.Now()
	out := make([]apiwire.RolloutView, 0, len(page.Items))
	for _, ro := range page.Items {
		out = append(out, rolloutView(ro, now, false))
	}
	return answerList(lq, out, page.Total, page.Next)
}

// handleListRolloutDevices answers one page of a rollout's devices by id:
// ?limit=, ?after=, ?status=.
func (s *Server) handleListRolloutDevices(r *http.Request) (int, any, error) {
	lq, err := parseList(r, "status")
	if err != nil {
		return 0, nil, err
	}
	status := lq.values.Get("status")
	if status != "" && !fsm.RolloutDevice.Valid(fsm.RolloutDeviceState(status)) {
		return 0, nil, invalidParam("status", "not a rollout device status")
	}
	page, err := s.cfg.Store.ListRolloutDevices(r.Context(), r.PathValue("id"), store.RolloutDeviceFilter{Status: status}, lq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make([]apiwire.RolloutDeviceView, 0, len(page.Items))
	for _, d := range page.Items {
		out = append(out, apiwire.RolloutDeviceView{DeviceID: d.DeviceID, OperationID: d.OperationID, Status: string(d.Status),
			Reason: d.Reason, Attempts: d.Attempts, StartedAt: d.StartedAt, FinishedAt: d.FinishedAt})
	}
	return answerList(lq, out, page.Total, page.Next)
}

func (s *Server) rolloutMove(action store.RolloutAction) handler {
	return func(r *http.Request) (int, any, error) {
		if err := decodeOptionalBody(r, &struct{}{}); err != nil {
			return 0, nil, err
		}
		ro, err := s.cfg.Rollouts.Move(r.Context(), r.PathValue("id"), action, principal(r))
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, rolloutView(ro, time.Now(), true), nil
	}
}

func (s *Server) handleApproveRollout(r *http.Request) (int, any, error) {
	var req apiwire.RolloutApprovalRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	ro, isNew, err := s.cfg.Rollouts.Approve(r.Context(), r.PathValue("id"), req.Version, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), rolloutView(ro, time.Now(), true), nil
}
