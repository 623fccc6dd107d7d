package domain

import (
	"encoding/json"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Operation is the idempotency record of one business intent.
type Operation struct {
	OperationID     string
	Action          string
	Target          string
	Params          json.RawMessage
	RequestHash     string
	Status          fsm.OperationState
	Result          json.RawMessage
	Reason          string
	Attempt         int
	CommandID       string
	CommandIDs      []string
	Version         int64
	Owner           string
	LeaseExpiresAt  time.Time
	FencingToken    int64
	TaskID          string
	Step            string
	BusinessVersion string
	Compensates     string
	Compensations   []string
	StartedAt       time.Time
	UpdatedAt       time.Time
	// Attribution: the principal whose token submitted it ("anonymous"
	// without --tokens; a task step's requester, a rollout's creator), the
	// channel (Via*), and for a task step or a rollout device the approver
	// and the approved version. Operations older than the attribution
	// columns have them empty (0).
	SubmittedBy     string
	Via             string
	ApprovedBy      string
	ApprovedVersion int
}

// Channels an operation is submitted through (Operation.Via).
const (
	ViaAPI          = "api"
	ViaMCP          = "mcp"
	ViaTask         = "task"
	ViaRollout      = "rollout"
	ViaCompensation = "compensation"
)

// Fence is the lease holder's claim that a decision is made under: the
// owner and the fencing token it holds on the operation.
type Fence struct {
	Owner string
	Token int64
}
