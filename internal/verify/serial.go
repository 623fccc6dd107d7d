package verify

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// firstPublish is the reason of a command's first publish event (ClaimSend
// of attempt 0).
const firstPublish = "publish attempt 1"

// 10. On a device, serial commands never overlap and are published in the
// order their submits committed. From the events log, per device in log
// order: a serial command is in flight from its first publish (→ sent,
// "publish attempt 1", from pending or waiting_device) to its terminal
// event; a first publish while another serial command of the device is in
// flight is an overlap; a first publish must come after every earlier
// serial command of the device (lower serial_seq) has ended (so first
// publishes come in serial_seq order); and the submits (""→pending) must
// come in serial_seq order. From the witness, per device by execution
// time: executions of serial commands come in serial_seq order, and none is
// before the final receipt of the serial command published before it
// (the device's own clock on both), unless that one ended without the
// device's word: timeout, cancelled, resolved by a person, or no final
// receipt published at all (counted as skipped). Printed for every run.
func (r *run) serial(cmds []store.AuditSerialCommand, execs []witness.Execution, rcpts []witness.PublishedReceipt) Verdict {
	const name = "serial commands never overlap on a device and go out in submit order"
	if len(cmds) == 0 {
		return Verdict{10, name, true, "0 serial commands"}
	}
	byID := map[string]store.AuditSerialCommand{}
	order := map[string][]store.AuditSerialCommand{} // per device, by serial_seq
	for _, c := range cmds {
		byID[c.CommandID] = c
		order[c.DeviceID] = append(order[c.DeviceID], c)
	}
	for _, q := range order {
		sort.Slice(q, func(i, j int) bool { return q[i].SerialSeq < q[j].SerialSeq })
	}

	var bad []string
	overlaps, outOfOrder := 0, 0
	flag := func(overlap bool, format string, args ...any) {
		if overlap {
			overlaps++
		} else {
			outOfOrder++
		}
		bad = append(bad, fmt.Sprintf(format, args...))
	}

	// The events log.
	inFlight := map[string]map[string]bool{} // device → its published, not yet terminal serial commands
	published := map[string]bool{}
	ended := map[string]bool{}
	resolved := map[string]bool{} // ended by a person's resolve, not the device's receipt
	lastSubmit := map[string]int64{}
	queued := 0 // submitted behind an open serial command of the device
	for _, e := range r.events {
		if e.Refused || e.Machine != fsm.Command.Name() {
			continue
		}
		c, ok := byID[e.EntityID]
		if !ok {
			continue
		}
		dev := c.DeviceID
		switch {
		case e.From == "" && e.To == string(fsm.CmdPending):
			if c.SerialSeq <= lastSubmit[dev] {
				flag(false, "%s: %s (serial_seq %d) submitted after serial_seq %d", dev, c.CommandID, c.SerialSeq, lastSubmit[dev])
			}
			lastSubmit[dev] = max(lastSubmit[dev], c.SerialSeq)
			if strings.HasPrefix(e.Reason, "submitted, queued behind ") {
				queued++
			}
		case e.To == string(fsm.CmdSent) && e.Reason == firstPublish &&
			(e.From == string(fsm.CmdPending) || e.From == string(fsm.CmdWaitingDevice)) && !published[c.CommandID]:
			published[c.CommandID] = true
			if len(inFlight[dev]) > 0 {
				flag(true, "%s: %s published (event %d) while %s was in flight", dev, c.CommandID, e.ID, someKey(inFlight[dev]))
			}
			for _, p := range order[dev] {
				if p.SerialSeq >= c.SerialSeq {
					break
				}
				if !ended[p.CommandID] {
					flag(false, "%s: %s (serial_seq %d) published (event %d) ahead of %s (serial_seq %d), not yet ended",
						dev, c.CommandID, c.SerialSeq, e.ID, p.CommandID, p.SerialSeq)
					break
				}
			}
			if inFlight[dev] == nil {
				inFlight[dev] = map[string]bool{}
			}
			inFlight[dev][c.CommandID] = true
		case fsm.CommandState(e.To).Terminal() && !ended[c.CommandID]:
			ended[c.CommandID] = true
			resolved[c.CommandID] = strings.HasPrefix(e.Reason, "resolved by ")
			delete(inFlight[dev], c.CommandID)
		}
	}

	// The witness: the device's executions against its final receipts.
	final := map[string]time.Time{} // a command's first final receipt, by its own at
	for _, p := range rcpts {
		if !p.Status.Final() {
			continue
		}
		if at, ok := final[p.CommandID]; !ok || p.At.Before(at) {
			final[p.CommandID] = p.At
		}
	}
	perDevice := map[string][]witness.Execution{}
	for _, x := range execs {
		if c, ok := byID[x.CommandID]; ok {
			perDevice[c.DeviceID] = append(perDevice[c.DeviceID], x)
		}
	}
	checked, skipped := 0, 0
	for dev, xs := range perDevice {
		sort.SliceStable(xs, func(i, j int) bool { return xs[i].At.Before(xs[j].At) })
		var last store.AuditSerialCommand
		for _, x := range xs {
			c := byID[x.CommandID]
			if c.SerialSeq < last.SerialSeq {
				flag(false, "%s: %s (serial_seq %d) executed at %s after %s (serial_seq %d)",
					dev, c.CommandID, c.SerialSeq, clock(x.At), last.CommandID, last.SerialSeq)
			}
			if c.SerialSeq > last.SerialSeq {
				last = c
			}
			prev, ok := previousPublished(order[dev], c.SerialSeq, published)
			if !ok {
				checked++
				continue
			}
			at, receipted := final[prev.CommandID]
			if !receipted || prev.Status == fsm.CmdTimeout || prev.Status == fsm.CmdCancelled || resolved[prev.CommandID] {
				skipped++
				continue
			}
			checked++
			if x.At.Before(at) {
				flag(true, "%s: %s executed at %s, before %s's final receipt at %s",
					dev, c.CommandID, clock(x.At), prev.CommandID, clock(at))
			}
		}
	}

	detail := fmt.Sprintf("%d serial commands on %d devices (%d submitted behind another), %d published, %d overlaps, %d out of order; witness: %d executions checked, %d skipped (the one before ended timeout, cancelled or resolved, or without a final receipt)",
		len(cmds), len(order), queued, len(published), overlaps, outOfOrder, checked, skipped)
	if len(bad) > 0 {
		detail += "; the first: " + bad[0]
	}
	return Verdict{10, name, len(bad) == 0, detail}
}

// previousPublished is the serial command of the device published before
// the one numbered seq: the published one with the highest lower number.
func previousPublished(q []store.AuditSerialCommand, seq int64, published map[string]bool) (store.AuditSerialCommand, bool) {
	for i := len(q) - 1; i >= 0; i-- {
		if q[i].SerialSeq < seq && published[q[i].CommandID] {
			return q[i], true
		}
	}
	return store.AuditSerialCommand{}, false
}

// someKey is the lowest key of a set, for a stable message.
func someKey(m map[string]bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys[0]
}

// clock is a device time in a verdict's detail.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }
