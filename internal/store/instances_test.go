package store

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// peers opens n stores on one database, as n instances on different hosts
// would (each its own writer and its own clock reading).
func peers(t *testing.T, be string, n int, clk *clock.Fake) []*DB {
	t.Helper()
	dsn := testDSN(t, be)
	out := make([]*DB, n)
	for i := range out {
		s, err := testOpen(context.Background(), Config{Path: dsn, Instance: fmt.Sprintf("i%d", i+1), Now: clk.Now})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		out[i] = s
	}
	return out
}

// Two instances that decide at once about the same command (a stale holder
// and its taker-over, or a lost race): exactly one conditional write wins,
// on either backend, and each operation whose lease ran out is taken by one
// instance only.
func TestInstancesRaceOnOneDatabase(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
		ss := peers(t, be, 3, clk)
		ctx := context.Background()
		const ops = 60
		for i := 0; i < ops; i++ {
			n := newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i))
			n.Owner = "gone" // a dead instance's operations
			_, err := ss[i%3].Submit(ctx, n, nil)
			require.NoError(t, err)
		}
		clk.Advance(11 * time.Second) // every lease ran out

		var mu sync.Mutex
		taken := map[string][]string{}
		var wg sync.WaitGroup
		for _, s := range ss {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					ids, err := s.TakeOver(ctx, s.instance, 10*time.Second, 7)
					require.NoError(t, err)
					if len(ids) == 0 {
						return
					}
					mu.Lock()
					for _, id := range ids {
						taken[id] = append(taken[id], s.instance)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Len(t, taken, ops, "every expired lease is taken")
		for id, by := range taken {
			require.Len(t, by, 1, "%s taken by %v", id, by)
		}

		// Every instance tries to publish every command under its own fence:
		// one publish decision per command, by its holder.
		wins := map[string]int{}
		for i := 0; i < ops; i++ {
			id := fmt.Sprintf("c-%d", i)
			holder := taken[fmt.Sprintf("op-%d", i)][0]
			var wg sync.WaitGroup
			for _, s := range ss {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := s.ClaimSend(ctx, id, fsm.CmdPending, 0, 1, domain.Fence{Owner: s.instance, Token: 2}, clk.Now())
					if err == nil {
						mu.Lock()
						wins[id]++
						mu.Unlock()
						require.Equal(t, holder, s.instance)
						return
					}
					require.ErrorIs(t, err, ErrRefused)
				}()
			}
			wg.Wait()
		}
		for i := 0; i < ops; i++ {
			require.Equal(t, 1, wins[fmt.Sprintf("c-%d", i)])
		}
	})
}

// The instance lock: a second process with the same id is refused while
// the first holds it, and starts at once after the first lets go.
func TestInstanceLockIsExclusive(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		clk := clock.NewFake(time.Now())
		ss := peers(t, be, 2, clk)
		ctx := context.Background()
		first, err := ss[0].LockInstance(ctx, "ctl-a")
		require.NoError(t, err)
		_, err = ss[1].LockInstance(ctx, "ctl-a")
		require.ErrorIs(t, err, ErrInstanceRunning)
		other, err := ss[1].LockInstance(ctx, "ctl-b")
		require.NoError(t, err, "another id is free")
		other.Close()
		first.Close()
		again, err := ss[1].LockInstance(ctx, "ctl-a")
		require.NoError(t, err)
		again.Close()
	})
}

// Wake-ups through LISTEN/NOTIFY: a final receipt applied by one instance
// wakes the ?wait= callers of another; a receipt that makes a command due
// wakes every instance but the one that applied it (the holder decides).
// A wake-up is sent only when its change commits.
func TestWakeUpsReachTheOtherInstances(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	ss := peers(t, "postgres", 2, clk)
	ctx := context.Background()
	heard := &remoteLog{got: make(chan Fact, 16)}
	ss[0].feed = heard // what the holder hears from the other instance
	applierHeard := &remoteLog{got: make(chan Fact, 16)}
	ss[1].feed = applierHeard
	holder, err := ss[0].LockInstance(ctx, "i1")
	require.NoError(t, err)
	defer holder.Close()
	applier, err := ss[1].LockInstance(ctx, "i2")
	require.NoError(t, err)
	defer applier.Close()

	_, err = ss[0].Submit(ctx, newOp("op-1", "c-1"), nil)
	require.NoError(t, err)
	_, err = ss[0].ClaimSend(ctx, "c-1", fsm.CmdPending, 0, 1, fence, clk.Now().Add(time.Second))
	require.NoError(t, err)

	// A receipt refused before its commit wakes nobody.
	_, err = ss[1].ApplyReceipt(ctx, "device-1", wire.Receipt{CommandID: "c-1", OperationID: "op-1",
		Status: wire.ReceiptSucceeded, Seq: 3}, func() error { return sql.ErrConnDone })
	require.Error(t, err)
	out, err := ss[1].ApplyReceipt(ctx, "device-1", wire.Receipt{CommandID: "c-1", OperationID: "op-1",
		Status: wire.ReceiptSucceeded, Seq: 3}, nil)
	require.NoError(t, err)
	require.Equal(t, EffectApplied, out.Effect)

	select {
	case f := <-heard.got:
		require.Equal(t, Fact{Kind: FactChanged, ID: "op-1", Change: Change{Machine: "operation", ID: "op-1"}, Remote: true}, f,
			"the first wake-up is the committed one")
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up reached the other instance within 10s")
	}
	select {
	case f := <-applierHeard.got:
		t.Fatalf("an instance heard its own wake-up: %+v", f)
	default:
	}

	// Presence that makes the device's open commands due wakes their holder.
	_, err = ss[0].Submit(ctx, newOp("op-2", "c-2"), nil)
	require.NoError(t, err)
	ids, err := ss[1].Wake(ctx, "device-1")
	require.NoError(t, err)
	require.Equal(t, []string{"c-2"}, ids)
	select {
	case f := <-heard.got:
		require.Equal(t, Fact{Kind: FactDue, ID: "c-2", Remote: true}, f)
	case <-time.After(10 * time.Second):
		t.Fatal("no command wake-up within 10s")
	}
}

// remoteLog is a Feed that passes on the facts other instances' wake-ups
// bring (an instance's own commits publish local ones too).
type remoteLog struct{ got chan Fact }

func (r *remoteLog) Publish(f Fact) {
	if f.Remote {
		r.got <- f
	}
}

// PostgreSQL drops the writer's connection in the middle of the run (as a
// server restart or a failover does): the batch that was on it fails as a
// whole (a BatchError, nothing of it written), and the next change
// connects again and commits.
func TestLostConnectionFailsTheBatchAndTheNextOneReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t, "postgres")
	_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
	require.NoError(t, err)
	var pid int
	require.NoError(t, b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
		return t.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	}))

	err = b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
		// From a connection of the read pool: the writer's is busy here.
		if _, err := b.s.r.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return err
		}
		_, err := t.ExecContext(ctx, `UPDATE operations SET reason = 'x' WHERE operation_id = ?`, "op-1")
		return err
	})
	var be *BatchError
	require.ErrorAs(t, err, &be, "a dead connection fails the whole batch")

	_, err = b.s.Submit(b.ctx, newOp("op-2", "c-2"), nil)
	require.NoError(t, err, "the next batch reconnects")
	op, err := b.s.GetOperation(b.ctx, "op-1")
	require.NoError(t, err)
	require.Empty(t, op.Reason, "nothing of the failed batch was written")
}

// GET /v1/instances reads this: each instance's heartbeat and its leases.
func TestListInstances(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
		ss := peers(t, be, 2, clk)
		ctx := context.Background()
		_, err := ss[0].Submit(ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		_, err = ss[0].ReclaimOwn(ctx, "i1", 10*time.Second)
		require.NoError(t, err)
		_, err = ss[1].ReclaimOwn(ctx, "i2", 2*time.Second)
		require.NoError(t, err)
		clk.Advance(3 * time.Second) // i2 stops beating; i1 beats
		_, _, err = ss[0].RenewLeases(ctx, "i1", 10*time.Second)
		require.NoError(t, err)
		got, err := ss[1].ListInstances(ctx)
		require.NoError(t, err)
		require.Len(t, got, 2)
		require.Equal(t, "i1", got[0].InstanceID)
		require.True(t, got[0].Live)
		require.Equal(t, 1, got[0].Leases)
		require.Equal(t, clk.Now(), got[0].HeartbeatAt)
		require.Equal(t, "i2", got[1].InstanceID)
		require.False(t, got[1].Live, "its last heartbeat is older than its ttl")
		require.Equal(t, 0, got[1].Leases)
	})
}

// Receipts of one command applied at once by two instances (a shared
// subscription hands received to one and executing to the other): both
// facts count, whichever commits first. A change reads the rows it writes
// under a lock, so the later one sees the earlier's commit instead of
// being refused as stale.
func TestReceiptsOfOneCommandAppliedByTwoInstances(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		clk := clock.NewFake(time.Now())
		ss := peers(t, be, 2, clk)
		ctx := context.Background()
		const n = 40
		for i := 0; i < n; i++ {
			op, cmd := fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)
			_, err := ss[0].Submit(ctx, newOp(op, cmd), nil)
			require.NoError(t, err)
			_, err = ss[0].ClaimSend(ctx, cmd, fsm.CmdPending, 0, 1, fence, clk.Now().Add(time.Minute))
			require.NoError(t, err)
			var wg sync.WaitGroup
			for k, st := range []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := ss[k].ApplyReceipt(ctx, "device-1", wire.Receipt{CommandID: cmd, OperationID: op, Status: st, Seq: k + 1}, nil)
					require.NoError(t, err)
				}()
			}
			wg.Wait()
			c, err := ss[1].GetCommand(ctx, cmd)
			require.NoError(t, err)
			require.Equal(t, fsm.CmdExecuting, c.Status, "%s: the executing receipt was applied", cmd)
		}
	})
}

// A decision holds its fence until it commits: while an instance's fenced
// write about a command is open, a peer whose clock says the lease ran out
// does not take the operation over (its sweep passes over the held row and
// takes it at the next round), and a peer's receipt of the same command
// waits for the commit rather than deadlocking with it. Once the decision
// commits, the takeover goes through, the old holder's next decision is
// fenced, and the events log shows the decision before the takeover (what
// invariant 6 reads). Without the lock the takeover committed first and the
// decision after it, under the old token: the order the three-instance kill
// test caught. PostgreSQL only: SQLite's writers take turns on the whole
// file.
func TestADecisionHoldsItsFenceUntilItCommits(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t, "postgres")
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	open := func(id string, clk *clock.Fake) *DB {
		s, err := testOpen(context.Background(), Config{Path: dsn, Instance: id, Now: clk.Now})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	clk1, clk2 := clock.NewFake(start), clock.NewFake(start.Add(11*time.Second)) // i2: the 10 s lease ran out
	i1, i2 := open("i1", clk1), open("i2", clk2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := i1.Submit(ctx, newOp("op-1", "c-1"), nil)
	require.NoError(t, err)
	c, err := i1.ClaimSend(ctx, "c-1", fsm.CmdPending, 0, 1, fence, start.Add(time.Second))
	require.NoError(t, err)

	inside, release, decided := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // a failed check must not leave the writer waiting
	go func() {
		decided <- i1.write(ctx, func(ctx context.Context, t *tx) error {
			// A fenced decision's statement (the backend's, with its locks).
			r, err := t.Exec(t.s.q.CommandPostpone,
				append([]any{ms(start.Add(2 * time.Second)), "c-1", c.Command.Version}, fenceArgs(fence, t.now)...)...)
			if err != nil {
				return err
			}
			if n, _ := r.RowsAffected(); n != 1 {
				return fmt.Errorf("the decision was refused (%d rows)", n)
			}
			if err := t.event("command", "c-1", "sent", "sent", "the held decision", fence.Token); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-decided:
		t.Fatalf("the decision ended before it was held: %v", err)
	}

	// The sweep returns at once having taken nothing. Without the lock it
	// takes the operation, then waits for the command's row (its questions
	// are forgotten next): the owner read back says so.
	type sweep struct {
		ids []string
		err error
	}
	swept := make(chan sweep, 1)
	go func() {
		ids, err := i2.TakeOver(ctx, "i2", 10*time.Second, 100)
		swept <- sweep{ids, err}
	}()
	for done := false; !done; {
		select {
		case r := <-swept:
			require.NoError(t, r.err)
			require.Empty(t, r.ids, "no takeover while a decision under the current token is open")
			done = true
		case <-time.After(10 * time.Millisecond):
			op, err := i2.GetOperation(ctx, "op-1")
			require.NoError(t, err)
			if op.Owner != "i1" {
				letGo()
				<-swept
				t.Fatalf("taken over by %s (token %d) while i1's decision under token %d was open", op.Owner, op.FencingToken, fence.Token)
			}
		case <-ctx.Done():
			t.Fatal("the sweep neither returned nor took the operation")
		}
	}
	receipt := make(chan error, 1)
	go func() {
		_, err := i2.ApplyReceipt(ctx, "device-1", wire.Receipt{CommandID: "c-1", OperationID: "op-1", Status: wire.ReceiptReceived, Seq: 1}, nil)
		receipt <- err
	}()
	letGo()
	require.NoError(t, <-decided)
	require.NoError(t, <-receipt, "the receipt waited for the decision's commit, no deadlock")

	taken, err := i2.TakeOver(ctx, "i2", 10*time.Second, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"op-1"}, taken, "taken over once the decision committed")
	_, err = i1.ClaimQuery(ctx, "c-1", "q-1", fsm.CmdReceived, 0, true, fence, start.Add(3*time.Second))
	require.ErrorIs(t, err, ErrFenced, "the old holder's next decision")

	var order []string
	evs, err := i2.AllEvents(ctx)
	require.NoError(t, err)
	for _, e := range evs {
		if e.Reason == "the held decision" || (e.Machine == "lease" && e.EntityID == "op-1") {
			order = append(order, fmt.Sprintf("%s token %d", e.Machine, e.FencingToken))
		}
	}
	require.Equal(t, []string{"command token 1", "lease token 2"}, order, "the events log: the decision, then the takeover")
}

// Two instances whose batches each apply receipts of the same two commands,
// in opposite orders: each batch locks the commands its changes named, in
// one order, before any change runs (preLock), so the second waits for the
// first instead of both losing a second to a deadlock. PostgreSQL only.
func TestBatchesLockTheirCommandsInOneOrder(t *testing.T) {
	t.Parallel()
	c := newCrossing(t)
	for _, n := range []string{"1", "2"} {
		_, err := c.ss[0].Submit(c.ctx, newOp("op-"+n, "c-"+n), nil)
		require.NoError(t, err)
		_, err = c.ss[0].ClaimSend(c.ctx, "c-"+n, fsm.CmdPending, 0, 1, fence, c.clk.Now().Add(time.Minute))
		require.NoError(t, err)
	}
	apply := func(cmd, op string, st wire.ReceiptStatus, seq int) func(*tx) error {
		return func(t *tx) error {
			_, err := t.receipt(c.ctx, "device-1", wire.Receipt{CommandID: cmd, OperationID: op, Status: st, Seq: seq}, false, nil)
			return err
		}
	}
	c.cross(lockCommands("c-1", "c-2"), apply("c-1", "op-1", wire.ReceiptReceived, 1), apply("c-2", "op-2", wire.ReceiptReceived, 1),
		lockCommands("c-2", "c-1"), apply("c-2", "op-2", wire.ReceiptExecuting, 2), apply("c-1", "op-1", wire.ReceiptExecuting, 2))
	for _, id := range []string{"c-1", "c-2"} {
		got, err := c.ss[0].GetCommand(c.ctx, id)
		require.NoError(t, err)
		require.Equal(t, fsm.CmdExecuting, got.Status, id)
	}
}

// The same for devices seen for the first time: every instance applies
// every presence message, and each inserts the device's row; two batches
// inserting the same new devices in opposite orders deadlocked (the bench's
// three instances: 30 presence messages not recorded, 8 s until every
// device showed online). The batch inserts and locks them in one order
// first. PostgreSQL only.
func TestBatchesInsertNewDevicesInOneOrder(t *testing.T) {
	t.Parallel()
	c := newCrossing(t)
	birth := func(device string) func(*tx) error {
		return func(t *tx) error {
			_, err := t.presence(c.ctx, device, wire.Presence{Online: true, Session: 1})
			return err
		}
	}
	both := rowLocks{deviceRows: []string{"device-a", "device-b"}}
	c.cross(both, birth("device-a"), birth("device-b"), both, birth("device-b"), birth("device-a"))
	for _, id := range []string{"device-a", "device-b"} {
		d, err := c.ss[1].GetDevice(c.ctx, id)
		require.NoError(t, err)
		require.True(t, d.Online, id)
	}
}

// crossing is two instances on one PostgreSQL database whose batches lock
// the same rows in opposite orders.
type crossing struct {
	t   *testing.T
	ss  []*DB
	obs []*countingObserver
	clk *clock.Fake
	ctx context.Context
}

func newCrossing(t *testing.T) *crossing {
	dsn := testDSN(t, "postgres")
	c := &crossing{t: t, clk: clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))}
	for i := 0; i < 2; i++ {
		o := newObserver()
		s, err := testOpen(context.Background(), Config{Path: dsn, Instance: fmt.Sprintf("i%d", i+1), Now: c.clk.Now, Observer: o})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		c.ss, c.obs = append(c.ss, s), append(c.obs, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c.ctx = ctx
	return c
}

// cross runs a change on the first instance (aFirst, then aThen) and one
// on the second (bFirst, then bThen), each declaring its locks. The first
// holds what aFirst locked until the second is seen waiting for a lock
// (the server's own view, pg_stat_activity): without the pre-lock the
// second then holds what bFirst locked, aThen waits for it, bThen for
// aFirst's, and the server finds a deadlock. It checks that both commit
// and neither batch lost a deadlock.
func (c *crossing) cross(aLocks rowLocks, aFirst, aThen func(*tx) error, bLocks rowLocks, bFirst, bThen func(*tx) error) {
	t := c.t
	waiting := func() int {
		var n int
		require.NoError(t, c.ss[0].rq.QueryRowContext(c.ctx, `SELECT COUNT(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n
	}
	firstHolds, done := make(chan struct{}), make(chan error, 2)
	firstRun := true // a batch that lost a deadlock runs again: wait once
	go func() {
		done <- c.ss[0].writeLocking(c.ctx, aLocks, func(ctx context.Context, t *tx) error {
			if err := aFirst(t); err != nil {
				return err
			}
			if firstRun {
				firstRun = false
				close(firstHolds)
				for waiting() == 0 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-c.ctx.Done():
						return c.ctx.Err()
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
			return aThen(t)
		})
	}()
	<-firstHolds
	go func() {
		done <- c.ss[1].writeLocking(c.ctx, bLocks, func(ctx context.Context, t *tx) error {
			if err := bFirst(t); err != nil {
				return err
			}
			return bThen(t)
		})
	}()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	require.Zero(t, c.obs[0].deadlocks+c.obs[1].deadlocks, "no batch lost a deadlock")
}
