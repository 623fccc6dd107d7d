package store

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type countingObserver struct {
	mu                   sync.Mutex
	transitions, refused map[string]int
	receipts             map[string]int
	fenced               int
	batches, changes     int
	fallbacks            int
	deadlocks            int
	answered             map[string][]time.Duration // by change
}

func newObserver() *countingObserver {
	return &countingObserver{transitions: map[string]int{}, refused: map[string]int{}, receipts: map[string]int{},
		answered: map[string][]time.Duration{}}
}
func (o *countingObserver) Transition(m, f, t string) {
	o.mu.Lock()
	o.transitions[m+":"+f+"→"+t]++
	o.mu.Unlock()
}
func (o *countingObserver) Refused(m, r string) { o.mu.Lock(); o.refused[m+":"+r]++; o.mu.Unlock() }
func (o *countingObserver) Receipt(e string)    { o.mu.Lock(); o.receipts[e]++; o.mu.Unlock() }
func (o *countingObserver) Fenced()             { o.mu.Lock(); o.fenced++; o.mu.Unlock() }
func (o *countingObserver) Deadlock()           { o.mu.Lock(); o.deadlocks++; o.mu.Unlock() }
func (o *countingObserver) Answered(change string, took time.Duration) {
	o.mu.Lock()
	o.answered[change] = append(o.answered[change], took)
	o.mu.Unlock()
}

// answers is what Answered was told of change so far.
func (o *countingObserver) answers(change string) []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.answered[change]...)
}
func (o *countingObserver) Batch(n int, _ time.Duration, fellBack bool) {
	o.mu.Lock()
	o.batches++
	o.changes += n
	if fellBack {
		o.fallbacks++
	}
	o.mu.Unlock()
}

type testBundle struct {
	s   *DB
	clk *clock.Fake
	obs *countingObserver
	ctx context.Context
}

// The shared suite: every test that opens a store runs once per backend,
// as a subtest named after it (TestSubmitIsIdempotent/postgres), against a
// real SQLite file or a fresh database on a throwaway PostgreSQL cluster.
var backends = []string{"sqlite", "postgres"}

func eachBackend(t *testing.T, test func(t *testing.T, be string)) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			test(t, be)
		})
	}
}

// testDSN is a new, empty database of the backend.
func testDSN(t *testing.T, be string) string {
	t.Helper()
	if be == "postgres" {
		return testenv.SharedPostgres(t).NewDatabase(t)
	}
	return filepath.Join(t.TempDir(), "c.db")
}

func setup(t *testing.T, be string) *testBundle {
	t.Helper()
	return setupFeed(t, be, nil)
}

// setupFeed is setup with the store's facts published to feed.
func setupFeed(t *testing.T, be string, feed Feed) *testBundle {
	t.Helper()
	return setupConfig(t, be, func(c *Config) { c.Feed = feed })
}

// setupConfig is setup with the store's Config changed by tweak.
func setupConfig(t *testing.T, be string, tweak func(*Config)) *testBundle {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	obs := newObserver()
	cfg := Config{Path: testDSN(t, be), Instance: "i1", Now: clk.Now, Observer: obs}
	tweak(&cfg)
	s, err := testOpen(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return &testBundle{s: s, clk: clk, obs: obs, ctx: context.Background()}
}

func newOp(id, cmd string) NewOperation {
	return NewOperation{OperationID: id, Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`),
		RequestHash: "h1", CommandID: cmd, CommandTTL: time.Minute, QoS: 1, Owner: "i1", LeaseTTL: 10 * time.Second}
}

var fence = domain.Fence{Owner: "i1", Token: 1}

func TestSubmitIsIdempotent(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		r1, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		require.True(t, r1.Created)
		require.Equal(t, fsm.OpStarted, r1.Operation.Status)
		require.Equal(t, []string{"c-1"}, r1.Operation.CommandIDs)

		r2, err := b.s.Submit(b.ctx, newOp("op-1", "c-2"), nil)
		require.NoError(t, err)
		require.False(t, r2.Created)
		require.Equal(t, "c-1", r2.Operation.CommandID, "the stored record, not the new command id")

		other := newOp("op-1", "c-3")
		other.RequestHash = "h2"
		_, err = b.s.Submit(b.ctx, other, nil)
		require.ErrorIs(t, err, domain.ErrKeyReused)

		_, err = b.s.GetCommand(b.ctx, "c-2")
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
}

// A new operation's answer, and its command, are built without reading them
// back: they must be what a read finds, field for field, for a plain
// operation, a task's step and a compensation; and a resubmission answers
// with the stored record.
func TestSubmitAnswersWhatIsStored(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		step := newOp("task_1:s.1:dev-2:v3", "c_2.x:y")
		step.Target, step.TaskID, step.Step, step.BusinessVersion = "dev-2", "task_1", "s.1", "v3" // every character ids may hold
		step.Params = json.RawMessage(`{"a":[1,2],"b":"x"}`)
		comp := newOp("op-1:compensate:v2", "c-3")
		comp.Compensates, comp.BusinessVersion = "op-1", "v2"
		for i, n := range []NewOperation{newOp("op-1", "c-1"), step, comp} {
			b.clk.Advance(1500 * time.Microsecond) // not on a millisecond
			res, err := b.s.Submit(b.ctx, n, nil)
			require.NoError(t, err, i)
			require.True(t, res.Created, i)
			got, err := b.s.GetOperation(b.ctx, n.OperationID)
			require.NoError(t, err, i)
			require.Equal(t, got, res.Operation, "submit %d answers what a read finds", i)
			oc, err := b.s.OpenCommand(b.ctx, n.CommandID)
			require.NoError(t, err, i)
			require.Equal(t, oc, res.Inserted, "submit %d hands on its command as a read finds it", i)

			again, err := b.s.Submit(b.ctx, n, nil)
			require.NoError(t, err, i)
			require.False(t, again.Created, i)
			if i > 0 {
				require.Equal(t, got, again.Operation, "resubmit %d answers the stored record", i)
			}
		}
		op1, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, []string{"op-1:compensate:v2"}, op1.Compensations)
	})
}

func TestSubmitBeforeCommitErrorRollsBack(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		boom := errors.New("boom")
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), func() error { return boom })
		require.ErrorIs(t, err, boom)
		_, err = b.s.GetOperation(b.ctx, "op-1")
		require.ErrorIs(t, err, domain.ErrNotFound)
		_, err = b.s.GetCommand(b.ctx, "c-1")
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
}

func TestConcurrentSubmitsOneRow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		var wg sync.WaitGroup
		var mu sync.Mutex
		created := 0
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := b.s.Submit(b.ctx, newOp("op-1", "c-"+string(rune('a'+i%26))+string(rune('a'+i/26))), nil)
				require.NoError(t, err)
				if r.Created {
					mu.Lock()
					created++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, created)
		op, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Len(t, op.CommandIDs, 1)
	})
}

func TestClaimSendOnlyOneWinner(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		d, err := b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now().Add(time.Second))
		require.NoError(t, err)
		require.Equal(t, fsm.CmdSent, d.Command.Status)
		require.Equal(t, 1, d.Command.Attempt)
		require.Equal(t, b.clk.Now().Add(10*time.Second), d.LeaseExpiresAt)

		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		var re *RefusedError
		require.ErrorAs(t, err, &re)
		require.Equal(t, ReasonStale, re.Reason)
		require.False(t, errors.Is(err, ErrFenced))

		// A re-send is attempt n → n+1 on the same state.
		d, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdSent, 1, 1, fence, b.clk.Now())
		require.NoError(t, err)
		require.Equal(t, 2, d.Command.Attempt)
		require.Equal(t, 1, b.obs.refused["command:stale"])

		evs, err := b.s.Events(b.ctx, "c-1")
		require.NoError(t, err)
		refused := 0
		for _, e := range evs {
			if e.Refused {
				refused++
			}
		}
		require.Equal(t, 1, refused, "the refusal is on record")
	})
}

func TestDecisionsAreFenced(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)

		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, domain.Fence{Owner: "i1", Token: 2}, b.clk.Now())
		require.ErrorIs(t, err, ErrFenced, "wrong token")
		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, domain.Fence{Owner: "i2", Token: 1}, b.clk.Now())
		require.ErrorIs(t, err, ErrFenced, "wrong owner")

		// The restarted instance takes over its own operations with a new token.
		n, err := b.s.ReclaimOwn(b.ctx, "i1", 10*time.Second)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.ErrorIs(t, err, ErrFenced, "the old token is stale after the takeover")
		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, domain.Fence{Owner: "i1", Token: 2}, b.clk.Now())
		require.NoError(t, err)

		// A lease that ran out fences its holder too, and a heartbeat cannot revive it.
		b.clk.Advance(11 * time.Second)
		_, err = b.s.ClaimQuery(b.ctx, "c-1", "q-1", fsm.CmdSent, 0, true, domain.Fence{Owner: "i1", Token: 2}, b.clk.Now())
		require.ErrorIs(t, err, ErrFenced)
		renewed, _, err := b.s.RenewLeases(b.ctx, "i1", 10*time.Second)
		require.NoError(t, err)
		require.Zero(t, renewed)
		require.Equal(t, 4, b.obs.fenced)
		c, err := b.s.GetCommand(b.ctx, "c-1")
		require.NoError(t, err)
		require.Equal(t, 0, c.Queries, "nothing a fenced decision tried was applied")

		// ... but its holder, alive again after the stall, takes it over
		// itself with a new token (no peer may be there to do it), and the
		// command is due for a question: once it has been expired for a
		// whole ttl more, which leaves it to a live peer first.
		taken, err := b.s.TakeOver(b.ctx, "i1", 10*time.Second, 10)
		require.NoError(t, err)
		require.Empty(t, taken, "expired for 1 s: a peer's to take")
		b.clk.Advance(10 * time.Second)
		taken, err = b.s.TakeOver(b.ctx, "i1", 10*time.Second, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"op-1"}, taken)
		op, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.EqualValues(t, 3, op.FencingToken)
		require.Equal(t, "i1", op.Owner)
		_, err = b.s.ClaimQuery(b.ctx, "c-1", "q-1", fsm.CmdSent, 0, true, domain.Fence{Owner: "i1", Token: 2}, b.clk.Now())
		require.ErrorIs(t, err, ErrFenced, "the stalled decision's token is stale")
		_, err = b.s.ClaimQuery(b.ctx, "c-1", "q-2", fsm.CmdSent, 0, true, domain.Fence{Owner: "i1", Token: 3}, b.clk.Now())
		require.NoError(t, err)
	})
}

func TestHeartbeatExtendsWithoutBumpingVersion(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		r, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		b.clk.Advance(5 * time.Second)
		n, until, err := b.s.RenewLeases(b.ctx, "i1", 10*time.Second)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, until, op.LeaseExpiresAt)
		require.Equal(t, r.Operation.Version, op.Version)
		require.Equal(t, r.Operation.FencingToken, op.FencingToken)
	})
}

func receipt(cmd string, st wire.ReceiptStatus, seq int) wire.Receipt {
	return wire.Receipt{CommandID: cmd, OperationID: "op-1", Status: st, Seq: seq, At: time.Now()}
}

// receiptTrips applies r from device-1 and returns the statements it took.
func receiptTrips(t *testing.T, b *testBundle, r wire.Receipt) int64 {
	t.Helper()
	before := changeTrips(b.s)
	_, err := b.s.ApplyReceipt(b.ctx, "device-1", r, nil)
	require.NoError(t, err)
	return changeTrips(b.s) - before
}

// changeTrips is RoundTrips without the statements of the writer's moves
// of pending rows into the device lists (listDevices), which join a batch
// on the store's clock, whoever's change it holds.
func changeTrips(s *DB) int64 { return s.RoundTrips() - s.moveTrips.Load() }

// sentToOnline is sentCommand to device-1 online.
func sentToOnline(t *testing.T, b *testBundle) {
	t.Helper()
	_, err := b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: true, Session: 1})
	require.NoError(t, err)
	sentCommand(t, b)
}

func sentCommand(t *testing.T, b *testBundle) { sentAs(t, b, "op-1", "c-1") }

// sentAs submits operation op with command cmd and publishes it.
func sentAs(t *testing.T, b *testBundle, op, cmd string) {
	t.Helper()
	_, err := b.s.Submit(b.ctx, newOp(op, cmd), nil)
	require.NoError(t, err)
	_, err = b.s.ClaimSend(b.ctx, cmd, fsm.CmdPending, 0, 1, fence, b.clk.Now().Add(time.Second))
	require.NoError(t, err)
}

func TestReceiptsMoveForwardOnly(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		apply := func(r wire.Receipt) ReceiptOutcome {
			out, err := b.s.ApplyReceipt(b.ctx, "device-1", r, nil)
			require.NoError(t, err)
			return out
		}
		require.Equal(t, EffectApplied, apply(receipt("c-1", wire.ReceiptExecuting, 2)).Effect, "a jump over received")
		require.Equal(t, EffectStale, apply(receipt("c-1", wire.ReceiptReceived, 1)).Effect)
		require.Equal(t, EffectDuplicate, apply(receipt("c-1", wire.ReceiptExecuting, 2)).Effect)
		r := receipt("c-1", wire.ReceiptSucceeded, 3)
		r.Result = json.RawMessage(`{"ok":true}`)
		out := apply(r)
		require.Equal(t, EffectApplied, out.Effect)
		require.Equal(t, fsm.CmdSucceeded, out.To)
		require.Equal(t, EffectDuplicate, apply(r).Effect)
		require.Equal(t, EffectStale, apply(receipt("c-1", wire.ReceiptExecuting, 2)).Effect, "executing after succeeded")
		require.Equal(t, EffectUnknownCommand, apply(receipt("c-9", wire.ReceiptSucceeded, 3)).Effect)
		wrong := receipt("c-1", wire.ReceiptFailed, 3)
		wrong.OperationID = "op-2"
		require.Equal(t, EffectMismatch, apply(wrong).Effect)
		out, err := b.s.ApplyReceipt(b.ctx, "device-2", receipt("c-1", wire.ReceiptFailed, 3), nil)
		require.NoError(t, err)
		require.Equal(t, EffectMismatch, out.Effect, "topic device differs")

		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdSucceeded, c.Status)
		require.Empty(t, c.LateOutcome)
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpSucceeded, op.Status)
		require.JSONEq(t, `{"ok":true}`, string(op.Result))
		recs, _ := b.s.Receipts(b.ctx, "c-1")
		require.Len(t, recs, 8)
	})
}

// A receipt on a command in the state expected before it is applied in one
// write (advanceExpected), with every check of the read path: another
// device, another operation or a rank already reached change nothing there
// either, alone or in a run.
func TestReceiptInTheExpectedStateKeepsEveryCheck(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		state := func() (fsm.CommandState, int) {
			c, err := b.s.GetCommand(b.ctx, "c-1")
			require.NoError(t, err)
			return c.Status, c.StatusRank
		}
		out, err := b.s.ApplyReceipt(b.ctx, "device-2", receipt("c-1", wire.ReceiptReceived, 1), nil)
		require.NoError(t, err)
		require.Equal(t, EffectMismatch, out.Effect, "another device")
		other := receipt("c-1", wire.ReceiptReceived, 1)
		other.OperationID = "op-2"
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", other, nil)
		require.NoError(t, err)
		require.Equal(t, EffectMismatch, out.Effect, "another operation")
		run := []wire.Receipt{receipt("c-1", wire.ReceiptReceived, 1), receipt("c-1", wire.ReceiptExecuting, 2)}
		run[1].OperationID = "op-2"
		res, err := b.s.ApplyReceipts(b.ctx, "device-1", run, nil)
		require.NoError(t, err)
		require.Len(t, res, 2)
		require.Equal(t, EffectApplied, res[0].Out.Effect, "the first alone")
		require.Equal(t, EffectMismatch, res[1].Out.Effect, "a run with another operation's receipt")
		st, rank := state()
		require.Equal(t, fsm.CmdReceived, st)
		require.Equal(t, fsm.RankReceived, rank)

		// Back in sent with a receipt's rank reached (as after a resend):
		// an executing receipt is applied, a received one is not.
		force(t, b, "UPDATE commands SET status = 'sent', status_rank = 2 WHERE command_id = 'c-1'")
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptReceived, 3), nil)
		require.NoError(t, err)
		require.Equal(t, EffectStale, out.Effect, "below the rank reached")
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptExecuting, 4), nil)
		require.NoError(t, err)
		require.Equal(t, EffectDuplicate, out.Effect, "at the rank reached")
		st, rank = state()
		require.Equal(t, fsm.CmdSent, st)
		require.Equal(t, fsm.RankExecuting, rank)
		op, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, fsm.OpStarted, op.Status)
	})
}

// force puts rows in a state the store's own changes reach only by
// another path (a resend, another instance), through its writer.
func force(t *testing.T, b *testBundle, statement string) {
	t.Helper()
	require.NoError(t, b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
		_, err := t.ExecContext(ctx, statement)
		return err
	}))
}

// A command's final receipt ends its operation only while it is the
// operation's current command (finishOperation's one-statement case keeps
// the read path's condition).
func TestOperationEndsOnlyByItsCurrentCommand(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		force(t, b, "UPDATE operations SET command_id = 'c-other' WHERE operation_id = 'op-1'")
		out, err := b.s.ApplyReceipts(b.ctx, "device-1", []wire.Receipt{receipt("c-1", wire.ReceiptReceived, 1),
			receipt("c-1", wire.ReceiptExecuting, 2), receipt("c-1", wire.ReceiptSucceeded, 3)}, nil)
		require.NoError(t, err)
		require.Len(t, out, 3)
		require.Equal(t, fsm.CmdSucceeded, out[2].Out.To)
		op, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, fsm.OpStarted, op.Status)
	})
}

// Ended names, in one read, the operations of a list that are no longer
// started.
func TestEndedNamesTheOperationsThatLeftStarted(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		sentAs(t, b, "op-2", "c-2")
		ended, err := b.s.Ended(b.ctx, []string{"op-1", "op-2", "op-9"})
		require.NoError(t, err)
		require.Empty(t, ended)
		_, err = b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptSucceeded, 3), nil)
		require.NoError(t, err)
		ended, err = b.s.Ended(b.ctx, []string{"op-1", "op-2", "op-9"})
		require.NoError(t, err)
		require.Equal(t, []string{"op-1"}, ended)
		ended, err = b.s.Ended(b.ctx, nil)
		require.NoError(t, err)
		require.Empty(t, ended)
	})
}

func TestBeforeReceiptCommitErrorRecordsNothing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		boom := errors.New("boom")
		_, err := b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptSucceeded, 3), func() error { return boom })
		require.ErrorIs(t, err, boom)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdSent, c.Status)
		recs, _ := b.s.Receipts(b.ctx, "c-1")
		require.Empty(t, recs)
	})
}

func TestLateReceiptAfterTimeout(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		c2, err := b.s.Move(b.ctx, "c-1", fsm.CmdSent, c.Version, fsm.CmdTimeout, fsm.ReasonTimeout, fence, b.clk.Now())
		require.NoError(t, err)
		require.Equal(t, fsm.CmdTimeout, c2.Status)
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpFailedRetryable, op.Status)

		r := receipt("c-1", wire.ReceiptSucceeded, 3)
		r.Result = json.RawMessage(`{"late":1}`)
		out, err := b.s.ApplyReceipt(b.ctx, "device-1", r, nil)
		require.NoError(t, err)
		require.Equal(t, EffectLate, out.Effect)
		c, _ = b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdTimeout, c.Status, "a terminal state is never rewritten")
		require.Equal(t, "succeeded", c.LateOutcome)
		require.JSONEq(t, `{"late":1}`, string(c.LateResult))
		op, _ = b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpSucceeded, op.Status, "a late success decides the failed_retryable operation")

		out, err = b.s.ApplyReceipt(b.ctx, "device-1", r, nil)
		require.NoError(t, err)
		require.Equal(t, EffectDuplicate, out.Effect)
	})
}

func TestQueryAnswerForAnotherCommandOfTheOperation(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		_, err := b.s.ClaimQuery(b.ctx, "c-1", "q-1", fsm.CmdSent, 0, true, fence, b.clk.Now().Add(time.Second))
		require.NoError(t, err)
		r := receipt("c-0", wire.ReceiptSucceeded, 3) // the device ran another command of op-1
		r.QueryID = "q-1"
		out, err := b.s.ApplyReceipt(b.ctx, "device-1", r, nil)
		require.NoError(t, err)
		require.Equal(t, EffectApplied, out.Effect)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdSucceeded, c.Status)
		require.Equal(t, "c-0", c.ExecutedAs)

		// An unknown answer to a query is information, not a state change.
		_, err = b.s.Submit(b.ctx, NewOperation{OperationID: "op-2", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`),
			RequestHash: "h", CommandID: "c-2", CommandTTL: time.Minute, Owner: "i1", LeaseTTL: 10 * time.Second, QoS: 1}, nil)
		require.NoError(t, err)
		_, err = b.s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		_, err = b.s.ClaimQuery(b.ctx, "c-2", "q-2", fsm.CmdSent, 0, true, fence, b.clk.Now())
		require.NoError(t, err)
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", wire.Receipt{CommandID: "c-2", OperationID: "op-2", Status: wire.ReceiptUnknown, QueryID: "q-2"}, nil)
		require.NoError(t, err)
		require.True(t, out.Unknown)
		require.True(t, out.Due, "an unknown answer wakes the lease holder")
		c, _ = b.s.GetCommand(b.ctx, "c-2")
		require.Equal(t, fsm.CmdSent, c.Status)
		require.Equal(t, "unknown", c.LastAnswer)
	})
}

func TestPresenceByRank(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		at := b.clk.Now().Add(1500 * time.Millisecond)
		caps := &wire.Capabilities{Dedupe: true, Query: true}
		out, err := b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: true, Session: 2, Capabilities: caps, At: &at})
		require.NoError(t, err)
		require.True(t, out.Applied)
		require.True(t, out.WentOnline)
		require.Equal(t, 1500*time.Millisecond, out.Device.ClockSkew)

		out, err = b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: false, Session: 1})
		require.NoError(t, err)
		require.False(t, out.Applied, "a delayed LWT of an older session")
		out, err = b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: false, Session: 2})
		require.NoError(t, err)
		require.True(t, out.Applied)
		out, err = b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: true, Session: 2, Capabilities: caps})
		require.NoError(t, err)
		require.False(t, out.Applied, "a stale online of the same session after its offline")
		d, _ := b.s.GetDevice(b.ctx, "device-1")
		require.False(t, d.Online)
		require.True(t, d.Capabilities.Dedupe)
	})
}

func TestEventsAreAppendOnly(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		exec := func(q string) error {
			return b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
				_, err := t.ExecContext(ctx, q)
				return err
			})
		}
		err := exec(`UPDATE events SET reason = 'x'`)
		require.ErrorContains(t, err, "append-only")
		err = exec(`DELETE FROM events`)
		require.ErrorContains(t, err, "append-only")
		err = exec(`UPDATE commands SET status = 'bogus'`)
		require.Error(t, err)
		require.Regexp(t, `(?i)check constraint`, err.Error())
	})
}

func TestIllegalFinishRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		_, err := b.s.Move(b.ctx, "c-1", fsm.CmdSent, c.Version, fsm.CmdCancelled, "cancelled", fence, b.clk.Now())
		require.ErrorIs(t, err, ErrRefused)
		var re *RefusedError
		require.ErrorAs(t, err, &re)
		require.Equal(t, ReasonIllegal, re.Reason)
		c2, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, c, c2)
	})
}

func needsAttention(t *testing.T, b *testBundle) {
	t.Helper()
	sentCommand(t, b)
	c, _ := b.s.GetCommand(b.ctx, "c-1")
	_, err := b.s.Move(b.ctx, "c-1", fsm.CmdSent, c.Version, fsm.CmdNeedsAttention, "asks used up", fence, b.clk.Now())
	require.NoError(t, err)
}

func TestResolveThenLateReceiptConflict(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		needsAttention(t, b)
		out, err := b.s.Resolve(b.ctx, "c-1", fsm.CmdSucceeded, "looked at it", "alice")
		require.NoError(t, err)
		require.False(t, out.Lost)
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpSucceeded, op.Status)

		r, err := b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptFailed, 3), nil)
		require.NoError(t, err)
		require.Equal(t, EffectLate, r.Effect)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdSucceeded, c.Status, "the resolve won; never rewritten")
		require.Equal(t, "failed", c.LateOutcome)
		require.True(t, c.LateConflict)
		op, _ = b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpSucceeded, op.Status)
	})
}

func TestFinalReceiptThenResolveIsKeptAsLate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		needsAttention(t, b)
		r, err := b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptSucceeded, 3), nil)
		require.NoError(t, err)
		require.Equal(t, EffectApplied, r.Effect, "a final receipt settles needs_attention")
		out, err := b.s.Resolve(b.ctx, "c-1", fsm.CmdFailed, "thought it failed", "alice")
		require.NoError(t, err)
		require.True(t, out.Lost)
		require.Equal(t, fsm.CmdSucceeded, out.Command.Status)
		require.True(t, out.Command.LateConflict)
		_, err = b.s.Resolve(b.ctx, "c-1", "maybe", "", "alice")
		require.ErrorIs(t, err, domain.ErrIllegalState)
	})
}

func TestCancelRacesTheClaim(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		c, err := b.s.Cancel(b.ctx, "c-1", "bob")
		require.NoError(t, err)
		require.Equal(t, fsm.CmdCancelled, c.Status)
		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.ErrorIs(t, err, ErrRefused, "a cancelled command is never published")
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpFailedFinal, op.Status)

		_, err = b.s.Submit(b.ctx, newOp("op-2", "c-2"), nil)
		require.NoError(t, err)
		_, err = b.s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		_, err = b.s.Cancel(b.ctx, "c-2", "bob")
		require.ErrorIs(t, err, domain.ErrAlreadyPublished)
	})
}

// timedOutThenRetried publishes c-1 of op-1, times it out (the operation is
// failed_retryable) and submits op-1 again: the caller's retry.
func timedOutThenRetried(t *testing.T, b *testBundle) SubmitResult {
	t.Helper()
	sentCommand(t, b)
	c, _ := b.s.GetCommand(b.ctx, "c-1")
	_, err := b.s.Move(b.ctx, "c-1", fsm.CmdSent, c.Version, fsm.CmdTimeout, fsm.ReasonTimeout, fence, b.clk.Now())
	require.NoError(t, err)
	res, err := b.s.Submit(b.ctx, newOp("op-1", "c-x"), nil)
	require.NoError(t, err)
	require.True(t, res.Retried)
	return res
}

func TestRetryAsksThenMints(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		res := timedOutThenRetried(t, b)
		require.Equal(t, fsm.OpStarted, res.Operation.Status)
		require.EqualValues(t, 2, res.Operation.FencingToken, "the retry takes the lease with a new token")
		r, err := b.s.RetryingOf(b.ctx, "c-1", "i1")
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: 2}
		_, err = b.s.ClaimQuery(b.ctx, "c-1", "q-r", fsm.CmdTimeout, r.Last.Queries, true, f, b.clk.Now())
		require.NoError(t, err)
		_, err = b.s.ApplyReceipt(b.ctx, "device-1", wire.Receipt{CommandID: "c-1", OperationID: "op-1", Status: wire.ReceiptUnknown, QueryID: "q-r"}, nil)
		require.NoError(t, err)
		r, err = b.s.RetryingOf(b.ctx, "c-1", "i1")
		require.NoError(t, err)
		require.Equal(t, "unknown", r.Last.LastAnswer)
		require.ErrorIs(t, b.s.MintCommand(b.ctx, r, fence, "c-2", time.Minute, 1, false), ErrFenced, "the old token cannot mint")
		require.NoError(t, b.s.MintCommand(b.ctx, r, f, "c-2", time.Minute, 1, false))
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, []string{"c-1", "c-2"}, op.CommandIDs)
		require.Equal(t, 2, op.Attempt)
		_, err = b.s.RetryingOf(b.ctx, "c-1", "i1")
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
}

func TestWakeRefusesADecisionMadeOnOldPresence(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		seen, _ := b.s.GetCommand(b.ctx, "c-1") // the holder reads it while the device looks offline
		ids, err := b.s.Wake(b.ctx, "device-1") // the device's birth arrives
		require.NoError(t, err)
		require.Equal(t, []string{"c-1"}, ids)
		_, err = b.s.Move(b.ctx, "c-1", fsm.CmdPending, seen.Version, fsm.CmdWaitingDevice, "device offline", fence, b.clk.Now().Add(time.Minute))
		require.ErrorIs(t, err, ErrRefused, "the decision on the old presence is refused, to be taken again")
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdPending, c.Status)
		require.False(t, c.NextCheckAt.After(b.clk.Now()), "still due now")
	})
}

// A final receipt that contradicts the terminal state (another status, or
// another result) is flagged late_conflict and kept, never a duplicate.
func TestContradictingFinalReceiptsAfterSucceeded(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentCommand(t, b)
		ok := receipt("c-1", wire.ReceiptSucceeded, 3)
		ok.Result = json.RawMessage(`{"a":1,"b":2}`)
		out, err := b.s.ApplyReceipt(b.ctx, "device-1", ok, nil)
		require.NoError(t, err)
		require.Equal(t, EffectApplied, out.Effect)

		same := ok
		same.Result = json.RawMessage(`{"b":2.0, "a":1}`)
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", same, nil)
		require.NoError(t, err)
		require.Equal(t, EffectDuplicate, out.Effect, "the same result, spelt otherwise")
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.False(t, c.LateConflict)

		failed := receipt("c-1", wire.ReceiptFailed, 4)
		failed.Error = "disk_full"
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", failed, nil)
		require.NoError(t, err)
		require.Equal(t, EffectLate, out.Effect)
		c, _ = b.s.GetCommand(b.ctx, "c-1")
		require.True(t, c.LateConflict)
		require.Equal(t, fsm.CmdSucceeded, c.Status, "the terminal state is never rewritten")

		other := receipt("c-1", wire.ReceiptSucceeded, 5)
		other.Result = json.RawMessage(`{"a":2}`)
		out, err = b.s.ApplyReceipt(b.ctx, "device-1", other, nil)
		require.NoError(t, err)
		require.Equal(t, EffectLate, out.Effect, "another result is a conflict too")
		recs, err := b.s.Receipts(b.ctx, "c-1")
		require.NoError(t, err)
		require.Len(t, recs, 4, "every receipt is kept in the log")
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpSucceeded, op.Status)
		require.JSONEq(t, `{"a":1,"b":2}`, string(op.Result), "the operation keeps the first outcome")
	})
}

// A presence with a huge session poisons the rank: later real births are
// ignored, counted as stale and shown; an admin's reset lets the next one apply.
func TestStalePresenceCountedAndReset(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		caps := &wire.Capabilities{Dedupe: true, Query: true}
		_, err := b.s.ApplyPresence(b.ctx, "device-5", wire.Presence{Online: false, Session: 9007199254740000})
		require.NoError(t, err)
		for session := int64(2); session <= 3; session++ {
			out, err := b.s.ApplyPresence(b.ctx, "device-5", wire.Presence{Online: true, Session: session, Capabilities: caps})
			require.NoError(t, err)
			require.False(t, out.Applied)
			require.True(t, out.Stale)
		}
		out, err := b.s.ApplyPresence(b.ctx, "device-5", wire.Presence{Online: false, Session: 9007199254740000})
		require.NoError(t, err)
		require.False(t, out.Stale, "the same message again is not stale")
		d, err := b.s.GetDevice(b.ctx, "device-5")
		require.NoError(t, err)
		require.False(t, d.Online)
		require.EqualValues(t, 2, d.StalePresence)
		require.EqualValues(t, 3, d.LastStaleSession)

		d, err = b.s.ResetPresence(b.ctx, "device-5", "admin")
		require.NoError(t, err)
		require.Zero(t, d.StalePresence)
		out, err = b.s.ApplyPresence(b.ctx, "device-5", wire.Presence{Online: true, Session: 4, Capabilities: caps})
		require.NoError(t, err)
		require.True(t, out.Applied)
		require.True(t, out.Device.Online)
		_, err = b.s.ResetPresence(b.ctx, "device-404", "admin")
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
}

// A success the controller already holds is adopted: after a retry minted a
// new command, a late success of the earlier one decides the operation, and
// the newer command, never published, is cancelled.
func TestLateSuccessOfAnEarlierCommandDecidesTheOperation(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		timedOutThenRetried(t, b)
		r, err := b.s.RetryingOf(b.ctx, "c-1", "i1")
		require.NoError(t, err)
		f := domain.Fence{Owner: "i1", Token: r.Operation.FencingToken}
		require.NoError(t, b.s.MintCommand(b.ctx, r, f, "c-2", time.Minute, 1, false)) // the device said unknown
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpStarted, op.Status)
		require.Equal(t, "c-2", op.CommandID)

		ok := receipt("c-1", wire.ReceiptSucceeded, 3)
		ok.Result = json.RawMessage(`{"boots":2}`)
		out, err := b.s.ApplyReceipt(b.ctx, "device-1", ok, nil)
		require.NoError(t, err)
		require.Equal(t, EffectLate, out.Effect)
		op, _ = b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpSucceeded, op.Status, "the device's own success decides the operation")
		require.JSONEq(t, `{"boots":2}`, string(op.Result))
		c2, _ := b.s.GetCommand(b.ctx, "c-2")
		require.Equal(t, fsm.CmdCancelled, c2.Status, "the newer command, never published, is cancelled")
	})
}

// A command parked until its expiry (sends and asks used up) whose device
// then says it has it is due for a decision again, so its lost final
// receipt is asked for instead of waiting for the expiry.
func TestProgressUnparksACommandParkedUntilItsExpiry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		_, err = b.s.ClaimSend(b.ctx, "c-1", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.NoError(t, b.s.Postpone(b.ctx, "c-1", c.Version, fence, c.ExpiresAt))

		out, err := b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptReceived, 1), nil)
		require.NoError(t, err)
		require.True(t, out.Due, "parked, then progress: due now")
		c, _ = b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, b.clk.Now(), c.NextCheckAt)

		out, err = b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptExecuting, 2), nil)
		require.NoError(t, err)
		require.False(t, out.Due, "not parked: its next check stands")
	})
}

func TestOperationMayChangeOnlyWhenTheCommandEnds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		out  ReceiptOutcome
		want bool
	}{
		{ReceiptOutcome{Effect: EffectApplied, From: fsm.CmdSent, To: fsm.CmdReceived}, false},
		{ReceiptOutcome{Effect: EffectApplied, From: fsm.CmdReceived, To: fsm.CmdExecuting}, false},
		{ReceiptOutcome{Effect: EffectApplied, From: fsm.CmdExecuting, To: fsm.CmdSucceeded, Terminal: true}, true},
		{ReceiptOutcome{Effect: EffectApplied, From: fsm.CmdSent, To: fsm.CmdFailed, Terminal: true}, true},
		{ReceiptOutcome{Effect: EffectDuplicate, From: fsm.CmdSucceeded, To: fsm.CmdSucceeded, Terminal: true}, false},
		{ReceiptOutcome{Effect: EffectStale, From: fsm.CmdExecuting, To: fsm.CmdExecuting}, false},
		{ReceiptOutcome{Effect: EffectLate, From: fsm.CmdTimeout, To: fsm.CmdTimeout, Terminal: true}, true},
	} {
		require.Equal(t, c.want, c.out.OperationMayChange(), "%+v", c.out)
	}
}

func TestGetOperationListsCommandsAndCompensationsInOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		for i, id := range []string{"k-2", "k-1", "k-3", "k-0"} {
			if i < 3 {
				b.clk.Advance(time.Second) // k-3 and k-0 start in the same millisecond
			}
			n := newOp(id, "c-"+id)
			n.Compensates = "op-1"
			_, err := b.s.Submit(b.ctx, n, nil)
			require.NoError(t, err)
		}
		op, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, []string{"c-1"}, op.CommandIDs)
		require.Equal(t, []string{"k-2", "k-1", "k-0", "k-3"}, op.Compensations, "in the order they started, then by id")
		k, err := b.s.GetOperation(b.ctx, "k-1")
		require.NoError(t, err)
		require.Equal(t, []string{"c-k-1"}, k.CommandIDs)
		require.Equal(t, []string{}, k.Compensations)
	})
}

// A device's receipts applied together are applied in their order in one
// change; one that fails is rolled back alone and stops the ones after it.
func TestApplyReceiptsInOrderAndAFailureStopsThere(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentToOnline(t, b)
		b.clk.Advance(time.Minute)
		res, err := b.s.ApplyReceipts(b.ctx, "device-1", []wire.Receipt{receipt("c-1", wire.ReceiptReceived, 1),
			receipt("c-1", wire.ReceiptReceived, 1), receipt("c-1", wire.ReceiptExecuting, 2)}, nil)
		require.NoError(t, err)
		require.Len(t, res, 3)
		for i, want := range []string{EffectApplied, EffectDuplicate, EffectApplied} {
			require.NoError(t, res[i].Err, i)
			require.Equal(t, want, res[i].Out.Effect, i)
		}
		require.Equal(t, fsm.CmdExecuting, res[2].Out.To)
		c, _ := b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdExecuting, c.Status)
		events, err := b.s.Events(b.ctx, "c-1")
		require.NoError(t, err)
		var moves []string
		for _, e := range events {
			moves = append(moves, e.From+">"+e.To)
		}
		require.Equal(t, []string{">pending", "pending>sent", "sent>received", "received>executing"}, moves)
		d, err := b.s.GetDevice(b.ctx, "device-1")
		require.NoError(t, err)
		require.NotNil(t, d.LastSeenAt)
		require.Equal(t, b.clk.Now().UnixMilli(), d.LastSeenAt.UnixMilli(), "the group touched its device")

		// Another command on the device, and a failure in the middle.
		_, err = b.s.Submit(b.ctx, newOp("op-2", "c-2"), nil)
		require.NoError(t, err)
		_, err = b.s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now())
		require.NoError(t, err)
		of2 := func(r wire.Receipt) wire.Receipt { r.OperationID = "op-2"; return r }
		boom, calls := errors.New("boom"), 0
		res, err = b.s.ApplyReceipts(b.ctx, "device-1", []wire.Receipt{of2(receipt("c-2", wire.ReceiptReceived, 1)),
			receipt("c-1", wire.ReceiptSucceeded, 3), of2(receipt("c-2", wire.ReceiptSucceeded, 3))}, func() error {
			if calls++; calls == 2 {
				return boom
			}
			return nil
		})
		require.NoError(t, err)
		require.Len(t, res, 2, "stopped at the failure")
		require.NoError(t, res[0].Err)
		require.Equal(t, EffectApplied, res[0].Out.Effect)
		require.ErrorIs(t, res[1].Err, boom)
		c2, _ := b.s.GetCommand(b.ctx, "c-2")
		require.Equal(t, fsm.CmdReceived, c2.Status, "the one before the failure is committed, the one after it not applied")
		c, _ = b.s.GetCommand(b.ctx, "c-1")
		require.Equal(t, fsm.CmdExecuting, c.Status, "the failed one is rolled back")
		recs, _ := b.s.Receipts(b.ctx, "c-1")
		require.Len(t, recs, 3, "nothing of the failed one recorded")
		op, _ := b.s.GetOperation(b.ctx, "op-1")
		require.Equal(t, fsm.OpStarted, op.Status)
	})
}

// A final receipt's change carries its operation as committed, the same
// as a read after the commit returns: a ?wait= caller is answered with it
// and reads nothing.
func TestOperationEndCarriesItsCommittedRow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		log := &changeLog{}
		b := setupFeed(t, be, log)
		sentCommand(t, b)
		b.clk.Advance(time.Second)
		res, err := b.s.ApplyReceipts(b.ctx, "device-1", []wire.Receipt{receipt("c-1", wire.ReceiptExecuting, 1),
			func() wire.Receipt {
				r := receipt("c-1", wire.ReceiptSucceeded, 2)
				r.Result = json.RawMessage(`{"uptime_s": 0}`)
				return r
			}()}, nil)
		require.NoError(t, err)
		require.Len(t, res, 2)
		var ended []*domain.Operation
		log.mu.Lock()
		for _, f := range log.facts {
			if f.Kind == FactChanged && f.Change.Machine == "operation" && f.Change.To != string(fsm.OpStarted) {
				ended = append(ended, f.Change.Operation)
			}
		}
		log.mu.Unlock()
		require.Len(t, ended, 1)
		require.NotNil(t, ended[0], "the end carries the row")
		read, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, fsm.OpSucceeded, read.Status)
		require.Equal(t, read, *ended[0])
		recs, err := b.s.Receipts(b.ctx, "c-1")
		require.NoError(t, err)
		require.Len(t, recs, 2, "both receipts logged, at the batch's end")
		require.Equal(t, []string{"executing", "succeeded"}, []string{recs[0].Status, recs[1].Status})
	})
}

// A submit to a device online (and deduplicating) as its transaction reads
// it claims the first publish in its own insert: the command as the submit
// returns it is the row as read back (sent, attempt 1, its first check,
// the device's QoS), both moves are in the events log, and a serial one
// queued behind another stays pending.
func TestSubmitClaimsTheFirstPublishInItsInsert(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: true, Session: 1,
			Capabilities: &wire.Capabilities{Dedupe: true}})
		require.NoError(t, err)
		first := b.clk.Now().Add(3 * time.Second)
		claimed := func(n NewOperation) NewOperation {
			n.FromDevice, n.FirstCheck, n.QoS = true, first, 0 // the device's row says 1
			return n
		}
		res, err := b.s.Submit(b.ctx, claimed(newOp("op-1", "c-1")), nil)
		require.NoError(t, err)
		require.True(t, res.Inserted.Claimed)
		read, err := b.s.GetCommand(b.ctx, "c-1")
		require.NoError(t, err)
		require.Equal(t, fsm.CmdSent, read.Status)
		require.Equal(t, 1, read.Attempt)
		require.Equal(t, first.UnixMilli(), read.NextCheckAt.UnixMilli())
		require.NotNil(t, read.LastSentAt)
		require.Equal(t, read, res.Inserted.Command, "the copy the dispatcher publishes is the row")
		events, err := b.s.Events(b.ctx, "c-1")
		require.NoError(t, err)
		var moves []string
		for _, e := range events {
			moves = append(moves, e.From+">"+e.To+" "+e.Reason)
		}
		require.Equal(t, []string{">pending submitted", "pending>sent publish attempt 1"}, moves)

		for i := 1; i <= 2; i++ {
			res, err = b.s.Submit(b.ctx, claimed(serialOp("op-s"+strconv.Itoa(i), "c-s"+strconv.Itoa(i))), nil)
			require.NoError(t, err)
			require.Equal(t, i == 1, res.Inserted.Claimed, "only the head of the queue claims")
		}
		queued, err := b.s.GetCommand(b.ctx, "c-s2")
		require.NoError(t, err)
		require.Equal(t, fsm.CmdPending, queued.Status)
		require.Equal(t, 0, queued.Attempt)
		require.Equal(t, ReasonQueued, queued.Reason)
		require.Equal(t, 1, queued.QoS)
	})
}

// A submit that leaves the decision to the device's row (FromDevice) reads
// it in its transaction: an offline device's command waits (pending), at
// QoS 1 if it deduplicates; a device that does not, or was never seen, gets
// QoS 0.
func TestSubmitFromTheDevicesRow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		for device, online := range map[string]bool{"offline-dedupe": false, "online-legacy": true} {
			_, err := b.s.ApplyPresence(b.ctx, device, wire.Presence{Online: true, Session: 1,
				Capabilities: &wire.Capabilities{Dedupe: device == "offline-dedupe"}})
			require.NoError(t, err)
			if !online {
				_, err := b.s.ApplyPresence(b.ctx, device, wire.Presence{Online: false, Session: 1})
				require.NoError(t, err)
			}
		}
		for device, want := range map[string]struct {
			status fsm.CommandState
			qos    int
		}{"offline-dedupe": {fsm.CmdPending, 1}, "online-legacy": {fsm.CmdSent, 0}, "never-seen": {fsm.CmdPending, 0}} {
			n := newOp("op-"+device, "c-"+device)
			n.Target, n.FromDevice, n.QoS, n.FirstCheck = device, true, 7, b.clk.Now().Add(time.Second)
			res, err := b.s.Submit(b.ctx, n, nil)
			require.NoError(t, err)
			c, err := b.s.GetCommand(b.ctx, n.CommandID)
			require.NoError(t, err)
			require.Equal(t, want.status, c.Status, device)
			require.Equal(t, want.qos, c.QoS, device)
			require.Equal(t, c, res.Inserted.Command, device)
			require.Equal(t, want.status == fsm.CmdSent, res.Inserted.Claimed, device)
		}

		// Its operation_id taken, such a submit inserts nothing (on
		// PostgreSQL the operation and its command are one statement, one
		// round trip less than a submit that names its QoS).
		trips := func(n NewOperation) int64 {
			before := changeTrips(b.s)
			_, err := b.s.Submit(b.ctx, n, nil)
			require.NoError(t, err)
			return changeTrips(b.s) - before
		}
		again := newOp("op-never-seen", "c-again")
		again.Target, again.FromDevice = "never-seen", true
		res, err := b.s.Submit(b.ctx, again, nil)
		require.NoError(t, err)
		require.False(t, res.Created)
		require.Equal(t, "c-never-seen", res.Operation.CommandID)
		_, err = b.s.GetCommand(b.ctx, "c-again")
		require.ErrorIs(t, err, domain.ErrNotFound)
		again.RequestHash = "h2"
		_, err = b.s.Submit(b.ctx, again, nil)
		require.ErrorIs(t, err, domain.ErrKeyReused)
		fromDevice, named := newOp("op-t1", "c-t1"), newOp("op-t2", "c-t2")
		fromDevice.FromDevice = true
		together, apart := trips(fromDevice), trips(named)
		if be == "postgres" {
			require.Equal(t, apart-1, together)
		} else {
			require.Equal(t, apart, together)
		}
	})
}

// A receipt confirms its device and moves its last-seen time, at most
// once a second, and without a statement while this store's own touch is
// that fresh; after UnconfirmAll the next receipt confirms it again at once.
func TestReceiptsTouchTheirDeviceOnceASecond(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentToOnline(t, b)
		apply := func(st wire.ReceiptStatus, seq int) int64 {
			t.Helper()
			return receiptTrips(t, b, receipt("c-1", st, seq))
		}
		device := func() domain.Device {
			t.Helper()
			d, err := b.s.GetDevice(b.ctx, "device-1")
			require.NoError(t, err)
			return d
		}
		b.clk.Advance(time.Second)
		apply(wire.ReceiptReceived, 1)
		t0 := b.clk.Now()
		require.Equal(t, t0.UnixMilli(), device().LastSeenAt.UnixMilli())

		b.clk.Advance(500 * time.Millisecond)
		quiet := apply(wire.ReceiptReceived, 1) // a duplicate: the same statements but the touch
		require.Equal(t, t0.UnixMilli(), device().LastSeenAt.UnixMilli(), "within the second")

		require.NoError(t, b.s.UnconfirmAll(b.ctx))
		require.False(t, device().Confirmed)
		b.clk.Advance(100 * time.Millisecond)
		require.Equal(t, quiet+1, apply(wire.ReceiptReceived, 1), "touched again after UnconfirmAll")
		require.True(t, device().Confirmed, "its next receipt confirms it")

		b.clk.Advance(time.Second)
		require.Equal(t, quiet+1, apply(wire.ReceiptReceived, 1), "and again a second later")
		require.Equal(t, b.clk.Now().UnixMilli(), device().LastSeenAt.UnixMilli())
	})
}

// A command's receipts that arrive together, each moving it forward, are
// applied with one write of the command (and no read: it is in the state
// expected before the first): the same states, events and receipt log as
// one by one, one statement more than a single final receipt on a command
// in the state expected before it (the run's three log rows take two
// inserts instead of one).
func TestApplyReceiptsWritesACommandsRunOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentToOnline(t, b)
		sentAs(t, b, "op-2", "c-2")

		b.clk.Advance(time.Second)
		before := changeTrips(b.s)
		res, err := b.s.ApplyReceipts(b.ctx, "device-1", []wire.Receipt{receipt("c-1", wire.ReceiptReceived, 1),
			receipt("c-1", wire.ReceiptExecuting, 2), receipt("c-1", wire.ReceiptSucceeded, 3)}, nil)
		require.NoError(t, err)
		run := changeTrips(b.s) - before
		require.Len(t, res, 3)
		var tos []fsm.CommandState
		for _, r := range res {
			require.NoError(t, r.Err)
			require.Equal(t, EffectApplied, r.Out.Effect)
			tos = append(tos, r.Out.To)
		}
		require.Equal(t, []fsm.CommandState{fsm.CmdReceived, fsm.CmdExecuting, fsm.CmdSucceeded}, tos)
		c, err := b.s.GetCommand(b.ctx, "c-1")
		require.NoError(t, err)
		require.Equal(t, fsm.CmdSucceeded, c.Status)
		require.Equal(t, 3, c.LastSeq)
		op, err := b.s.GetOperation(b.ctx, "op-1")
		require.NoError(t, err)
		require.Equal(t, fsm.OpSucceeded, op.Status)
		events, err := b.s.Events(b.ctx, "c-1")
		require.NoError(t, err)
		var moves []string
		for _, e := range events {
			moves = append(moves, e.From+">"+e.To+" "+e.Reason)
		}
		require.Equal(t, []string{">pending submitted", "pending>sent publish attempt 1", "sent>received receipt received",
			"received>executing receipt executing", "executing>succeeded receipt succeeded"}, moves)
		recs, err := b.s.Receipts(b.ctx, "c-1")
		require.NoError(t, err)
		require.Len(t, recs, 3)
		for _, r := range recs {
			require.Equal(t, EffectApplied, r.Effect)
		}

		b.clk.Advance(time.Second)
		for seq, st := range []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting} {
			r := receipt("c-2", st, seq+1)
			r.OperationID = "op-2"
			out, err := b.s.ApplyReceipt(b.ctx, "device-1", r, nil)
			require.NoError(t, err)
			require.Equal(t, EffectApplied, out.Effect)
		}
		b.clk.Advance(time.Second) // the device is touched, as for the run
		of2 := receipt("c-2", wire.ReceiptSucceeded, 3)
		of2.OperationID = "op-2"
		require.Equal(t, receiptTrips(t, b, of2)+1, run)
	})
}

// writesTogether sets the store's Capabilities.WritesTogether on the
// writer goroutine, which reads the capabilities while it runs: a change
// of its own orders the write before the next batch's reads.
func writesTogether(t *testing.T, b *testBundle, on bool) {
	t.Helper()
	require.NoError(t, b.s.write(b.ctx, func(context.Context, *tx) error {
		b.s.caps.WritesTogether = on
		return nil
	}))
}

// On PostgreSQL a final receipt ends its command and its operation in one
// statement (CommandAdvanceFinish): one round trip fewer than the two
// statements it takes without (SQLite's way), to the same end and events.
func TestAFinalReceiptEndsItsOperationInOneStatement(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentToOnline(t, b)
		sentAs(t, b, "op-2", "c-2")
		sentAs(t, b, "op-3", "c-3")
		of := func(n int, st wire.ReceiptStatus, seq int) wire.Receipt {
			r := receipt("c-"+strconv.Itoa(n), st, seq)
			r.OperationID = "op-" + strconv.Itoa(n)
			return r
		}
		final := func(n int) int64 {
			t.Helper()
			for seq, st := range []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting} {
				out, err := b.s.ApplyReceipt(b.ctx, "device-1", of(n, st, seq+1), nil)
				require.NoError(t, err)
				require.Equal(t, EffectApplied, out.Effect)
			}
			b.clk.Advance(time.Second) // each final receipt touches the device
			return receiptTrips(t, b, of(n, wire.ReceiptSucceeded, 3))
		}
		final(1) // the first of the store's final receipts reads once more
		together := final(2)
		was := b.s.caps.WritesTogether
		writesTogether(t, b, false)
		apart := final(3)
		writesTogether(t, b, was)
		want := apart
		if be == "postgres" {
			want--
		}
		require.Equal(t, want, together)
		var moves [2][]string
		for i, n := range []string{"2", "3"} {
			op, err := b.s.GetOperation(b.ctx, "op-"+n)
			require.NoError(t, err)
			require.Equal(t, fsm.OpSucceeded, op.Status, n)
			require.Equal(t, []string{"c-" + n}, op.CommandIDs, n)
			events, err := b.s.Events(b.ctx, "op-"+n)
			require.NoError(t, err)
			for _, e := range events {
				moves[i] = append(moves[i], e.From+">"+e.To+" "+strings.ReplaceAll(e.Reason, "c-"+n, "c-N"))
			}
		}
		require.Equal(t, moves[1], moves[0])
		require.Contains(t, moves[0], "started>succeeded command c-N succeeded")
	})
}

// A store alone takes no pre-lock: on PostgreSQL a receipt's batch is one
// statement shorter; SQLite never takes one.
func TestAStoreAloneTakesNoPreLock(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		sentToOnline(t, b)
		apply := func(seq int) int64 {
			t.Helper()
			b.clk.Advance(time.Second) // each touches its device
			return receiptTrips(t, b, receipt("c-1", wire.ReceiptReceived, seq))
		}
		apply(1)
		locked := apply(1) // a duplicate: the same statements each time
		alone := true
		b.s.SetAlone(func() bool { return alone })
		want := locked
		if be == "postgres" {
			want--
		}
		require.Equal(t, want, apply(1), "alone")
		alone = false
		require.Equal(t, locked, apply(1), "no longer alone")
	})
}
