package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// Actions the simulated devices support.
const (
	// ActionRestart bumps the durable boot counter; result
	// {"restarted":true,"boots":N}. The device does not reconnect.
	ActionRestart = "restart"
	// ActionSetConfig merges its params (an object) into the durable config
	// as a JSON merge patch (a null value removes the key); result
	// SetConfigResult: a summary of the config, never the config itself
	// when that is large, so that the receipt stays within the protocol's
	// result limit whatever was merged before.
	ActionSetConfig = "set-config"
)

// Error strings of the receipts a device makes itself.
const (
	ErrExpired           = "expired"
	ErrUnsupportedAction = "unsupported_action"
	ErrInvalidParams     = "invalid_params"
	ErrInterrupted       = "interrupted"
	ErrSimulatedFailure  = "simulated_failure"
	ErrSimulatedReject   = "simulated_rejection"
)

// job asks the executor to run one accepted command.
type job struct {
	id     string
	legacy bool // a dedupe:false device runs every delivery
}

// handleMessage is the worker: one message at a time, in arrival order.
func (inc *incarnation) handleMessage(m mqtt.Message) {
	switch m.Topic() {
	case inc.d.topics.commands:
		inc.handleCommand(m)
	case inc.d.topics.queries:
		inc.handleQuery(m)
	default:
		m.Ack()
	}
}

// handleCommand applies the contract's order: dedupe (command_id, then
// operation_id), then expiry, then the device's own checks; an accepted
// command is recorded "received" before its receipt is published and before
// it is acknowledged to the broker.
func (inc *incarnation) handleCommand(m mqtt.Message) {
	d := inc.d
	var cmd wire.Command
	if err := wire.Decode(m.Payload(), &cmd); err != nil || cmd.CommandID == "" {
		d.log.Warn("ignoring malformed command", "err", err)
		m.Ack()
		return
	}
	d.mu.Lock()
	if inc.killed || inc.stopping {
		d.mu.Unlock()
		return // not acknowledged: the broker redelivers it
	}
	d.stats.CommandsSeen++
	if d.fireLocked("drop_command", d.faults.DropCommand) {
		d.stats.CommandsDropped++
		d.mu.Unlock()
		m.Ack()
		return
	}
	if inc.crashAtLocked(PointCommand) {
		d.mu.Unlock()
		return
	}
	inc.dropAtLocked(PointCommand)

	st, caps, now := d.st, d.capsLocked(), d.nowLocked()
	if caps.Dedupe {
		if r, ok := dedupeAnswer(st, cmd.CommandID, cmd.OperationID); ok {
			d.stats.DuplicatesSuppressed++
			d.mu.Unlock()
			m.Ack()
			inc.emit(r)
			return
		}
	}
	rec := st.Commands[cmd.CommandID]
	if rec == nil {
		rec = &record{Command: cmd, SeenAt: now}
		st.Commands[cmd.CommandID] = rec
	}
	seq := rec.Latest.Seq + 1
	reject := func(e string) {
		rec.Latest = newReceipt(cmd, wire.ReceiptRejected, seq, now, nil, e)
		d.stats.Rejected++
	}
	accepted := false
	switch rf := d.faults.Reject; {
	case expired(cmd, now):
		reject(ErrExpired)
		d.stats.Expired++
	case cmd.Action != ActionRestart && cmd.Action != ActionSetConfig:
		reject(ErrUnsupportedAction)
	case cmd.Action == ActionSetConfig && !paramsObject(cmd.Params):
		reject(ErrInvalidParams)
	case rf.matches(cmd.Action) && d.fireLocked("reject", rf.Trigger):
		reject(or(rf.Error, ErrSimulatedReject))
	default:
		accepted = true
		rec.Latest = newReceipt(cmd, wire.ReceiptReceived, seq, now, nil, "")
		if caps.Dedupe && cmd.OperationID != "" {
			st.Operations[cmd.OperationID] = cmd.CommandID
		}
	}
	if !inc.saveLocked(rec) {
		d.mu.Unlock()
		return
	}
	if accepted {
		if inc.crashAtLocked(PointReceived) {
			d.mu.Unlock()
			return
		}
		inc.dropAtLocked(PointReceived)
	}
	r, t := rec.Latest, d.last
	d.mu.Unlock()
	// Acknowledged only once recorded durably: until then a crash leaves
	// it to the broker to redeliver.
	if err := t.wait(); err != nil {
		inc.durableFailed(err)
		return
	}
	d.mu.Lock()
	dead := inc.killed
	d.mu.Unlock()
	if dead {
		return // died meanwhile: the broker redelivers it to the next one
	}
	m.Ack()
	inc.emit(r)
	if accepted {
		inc.jobs.push(job{id: cmd.CommandID, legacy: !caps.Dedupe})
	}
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

func (inc *incarnation) handleQuery(m mqtt.Message) {
	d := inc.d
	var q wire.Query
	if err := wire.Decode(m.Payload(), &q); err != nil || q.QueryID == "" {
		d.log.Warn("ignoring malformed query", "err", err)
		m.Ack()
		return
	}
	m.Ack()
	d.mu.Lock()
	if inc.killed || inc.stopping {
		d.mu.Unlock()
		return
	}
	d.stats.QueriesSeen++
	if !d.capsLocked().Query || d.fireLocked("ignore_queries", d.faults.IgnoreQueries) {
		d.stats.QueriesIgnored++
		d.mu.Unlock()
		return
	}
	r, ok := dedupeAnswer(d.st, q.CommandID, q.OperationID)
	if !ok {
		r = wire.Receipt{CommandID: q.CommandID, OperationID: q.OperationID, Status: wire.ReceiptUnknown, Seq: 0, At: d.nowLocked()}
	}
	r.QueryID = q.QueryID
	d.stats.QueriesAnswered++
	d.mu.Unlock()
	inc.emit(r)
}

// execute runs one accepted command, persisting before acting:
// "executing" with the planned outcome, then the action (its line in
// executions.jsonl is the execution), then the final receipt with the
// action's effect on the durable state.
func (inc *incarnation) execute(j job) {
	d := inc.d
	d.mu.Lock()
	if inc.killed || inc.stopping {
		d.mu.Unlock()
		return
	}
	st := d.st
	rec := st.Commands[j.id]
	if rec == nil || (!j.legacy && rec.Latest.Status != wire.ReceiptReceived) {
		d.mu.Unlock()
		return
	}
	cmd, now := rec.Command, d.nowLocked()
	if expired(cmd, now) {
		rec.Latest = newReceipt(cmd, wire.ReceiptRejected, rec.Latest.Seq+1, now, nil, ErrExpired)
		releaseOp(st, cmd)
		d.stats.Rejected++
		d.stats.Expired++
		inc.finishLocked(rec)
		return
	}
	p := d.planLocked(st, cmd)
	rec.Latest = newReceipt(cmd, wire.ReceiptExecuting, rec.Latest.Seq+1, now, nil, "")
	rec.Plan = p
	if !inc.saveLocked(rec) || inc.crashAtLocked(PointExecuting) {
		d.mu.Unlock()
		return
	}
	inc.dropAtLocked(PointExecuting)
	var delay time.Duration
	if sf := d.faults.SlowExecution; sf.matches(cmd.Action) && d.fireLocked("slow_execution", sf.Trigger) {
		delay = sf.Delay.D()
	}
	r := rec.Latest
	d.mu.Unlock()
	inc.emit(r)

	interrupted := false
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-inc.done:
			t.Stop()
			interrupted = true
		}
	}

	d.mu.Lock()
	if inc.killed {
		d.mu.Unlock()
		return
	}
	now = d.nowLocked()
	if interrupted { // a clean stop cut the action short: it did not run
		rec.Latest = newReceipt(cmd, wire.ReceiptFailed, rec.Latest.Seq+1, now, nil, ErrInterrupted)
		rec.Plan = nil
		releaseOp(st, cmd)
		d.stats.Failed++
		inc.finishLocked(rec)
		return
	}
	// The line goes to the journal's batch; the final state below is made
	// durable only after it (see journal.commit), and emit waits for both.
	t, err := d.f.j.execution(witness.Execution{DeviceID: d.id, CommandID: cmd.CommandID, OperationID: cmd.OperationID, Action: cmd.Action, At: now})
	if err != nil {
		d.log.Error("cannot write the execution witness; crashing", "err", err)
		d.crashLocked(time.Second, true)
		d.mu.Unlock()
		return
	}
	d.last = t
	rec.Executions++
	d.stats.Executions++
	if inc.crashAtLocked(PointExecuted) {
		d.mu.Unlock()
		return
	}
	inc.dropAtLocked(PointExecuted)
	d.applyLocked(st, rec, p, now)
	if !inc.saveLocked(rec) || inc.crashAtLocked(PointFinal) {
		d.mu.Unlock()
		return
	}
	inc.dropAtLocked(PointFinal)
	r = rec.Latest
	d.mu.Unlock()
	inc.emit(r)
}

// finishLocked saves a final outcome decided without running, unlocks and
// publishes it.
func (inc *incarnation) finishLocked(rec *record) {
	if !inc.saveLocked(rec) {
		inc.d.mu.Unlock()
		return
	}
	r := rec.Latest
	inc.d.mu.Unlock()
	inc.emit(r)
}

// planLocked decides the outcome of an execution before it starts.
func (d *Device) planLocked(st *durableState, cmd wire.Command) *plan {
	if ff := d.faults.Fail; ff.matches(cmd.Action) && d.fireLocked("fail", ff.Trigger) {
		return &plan{Status: wire.ReceiptFailed, Error: or(ff.Error, ErrSimulatedFailure)}
	}
	switch cmd.Action {
	case ActionRestart:
		res, _ := json.Marshal(map[string]any{"restarted": true, "boots": st.Boots + 1})
		return &plan{Status: wire.ReceiptSucceeded, Result: res, Boot: true}
	default: // ActionSetConfig; params were checked on arrival
		next := copyConfig(st.Config)
		var patch map[string]json.RawMessage
		_ = json.Unmarshal(cmd.Params, &patch)
		for k, v := range patch {
			if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				delete(next, k)
			} else {
				next[k] = v
			}
		}
		return &plan{Status: wire.ReceiptSucceeded, Result: SetConfigResult(next, len(patch)), SetConfig: true, Config: next}
	}
}

// applyLocked applies an executed plan: its effect and its final receipt.
func (d *Device) applyLocked(st *durableState, rec *record, p *plan, now time.Time) {
	if p.Boot {
		st.Boots++
	}
	if p.SetConfig {
		st.Config = copyConfig(p.Config)
	}
	rec.Latest = newReceipt(rec.Command, p.Status, rec.Latest.Seq+1, now, p.Result, p.Error)
	rec.Plan = nil
	if p.Status == wire.ReceiptSucceeded {
		d.stats.Succeeded++
	} else {
		d.stats.Failed++
	}
}

// saveLocked hands a change of the state to the journal: the device's
// counters and config, the records given with their operation claims, and
// what pruning forgets. It does not wait: whoever acts on the change
// (acknowledges, publishes, connects) first waits for d.last. A device that
// cannot record its state crashes (and restarts from what is durable)
// rather than act on something it could not record.
func (inc *incarnation) saveLocked(recs ...*record) bool {
	d := inc.d
	st := d.st
	cmds, ops := st.prune(d.nowLocked(), d.f.cfg.Retention)
	dl := &delta{Session: st.Session, Boots: st.Boots, Config: st.Config}
	if len(recs)+len(cmds) > 0 {
		dl.Commands = make(map[string]*record, len(recs)+len(cmds))
	}
	for _, id := range cmds {
		dl.Commands[id] = nil
	}
	for _, r := range recs {
		id := r.Command.CommandID
		dl.Commands[id] = st.Commands[id] // nil if pruned
		if op := r.Command.OperationID; op != "" {
			ops = append(ops, op)
		}
	}
	if len(ops) > 0 {
		dl.Operations = make(map[string]string, len(ops))
		for _, op := range ops {
			dl.Operations[op] = st.Operations[op] // "" if released
		}
	}
	b, err := d.f.j.state(journalEntry{Device: d.id, Delta: dl})
	if err != nil {
		d.log.Error("cannot save state; crashing", "err", err)
		d.crashLocked(time.Second, true)
		return false
	}
	d.last = b
	return true
}

// durableFailed: a change the incarnation made could not be made durable.
// It crashes and boots again a second later from what is durable, without
// acting on the change.
func (inc *incarnation) durableFailed(err error) {
	d := inc.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inc != inc {
		return
	}
	d.log.Error("state not durable; crashing", "err", err)
	d.crashLocked(time.Second, true)
}

// crashAtLocked fires the crash fault at a point; true if the device died.
func (inc *incarnation) crashAtLocked(p Point) bool {
	d := inc.d
	f := d.faults.Crash
	if f.Every > 0 || f.at() != p || !d.fireLocked("crash", f.Trigger) {
		return false
	}
	d.crashLocked(f.For.D(), true)
	return true
}

// dropAtLocked fires the drop_connection fault at a point.
func (inc *incarnation) dropAtLocked(p Point) {
	d := inc.d
	f := d.faults.DropConnection
	if f.Every > 0 || f.at() != p || !inc.connectedLocked() || !d.fireLocked("drop_connection", f.Trigger) {
		return
	}
	d.dropForLocked(f.For.D())
}

func releaseOp(st *durableState, cmd wire.Command) {
	if op := cmd.OperationID; op != "" && st.Operations[op] == cmd.CommandID {
		delete(st.Operations, op)
	}
}

func newReceipt(cmd wire.Command, s wire.ReceiptStatus, seq int, at time.Time, result json.RawMessage, errStr string) wire.Receipt {
	r := wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID, Status: s, Seq: seq, At: at, Result: result, Error: errStr}
	wire.BoundReceipt(&r)
	return r
}

// SetConfigEchoBytes is the largest config a set-config result carries
// whole.
const SetConfigEchoBytes = 4 << 10

// SetConfigResult is a set-config's result: {"config_keys":N,
// "config_sha256":"<hex of the config's JSON>","changed_keys":M}, with
// "config" itself when it encodes to at most SetConfigEchoBytes. The JSON
// hashed is the config's compact encoding, its keys sorted.
func SetConfigResult(config map[string]json.RawMessage, changed int) json.RawMessage {
	whole, _ := json.Marshal(config)
	sum := sha256.Sum256(whole)
	res := map[string]any{"config_keys": len(config), "config_sha256": hex.EncodeToString(sum[:]), "changed_keys": changed}
	if len(whole) <= SetConfigEchoBytes {
		res["config"] = json.RawMessage(whole)
	}
	out, _ := json.Marshal(res)
	return out
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

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
