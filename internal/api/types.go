package api

import (
	"encoding/json"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
)

// The API's bodies are apiwire's types; these views build them from the
// store's records, at the API's edge.

func operationView(op domain.Operation) apiwire.Operation {
	return apiwire.Operation{
		OperationID: op.OperationID, Status: string(op.Status), RequestHash: op.RequestHash, Action: op.Action,
		Target: op.Target, Params: op.Params, Result: nullable(op.Result), Reason: op.Reason, CommandID: op.CommandID,
		CommandIDs: op.CommandIDs, Attempt: op.Attempt, TaskID: op.TaskID, Step: op.Step,
		BusinessVersion: op.BusinessVersion, Compensates: op.Compensates, Compensations: op.Compensations,
		Owner: op.Owner, FencingToken: op.FencingToken, LeaseExpiresAt: op.LeaseExpiresAt, Version: op.Version,
		StartedAt: op.StartedAt, UpdatedAt: op.UpdatedAt,
		SubmittedBy: op.SubmittedBy, Via: op.Via, ApprovedBy: op.ApprovedBy, ApprovedVersion: op.ApprovedVersion,
	}
}

func nullable(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func commandView(c domain.Command, receipts []domain.ReceiptRecord, events []domain.Event) apiwire.Command {
	out := apiwire.Command{
		CommandID: c.CommandID, OperationID: c.OperationID, DeviceID: c.DeviceID, Action: c.Action, Params: c.Params,
		Status: string(c.Status), Reason: c.Reason, Result: nullable(c.Result), Attempt: c.Attempt, Queries: c.Queries,
		QoS: c.QoS, IssuedAt: c.IssuedAt, ExpiresAt: c.ExpiresAt, LastSentAt: c.LastSentAt, NextCheckAt: c.NextCheckAt,
		LateOutcome: c.LateOutcome, LateResult: c.LateResult, LateConflict: c.LateConflict, ExecutedAs: c.ExecutedAs,
		ResolvedBy: c.ResolvedBy, SerialSeq: c.SerialSeq, QueuedBehind: c.QueuedBehind,
		Receipts: []apiwire.Receipt{}, Events: []apiwire.Event{},
	}
	for _, r := range receipts {
		out.Receipts = append(out.Receipts, apiwire.Receipt{Status: r.Status, Seq: r.Seq, At: r.At, ReceivedAt: r.ReceivedAt,
			QueryID: r.QueryID, SentAs: r.SentAs, Effect: r.Effect, Error: r.Error, Result: r.Result, Instance: r.Instance})
	}
	for _, e := range events {
		out.Events = append(out.Events, apiwire.Event{At: e.At, From: e.From, To: e.To, Reason: e.Reason, Instance: e.Instance,
			FencingToken: e.FencingToken, Refused: e.Refused, Principal: e.Principal})
	}
	return out
}

func deviceView(d domain.Device) apiwire.Device {
	return apiwire.Device{DeviceID: d.DeviceID, Online: d.Online, Confirmed: d.Confirmed, Seen: d.Seen, Session: d.Session,
		Capabilities: apiwire.Caps{Dedupe: d.Capabilities.Dedupe, Query: d.Capabilities.Query},
		ClockSkewMS:  d.ClockSkew.Milliseconds(), LastSeenAt: d.LastSeenAt,
		StalePresence: d.StalePresence, LastStaleSession: d.LastStaleSession}
}
