package domain

import (
	"encoding/json"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Rollout is a rollout as stored, with its device counts and history.
type Rollout struct {
	RolloutID        string
	Status           fsm.RolloutState
	Reason           string
	Version          int
	RowVersion       int64
	Action           string
	Params           json.RawMessage
	Selector         json.RawMessage
	Spec             json.RawMessage
	CreateHash       string
	MaxPerMinute     int
	MaxInFlight      int
	Retries          int
	ExecuteAfter     *time.Time
	ExecuteBefore    *time.Time
	ApprovalRequired bool
	ApprovedVersion  int
	Approver         string
	ApprovedAt       *time.Time
	DevicesTotal     int
	CreatedBy        string
	CreatedAt        time.Time
	UpdatedAt        time.Time
	EndedAt          *time.Time
	Owner            string
	FencingToken     int64
	LeaseExpiresAt   time.Time
	Starts           int64
	LastStartAt      *time.Time
	// Counts by device status, every status present (0 when none).
	Counts map[fsm.RolloutDeviceState]int
	// StartsLastMinute and StartsLast10s count the committed starts in the
	// trailing minute and 10 s, by the reader's clock.
	StartsLastMinute, StartsLast10s int
	History                         []RolloutEvent
}

// RolloutEvent is one line of a rollout's history.
type RolloutEvent struct {
	At        time.Time
	Principal string
	Action    string
	From, To  string
	Version   int
	Reason    string
}

// RolloutDevice is one device of a rollout.
type RolloutDevice struct {
	RolloutID   string
	DeviceID    string
	Position    int
	OperationID string
	Status      fsm.RolloutDeviceState
	Reason      string
	Attempts    int
	StartedAt   *time.Time
	FinishedAt  *time.Time
	UpdatedAt   time.Time
}
