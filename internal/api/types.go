package api

import (
	"encoding/json"
	"time"

	"github.com/fleetctl/fleetctl/internal/store"
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

// Event is one line of the events log.
type Event struct {
	At           time.Time `json:"at"`
	From         string    `json:"from"`
	To           string    `json:"to"`
	Reason       string    `json:"reason"`
	Instance     string    `json:"instance"`
	FencingToken int64     `json:"fencing_token,omitempty"`
	Refused      bool      `json:"refused,omitempty"`
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
	Receipts     []Receipt       `json:"receipts"`
	Events       []Event         `json:"events"`
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

func operationView(op store.Operation) Operation {
	return Operation{
		OperationID: op.OperationID, Status: string(op.Status), RequestHash: op.RequestHash, Action: op.Action,
		Target: op.Target, Params: op.Params, Result: nullable(op.Result), Reason: op.Reason, CommandID: op.CommandID,
		CommandIDs: op.CommandIDs, Attempt: op.Attempt, TaskID: op.TaskID, Step: op.Step,
		BusinessVersion: op.BusinessVersion, Compensates: op.Compensates, Compensations: op.Compensations,
		Owner: op.Owner, FencingToken: op.FencingToken, LeaseExpiresAt: op.LeaseExpiresAt, Version: op.Version,
		StartedAt: op.StartedAt, UpdatedAt: op.UpdatedAt,
	}
}

func nullable(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func commandView(c store.Command, receipts []store.ReceiptRecord, events []store.Event) Command {
	out := Command{
		CommandID: c.CommandID, OperationID: c.OperationID, DeviceID: c.DeviceID, Action: c.Action, Params: c.Params,
		Status: string(c.Status), Reason: c.Reason, Result: nullable(c.Result), Attempt: c.Attempt, Queries: c.Queries,
		QoS: c.QoS, IssuedAt: c.IssuedAt, ExpiresAt: c.ExpiresAt, LastSentAt: c.LastSentAt, NextCheckAt: c.NextCheckAt,
		LateOutcome: c.LateOutcome, LateResult: c.LateResult, LateConflict: c.LateConflict, ExecutedAs: c.ExecutedAs,
		ResolvedBy: c.ResolvedBy, Receipts: []Receipt{}, Events: []Event{},
	}
	for _, r := range receipts {
		out.Receipts = append(out.Receipts, Receipt{Status: r.Status, Seq: r.Seq, At: r.At, ReceivedAt: r.ReceivedAt,
			QueryID: r.QueryID, SentAs: r.SentAs, Effect: r.Effect, Error: r.Error, Result: r.Result, Instance: r.Instance})
	}
	for _, e := range events {
		out.Events = append(out.Events, Event{At: e.At, From: e.From, To: e.To, Reason: e.Reason, Instance: e.Instance,
			FencingToken: e.FencingToken, Refused: e.Refused})
	}
	return out
}

func deviceView(d store.Device) Device {
	return Device{DeviceID: d.DeviceID, Online: d.Online, Confirmed: d.Confirmed, Seen: d.Seen, Session: d.Session,
		Capabilities: Caps{Dedupe: d.Capabilities.Dedupe, Query: d.Capabilities.Query},
		ClockSkewMS:  d.ClockSkew.Milliseconds(), LastSeenAt: d.LastSeenAt,
		StalePresence: d.StalePresence, LastStaleSession: d.LastStaleSession}
}
