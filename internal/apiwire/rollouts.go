package apiwire

import (
	"encoding/json"
	"time"
)

// RolloutRequest is the body of POST /v1/rollouts.
type RolloutRequest struct {
	RolloutID string          `json:"rollout_id"`
	Action    string          `json:"action"`
	Params    json.RawMessage `json:"params,omitempty"`
	// Devices is a glob ("device-*") or a list of device ids.
	Devices json.RawMessage `json:"devices"`
	RolloutSpec
}

// The limits a rollout has when its request leaves them out (a limit given
// as 0 is refused).
const (
	DefaultMaxPerMinute = 60
	DefaultMaxInFlight  = 100
)

// RolloutSpec is a rollout's rules: everything that decides when a device
// starts and when the rollout ends. internal/rollout's Spec is this type
// with the methods that apply the rules; it is stored as canonical JSON.
type RolloutSpec struct {
	MaxPerMinute  int                 `json:"max_per_minute,omitempty"`
	Ramp          *Ramp               `json:"ramp,omitempty"`
	MaxInFlight   int                 `json:"max_in_flight,omitempty"`
	Abort         []AbortRule         `json:"abort,omitempty"`
	ExecuteAfter  *time.Time          `json:"execute_after,omitempty"`
	ExecuteBefore *time.Time          `json:"execute_before,omitempty"`
	Windows       []MaintenanceWindow `json:"windows,omitempty"`
	Retries       int                 `json:"retries,omitempty"`
}

// Ramp: the start rate begins at BasePerMinute and is multiplied by Factor
// each time EverySucceeded more devices have succeeded, up to MaxPerMinute.
type Ramp struct {
	BasePerMinute  int     `json:"base_per_minute"`
	Factor         float64 `json:"factor"`
	EverySucceeded int     `json:"every_succeeded"`
}

// AbortRule: once at least MinFinished devices have finished, if the share
// of the finished ones whose outcome is When reaches Percent, the rollout
// is aborted.
type AbortRule struct {
	When        string  `json:"when"`
	Percent     float64 `json:"percent"`
	MinFinished int     `json:"min_finished"`
}

// MaintenanceWindow is a recurring window, in UTC: it opens at each time
// Cron names and stays open for Duration. Cron has five fields (minute
// hour day month weekday, "0 2 * * *") or six with seconds first.
type MaintenanceWindow struct {
	Cron     string `json:"cron"`
	Duration string `json:"duration"`
}

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
	RolloutSpec                      // max_per_minute, ramp, max_in_flight, abort, execute_*, windows, retries
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
	AbortRule
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
