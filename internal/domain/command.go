package domain

import (
	"encoding/json"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Command is the controller's record of one command_id.
type Command struct {
	CommandID    string
	OperationID  string
	DeviceID     string
	Action       string
	Params       json.RawMessage
	IssuedAt     time.Time
	ExpiresAt    time.Time
	Status       fsm.CommandState
	StatusRank   int
	Attempt      int // committed publish decisions
	Queries      int // committed query decisions
	QoS          int
	Version      int64
	Reason       string
	Result       json.RawMessage
	LastSeq      int
	ExecutedAs   string
	ResolvedBy   string
	LateOutcome  string
	LateResult   json.RawMessage
	LateConflict bool
	LastQueryID  string
	LastAnswer   string
	NextCheckAt  time.Time
	LastSentAt   *time.Time
	CreatedAt    time.Time
	UpdatedAt    time.Time
	// SerialSeq is a serial command's place in its device's queue (the
	// order its submit committed in); 0 for a parallel command.
	SerialSeq int64
	// QueuedBehind is the open serial command just ahead of this one on its
	// device, while this one waits unpublished; "" otherwise. It is read
	// with the command, never stored.
	QueuedBehind string
}

// Query is one query the controller sent about a command (a status
// request with its own query_id), and the device's answer if one came.
type Query struct {
	QueryID      string
	CommandID    string
	Instance     string // the instance that asked
	FencingToken int64
	SentAt       time.Time
	AnsweredAt   *time.Time // nil: no answer (yet)
	Answer       string     // the answered status, "unknown" if the device never saw the command
}

// ReceiptRecord is one line of a command's receipt log.
type ReceiptRecord struct {
	CommandID  string
	SentAs     string
	DeviceID   string
	Status     string
	Seq        int
	At         string
	ReceivedAt time.Time
	QueryID    string
	Effect     string
	Error      string
	Result     json.RawMessage
	Instance   string
}

// Event is one line of the events log.
type Event struct {
	ID           int64
	At           time.Time
	Machine      string
	EntityID     string
	From, To     string
	Reason       string
	Instance     string
	FencingToken int64
	Refused      bool
	// Principal is the person whose change this is (a cancel, a resolve,
	// an approval...); "" for the controller's own.
	Principal string
}
