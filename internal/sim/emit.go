package sim

import (
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// outgoing is a receipt on its way out, after the receipt faults decided
// its fate.
type outgoing struct {
	r      wire.Receipt
	copies int
	delay  time.Duration
}

// heldReceipt is a receipt the reorder fault holds back.
type heldReceipt struct {
	out   outgoing
	timer *time.Timer
}

const defaultFaultDelay = time.Second

// emit publishes a receipt through the receipt faults: drop, duplicate,
// delay, reorder. The receipt is already durable as the command's latest
// (or is a query's answer), so a dropped one is still what a repeat or a
// query gets.
func (inc *incarnation) emit(r wire.Receipt) {
	d := inc.d
	d.mu.Lock()
	if inc.killed {
		d.mu.Unlock()
		return
	}
	// Nothing is said before what it reports is durable: the receipt was
	// read from the state after its change was enqueued, so the device's
	// latest batch covers it.
	t := d.last
	d.mu.Unlock()
	if err := t.wait(); err != nil {
		inc.durableFailed(err)
		return
	}
	d.mu.Lock()
	if inc.killed {
		d.mu.Unlock()
		return
	}
	f := d.faults
	status, query := string(r.Status), r.QueryID != ""
	fires := func(name string, rf ReceiptFault) bool {
		return rf.matches(status, query) && d.fireLocked(name, rf.Trigger)
	}
	if fires("drop_receipt", f.DropReceipt) {
		d.stats.ReceiptsDropped++
		d.mu.Unlock()
		return
	}
	out := outgoing{r: r, copies: 1}
	if fires("duplicate_receipt", f.DuplicateReceipt) {
		out.copies = 2
		d.stats.ReceiptsDuplicated++
	}
	if fires("delay_receipt", f.DelayReceipt) {
		out.delay = durationOr(f.DelayReceipt.Delay, defaultFaultDelay)
		d.stats.ReceiptsDelayed++
	}
	if inc.held == nil && fires("reorder_receipt", f.ReorderReceipt) {
		h := &heldReceipt{out: out}
		h.timer = time.AfterFunc(durationOr(f.ReorderReceipt.Delay, defaultFaultDelay), func() { inc.releaseHeld(h) })
		inc.held = h
		d.stats.ReceiptsReordered++
		d.mu.Unlock()
		return
	}
	prev := inc.held
	if prev != nil {
		if prev.timer.Stop() {
			inc.held = nil
		} else {
			prev = nil // its timer is releasing it
		}
	}
	d.mu.Unlock()
	inc.send(out)
	if prev != nil {
		inc.send(prev.out)
	}
}

func (inc *incarnation) releaseHeld(h *heldReceipt) {
	inc.d.mu.Lock()
	if inc.held != h || inc.killed {
		inc.d.mu.Unlock()
		return
	}
	inc.held = nil
	inc.d.mu.Unlock()
	inc.send(h.out)
}

func (inc *incarnation) send(o outgoing) {
	if o.delay <= 0 {
		inc.publishN(o.r, o.copies)
		return
	}
	d := inc.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if inc.killed {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(o.delay, func() {
		d.mu.Lock()
		_, ok := inc.timers[t]
		delete(inc.timers, t)
		d.mu.Unlock()
		if ok {
			inc.publishN(o.r, o.copies)
		}
	})
	inc.timers[t] = o
}

// flushDelayed publishes at once what the delay and reorder faults still
// hold (clean stop).
func (inc *incarnation) flushDelayed() {
	d := inc.d
	d.mu.Lock()
	var outs []outgoing
	for t, o := range inc.timers {
		if t.Stop() {
			outs = append(outs, o)
		}
		delete(inc.timers, t)
	}
	if h := inc.held; h != nil && h.timer.Stop() {
		inc.held = nil
		outs = append(outs, h.out)
	}
	d.mu.Unlock()
	for _, o := range outs {
		inc.publishN(o.r, o.copies)
	}
}

func (inc *incarnation) publishN(r wire.Receipt, n int) {
	for range n {
		inc.publish(r)
	}
}

// publish sends a receipt (QoS 1, not retained) if the device is online,
// else keeps it for the next connection.
func (inc *incarnation) publish(r wire.Receipt) {
	d := inc.d
	d.mu.Lock()
	if inc.killed {
		d.mu.Unlock()
		return
	}
	if !inc.connected || inc.client == nil || !inc.conn.up() {
		inc.pending = append(inc.pending, r)
		d.mu.Unlock()
		return
	}
	client, gen := inc.client, inc.gen.Load()
	inc.inflight++
	d.mu.Unlock()
	payload, _ := wire.Encode(r)
	tok := client.Publish(d.topics.receipts, 1, false, payload)
	go inc.confirm(tok, r, gen)
}

// confirm waits for the broker's acknowledgement. An acknowledged final
// receipt gets its line in receipts.jsonl (handed to the journal under the
// device's lock, with the counters); one not acknowledged on the connection
// it was sent on is kept for the next connection.
func (inc *incarnation) confirm(tok mqtt.Token, r wire.Receipt, gen uint64) {
	d := inc.d
	defer inc.publishDone()
	select {
	case <-tok.Done():
	case <-inc.dead:
		return
	}
	ok := tok.Error() == nil && inc.gen.Load() == gen
	d.mu.Lock()
	defer d.mu.Unlock()
	if inc.killed {
		return
	}
	if !ok {
		d.log.Debug("receipt not confirmed, kept for the next connection", "command_id", r.CommandID, "status", r.Status, "err", tok.Error())
		inc.pending = append(inc.pending, r)
		if inc.connected {
			time.AfterFunc(100*time.Millisecond, inc.flushPending)
		}
		return
	}
	d.stats.ReceiptsPublished++
	if !r.Status.Final() {
		return
	}
	d.stats.FinalReceiptsPublished++
	// Enqueued, not waited for: the line follows the publish, nothing
	// depends on it (the writer logs a failed batch).
	_, err := d.f.j.receipt(witness.PublishedReceipt{
		DeviceID: d.id, CommandID: r.CommandID, OperationID: r.OperationID,
		Status: r.Status, Seq: r.Seq, At: r.At, Error: r.Error, QueryID: r.QueryID,
	})
	if err != nil {
		d.log.Error("cannot write the receipt witness", "err", err)
	}
}

func (inc *incarnation) publishDone() {
	d := inc.d
	d.mu.Lock()
	defer d.mu.Unlock()
	inc.inflight--
	if inc.inflight == 0 && inc.idle != nil {
		close(inc.idle)
		inc.idle = nil
	}
}

// waitIdle waits until every publish is acknowledged, or the timeout.
func (inc *incarnation) waitIdle(timeout time.Duration) bool {
	d := inc.d
	d.mu.Lock()
	if inc.inflight == 0 {
		d.mu.Unlock()
		return true
	}
	if inc.idle == nil {
		inc.idle = make(chan struct{})
	}
	ch := inc.idle
	d.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// flushPending publishes, in order, the receipts that waited for a
// connection.
func (inc *incarnation) flushPending() {
	d := inc.d
	d.mu.Lock()
	if inc.killed || !inc.connected || !inc.conn.up() {
		d.mu.Unlock()
		return
	}
	items := inc.pending
	inc.pending = nil
	d.mu.Unlock()
	for _, r := range items {
		inc.publish(r)
	}
}

func durationOr(d Duration, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d.D()
}
