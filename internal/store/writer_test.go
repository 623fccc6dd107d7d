package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/stretchr/testify/require"
)

// holdWriter makes the writer busy with a change that waits until release
// is called, so the changes queued meanwhile form the next batch.
func holdWriter(t *testing.T, s *DB) (release func()) {
	t.Helper()
	entered, gate := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.write(context.Background(), func(context.Context, *tx) error {
			close(entered)
			<-gate
			return nil
		})
	}()
	<-entered
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(gate)
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(release)
	return release
}

// queued starts change in a goroutine and returns once it waits in the
// writer's queue, so changes queue in the order they are started.
func queued(t *testing.T, s *DB, change func() error) <-chan error {
	t.Helper()
	before := len(s.queue)
	out := start(change)
	require.Eventually(t, func() bool { return len(s.queue) > before }, 10*time.Second, time.Millisecond,
		"the change never reached the writer's queue")
	return out
}

func TestGroupCommitIsolatesAFailingChange(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		release := holdWriter(t, b.s)
		batchesBefore := b.obs.batches

		okA := queued(t, b.s, func() error { _, err := b.s.Submit(b.ctx, newOp("op-a", "c-a"), nil); return err })
		injected := errors.New("injected")
		failing := queued(t, b.s, func() error {
			_, err := b.s.Submit(b.ctx, newOp("op-x", "c-x"), func() error { return injected })
			return err
		})
		panicking := queued(t, b.s, func() error {
			return b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
				if _, err := t.ExecContext(ctx, `UPDATE operations SET action = 'wiped'`); err != nil {
					return err
				}
				panic("a broken change")
			})
		})
		okB := queued(t, b.s, func() error { _, err := b.s.Submit(b.ctx, newOp("op-b", "c-b"), nil); return err })
		release()

		require.NoError(t, <-okA)
		require.ErrorIs(t, <-failing, injected)
		require.ErrorContains(t, <-panicking, "panicked")
		require.NoError(t, <-okB)
		for _, id := range []string{"op-a", "op-b"} {
			op, err := b.s.GetOperation(b.ctx, id)
			require.NoError(t, err, "%s must have committed beside the failing changes", id)
			require.Equal(t, "restart", op.Action, "the panicking change's update must be rolled back")
		}
		_, err := b.s.GetOperation(b.ctx, "op-x")
		require.ErrorIs(t, err, domain.ErrNotFound, "the failing change must leave nothing")
		_, err = b.s.GetCommand(b.ctx, "c-x")
		require.ErrorIs(t, err, domain.ErrNotFound)

		b.obs.mu.Lock()
		defer b.obs.mu.Unlock()
		require.Equal(t, batchesBefore+2, b.obs.batches, "the held change, then the four queued ones in one commit")
	})
}

// noop is a change that writes nothing.
func noop(s *DB) func() error {
	return func() error { return s.write(context.Background(), func(context.Context, *tx) error { return nil }) }
}

// start runs change in a goroutine; its error comes on the channel (see
// queued, to have it wait in the queue first).
func start(change func() error) <-chan error {
	out := make(chan error, 1)
	go func() { out <- change() }()
	return out
}

// siblings commits n changes together, as when several callers are in
// flight, so that the writer's next batch may wait for more.
func siblings(t *testing.T, s *DB, n int) {
	t.Helper()
	release := holdWriter(t, s)
	var all []<-chan error
	for range n {
		all = append(all, queued(t, s, noop(s)))
	}
	release()
	for _, ch := range all {
		require.NoError(t, <-ch)
	}
}

// While others are in flight, a small batch waits (CommitDelay) for more
// changes and commits them together: here a change the writer had already
// taken when the fifteen others came, which would otherwise have
// committed alone.
func TestSmallBatchWaitsForMoreWhileOthersAreInFlight(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setupConfig(t, be, func(c *Config) { c.CommitDelay = time.Minute })
		waiting := make(chan int, 1)
		b.s.delaying = func(n int) { // set before the writer's next receive: no race
			select {
			case waiting <- n:
			default:
			}
		}
		siblings(t, b.s, commitSiblings)
		b.obs.mu.Lock()
		before := b.obs.batches
		b.obs.mu.Unlock()

		all := []<-chan error{start(noop(b.s))}
		select {
		case n := <-waiting:
			require.Equal(t, 1, n, "the writer took the one change and waits")
		case <-time.After(10 * time.Second):
			t.Fatal("the writer never waited for more changes")
		}
		for range commitTarget - 1 {
			all = append(all, start(noop(b.s)))
		}
		for _, ch := range all {
			require.NoError(t, <-ch)
		}
		b.obs.mu.Lock()
		defer b.obs.mu.Unlock()
		require.Equal(t, before+1, b.obs.batches, "the taken change waited and committed with the %d after it", commitTarget-1)
	})
}

// The wait ends after CommitDelay when no more changes come, and a lone
// caller (a batch of one before it) never waits.
func TestCommitDelayIsBoundedAndSparesALoneCaller(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		const delay = 300 * time.Millisecond
		b := setupConfig(t, be, func(c *Config) { c.CommitDelay = delay })
		siblings(t, b.s, commitSiblings)
		began := time.Now()
		require.NoError(t, noop(b.s)())
		require.GreaterOrEqual(t, time.Since(began), delay, "after a batch of siblings a lone change waits for company")

		// That batch held one change: the next ones do not begin to wait
		// (any wait calls delaying).
		var waited atomic.Bool
		b.s.delaying = func(int) { waited.Store(true) } // set before the writer's next receive: no race
		for range 5 {
			require.NoError(t, noop(b.s)())
		}
		require.False(t, waited.Load(), "a lone caller's changes must not wait")

		// Never, when the delay is negative: the batch after the siblings
		// does not begin to wait (any wait at all, the default's 1 ms
		// included, calls delaying).
		off := setupConfig(t, be, func(c *Config) { c.CommitDelay = -1 })
		waited.Store(false)
		off.s.delaying = func(int) { waited.Store(true) } // set before the writer's next receive: no race
		siblings(t, off.s, commitSiblings)
		require.NoError(t, noop(off.s)())
		require.False(t, waited.Load(), "a negative delay turns the wait off")
	})
}

func TestGroupCommitFailsTheWholeBatchWhenTheDiskIsFull(t *testing.T) {
	b := setup(t, "sqlite")
	var pages int
	var conn *sql.Conn // the writer's connection
	require.NoError(t, b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
		conn = t.c
		if err := t.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
			return err
		}
		_, err := t.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages+2))
		return err
	}))
	release := holdWriter(t, b.s)
	small := queued(t, b.s, func() error { _, err := b.s.Submit(b.ctx, newOp("op-small", "c-small"), nil); return err })
	big := newOp("op-big", "c-big")
	big.Params = []byte(`{"blob":"` + strings.Repeat("x", 256<<10) + `"}`)
	huge := queued(t, b.s, func() error { _, err := b.s.Submit(b.ctx, big, nil); return err })
	release()

	for _, ch := range []<-chan error{small, huge} {
		err := <-ch
		var be *BatchError
		require.ErrorAs(t, err, &be, "every change of a batch the disk could not hold fails: %v", err)
	}
	_, err := b.s.GetOperation(b.ctx, "op-small")
	require.ErrorIs(t, err, domain.ErrNotFound, "nothing of a failed batch is written")

	// Room again: the caller's retry of the same change succeeds.
	var after *sql.Conn
	require.NoError(t, b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
		after = t.c
		_, err := t.ExecContext(ctx, `PRAGMA max_page_count = 1073741823`)
		return err
	}))
	// The writer kept its connection: closed while no reader held the file
	// open, it would have taken the WAL with it, and the file guard refuses
	// the new WAL of the next connection (the database "replaced").
	require.Same(t, conn, after, "the failed batch's connection is kept")
	_, err = b.s.Submit(b.ctx, newOp("op-small", "c-small"), nil)
	require.NoError(t, err)
}

// The batch's lines of the events log go in at its end, in multi-row
// INSERTs that SQLite runs without a statement journal (OR FAIL): a row
// refused there leaves the rows before it in the transaction. The batch
// then fails as a whole, so none of them, and none of its changes, is
// committed.
func TestAFailingEventsInsertFailsTheWholeBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		var before int
		require.NoError(t, b.s.r.QueryRowContext(b.ctx, `SELECT COUNT(*) FROM events`).Scan(&before))
		release := holdWriter(t, b.s)
		// Three good lines, then the refused one: the fourth row of the
		// batch's first INSERT (of at least four rows).
		refused := queued(t, b.s, func() error {
			return b.s.write(b.ctx, func(_ context.Context, w *tx) error {
				for i := range 3 {
					w.logEvent("device", fmt.Sprintf("dev-%d", i), "offline", "online", "a good line", 0)
				}
				w.logEvent("no-such-machine", "x", "a", "b", "refused by the events table's CHECK", 0)
				return nil
			})
		})
		first := queued(t, b.s, func() error { _, err := b.s.Submit(b.ctx, newOp("op-first", "c-first"), nil); return err })
		release()

		for _, ch := range []<-chan error{refused, first} {
			err := <-ch
			var be *BatchError
			require.ErrorAs(t, err, &be, "every change of the batch fails: %v", err)
			require.ErrorContains(t, err, "record events")
		}
		_, err := b.s.GetOperation(b.ctx, "op-first")
		require.ErrorIs(t, err, domain.ErrNotFound, "nothing of the failed batch is written")
		var after int
		require.NoError(t, b.s.r.QueryRowContext(b.ctx, `SELECT COUNT(*) FROM events`).Scan(&after))
		require.Equal(t, before, after, "none of the batch's events, not even those before the refused one")

		_, err = b.s.Submit(b.ctx, newOp("op-first", "c-first"), nil)
		require.NoError(t, err, "the caller's retry goes in")
	})
}

func TestSubmitIsShedWhenTheQueueIsFull(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		s, err := testOpen(context.Background(), Config{Path: testDSN(t, be), Instance: "i1", QueueSize: 1})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		ctx := context.Background()

		release := holdWriter(t, s)
		waiting := queued(t, s, func() error { _, err := s.Submit(ctx, newOp("op-1", "c-1"), nil); return err })
		_, err = s.Submit(ctx, newOp("op-2", "c-2"), nil)
		require.ErrorIs(t, err, ErrOverloaded)
		release()
		require.NoError(t, <-waiting)
		_, err = s.GetOperation(ctx, "op-2")
		require.ErrorIs(t, err, domain.ErrNotFound, "a shed submit writes nothing")
		_, err = s.Submit(ctx, newOp("op-2", "c-2"), nil)
		require.NoError(t, err, "the retry succeeds once there is room")
	})
}

func TestAChangeGivenUpBeforeItsTurnWritesNothing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		release := holdWriter(t, b.s)
		ctx, cancel := context.WithCancel(b.ctx)
		gaveUp := queued(t, b.s, func() error { _, err := b.s.Submit(ctx, newOp("op-1", "c-1"), nil); return err })
		cancel()
		release()
		require.ErrorIs(t, <-gaveUp, context.Canceled)
		_, err := b.s.GetOperation(b.ctx, "op-1")
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
}

func TestClosedStoreRefusesChanges(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		s, err := testOpen(context.Background(), Config{Path: testDSN(t, be), Instance: "i1"})
		require.NoError(t, err)
		require.NoError(t, s.Close())
		_, err = s.Submit(context.Background(), newOp("op-1", "c-1"), nil)
		require.ErrorIs(t, err, ErrClosed)
	})
}

// Statements are prepared once: the writer's after the batch that first
// ran them (its one connection is busy during a batch), the readers' on
// first use; the same changes and reads then run prepared.
func TestStatementsArePreparedOnce(t *testing.T) {
	b := setup(t, "sqlite")
	prepared := func(c *stmtCache) int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.m) }
	_, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
	require.NoError(t, err)
	// The writer prepares right after answering: wait for it to be done.
	require.NoError(t, b.s.write(b.ctx, func(context.Context, *tx) error { return nil }))
	afterFirst := prepared(b.s.wstmts)
	require.NotZero(t, afterFirst, "the submit's statements are prepared after its batch")
	_, err = b.s.Submit(b.ctx, newOp("op-2", "c-2"), nil)
	require.NoError(t, err)
	require.NoError(t, b.s.write(b.ctx, func(context.Context, *tx) error { return nil }))
	require.Equal(t, afterFirst, prepared(b.s.wstmts), "a second submit needs no new statement")

	for _, id := range []string{"op-1", "op-2"} {
		op, err := b.s.GetOperation(b.ctx, id)
		require.NoError(t, err)
		require.Equal(t, []string{"c" + id[2:]}, op.CommandIDs, "prepared reads return the right rows")
	}
	require.NotZero(t, prepared(b.s.rq.c))
}

// A batch's events are written together at its end, across the chunk
// sizes of the multi-row INSERT, in the order the changes made them: a
// change that failed leaves only its refusals.
func TestBatchEventsKeepTheirOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		release := holdWriter(t, b.s)
		const first, second = 300, 7 // 308 lines in one batch: 256, 16, 16, 16 and 4
		emit := func(from, n int) func(context.Context, *tx) error {
			return func(_ context.Context, t *tx) error {
				for i := from; i < from+n; i++ {
					if err := t.event("command", "c-order", fmt.Sprint(i), fmt.Sprint(i+1), "step", 0); err != nil {
						return err
					}
				}
				return nil
			}
		}
		a := queued(t, b.s, func() error { return b.s.write(b.ctx, emit(0, first)) })
		injected := errors.New("injected")
		failing := queued(t, b.s, func() error {
			return b.s.write(b.ctx, func(ctx context.Context, t *tx) error {
				if err := emit(1000, 5)(ctx, t); err != nil {
					return err
				}
				t.refuse("command", "c-order", "x", "y", ReasonStale, 0)
				return injected
			})
		})
		c := queued(t, b.s, func() error { return b.s.write(b.ctx, emit(first, second)) })
		release()
		require.NoError(t, <-a)
		require.ErrorIs(t, <-failing, injected)
		require.NoError(t, <-c)

		events, err := b.s.Events(b.ctx, "c-order")
		require.NoError(t, err)
		require.Len(t, events, first+1+second)
		var got []string
		for _, e := range events {
			got = append(got, fmt.Sprintf("%s>%s/%v", e.From, e.To, e.Refused))
		}
		var want []string
		for i := 0; i < first; i++ {
			want = append(want, fmt.Sprintf("%d>%d/false", i, i+1))
		}
		want = append(want, "x>y/true") // the failed change: its refusal, not its events
		for i := first; i < first+second; i++ {
			want = append(want, fmt.Sprintf("%d>%d/false", i, i+1))
		}
		require.Equal(t, want, got)
	})
}

// A batch runs without savepoints until a change fails; then it runs again
// with them, the failed change answered from its first run. Every change's
// hook (its failpoint) is called once all the same, and the changes before
// and after the failed one commit.
func TestFallbackToSavepointsCallsEachHookOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		release := holdWriter(t, b.s)
		var mu sync.Mutex
		calls := map[string]int{}
		hook := func(id string, err error) func() error {
			return func() error {
				mu.Lock()
				defer mu.Unlock()
				calls[id]++
				return err
			}
		}
		injected := errors.New("injected")
		submit := func(id string, err error) <-chan error {
			return queued(t, b.s, func() error {
				_, serr := b.s.Submit(b.ctx, newOp(id, "c-"+id), hook(id, err))
				return serr
			})
		}
		first, failing, last := submit("op-1", nil), submit("op-2", injected), submit("op-3", nil)
		release()
		require.NoError(t, <-first)
		require.ErrorIs(t, <-failing, injected)
		require.NoError(t, <-last)
		require.Equal(t, map[string]int{"op-1": 1, "op-2": 1, "op-3": 1}, calls, "each hook once, though op-1 ran twice")
		for id, want := range map[string]error{"op-1": nil, "op-2": domain.ErrNotFound, "op-3": nil} {
			_, err := b.s.GetOperation(b.ctx, id)
			if want == nil {
				require.NoError(t, err, id)
			} else {
				require.ErrorIs(t, err, want, id)
			}
		}
		events, err := b.s.Events(b.ctx, "op-1")
		require.NoError(t, err)
		require.Len(t, events, 1, "op-1's run that was rolled back left no event")
		b.obs.mu.Lock()
		defer b.obs.mu.Unlock()
		require.Equal(t, 1, b.obs.fallbacks, "one batch fell back (the held change's did not)")
	})
}

// The observer hears how long each submit and each call applying receipts
// waited for its answer, the writer's queue included, and only of changes
// that committed.
func TestTheWriterTellsHowLongItsAnswersTook(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		release := holdWriter(t, b.s)
		called := time.Now()
		submitted := queued(t, b.s, func() error { _, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil); return err })
		// The submit waits in the queue while the writer is held: a wait
		// of its own that its answer's time must include.
		const held = 20 * time.Millisecond
		<-time.After(held)
		release()
		require.NoError(t, <-submitted)
		bound := time.Since(called)
		took := b.obs.answers(ChangeSubmit)
		require.Len(t, took, 1)
		require.GreaterOrEqual(t, took[0], held, "the time in the writer's queue is part of the answer's")
		require.LessOrEqual(t, took[0], bound)

		other := newOp("op-1", "c-2")
		other.RequestHash = "h2"
		_, err := b.s.Submit(b.ctx, other, nil)
		require.ErrorIs(t, err, domain.ErrKeyReused)
		require.Len(t, b.obs.answers(ChangeSubmit), 1, "a refused submit committed nothing")

		sentCommand(t, b)
		_, err = b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-1", wire.ReceiptReceived, 1), nil)
		require.NoError(t, err)
		out, err := b.s.ApplyReceipt(b.ctx, "device-1", receipt("c-unknown", wire.ReceiptReceived, 1), nil)
		require.NoError(t, err)
		require.Equal(t, EffectUnknownCommand, out.Effect, "recorded in the receipt log: a commit too")
		res, err := b.s.ApplyReceipts(b.ctx, "device-1", []wire.Receipt{receipt("c-1", wire.ReceiptExecuting, 2),
			receipt("c-1", wire.ReceiptSucceeded, 3)}, nil)
		require.NoError(t, err)
		require.Len(t, res, 2)
		require.Len(t, b.obs.answers(ChangeReceipts), 3, "two calls of one receipt, one call of two")
	})
}
