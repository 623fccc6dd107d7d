package device

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// handleMessage is the worker: one message at a time, in arrival order.
func (d *Device) handleMessage(m mqtt.Message) {
	switch m.Topic() {
	case d.topics.commands:
		d.handleCommand(m)
	case d.topics.queries:
		d.handleQuery(m)
	default:
		m.Ack()
	}
}

// handleCommand applies the protocol's order: dedupe (command_id, then
// operation_id), then expiry, then the device's own checks; an accepted
// command is recorded "received", durably, before it is acknowledged to
// the broker and before its receipt is published.
func (d *Device) handleCommand(m mqtt.Message) {
	var cmd wire.Command
	if err := wire.Decode(m.Payload(), &cmd); err != nil || cmd.CommandID == "" {
		d.log.Warn("ignoring malformed command", "err", err)
		m.Ack()
		return
	}
	if h := d.o.Hooks.Command; h != nil && h(toCommand(cmd)) {
		m.Ack()
		return
	}
	if !d.point(PointCommand, cmd) {
		return
	}
	d.mu.Lock()
	if d.killed || d.stopping {
		d.mu.Unlock()
		return // not acknowledged: the broker redelivers it
	}
	st, now := d.st, d.now().UTC()
	caps := d.caps
	if caps.Dedupe {
		if r, ok := dedupeAnswer(st, cmd.CommandID, cmd.OperationID); ok {
			d.mu.Unlock()
			// Answered from the record, once what it says is durable.
			if d.waitDurable() {
				m.Ack()
				if h := d.o.Hooks.Repeat; h != nil {
					h(toCommand(cmd), toReceipt(r))
				}
				d.emit(r)
			}
			return
		}
	}
	rec := st.Commands[cmd.CommandID]
	if rec == nil {
		rec = &record{Command: cmd, SeenAt: now}
		st.Commands[cmd.CommandID] = rec
	}
	seq := rec.Latest.Seq + 1
	reject := func(e string) { rec.Latest = newReceipt(cmd, wire.ReceiptRejected, seq, now, nil, e) }
	accepted := false
	if expired(cmd, now) {
		reject(ErrorExpired)
	} else if d.o.Actions[cmd.Action] == nil {
		reject(ErrorUnsupportedAction)
	} else if !paramsObject(cmd.Params) {
		reject(ErrorInvalidParams)
	} else if err := d.accept(cmd); err != nil {
		reject(errorText(err))
	} else {
		accepted = true
		rec.Latest = newReceipt(cmd, wire.ReceiptReceived, seq, now, nil, "")
		if caps.Dedupe && cmd.OperationID != "" {
			st.Operations[cmd.OperationID] = cmd.CommandID
		}
	}
	if !d.saveLocked(rec) {
		d.mu.Unlock()
		return
	}
	r := rec.Latest
	d.mu.Unlock()
	// Acknowledged only once recorded durably: until then a crash leaves
	// it to the broker to redeliver.
	if !d.waitDurable() {
		return
	}
	if accepted && !d.point(PointReceived, cmd) {
		return
	}
	m.Ack()
	d.emit(r)
	if accepted {
		d.jobs.push(cmd.CommandID)
	}
}

func (d *Device) accept(cmd wire.Command) (err error) {
	if d.o.Accept == nil {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return d.o.Accept(toCommand(cmd))
}

// dedupeAnswer is the latest receipt for a command_id, or else for the
// command that took the operation_id.
func dedupeAnswer(st *durableState, commandID, operationID string) (wire.Receipt, bool) {
	if rec := st.Commands[commandID]; commandID != "" && rec != nil {
		return rec.Latest, true
	}
	if operationID != "" {
		if other := st.Operations[operationID]; other != "" {
			if rec := st.Commands[other]; rec != nil {
				return rec.Latest, true
			}
		}
	}
	return wire.Receipt{}, false
}

func (d *Device) handleQuery(m mqtt.Message) {
	var q wire.Query
	if err := wire.Decode(m.Payload(), &q); err != nil || q.QueryID == "" {
		d.log.Warn("ignoring malformed query", "err", err)
		m.Ack()
		return
	}
	m.Ack()
	if h := d.o.Hooks.Query; h != nil && h(Query{ID: q.QueryID, CommandID: q.CommandID, OperationID: q.OperationID}) {
		return
	}
	d.mu.Lock()
	if !d.caps.Query {
		d.mu.Unlock()
		return
	}
	if d.killed || d.stopping {
		d.mu.Unlock()
		return
	}
	r, ok := dedupeAnswer(d.st, q.CommandID, q.OperationID)
	if !ok {
		r = wire.Receipt{CommandID: q.CommandID, OperationID: q.OperationID, Status: wire.ReceiptUnknown, Seq: 0, At: d.now().UTC()}
	}
	r.QueryID = q.QueryID
	d.mu.Unlock()
	d.emit(r)
}

// execute is the executor: it runs one accepted command, recording before
// acting: "executing", then the handler, then the final receipt.
func (d *Device) execute(id string) {
	d.mu.Lock()
	if d.killed || d.stopping {
		d.mu.Unlock()
		return
	}
	st := d.st
	rec := st.Commands[id]
	if rec == nil || (d.caps.Dedupe && rec.Latest.Status != wire.ReceiptReceived) {
		d.mu.Unlock()
		return
	}
	cmd, now := rec.Command, d.now().UTC()
	if expired(cmd, now) {
		rec.Latest = newReceipt(cmd, wire.ReceiptRejected, rec.Latest.Seq+1, now, nil, ErrorExpired)
		releaseOp(st, cmd)
		d.finishLocked(rec)
		return
	}
	rec.Latest = newReceipt(cmd, wire.ReceiptExecuting, rec.Latest.Seq+1, now, nil, "")
	rec.Runs++
	if !d.saveLocked(rec) {
		d.mu.Unlock()
		return
	}
	r := rec.Latest
	d.mu.Unlock()
	if !d.waitDurable() || !d.point(PointExecuting, cmd) {
		return
	}
	d.emit(r)

	c := toCommand(cmd)
	d.mu.Lock()
	d.runs++
	c.dev, c.run = d, d.runs
	d.running = rec // cleared (under d.mu) once the handler returned
	d.mu.Unlock()
	result, err := runHandler(d.runCtx, d.o.Actions[cmd.Action], &c)
	d.mu.Lock()
	d.running = nil
	d.mu.Unlock()
	if !d.point(PointExecuted, cmd) {
		return
	}

	d.mu.Lock()
	if d.killed {
		d.mu.Unlock()
		return
	}
	now = d.now().UTC()
	switch {
	case errors.Is(err, ErrNotStarted):
		rec.Latest = newReceipt(cmd, wire.ReceiptFailed, rec.Latest.Seq+1, now, nil, ErrorInterrupted)
		releaseOp(st, cmd)
	case err != nil && d.stopping && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		rec.Latest = newReceipt(cmd, wire.ReceiptFailed, rec.Latest.Seq+1, now, nil, ErrorInterrupted)
	default:
		rec.Latest = d.outcome(cmd, rec.Latest.Seq+1, now, result, err)
	}
	if !d.saveLocked(rec) {
		d.mu.Unlock()
		return
	}
	r = rec.Latest
	d.mu.Unlock()
	if !d.waitDurable() || !d.point(PointFinal, cmd) {
		return
	}
	d.emit(r)
}

// progress records an "executing" receipt with a partial result and
// publishes it once durable.
func (d *Device) progress(run uint64, partial any) error {
	raw, err := encodeResult(partial)
	if err != nil {
		return err
	}
	d.mu.Lock()
	rec := d.running
	if rec == nil || run != d.runs {
		d.mu.Unlock()
		return errors.New("device: Progress after the handler returned")
	}
	if d.killed {
		d.mu.Unlock()
		return ErrKilled
	}
	rec.Latest = newReceipt(rec.Command, wire.ReceiptExecuting, rec.Latest.Seq+1, d.now().UTC(), raw, "")
	if !d.saveLocked(rec) {
		d.mu.Unlock()
		return ErrKilled
	}
	r := rec.Latest
	d.mu.Unlock()
	if !d.waitDurable() {
		return ErrKilled
	}
	d.emit(r)
	return nil
}

func runHandler(ctx context.Context, h Handler, c *Command) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			result, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return h(ctx, c)
}

// outcome is the final receipt of a handler's (or a resolver's) return.
func (d *Device) outcome(cmd wire.Command, seq int, now time.Time, result any, err error) wire.Receipt {
	if err != nil {
		return newReceipt(cmd, wire.ReceiptFailed, seq, now, nil, errorText(err))
	}
	raw, encErr := encodeResult(result)
	if encErr != nil {
		d.log.Error("handler's result refused; the command fails", "command_id", cmd.CommandID, "err", encErr)
		return newReceipt(cmd, wire.ReceiptFailed, seq, now, nil, ErrorInvalidResult+": "+encErr.Error())
	}
	if len(raw) > wire.MaxResultBytes {
		d.log.Warn("result over the protocol's limit; sending the result_too_large marker in its place",
			"command_id", cmd.CommandID, "bytes", len(raw), "limit", wire.MaxResultBytes)
	}
	return newReceipt(cmd, wire.ReceiptSucceeded, seq, now, raw, "")
}

// encodeResult encodes a result: nil is none, a json.RawMessage is used
// as it is; it must be a JSON object.
func encodeResult(v any) (json.RawMessage, error) {
	var raw []byte
	switch r := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if r == nil {
			return nil, nil
		}
		raw = r
	case []byte:
		raw = r
	default:
		b, err := wire.Encode(v)
		if err != nil {
			return nil, fmt.Errorf("encode result: %w", err)
		}
		raw = b
	}
	t := bytes.TrimSpace(raw)
	if string(t) == "null" {
		return nil, nil
	}
	if len(t) == 0 || t[0] != '{' || !json.Valid(t) {
		return nil, errors.New("result is not a JSON object")
	}
	if err := wire.CheckValidJSON(t, wire.CheckOptions{}); err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	if compact(t) {
		return bytes.Clone(t), nil // what json.Compact would make of it
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, t); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compact reports whether valid JSON has no whitespace outside its strings
// (json.Compact leaves it as it is).
func compact(t []byte) bool {
	in := false
	for i := 0; i < len(t); i++ {
		switch c := t[i]; {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}

// finishLocked saves a final outcome decided without running, unlocks and
// publishes it.
func (d *Device) finishLocked(rec *record) {
	if !d.saveLocked(rec) {
		d.mu.Unlock()
		return
	}
	r := rec.Latest
	d.mu.Unlock()
	if d.waitDurable() {
		d.emit(r)
	}
}

func releaseOp(st *durableState, cmd wire.Command) {
	if op := cmd.OperationID; op != "" && st.Operations[op] == cmd.CommandID {
		delete(st.Operations, op)
	}
}

// newReceipt makes a receipt within the protocol's limits (wire.BoundReceipt).
func newReceipt(cmd wire.Command, s wire.ReceiptStatus, seq int, at time.Time, result json.RawMessage, errStr string) wire.Receipt {
	r := wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID, Status: s, Seq: seq, At: at, Result: result, Error: errStr}
	wire.BoundReceipt(&r)
	return r
}

func errorText(err error) string {
	if s := err.Error(); s != "" {
		return s
	}
	return "error"
}

// expired: expires_at has passed by the device's clock (a command without
// expires_at never expires).
func expired(cmd wire.Command, now time.Time) bool {
	return !cmd.ExpiresAt.IsZero() && now.After(cmd.ExpiresAt)
}

// paramsObject: params absent, null or a JSON object.
func paramsObject(p json.RawMessage) bool {
	t := bytes.TrimSpace(p)
	if len(t) == 0 || string(t) == "null" {
		return true
	}
	var m map[string]json.RawMessage
	return t[0] == '{' && json.Unmarshal(t, &m) == nil
}
