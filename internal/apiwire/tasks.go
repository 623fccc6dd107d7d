package apiwire

import (
	"encoding/json"
	"time"
)

// Step is one step of a plan, as a task's body gives it and GET shows it.
type Step struct {
	Step   string          `json:"step"`
	Action string          `json:"action"`
	Target string          `json:"target"`
	Params json.RawMessage `json:"params"`
}

// TaskRequest is the body of POST /v1/tasks.
type TaskRequest struct {
	TaskID        string     `json:"task_id"`
	ExecuteAfter  *time.Time `json:"execute_after,omitempty"`
	ExecuteBefore *time.Time `json:"execute_before,omitempty"`
	Steps         []Step     `json:"steps"`
}

// PlanRequest is the body of PUT /v1/tasks/{id}/plan.
type PlanRequest struct {
	Steps       []Step `json:"steps"`
	BaseVersion *int   `json:"base_version,omitempty"`
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
	Step
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

// TaskListItem is a task as GET /v1/tasks lists it: its current plan, not
// its approval or history (GET /v1/tasks/{id} has those).
type TaskListItem struct {
	TaskID        string     `json:"task_id"`
	Status        string     `json:"status"`
	Reason        string     `json:"reason,omitempty"`
	Version       int        `json:"version"`
	PlanHash      string     `json:"plan_hash"`
	Author        string     `json:"author"` // of the current version
	CreatedBy     string     `json:"created_by"`
	ExecuteAfter  *time.Time `json:"execute_after"`
	ExecuteBefore *time.Time `json:"execute_before"`
	Steps         []Step     `json:"steps"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
}

// ApprovalV is an approval as the API shows it.
type ApprovalV struct {
	TaskID     string    `json:"task_id"`
	Version    int       `json:"version"`
	Approver   string    `json:"approver"`
	ApprovedAt time.Time `json:"approved_at"`
	PlanHash   string    `json:"plan_hash"`
}

// HistoryEv is one line of a task's or a rollout's history.
type HistoryEv struct {
	At        time.Time `json:"at"`
	Principal string    `json:"principal"`
	Action    string    `json:"action"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Version   int       `json:"version"`
	Reason    string    `json:"reason,omitempty"`
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
