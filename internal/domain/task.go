package domain

import (
	"encoding/json"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Step is one step of a plan.
type Step struct {
	Step   string          `json:"step"`
	Action string          `json:"action"`
	Target string          `json:"target"`
	Params json.RawMessage `json:"params"`
}

// Task is a task with its current plan.
type Task struct {
	TaskID          string
	Status          fsm.TaskState
	Reason          string
	Version         int
	PlanHash        string
	Steps           []Step
	Author          string // of the current version
	ExecuteAfter    *time.Time
	ExecuteBefore   *time.Time
	CreatedBy       string
	ApprovedVersion int
	Approval        *Approval
	StepIndex       int
	RowVersion      int64
	// The runner's lease: the instance driving the task, its fencing
	// token, and when the lease runs out.
	Owner          string
	FencingToken   int64
	LeaseExpiresAt time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
	History        []TaskEvent
}

// Requester is the author of the approved version ("" before approval).
func (t Task) Requester() string {
	if t.Approval == nil {
		return ""
	}
	return t.Approval.Author
}

// Approval is the approval of one plan version.
type Approval struct {
	TaskID     string
	Version    int
	Approver   string
	PlanHash   string
	ApprovedAt time.Time
	Author     string // of the approved version: the task's requester
	Steps      []Step // of the approved version
}

// TaskEvent is one line of a task's history.
type TaskEvent struct {
	At        time.Time
	Principal string
	Action    string
	From, To  string
	Version   int
	Reason    string
}
