package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/wire"
)

func newRollout(id string, n int) NewRollout {
	r := NewRollout{RolloutID: id, Action: "restart", Params: json.RawMessage(`{}`), Selector: json.RawMessage(`"device-*"`),
		Spec: json.RawMessage(`{}`), CreateHash: "h1", MaxPerMinute: 60, MaxInFlight: 2, CreatedBy: "alice",
		Owner: "i1", LeaseTTL: 10 * time.Second}
	for i := 1; i <= n; i++ {
		d := fmt.Sprintf("device-%d", i)
		r.Devices = append(r.Devices, d)
		r.OperationIDs = append(r.OperationIDs, domain.RolloutOperationID(id, d, 1))
	}
	return r
}

// rolloutOp is the operation record a start of device inserts.
func rolloutOp(rollout, device string, n int) NewOperation {
	return NewOperation{OperationID: domain.RolloutOperationID(rollout, device, 1), Action: "restart", Target: device,
		Params: json.RawMessage(`{}`), RequestHash: "h-" + device, TaskID: rollout, Step: "rollout", BusinessVersion: "v1",
		CommandID: fmt.Sprintf("c-%s-%d", device, n), CommandTTL: time.Minute, QoS: 1, Owner: "i1", LeaseTTL: 10 * time.Second}
}

// startEvery is a decide function that starts every candidate with the
// given spacing and moves a scheduled rollout to running.
func startEvery(interval time.Duration) func(RolloutSnapshot) RolloutDecision {
	return func(s RolloutSnapshot) RolloutDecision {
		d := RolloutDecision{Start: true, Interval: interval}
		if s.Rollout.Status == fsm.RolloutScheduled {
			d.To = fsm.RolloutRunning
		}
		return d
	}
}

// pass runs one pass with the next candidate.
func pass(t *testing.T, s *DB, id string, f domain.Fence, decide func(RolloutSnapshot) RolloutDecision) RolloutPassResult {
	t.Helper()
	ctx := context.Background()
	var cand *RolloutCandidate
	if d, ok, err := s.NextRolloutCandidate(ctx, id); err == nil && ok {
		cand = &RolloutCandidate{Device: d, Operation: rolloutOp(id, d.DeviceID, d.Attempts+1)}
	} else {
		require.NoError(t, err)
	}
	res, err := s.RolloutPass(ctx, id, f, 10*time.Second, cand, RolloutChecks{}, decide)
	require.NoError(t, err)
	return res
}

func TestRolloutCreateIsIdempotent(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		r, created, err := b.s.CreateRollout(b.ctx, newRollout("fw-1", 3))
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, fsm.RolloutScheduled, r.Status)
		require.Equal(t, 3, r.DevicesTotal)
		require.Equal(t, 3, r.Counts[fsm.DevPending])
		require.Equal(t, "i1", r.Owner)
		require.Equal(t, int64(1), r.FencingToken)

		again, created, err := b.s.CreateRollout(b.ctx, newRollout("fw-1", 4))
		require.NoError(t, err, "the same create hash: a replay, whatever the devices now")
		require.False(t, created)
		require.Equal(t, 3, again.DevicesTotal)

		other := newRollout("fw-1", 3)
		other.CreateHash = "h2"
		_, _, err = b.s.CreateRollout(b.ctx, other)
		require.ErrorIs(t, err, domain.ErrKeyReused)

		devs, err := b.s.ListRolloutDevices(b.ctx, "fw-1", RolloutDeviceFilter{Status: "pending"}, Page{Limit: 2})
		require.NoError(t, err)
		require.Equal(t, int64(3), devs.Total)
		require.Len(t, devs.Items, 2)
		require.Equal(t, "fw-1:rollout:device-1:v1", devs.Items[0].OperationID)
		require.Equal(t, "device-2", devs.Next)
	})
}

func TestRolloutPersonMoves(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, _, err := b.s.CreateRollout(b.ctx, newRollout("fw-1", 3))
		require.NoError(t, err)
		_, err = b.s.MoveRollout(b.ctx, "fw-1", RolloutResume, "", "bob")
		require.ErrorIs(t, err, domain.ErrIllegalState, "resume of a rollout that is not paused")
		r, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutPause, "", "bob")
		require.NoError(t, err)
		require.Equal(t, fsm.RolloutPaused, r.Status)
		r, err = b.s.MoveRollout(b.ctx, "fw-1", RolloutPause, "", "bob")
		require.NoError(t, err, "a replay")
		require.Equal(t, fsm.RolloutPaused, r.Status)
		r, err = b.s.MoveRollout(b.ctx, "fw-1", RolloutResume, "", "bob")
		require.NoError(t, err)
		require.Equal(t, fsm.RolloutRunning, r.Status)
		r, err = b.s.MoveRollout(b.ctx, "fw-1", RolloutCancel, "", "bob")
		require.NoError(t, err)
		require.Equal(t, fsm.RolloutCancelled, r.Status)
		require.Equal(t, 3, r.Counts[fsm.DevCancelled], "the devices never started are cancelled")
		require.NotNil(t, r.EndedAt)
		_, err = b.s.MoveRollout(b.ctx, "fw-1", RolloutPause, "", "bob")
		require.ErrorIs(t, err, domain.ErrIllegalState)
		var actions []string
		for _, h := range r.History {
			actions = append(actions, h.Action+":"+h.To)
		}
		require.Equal(t, []string{"create:scheduled", "pause:paused", "resume:running", "cancel:cancelled"}, actions)
	})
}

func TestRolloutApproval(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		n := newRollout("fw-1", 2)
		n.ApprovalRequired = true
		r, _, err := b.s.CreateRollout(b.ctx, n)
		require.NoError(t, err)
		require.Equal(t, fsm.RolloutWaitingApproval, r.Status)
		_, _, err = b.s.ApproveRollout(b.ctx, "fw-1", 2, "bob", true)
		require.ErrorIs(t, err, domain.ErrStaleVersion)
		_, _, err = b.s.ApproveRollout(b.ctx, "fw-1", 1, "alice", true)
		require.ErrorIs(t, err, domain.ErrFourEyes, "alice created it")
		r, created, err := b.s.ApproveRollout(b.ctx, "fw-1", 1, "bob", true)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, fsm.RolloutScheduled, r.Status)
		require.Equal(t, "bob", r.Approver)
		_, created, err = b.s.ApproveRollout(b.ctx, "fw-1", 1, "bob", true)
		require.NoError(t, err, "an exact replay")
		require.False(t, created)
		_, _, err = b.s.ApproveRollout(b.ctx, "fw-1", 1, "carol", true)
		require.ErrorIs(t, err, domain.ErrIllegalState)
	})
}

// The scheduler's fence: a pass under a lease that was taken over is
// refused as fenced, and nothing of it is written.
func TestRolloutPassIsFenced(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, _, err := b.s.CreateRollout(b.ctx, newRollout("fw-1", 3))
		require.NoError(t, err)
		_, err = b.s.AcquireRollout(b.ctx, "fw-1", "i2", 10*time.Second, false)
		require.ErrorIs(t, err, ErrRefused, "i1's lease is live")
		old := domain.Fence{Owner: "i1", Token: 1}
		res := pass(t, b.s, "fw-1", old, startEvery(time.Second))
		require.NotNil(t, res.Started)

		b.clk.Advance(11 * time.Second)
		f2, err := b.s.AcquireRollout(b.ctx, "fw-1", "i2", 10*time.Second, false)
		require.NoError(t, err)
		require.Equal(t, domain.Fence{Owner: "i2", Token: 2}, f2)

		d, _, err := b.s.NextRolloutCandidate(b.ctx, "fw-1")
		require.NoError(t, err)
		_, err = b.s.RolloutPass(b.ctx, "fw-1", old, 10*time.Second,
			&RolloutCandidate{Device: d, Operation: rolloutOp("fw-1", d.DeviceID, 1)}, RolloutChecks{}, startEvery(time.Second))
		require.ErrorIs(t, err, ErrFenced)
		r, err := b.s.GetRollout(b.ctx, "fw-1")
		require.NoError(t, err)
		require.Equal(t, int64(1), r.Starts, "the fenced pass started nothing")
		require.Equal(t, 1, r.Counts[fsm.DevStarted])
		_, err = b.s.GetOperation(b.ctx, domain.RolloutOperationID("fw-1", "device-2", 1))
		require.ErrorIs(t, err, domain.ErrNotFound)
		require.GreaterOrEqual(t, b.obs.fenced, 1)

		res = pass(t, b.s, "fw-1", f2, startEvery(time.Second))
		require.NotNil(t, res.Started, "the new holder starts")
		starts, err := b.s.RolloutStarts(b.ctx, "fw-1")
		require.NoError(t, err)
		require.Len(t, starts, 2)
		require.Equal(t, "i2", starts[1].Instance)
		require.Equal(t, int64(2), starts[1].FencingToken)

		// A restarted i2 reclaims its own live lease with a new token.
		f3, err := b.s.AcquireRollout(b.ctx, "fw-1", "i2", 10*time.Second, true)
		require.NoError(t, err)
		require.Equal(t, int64(3), f3.Token)
	})
}

// The rate limit holds from committed start times: a start closer than the
// interval to the last committed one is refused by the database, whoever
// makes it (a second store on the same database takes over in between).
func TestRolloutSpacingFromCommittedStarts(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		dsn := testDSN(t, be)
		clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
		open := func(instance string) *DB {
			s, err := testOpen(context.Background(), Config{Path: dsn, Instance: instance, Now: clk.Now})
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			return s
		}
		s1 := open("i1")
		ctx := context.Background()
		_, _, err := s1.CreateRollout(ctx, newRollout("fw-1", 5))
		require.NoError(t, err)
		f1 := domain.Fence{Owner: "i1", Token: 1}
		always := startEvery(20 * time.Second)
		require.NotNil(t, pass(t, s1, "fw-1", f1, always).Started)
		clk.Advance(time.Second)
		res := pass(t, s1, "fw-1", f1, always)
		require.Nil(t, res.Started)
		require.Equal(t, "spacing", res.StartRefused)

		// i1 dies; i2, another process on the database, takes over once the
		// lease (10 s from i1's last pass) ran out, and is held to the same
		// committed start time.
		s2 := open("i2")
		clk.Advance(11 * time.Second)
		f2, err := s2.AcquireRollout(ctx, "fw-1", "i2", 10*time.Second, false)
		require.NoError(t, err)
		res = pass(t, s2, "fw-1", f2, always)
		require.Nil(t, res.Started, "12 s after the last start: still inside the 20 s interval")
		clk.Advance(8 * time.Second)
		res = pass(t, s2, "fw-1", f2, always)
		require.NotNil(t, res.Started)
		starts, err := s2.RolloutStarts(ctx, "fw-1")
		require.NoError(t, err)
		require.Len(t, starts, 2)
		require.Equal(t, 20*time.Second, starts[1].StartedAt.Sub(starts[0].StartedAt))
	})
}

// Outcomes are settled from the operations; the decide function sees the
// committed in-flight count; an abort cancels the devices not started and
// the command not yet published, while a published one runs to its end.
func TestRolloutSettleAndAbort(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, _, err := b.s.CreateRollout(b.ctx, newRollout("fw-1", 5))
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: 1}
		var seen []int
		decide := func(s RolloutSnapshot) RolloutDecision {
			seen = append(seen, s.InFlight)
			d := startEvery(0)(s)
			d.Start = s.InFlight < 3
			return d
		}
		for i := 0; i < 4; i++ {
			pass(t, b.s, "fw-1", f, decide)
		}
		require.Equal(t, []int{0, 1, 2, 3}, seen, "the fourth pass saw 3 in flight and started nothing")
		ops := func(d string) domain.Operation {
			op, err := b.s.GetOperation(b.ctx, domain.RolloutOperationID("fw-1", d, 1))
			require.NoError(t, err)
			return op
		}
		// device-1 succeeds, device-2 fails; device-3's command is
		// published (sent), not yet answered.
		for _, d := range []struct {
			id string
			st wire.ReceiptStatus
		}{{"device-1", wire.ReceiptSucceeded}, {"device-2", wire.ReceiptFailed}} {
			op := ops(d.id)
			_, err := b.s.ClaimSend(b.ctx, op.CommandID, fsm.CmdPending, 0, 1, domain.Fence{Owner: "i1", Token: 1}, b.clk.Now().Add(time.Second))
			require.NoError(t, err)
			_, err = b.s.ApplyReceipt(b.ctx, d.id, wire.Receipt{CommandID: op.CommandID, OperationID: op.OperationID,
				Status: d.st, Seq: 1, At: b.clk.Now(), Error: "boom"}, nil)
			require.NoError(t, err)
		}
		_, err = b.s.ClaimSend(b.ctx, ops("device-3").CommandID, fsm.CmdPending, 0, 1, domain.Fence{Owner: "i1", Token: 1}, b.clk.Now().Add(time.Second))
		require.NoError(t, err)
		res := pass(t, b.s, "fw-1", f, func(RolloutSnapshot) RolloutDecision { return RolloutDecision{} })
		require.Len(t, res.Snapshot.Settled, 2)
		require.Equal(t, 1, res.Snapshot.Rollout.Counts[fsm.DevSucceeded])
		require.Equal(t, 1, res.Snapshot.Rollout.Counts[fsm.DevFailed])
		require.Equal(t, 1, res.Snapshot.InFlight)
		require.NotNil(t, pass(t, b.s, "fw-1", f, decide).Started, "device-4 starts, its command not published")

		res = pass(t, b.s, "fw-1", f, func(RolloutSnapshot) RolloutDecision {
			return RolloutDecision{To: fsm.RolloutAborted, Reason: "failed 50% of 2 finished"}
		})
		require.True(t, res.Moved)
		require.Equal(t, []string{domain.RolloutOperationID("fw-1", "device-4", 1)}, res.Cancelled)
		r, err := b.s.GetRollout(b.ctx, "fw-1")
		require.NoError(t, err)
		require.Equal(t, fsm.RolloutAborted, r.Status)
		require.Equal(t, 2, r.Counts[fsm.DevCancelled], "device-4 (unpublished) and device-5 (never started)")
		require.Equal(t, 1, r.Counts[fsm.DevStarted], "device-3 was published: it runs to its end")
		require.Equal(t, fsm.OpFailedFinal, ops("device-4").Status)
		require.Equal(t, fsm.OpStarted, ops("device-3").Status)

		// Nothing starts once aborted, whatever decide says.
		require.Nil(t, pass(t, b.s, "fw-1", f, decide).Started)
		active, err := b.s.ActiveRollouts(b.ctx)
		require.NoError(t, err)
		require.Len(t, active, 1, "ended, but device-3 is still to be settled")
	})
}

// A device whose operation ended failed_retryable waits for its retry, and
// its next start is that operation's own retry (the same operation_id).
func TestRolloutRetryIsTheOperationsRetry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		n := newRollout("fw-1", 1)
		n.Retries = 1
		_, _, err := b.s.CreateRollout(b.ctx, n)
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: 1}
		require.NotNil(t, pass(t, b.s, "fw-1", f, startEvery(0)).Started)
		opID := domain.RolloutOperationID("fw-1", "device-1", 1)
		op, err := b.s.GetOperation(b.ctx, opID)
		require.NoError(t, err)
		_, err = b.s.Move(b.ctx, op.CommandID, fsm.CmdPending, 1, fsm.CmdTimeout, fsm.ReasonTimeout, domain.Fence{Owner: "i1", Token: 1}, b.clk.Now())
		require.NoError(t, err)
		res := pass(t, b.s, "fw-1", f, func(RolloutSnapshot) RolloutDecision { return RolloutDecision{} })
		require.Equal(t, 1, res.Snapshot.Rollout.Counts[fsm.DevRetry])
		res = pass(t, b.s, "fw-1", f, startEvery(0))
		require.NotNil(t, res.Started)
		require.True(t, res.Started.Retried)
		require.Equal(t, opID, res.Started.Operation.OperationID)
		op, err = b.s.GetOperation(b.ctx, opID)
		require.NoError(t, err)
		require.Equal(t, fsm.OpStarted, op.Status)
		// The retry asks about the last command and hears nothing in time.
		rt, err := b.s.RetryingOf(b.ctx, op.CommandID, "i1")
		require.NoError(t, err)
		require.NoError(t, b.s.AbandonRetry(b.ctx, rt, domain.Fence{Owner: "i1", Token: 2}, "retry: no answer"))
		res = pass(t, b.s, "fw-1", f, func(RolloutSnapshot) RolloutDecision { return RolloutDecision{} })
		require.Equal(t, 1, res.Snapshot.Rollout.Counts[fsm.DevTimeout], "retries used up")
		starts, err := b.s.RolloutStarts(b.ctx, "fw-1")
		require.NoError(t, err)
		require.Len(t, starts, 2)
		require.Equal(t, 2, starts[1].Attempt)
	})
}

// The re-checks before each start: a grant revoked after creation aborts
// the rollout at the next start, and nothing of that start is written.
func TestRolloutStartRechecksGrant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		g, _, err := b.s.CreateGrant(b.ctx, "g-1", "alice", "restart", "device-*", "admin")
		require.NoError(t, err)
		_, _, err = b.s.CreateRollout(b.ctx, newRollout("fw-1", 2))
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: 1}
		run := func() RolloutPassResult {
			d, _, err := b.s.NextRolloutCandidate(b.ctx, "fw-1")
			require.NoError(t, err)
			res, err := b.s.RolloutPass(b.ctx, "fw-1", f, 10*time.Second,
				&RolloutCandidate{Device: d, Operation: rolloutOp("fw-1", d.DeviceID, 1)},
				RolloutChecks{EnforceGrants: true}, startEvery(0))
			require.NoError(t, err)
			return res
		}
		require.NotNil(t, run().Started)
		_, err = b.s.RevokeGrant(b.ctx, g.GrantID, "admin")
		require.NoError(t, err)
		res := run()
		require.Nil(t, res.Started)
		require.Equal(t, "permission_revoked", res.StartRefused)
		r, err := b.s.GetRollout(b.ctx, "fw-1")
		require.NoError(t, err)
		require.Equal(t, fsm.RolloutAborted, r.Status)
		require.Contains(t, r.Reason, "permission_revoked: device-2")
		require.Equal(t, int64(1), r.Starts)
	})
}

// A device follows its operation to the operation's final state: its
// command times out (the device is settled timeout, a provisional outcome
// while the operation is failed_retryable), then a late final receipt
// decides the operation succeeded and the next pass makes the device
// succeeded; an ended rollout with such a device is listed to be driven
// again.
func TestRolloutFollowsLateFinalReceipt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, _, err := b.s.CreateRollout(b.ctx, newRollout("fw-1", 2))
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: 1}
		nothing := func(RolloutSnapshot) RolloutDecision { return RolloutDecision{} }
		for i := 0; i < 2; i++ {
			require.NotNil(t, pass(t, b.s, "fw-1", f, startEvery(0)).Started)
		}
		late := map[string]bool{"device-1": true}
		for _, dev := range []string{"device-1", "device-2"} {
			op, err := b.s.GetOperation(b.ctx, domain.RolloutOperationID("fw-1", dev, 1))
			require.NoError(t, err)
			_, err = b.s.ClaimSend(b.ctx, op.CommandID, fsm.CmdPending, 0, 1, f, b.clk.Now().Add(time.Second))
			require.NoError(t, err)
			c, err := b.s.GetCommand(b.ctx, op.CommandID)
			require.NoError(t, err)
			_, err = b.s.Move(b.ctx, op.CommandID, fsm.CmdSent, c.Version, fsm.CmdTimeout, fsm.ReasonTimeout, f, b.clk.Now())
			require.NoError(t, err)
		}
		res := pass(t, b.s, "fw-1", f, nothing)
		require.Equal(t, 2, res.Snapshot.Rollout.Counts[fsm.DevTimeout])
		require.Equal(t, 2, res.Snapshot.Provisional, "both operations are failed_retryable")
		require.Equal(t, b.clk.Now(), res.Snapshot.ProvisionalSince)

		b.clk.Advance(time.Second)
		for dev := range late {
			op, err := b.s.GetOperation(b.ctx, domain.RolloutOperationID("fw-1", dev, 1))
			require.NoError(t, err)
			_, err = b.s.ApplyReceipt(b.ctx, dev, wire.Receipt{CommandID: op.CommandID, OperationID: op.OperationID,
				Status: wire.ReceiptSucceeded, Seq: 3, At: b.clk.Now()}, nil)
			require.NoError(t, err)
			op, err = b.s.GetOperation(b.ctx, op.OperationID)
			require.NoError(t, err)
			require.Equal(t, fsm.OpSucceeded, op.Status, "the late final receipt decides the operation")
		}
		res = pass(t, b.s, "fw-1", f, nothing)
		require.Len(t, res.Snapshot.Settled, 1)
		require.Equal(t, fsm.DevSucceeded, res.Snapshot.Settled[0].Status)
		require.Equal(t, "late final receipt, was timeout", res.Snapshot.Settled[0].Reason)
		require.Equal(t, 1, res.Snapshot.Rollout.Counts[fsm.DevSucceeded])
		require.Equal(t, 1, res.Snapshot.Rollout.Counts[fsm.DevTimeout])
		require.Equal(t, 1, res.Snapshot.Provisional)

		// Ended, then device-2's late success: listed again, and followed.
		res = pass(t, b.s, "fw-1", f, func(RolloutSnapshot) RolloutDecision {
			return RolloutDecision{To: fsm.RolloutCompletedWithFailures, Reason: "succeeded 1, timeout 1"}
		})
		require.True(t, res.Moved)
		active, err := b.s.ActiveRollouts(b.ctx)
		require.NoError(t, err)
		require.Empty(t, active, "ended, nothing in flight, nothing decided late")
		op, err := b.s.GetOperation(b.ctx, domain.RolloutOperationID("fw-1", "device-2", 1))
		require.NoError(t, err)
		_, err = b.s.ApplyReceipt(b.ctx, "device-2", wire.Receipt{CommandID: op.CommandID, OperationID: op.OperationID,
			Status: wire.ReceiptSucceeded, Seq: 3, At: b.clk.Now()}, nil)
		require.NoError(t, err)
		active, err = b.s.ActiveRollouts(b.ctx)
		require.NoError(t, err)
		require.Len(t, active, 1, "ended, with a device decided late")
		res = pass(t, b.s, "fw-1", f, nothing)
		require.Equal(t, 2, res.Snapshot.Rollout.Counts[fsm.DevSucceeded])
		require.Equal(t, fsm.RolloutCompletedWithFailures, res.Snapshot.Rollout.Status, "a terminal status is not rewritten")
		active, err = b.s.ActiveRollouts(b.ctx)
		require.NoError(t, err)
		require.Empty(t, active)
	})
}

// The scheduler's look, twice a second, reads the devices that may still
// move and their operations by key: never a range of operations by status,
// which holds the whole history (SQLite's plan; PostgreSQL's planner
// chooses from its statistics).
func TestActiveRolloutsReadNoOperationsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite")
	p := queryPlan(t, b, b.s.q.RolloutListActive)
	require.NotContains(t, p, "SCAN", p)
	require.NotContains(t, p, "operations_status_started", p)
	require.Contains(t, p, "SEARCH o USING INDEX sqlite_autoindex_operations_1 (operation_id=?)", p)
	require.Equal(t, 2, strings.Count(p, "USING COVERING INDEX rollout_devices_by_status (status=?)")+
		strings.Count(p, "USING INDEX rollout_devices_by_status (status=?)"), p)
}
