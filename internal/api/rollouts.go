package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
)

// RolloutRequest is the body of POST /v1/rollouts.
type RolloutRequest = rollout.Request

// RolloutApprovalRequest is the body of POST /v1/rollouts/{id}/approvals.
type RolloutApprovalRequest struct {
	Version int `json:"version"`
}

// RolloutView is a rollout as the API shows it.
type RolloutView struct {
	RolloutID        string          `json:"rollout_id"`
	Status           string          `json:"status"`
	Reason           string          `json:"reason,omitempty"`
	Version          int             `json:"version"`
	Action           string          `json:"action"`
	Params           json.RawMessage `json:"params"`
	Devices          json.RawMessage `json:"devices"`
	DevicesTotal     int             `json:"devices_total"`
	rollout.Spec                     // max_per_minute, ramp, max_in_flight, abort, execute_*, windows, retries
	ApprovalRequired bool            `json:"approval_required"`
	Approval         *RolloutApprV   `json:"approval"`
	CreatedBy        string          `json:"created_by"`
	CreatedAt        time.Time       `json:"created_at"`
	UpdatedAt        time.Time       `json:"updated_at"`
	EndedAt          *time.Time      `json:"ended_at"`
	// Counts by device status; Finished counts those with an outcome.
	Counts   map[string]int `json:"counts"`
	Finished int            `json:"finished"`
	InFlight int            `json:"in_flight"`
	Rate     RolloutRate    `json:"rate"`
	// AbortState is every abort rule against the committed outcomes.
	AbortState []RolloutAbort `json:"abort_state"`
	Window     RolloutWindow  `json:"window"`
	Scheduler  RolloutLeaseV  `json:"scheduler"`
	History    []HistoryEv    `json:"history,omitempty"`
}

// RolloutApprV is a rollout's approval.
type RolloutApprV struct {
	Version    int        `json:"version"`
	Approver   string     `json:"approver"`
	ApprovedAt *time.Time `json:"approved_at"`
}

// RolloutRate is the start rate now: allowed by the ramp and the limit,
// and committed in the trailing minute and 10 s.
type RolloutRate struct {
	AllowedPerMinute float64    `json:"allowed_per_minute"`
	IntervalMS       int64      `json:"interval_ms"`
	StartsLastMinute int        `json:"starts_last_minute"`
	StartsLast10s    int        `json:"starts_last_10s"`
	Starts           int64      `json:"starts"`
	LastStartAt      *time.Time `json:"last_start_at"`
}

// RolloutAbort is one abort rule's state.
type RolloutAbort struct {
	rollout.AbortRule
	Finished     int     `json:"finished"`
	Matching     int     `json:"matching"`
	SharePercent float64 `json:"share_percent"`
	Tripped      bool    `json:"tripped"`
}

// RolloutWindow says whether devices may start now.
type RolloutWindow struct {
	Open  bool       `json:"open"`
	Ends  *time.Time `json:"ends,omitempty"`
	Opens *time.Time `json:"opens,omitempty"`
}

// RolloutLeaseV is the scheduler's lease on the rollout.
type RolloutLeaseV struct {
	Owner          string    `json:"owner"`
	FencingToken   int64     `json:"fencing_token"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
}

// RolloutDeviceView is one device of a rollout.
type RolloutDeviceView struct {
	DeviceID    string     `json:"device_id"`
	OperationID string     `json:"operation_id"`
	Status      string     `json:"status"`
	Reason      string     `json:"reason,omitempty"`
	Attempts    int        `json:"attempts"`
	StartedAt   *time.Time `json:"started_at"`
	FinishedAt  *time.Time `json:"finished_at"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func rolloutView(r store.Rollout, now time.Time, history bool) RolloutView {
	spec, _ := rollout.ParseSpec(r.Spec)
	v := RolloutView{RolloutID: r.RolloutID, Status: string(r.Status), Reason: r.Reason, Version: r.Version, Action: r.Action,
		Params: r.Params, Devices: r.Selector, DevicesTotal: r.DevicesTotal, Spec: spec, ApprovalRequired: r.ApprovalRequired,
		CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, EndedAt: r.EndedAt,
		Counts: map[string]int{}, Finished: rollout.Finished(r.Counts), InFlight: r.Counts[fsm.DevStarted],
		Scheduler:  RolloutLeaseV{Owner: r.Owner, FencingToken: r.FencingToken, LeaseExpiresAt: r.LeaseExpiresAt},
		AbortState: []RolloutAbort{}}
	if r.Approver != "" {
		v.Approval = &RolloutApprV{Version: r.ApprovedVersion, Approver: r.Approver, ApprovedAt: r.ApprovedAt}
	}
	for st, n := range r.Counts {
		v.Counts[string(st)] = n
	}
	rate := spec.Rate(r.Counts[fsm.DevSucceeded])
	v.Rate = RolloutRate{AllowedPerMinute: rate, IntervalMS: rollout.Interval(rate).Milliseconds(),
		StartsLastMinute: r.StartsLastMinute, StartsLast10s: r.StartsLast10s, Starts: r.Starts, LastStartAt: r.LastStartAt}
	for _, a := range spec.AbortStates(r.Counts) {
		v.AbortState = append(v.AbortState, RolloutAbort{AbortRule: a.Rule, Finished: a.Finished, Matching: a.Matching,
			SharePercent: a.Share, Tripped: a.Tripped})
	}
	if !r.Status.Terminal() {
		w := spec.WindowAt(now)
		v.Window = RolloutWindow{Open: w.Open, Ends: timePtr(w.Ends), Opens: timePtr(w.Opens)}
	}
	if history {
		v.History = []HistoryEv{}
		for _, e := range r.History {
			v.History = append(v.History, HistoryEv{At: e.At, Principal: e.Principal, Action: e.Action, From: e.From, To: e.To,
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
	var req RolloutRequest
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
	if errors.Is(err, store.ErrKeyReused) {
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
	out := make([]RolloutView, 0, len(page.Items))
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
	out := make([]RolloutDeviceView, 0, len(page.Items))
	for _, d := range page.Items {
		out = append(out, RolloutDeviceView{DeviceID: d.DeviceID, OperationID: d.OperationID, Status: string(d.Status),
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
	var req RolloutApprovalRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	ro, isNew, err := s.cfg.Rollouts.Approve(r.Context(), r.PathValue("id"), req.Version, principal(r))
	if err != nil {
		return 0, nil, err
	}
	return created(isNew), rolloutView(ro, time.Now(), true), nil
}
