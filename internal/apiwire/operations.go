package apiwire

import (
	"encoding/json"
	"time"
)

// SubmitRequest is the body of POST /v1/operations.
type SubmitRequest struct {
	OperationID     string          `json:"operation_id,omitempty"`
	TaskID          string          `json:"task_id,omitempty"`
	Step            string          `json:"step,omitempty"`
	Target          string          `json:"target"`
	BusinessVersion string          `json:"business_version,omitempty"`
	Action          string          `json:"action"`
	Params          json.RawMessage `json:"params,omitempty"`
}

// Operation is the operation record as the API shows it.
type Operation struct {
	OperationID     string          `json:"operation_id"`
	Status          string          `json:"status"`
	RequestHash     string          `json:"request_hash"`
	Action          string          `json:"action"`
	Target          string          `json:"target"`
	Params          json.RawMessage `json:"params"`
	Result          json.RawMessage `json:"result"`
	Reason          string          `json:"reason,omitempty"`
	CommandID       string          `json:"command_id"`
	CommandIDs      []string        `json:"command_ids"`
	Attempt         int             `json:"attempt"`
	TaskID          string          `json:"task_id,omitempty"`
	Step            string          `json:"step,omitempty"`
	BusinessVersion string          `json:"business_version,omitempty"`
	Compensates     string          `json:"compensates,omitempty"`
	Compensations   []string        `json:"compensations"`
	Owner           string          `json:"owner"`
	FencingToken    int64           `json:"fencing_token"`
	LeaseExpiresAt  time.Time       `json:"lease_expires_at"`
	Version         int64           `json:"version"`
	StartedAt       time.Time       `json:"started_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	// Attribution: the principal whose token submitted it ("anonymous"
	// without --tokens), the channel (api, mcp, task, rollout,
	// compensation), and for a task step or a rollout device its approver
	// and the approved version. Operations stored before attribution was
	// recorded have "" for both of the first two.
	SubmittedBy     string `json:"submitted_by"`
	Via             string `json:"via"`
	ApprovedBy      string `json:"approved_by,omitempty"`
	ApprovedVersion int    `json:"approved_version,omitempty"`
}

// ViaHeader names the channel a submit came through when it is not the
// API itself: the MCP server sends "mcp" on each of its tool calls'
// requests. It only labels the operation's via; who submitted it is
// always the token's principal.
const ViaHeader = "X-Controller-Via"

// CompensationRequest is the body of POST /v1/operations/{id}/compensations.
type CompensationRequest struct {
	Action          string          `json:"action"`
	Params          json.RawMessage `json:"params,omitempty"`
	Reason          string          `json:"reason"`
	BusinessVersion string          `json:"business_version"`
}

// Receipt is one line of a command's receipt log.
type Receipt struct {
	Status     string          `json:"status"`
	Seq        int             `json:"seq"`
	At         string          `json:"at,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
	QueryID    string          `json:"query_id,omitempty"`
	SentAs     string          `json:"sent_as,omitempty"`
	Effect     string          `json:"effect"`
	Error      string          `json:"error,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	Instance   string          `json:"instance"`
}

// Event is one line of a command's events log.
type Event struct {
	At           time.Time `json:"at"`
	From         string    `json:"from"`
	To           string    `json:"to"`
	Reason       string    `json:"reason"`
	Instance     string    `json:"instance"`
	FencingToken int64     `json:"fencing_token,omitempty"`
	Refused      bool      `json:"refused,omitempty"`
	// Principal is the person whose change it is (a cancel, a resolve);
	// omitted for the controller's own.
	Principal string `json:"principal,omitempty"`
}

// Command is a command as the API shows it.
type Command struct {
	CommandID    string          `json:"command_id"`
	OperationID  string          `json:"operation_id"`
	DeviceID     string          `json:"device_id"`
	Action       string          `json:"action"`
	Params       json.RawMessage `json:"params"`
	Status       string          `json:"status"`
	Reason       string          `json:"reason,omitempty"`
	Result       json.RawMessage `json:"result"`
	Attempt      int             `json:"attempt"`
	Queries      int             `json:"queries"`
	QoS          int             `json:"qos"`
	IssuedAt     time.Time       `json:"issued_at"`
	ExpiresAt    time.Time       `json:"expires_at"`
	LastSentAt   *time.Time      `json:"last_sent_at"`
	NextCheckAt  time.Time       `json:"next_check_at"`
	LateOutcome  string          `json:"late_outcome,omitempty"`
	LateResult   json.RawMessage `json:"late_result,omitempty"`
	LateConflict bool            `json:"late_conflict"`
	ExecutedAs   string          `json:"executed_as,omitempty"`
	ResolvedBy   string          `json:"resolved_by,omitempty"`
	// SerialSeq is a serial command's place in its device's queue (the
	// order its submit committed in); omitted for a parallel command.
	SerialSeq int64 `json:"serial_seq,omitempty"`
	// QueuedBehind names the serial command just ahead of this one on its
	// device while it waits unpublished (reason queued): GET
	// /v1/commands/{id} only.
	QueuedBehind string    `json:"queued_behind,omitempty"`
	Receipts     []Receipt `json:"receipts"`
	Events       []Event   `json:"events"`
	// QueryLog lists the queries asked about the command and their
	// answers: GET /v1/commands/{id} only, not the list.
	QueryLog []Query `json:"query_log,omitempty"`
}

// Query is one query the controller sent about a command, and the answer.
type Query struct {
	QueryID    string     `json:"query_id"`
	SentAt     time.Time  `json:"sent_at"`
	Instance   string     `json:"instance"`
	AnsweredAt *time.Time `json:"answered_at"`
	Answer     string     `json:"answer,omitempty"`
}

// ResolveRequest is the body of POST /v1/commands/{id}/resolve.
type ResolveRequest struct {
	Outcome string `json:"outcome"`
	Note    string `json:"note"`
}

// Device is a device's presence as the API shows it.
type Device struct {
	DeviceID     string     `json:"device_id"`
	Online       bool       `json:"online"`
	Confirmed    bool       `json:"confirmed"`
	Seen         bool       `json:"seen"`
	Session      int64      `json:"session"`
	Capabilities Caps       `json:"capabilities"`
	ClockSkewMS  int64      `json:"clock_skew_ms"`
	LastSeenAt   *time.Time `json:"last_seen_at"`
	// StalePresence counts presence messages ignored as stale (a rank lower
	// than the stored one); LastStaleSession is the latest one's session.
	StalePresence    int64 `json:"stale_presence"`
	LastStaleSession int64 `json:"last_stale_session"`
}

// DeviceDetail is GET /v1/devices/{id}: the device's presence and its
// commands. InFlight are its commands published and not yet terminal
// (needs_attention included), oldest first, serial or not; Queued its
// serial commands not yet published, in the order they will go out.
type DeviceDetail struct {
	Device
	InFlight []string `json:"in_flight"`
	Queued   []string `json:"queued"`
}

// Caps are a device's capabilities.
type Caps struct {
	Dedupe bool `json:"dedupe"`
	Query  bool `json:"query"`
}

// Error is every error body.
type Error struct {
	Code    string `json:"error"`
	Message string `json:"message"`
}

// Every list (GET /v1/devices, /v1/grants, /v1/tasks, /v1/rollouts) pages
// by id: ?limit= from 1 to MaxPageLimit, DefaultPageLimit when absent.
const (
	DefaultPageLimit = 1000
	MaxPageLimit     = 10000
)
