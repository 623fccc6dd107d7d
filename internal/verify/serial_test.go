package verify

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// serialRun is a clean run of n serial commands s-1..s-n on device-1, one
// after the other (submitted, published, executed, final receipt,
// succeeded), with a parallel command p-1 published in between; events,
// executions and receipts one second apart.
type serialRun struct {
	cmds   []store.AuditSerialCommand
	events []domain.Event
	execs  []witness.Execution
	rcpts  []witness.PublishedReceipt
	at     time.Time
}

func (s *serialRun) tick() time.Time { s.at = s.at.Add(time.Second); return s.at }

func (s *serialRun) event(cmd, from, to, reason string) {
	s.events = append(s.events, domain.Event{ID: int64(len(s.events) + 1), Machine: "command", EntityID: cmd,
		From: from, To: to, Reason: reason, At: s.tick()})
}

func (s *serialRun) run(cmd string) {
	s.event(cmd, "sent", "received", "receipt")
	s.execs = append(s.execs, witness.Execution{DeviceID: "device-1", CommandID: cmd, OperationID: "op-" + cmd, At: s.tick()})
	s.rcpts = append(s.rcpts, witness.PublishedReceipt{DeviceID: "device-1", CommandID: cmd, Status: wire.ReceiptSucceeded, Seq: 3, At: s.tick()})
	s.event(cmd, "received", "succeeded", "receipt")
}

func cleanSerial(n int) *serialRun {
	s := &serialRun{at: t0}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s-%d", i)
		s.cmds = append(s.cmds, store.AuditSerialCommand{CommandID: id, DeviceID: "device-1", SerialSeq: int64(i), Status: fsm.CmdSucceeded})
		s.event(id, "", "pending", "submitted")
	}
	s.event("p-1", "", "pending", "submitted")
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s-%d", i)
		s.event(id, "pending", "sent", "publish attempt 1")
		if i == 1 {
			s.event("p-1", "pending", "sent", "publish attempt 1") // a parallel command goes by
		}
		s.run(id)
	}
	return s
}

// submittedTwo is a run where s-1 and s-2 of device-1 were submitted in
// that order; first and second are their states in the database.
func submittedTwo(first, second fsm.CommandState) *serialRun {
	s := &serialRun{at: t0}
	for i, st := range []fsm.CommandState{first, second} {
		id := fmt.Sprintf("s-%d", i+1)
		s.cmds = append(s.cmds, store.AuditSerialCommand{CommandID: id, DeviceID: "device-1", SerialSeq: int64(i + 1), Status: st})
		s.event(id, "", "pending", "submitted")
	}
	return s
}

func (s *serialRun) verdict() Verdict {
	return (&run{events: s.events}).serial(s.cmds, s.execs, s.rcpts)
}

func TestInvariant10(t *testing.T) {
	v := (&run{}).serial(nil, nil, nil)
	require.True(t, v.OK)
	require.Equal(t, 10, v.N)
	require.Equal(t, "0 serial commands", v.Detail)

	v = cleanSerial(3).verdict()
	require.True(t, v.OK, v.Detail)
	require.Contains(t, v.Detail, "3 serial commands on 1 devices (0 submitted behind another), 3 published, 0 overlaps, 0 out of order; witness: 3 executions checked, 0 skipped")

	t.Run("overlap", func(t *testing.T) {
		s := submittedTwo(fsm.CmdSucceeded, fsm.CmdSucceeded)
		s.event("s-1", "pending", "sent", "publish attempt 1")
		s.event("s-2", "pending", "sent", "publish attempt 1") // s-1 still in flight
		s.run("s-1")
		s.run("s-2")
		v := s.verdict()
		require.False(t, v.OK)
		require.Contains(t, v.Detail, "1 overlaps")
		require.Contains(t, v.Detail, "s-2 published (event 4) while s-1 was in flight")
	})

	t.Run("needs_attention is in flight", func(t *testing.T) {
		s := submittedTwo(fsm.CmdNeedsAttention, fsm.CmdSent)
		s.event("s-1", "pending", "sent", "publish attempt 1")
		s.event("s-1", "sent", "needs_attention", "unknown outcome")
		s.event("s-2", "pending", "sent", "publish attempt 1")
		v := s.verdict()
		require.False(t, v.OK, v.Detail)
		require.Contains(t, v.Detail, "1 overlaps")
	})

	t.Run("out of order publish", func(t *testing.T) {
		s := submittedTwo(fsm.CmdSucceeded, fsm.CmdSucceeded)
		s.event("s-2", "pending", "sent", "publish attempt 1") // ahead of s-1
		s.run("s-2")
		s.event("s-1", "pending", "sent", "publish attempt 1")
		s.run("s-1")
		v := s.verdict()
		require.False(t, v.OK)
		require.Contains(t, v.Detail, "s-2 (serial_seq 2) published (event 3) ahead of s-1 (serial_seq 1)")
		require.Contains(t, v.Detail, "2 out of order", "the publish, and the executions in the witness")
		require.Contains(t, v.Detail, "1 overlaps", "s-2 ran before s-1's final receipt")
	})

	t.Run("submits out of serial_seq order", func(t *testing.T) {
		s := cleanSerial(2)
		s.events[0].EntityID, s.events[1].EntityID = "s-2", "s-1"
		v := s.verdict()
		require.False(t, v.OK)
		require.Contains(t, v.Detail, "s-1 (serial_seq 1) submitted after serial_seq 2")
	})

	t.Run("an unpublished command ahead that ended is no obstacle", func(t *testing.T) {
		s := submittedTwo(fsm.CmdCancelled, fsm.CmdSucceeded)
		s.events[1].Reason = "submitted, queued behind s-1"
		s.event("s-1", "pending", "cancelled", "superseded")
		s.event("s-2", "pending", "sent", "publish attempt 1")
		s.run("s-2")
		v := s.verdict()
		require.True(t, v.OK, v.Detail)
		require.Contains(t, v.Detail, "2 serial commands on 1 devices (1 submitted behind another), 1 published")
	})

	t.Run("executed before the previous final receipt", func(t *testing.T) {
		s := cleanSerial(2)
		s.execs[1].At = s.rcpts[0].At.Add(-time.Millisecond)
		v := s.verdict()
		require.False(t, v.OK)
		require.Contains(t, v.Detail, "s-2 executed at 10:00:07.999, before s-1's final receipt at 10:00:08.000")
	})

	t.Run("executions out of serial_seq order", func(t *testing.T) {
		s := cleanSerial(2)
		s.execs[0].At, s.execs[1].At = s.execs[1].At, s.execs[0].At
		v := s.verdict()
		require.False(t, v.OK)
		require.Contains(t, v.Detail, "1 out of order", "s-1 ran after s-2")
	})

	t.Run("no final receipt before: skipped", func(t *testing.T) {
		s := cleanSerial(3)
		s.cmds[0].Status = fsm.CmdTimeout
		s.rcpts = s.rcpts[1:]
		s.execs[1].At = t0 // before anything: not judged, s-1 ended without the device's word
		v := s.verdict()
		require.False(t, v.OK, "the executions' order still holds: %s", v.Detail)
		s.execs[1].At = s.execs[0].At.Add(time.Millisecond)
		v = s.verdict()
		require.True(t, v.OK, v.Detail)
		require.Contains(t, v.Detail, "witness: 2 executions checked, 1 skipped")
	})
}
