package sim

import (
	"encoding/json"
	"time"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// The faults are the device library's seams (device.Hooks): the library
// keeps every rule of the protocol; the hooks below only decide what
// happens to messages and when a device dies or goes offline.

// hooks are one incarnation's seams.
func (d *Device) hooks(inc *incarnation) *device.Hooks {
	return &device.Hooks{
		Receipt:   func(r device.Receipt, send func(device.Receipt)) { d.receipt(inc, r, send) },
		Published: d.published,
		Command:   d.command,
		Repeat:    d.repeat,
		Query:     d.query,
		Point:     func(p device.Point, cmd device.Command) { d.point(inc, Point(p)) },
		SaveLine:  func() (string, []byte) { return d.saveLine(inc) },
		SaveApp:   d.saveApp,
		LoadApp:   func(raw json.RawMessage) { d.loadApp(raw); inc.markLoaded() },
		Connect:   d.waitOnlineWindow,
		Online:    func(int64) { d.mu.Lock(); d.stats.Connects++; d.mu.Unlock() },
	}
}

// command is drop_command: the command is acknowledged and lost.
func (d *Device) command(device.Command) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.CommandsSeen++
	if d.fireLocked("drop_command", d.faults.DropCommand) {
		d.stats.CommandsDropped++
		return true
	}
	return false
}

// repeatKey names a receipt a repeat is answered with, so that the
// receipt hook does not count the answer as a new outcome.
type repeatKey struct {
	command string
	seq     int
	status  device.Status
}

func (d *Device) repeat(_ device.Command, answer device.Receipt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.DuplicatesSuppressed++
	if d.repeats == nil {
		d.repeats = map[repeatKey]int{}
	}
	d.repeats[repeatKey{answer.CommandID, answer.Seq, answer.Status}]++
}

// query is ignore_queries (and counts a legacy device's ignored queries).
func (d *Device) query(device.Query) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.QueriesSeen++
	if !d.capsLocked().Query || d.fireLocked("ignore_queries", d.faults.IgnoreQueries) {
		d.stats.QueriesIgnored++
		return true
	}
	d.stats.QueriesAnswered++
	return false
}

// point is the crash and drop_connection faults at a point of a command's
// handling.
func (d *Device) point(inc *incarnation, p Point) {
	d.mu.Lock()
	if c := d.faults.Crash; c.Every == 0 && c.at() == p && d.fireLocked("crash", c.Trigger) {
		d.mu.Unlock()
		if p == PointExecuted {
			d.witnessOnly(inc) // the action ran: its line is written, nothing else
		}
		d.crash(inc, c.For.D(), true)
		return
	}
	f := d.faults.DropConnection
	if f.Every > 0 || f.at() != p || !f.Enabled() {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	if !inc.dev.Online() { // an opportunity only while connected
		return
	}
	d.mu.Lock()
	fire := d.fireLocked("drop_connection", f.Trigger)
	d.mu.Unlock()
	if fire {
		d.dropFor(f.For.D())
	}
}

// witnessOnly writes the line of an execution waiting for its save, without
// its effect, for a crash right after the action ran: the next boot finds
// the line and resolves the command as run.
func (d *Device) witnessOnly(inc *incarnation) {
	d.appMu.Lock()
	e := inc.executed
	inc.executed = nil
	d.appMu.Unlock()
	if e == nil {
		return
	}
	if err := d.f.j.AppendLine(d.f.execFile, e.line); err != nil {
		d.log.Error("cannot write the execution witness", "err", err)
		return
	}
	d.mu.Lock()
	d.stats.Executions++
	d.mu.Unlock()
}

// heldReceipt is a receipt the reorder fault holds back.
type heldReceipt struct {
	out   outgoing
	timer *time.Timer
}

// outgoing is a receipt on its way out, after the receipt faults decided
// its fate.
type outgoing struct {
	r      device.Receipt
	copies int
	send   func(device.Receipt)
}

func (o outgoing) publish() { publishN(o.send, o.r, o.copies) }

const defaultFaultDelay = time.Second

// receipt counts a durable receipt and passes it through the receipt
// faults: drop, duplicate, delay, reorder. The receipt is durable as the
// command's latest (or is a query's answer), so a dropped one is still what
// a repeat or a query gets.
func (d *Device) receipt(inc *incarnation, r device.Receipt, send func(device.Receipt)) {
	d.mu.Lock()
	if r.QueryID == "" {
		k := repeatKey{r.CommandID, r.Seq, r.Status}
		if n := d.repeats[k]; n > 0 {
			if n == 1 {
				delete(d.repeats, k)
			} else {
				d.repeats[k] = n - 1
			}
		} else {
			d.countLocked(r)
		}
	}
	if d.inc != inc {
		d.mu.Unlock()
		return
	}
	f := d.faults // replaced, never changed: no copy needed
	status, query := string(r.Status), r.QueryID != ""
	fires := func(name string, rf *ReceiptFault) bool {
		return rf.Enabled() && rf.matches(status, query) && d.fireLocked(name, rf.Trigger)
	}
	if fires("drop_receipt", &f.DropReceipt) {
		d.stats.ReceiptsDropped++
		d.mu.Unlock()
		return
	}
	copies := 1
	if fires("duplicate_receipt", &f.DuplicateReceipt) {
		copies = 2
		d.stats.ReceiptsDuplicated++
	}
	if d.stopNow { // a clean stop publishes at once what it would hold
		d.mu.Unlock()
		publishN(send, r, copies)
		return
	}
	var delay time.Duration
	if fires("delay_receipt", &f.DelayReceipt) {
		delay = durationOr(f.DelayReceipt.Delay, defaultFaultDelay)
		d.stats.ReceiptsDelayed++
	}
	if d.held == nil && fires("reorder_receipt", &f.ReorderReceipt) {
		d.holdLocked(outgoing{r: r, copies: copies, send: send}, durationOr(f.ReorderReceipt.Delay, defaultFaultDelay))
		d.stats.ReceiptsReordered++
		d.mu.Unlock()
		return
	}
	prev := d.held
	if prev != nil {
		if prev.timer.Stop() {
			d.held = nil
		} else {
			prev = nil // its timer is releasing it
		}
	}
	if delay > 0 {
		d.delayLocked(outgoing{r: r, copies: copies, send: send}, delay)
	}
	d.mu.Unlock()
	if delay <= 0 {
		publishN(send, r, copies)
	}
	if prev != nil {
		prev.out.publish()
	}
}

func publishN(send func(device.Receipt), r device.Receipt, copies int) {
	for range copies {
		send(r)
	}
}

// holdLocked holds a receipt back for the reorder fault (its own function,
// so that only a held receipt is moved to the heap).
func (d *Device) holdLocked(out outgoing, wait time.Duration) {
	h := &heldReceipt{out: out}
	h.timer = time.AfterFunc(wait, func() { d.releaseHeld(h) })
	d.held = h
}

// delayLocked publishes a receipt after delay (delay_receipt), unless a
// crash discards it first.
func (d *Device) delayLocked(out outgoing, delay time.Duration) {
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		d.mu.Lock()
		_, ok := d.delayed[t]
		delete(d.delayed, t)
		d.mu.Unlock()
		if ok {
			out.publish()
		}
	})
	if d.delayed == nil {
		d.delayed = map[*time.Timer]outgoing{}
	}
	d.delayed[t] = out
}

// countLocked counts a command's outcome (not a repeat's answer).
func (d *Device) countLocked(r device.Receipt) {
	switch r.Status {
	case device.Succeeded:
		d.stats.Succeeded++
	case device.Failed:
		d.stats.Failed++
	case device.Rejected:
		d.stats.Rejected++
		if r.Error == ErrExpired {
			d.stats.Expired++
		}
	default:
		return
	}
	d.appMu.Lock()
	if _, ok := d.app.Fail[r.CommandID]; ok {
		delete(d.app.Fail, r.CommandID) // ended without running
		d.appDirty = true
	}
	d.appMu.Unlock()
}

func (d *Device) releaseHeld(h *heldReceipt) {
	d.mu.Lock()
	if d.held != h {
		d.mu.Unlock()
		return
	}
	d.held = nil
	d.mu.Unlock()
	h.out.publish()
}

// takeHeldLocked takes what the delay and reorder faults hold: published
// at a clean stop, discarded at a crash.
func (d *Device) takeHeldLocked() []outgoing {
	var outs []outgoing
	for t, o := range d.delayed {
		if t.Stop() {
			outs = append(outs, o)
		}
		delete(d.delayed, t)
	}
	if h := d.held; h != nil && h.timer.Stop() {
		outs = append(outs, h.out)
	}
	d.held = nil
	return outs
}

// published counts a receipt the broker acknowledged and gives a final one
// its line in receipts.jsonl (in the journal's next batch, not waited for:
// nothing depends on it).
func (d *Device) published(r device.Receipt) {
	d.mu.Lock()
	d.stats.ReceiptsPublished++
	final := r.Status.Final()
	if final {
		d.stats.FinalReceiptsPublished++
	}
	d.mu.Unlock()
	if !final {
		return
	}
	line, _ := witness.Line(witness.PublishedReceipt{
		DeviceID: d.id, CommandID: r.CommandID, OperationID: r.OperationID,
		Status: wire.ReceiptStatus(r.Status), Seq: r.Seq, At: r.At, Error: r.Error, QueryID: r.QueryID,
	})
	if err := d.f.j.AppendLine(d.f.rcptFile, line); err != nil {
		d.log.Error("cannot write the receipt witness", "err", err)
	}
}

// waitOnlineWindow (Hooks.Connect) holds a connection attempt while the
// device is meant to be offline; false when the device ends meanwhile.
func (d *Device) waitOnlineWindow(done <-chan struct{}) bool {
	for {
		d.mu.Lock()
		if d.stopped {
			d.mu.Unlock()
			return false
		}
		if !d.offlineLocked() {
			d.mu.Unlock()
			return true
		}
		wake := d.wake
		var tc <-chan time.Time
		var t *time.Timer
		if !d.offHold {
			t = time.NewTimer(time.Until(d.offUntil))
			tc = t.C
		}
		d.mu.Unlock()
		select {
		case <-wake:
		case <-tc:
		case <-done:
			if t != nil {
				t.Stop()
			}
			return false
		}
		if t != nil {
			t.Stop()
		}
	}
}

func durationOr(d Duration, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d.D()
}
