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
}

// Fence is the lease holder's claim that a decision is made under: the
// owner and the fencing token it holds on the operation.
type Fence struct {
	Owner string
	Token int64
}
