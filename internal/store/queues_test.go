package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

func serialOp(id, cmd string) NewOperation {
	n := newOp(id, cmd)
	n.Serial = true
	return n
}

// queuesSince are the devices the feed was told their serial queue moved
// (FactQueue), after the first skip facts.
func (c *changeLog) queuesSince(skip int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []string{}
	for _, f := range c.facts[skip:] {
		if f.Kind == FactQueue {
			out = append(out, f.ID)
		}
	}
	return out
}

func (c *changeLog) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.facts)
}

// TestSerialCommandsQueueInSubmitOrder: serial commands of one device take
// their places in submit order; only the head may be published, whatever
// the caller claims; a parallel command goes by; a serial command's end
// tells the feed its device's queue moved, and the head read after it is
// the next one; a cancel in the middle closes the gap.
func TestSerialCommandsQueueInSubmitOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		log := &changeLog{}
		b := setupFeed(t, be, log)
		s := b.s

		var inserted []OpenCommand
		fallback := b.clk.Now().Add(40 * time.Second)
		for i := 1; i <= 4; i++ {
			n := serialOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i))
			n.QueuedCheck = fallback
			res, err := s.Submit(b.ctx, n, nil)
			require.NoError(t, err)
			inserted = append(inserted, res.Inserted)
		}
		_, err := s.Submit(b.ctx, newOp("op-p", "c-p"), nil)
		require.NoError(t, err)

		require.Equal(t, "", inserted[0].QueuedBehind)
		require.Equal(t, "", inserted[0].Reason)
		// The feed: the head's copy as inserted goes to the dispatcher; a
		// queued one has nothing to decide (its fallback check is set at
		// insert) and its device's queue is read after its commit instead.
		copies := map[string]bool{}
		log.mu.Lock()
		for _, f := range log.facts {
			if f.Kind == FactDue {
				copies[f.ID] = f.Inserted != nil
			}
		}
		log.mu.Unlock()
		require.Equal(t, map[string]bool{"c-1": true, "c-p": true}, copies)
		require.Equal(t, []string{"device-1", "device-1", "device-1"}, log.queuesSince(0), "one per queued submit")
		for i := 1; i < 4; i++ {
			require.Equal(t, fallback.UnixMilli(), inserted[i].NextCheckAt.UnixMilli(), "queued: its fallback check")
		}
		require.Equal(t, b.clk.Now().UnixMilli(), inserted[0].NextCheckAt.UnixMilli(), "the head: due now")
		for i := 1; i < 4; i++ {
			require.Equal(t, fmt.Sprintf("c-%d", i), inserted[i].QueuedBehind)
			require.Equal(t, ReasonQueued, inserted[i].Reason)
			require.Equal(t, inserted[i-1].SerialSeq+1, inserted[i].SerialSeq)
			read, err := s.OpenCommand(b.ctx, inserted[i].CommandID)
			require.NoError(t, err)
			require.Equal(t, inserted[i].Command, read.Command, "the copy as inserted is what a read finds")
		}

		_, err = s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		var re *RefusedError
		require.ErrorAs(t, err, &re, "not the head: never published")
		require.Equal(t, ReasonQueued, re.Reason)
		d, err := s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		require.Equal(t, fsm.CmdSent, d.Command.Status)
		_, err = s.ClaimSend(b.ctx, "c-p", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err, "a parallel command is not queued")
		_, err = s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.ErrorIs(t, err, ErrRefused, "c-1 is in flight")

		q, err := s.DeviceQueue(b.ctx, "device-1")
		require.NoError(t, err)
		require.Equal(t, []string{"c-1", "c-p"}, q.InFlight)
		require.Equal(t, []string{"c-2", "c-3", "c-4"}, q.Queued)

		// c-3 cancelled in the middle: c-4 is now behind c-2; the head
		// read after it is still c-1, published.
		mark := log.len()
		_, err = s.Cancel(b.ctx, "c-3", "bob")
		require.NoError(t, err)
		require.Equal(t, []string{"device-1"}, log.queuesSince(mark))
		head, unpublished, ok, err := s.QueueHead(b.ctx, "device-1")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "c-1", head)
		require.False(t, unpublished)
		c4, err := s.OpenCommand(b.ctx, "c-4")
		require.NoError(t, err)
		require.Equal(t, "c-2", c4.QueuedBehind)
		behind, err := s.QueuedBehind(b.ctx, c4.Command)
		require.NoError(t, err)
		require.Equal(t, "c-2", behind)

		// needs_attention holds the device (nothing moves); a person's
		// resolve frees it, and the head is the next one, unpublished.
		mark = log.len()
		_, err = s.Move(b.ctx, "c-1", fsm.CmdSent, d.Command.Version, fsm.CmdNeedsAttention, "unproven", fence, b.clk.Now().Add(time.Minute))
		require.NoError(t, err)
		require.Empty(t, log.queuesSince(mark))
		_, err = s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.ErrorIs(t, err, ErrRefused, "needs_attention is in flight")
		mark = log.len()
		_, err = s.Resolve(b.ctx, "c-1", fsm.CmdSucceeded, "checked on site", "alice")
		require.NoError(t, err)
		require.Equal(t, []string{"device-1"}, log.queuesSince(mark))
		head, unpublished, ok, err = s.QueueHead(b.ctx, "device-1")
		require.NoError(t, err)
		require.True(t, ok && unpublished)
		require.Equal(t, "c-2", head)
		c2, err := s.OpenCommand(b.ctx, "c-2")
		require.NoError(t, err)
		require.Equal(t, "", c2.QueuedBehind)
		d, err = s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		require.Equal(t, "", d.Command.Reason, "no longer queued once published")

		// A queued command past its expiry times out unpublished.
		c4, err = s.OpenCommand(b.ctx, "c-4")
		require.NoError(t, err)
		_, err = s.Move(b.ctx, "c-4", fsm.CmdPending, c4.Version, fsm.CmdTimeout, fsm.ReasonTimeout, fence, b.clk.Now())
		require.NoError(t, err)
		q, err = s.DeviceQueue(b.ctx, "device-1")
		require.NoError(t, err)
		require.Equal(t, []string{"c-2", "c-p"}, q.InFlight)
		require.Empty(t, q.Queued)
	})
}

// TestRetryGoesToTheBackOfTheQueue: a retry's new command_id is a new
// submit of an old intent: it queues behind what was submitted since.
func TestRetryGoesToTheBackOfTheQueue(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, serialOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		d, err := b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		_, err = b.s.Submit(b.ctx, serialOp("op-2", "c-2"), nil)
		require.NoError(t, err)
		_, err = b.s.Move(b.ctx, "c-1", fsm.CmdSent, d.Command.Version, fsm.CmdTimeout, fsm.ReasonTimeout, fence, b.clk.Now())
		require.NoError(t, err)
		res, err := b.s.Submit(b.ctx, serialOp("op-1", "c-x"), nil)
		require.NoError(t, err)
		require.True(t, res.Retried)
		r, err := b.s.RetryingOf(b.ctx, "c-1", "i1")
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: r.Operation.FencingToken}
		require.NoError(t, b.s.MintCommand(b.ctx, r, f, "c-1b", time.Minute, 1, true))
		c, err := b.s.OpenCommand(b.ctx, "c-1b")
		require.NoError(t, err)
		require.Equal(t, "c-2", c.QueuedBehind)
		require.Equal(t, ReasonQueued, c.Reason)
	})
}

// TestSupersedeLeavesTheLatestIntent: with the device offline, five
// intents of one action leave one; each older one is cancelled unpublished
// and names the next; a replay of a superseded POST returns its record;
// a published command is never superseded.
func TestSupersedeLeavesTheLatestIntent(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sup := func(i int) NewOperation {
			n := serialOp(fmt.Sprintf("set-%d", i), fmt.Sprintf("c-%d", i))
			n.Action, n.Supersede = "set-config", true
			return n
		}
		other := newOp("op-r", "c-r") // another action: untouched
		_, err := b.s.Submit(b.ctx, other, nil)
		require.NoError(t, err)
		for i := 1; i <= 5; i++ {
			_, err := b.s.Submit(b.ctx, sup(i), nil)
			require.NoError(t, err)
		}
		for i := 1; i <= 4; i++ {
			op, err := b.s.GetOperation(b.ctx, fmt.Sprintf("set-%d", i))
			require.NoError(t, err)
			require.Equal(t, fsm.OpFailedFinal, op.Status)
			require.Equal(t, SupersededBy(fmt.Sprintf("set-%d", i+1)), op.Reason)
			c, err := b.s.GetCommand(b.ctx, fmt.Sprintf("c-%d", i))
			require.NoError(t, err)
			require.Equal(t, fsm.CmdCancelled, c.Status)
			require.Equal(t, ReasonSuperseded, c.Reason)
			require.Equal(t, 0, c.Attempt)
		}
		c5, err := b.s.OpenCommand(b.ctx, "c-5")
		require.NoError(t, err)
		require.Equal(t, "", c5.QueuedBehind, "the superseded left the queue")
		r, err := b.s.GetOperation(b.ctx, "op-r")
		require.NoError(t, err)
		require.Equal(t, fsm.OpStarted, r.Status)

		again, err := b.s.Submit(b.ctx, sup(2), nil)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.False(t, again.Retried)
		require.Equal(t, fsm.OpFailedFinal, again.Operation.Status, "a replay is answered, not resurrected")
		op5, err := b.s.GetOperation(b.ctx, "set-5")
		require.NoError(t, err)
		require.Equal(t, fsm.OpStarted, op5.Status, "the replay superseded nothing")

		_, err = b.s.ClaimSend(b.ctx, "c-5", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		_, err = b.s.Submit(b.ctx, sup(6), nil)
		require.NoError(t, err)
		c, err := b.s.GetCommand(b.ctx, "c-5")
		require.NoError(t, err)
		require.Equal(t, fsm.CmdSent, c.Status, "a published one runs to its end")
		c6, err := b.s.OpenCommand(b.ctx, "c-6")
		require.NoError(t, err)
		require.Equal(t, "c-5", c6.QueuedBehind)
	})
}

// A supersede submit finds the intents it replaces among its device's open
// commands, each joined to its operation by key: never a range of the
// operations of an action, which holds the whole history (SQLite's plan;
// PostgreSQL's planner chooses from its statistics).
func TestSupersedeReadsNoOperationsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite")
	p := queryPlan(t, b, b.s.q.QueueSupersedable, "device-1", "set-config", "op-1")
	require.Contains(t, p, "SEARCH c USING INDEX commands_device_open (device_id=?)", p)
	require.Contains(t, p, "SEARCH o USING INDEX sqlite_autoindex_operations_1 (operation_id=?)", p)
	require.NotContains(t, p, "SCAN", p)
	require.NotContains(t, p, "_started", p)
}
