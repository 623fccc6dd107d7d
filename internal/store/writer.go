package store

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
)

// Group commit. Every change goes through one writer goroutine that owns the
// writer connection. It takes what is waiting in its queue (up to
// MaxBatch changes), applies each inside one IMMEDIATE transaction, commits
// once and only then answers every caller. A change that fails or is
// refused never takes its neighbours with it: the batch runs first without
// savepoints and, at the first change that fails, again with a savepoint
// for each (applyBatch), where a failing change rolls back to its savepoint
// and records its refusals there; an error that ends
// the whole transaction (the backend's endsTransaction: with SQLite FULL,
// IOERR, BUSY, INTERRUPT, NOMEM, CORRUPT; with PostgreSQL a lost
// connection or a server shutting down; or a failed COMMIT; or, with SQLite,
// a file of the store no longer at its path, guard.go) fails every change of the batch with a
// *BatchError, and each caller retries as it would after any store error.
// The queue is FIFO, so the changes of one caller (and of one command, which
// its callers apply in order) commit in the order they were made.
//
// A commit has a cost of its own (on SQLite its fsync and the pages every
// batch rewrites: the tails of the time-ordered indexes; on PostgreSQL a
// round trip and the server's fsync). Under load the batches are large
// and that cost is shared; at a moderate rate a writer that commits as
// soon as anything waits makes many small batches, pays the cost for each,
// and is busy nearly all the time, so changes queue behind it. So, as
// PostgreSQL's commit_delay does, while others are in flight (the last
// batch held at least commitSiblings changes) a batch smaller than
// commitTarget waits up to CommitDelay for more before it begins. A lone
// caller never waits: its batch of one has no siblings.

var (
	// ErrOverloaded (domain.ErrOverloaded): the writer's queue was full;
	// the change was not made. Submits get it (503 overloaded with
	// Retry-After); every other change waits for room instead.
	ErrOverloaded = domain.ErrOverloaded
	// ErrClosed: the store was closed before the change was made.
	ErrClosed = errors.New("store: closed")
)

// BatchError is a change that was not made because the transaction it
// shared with others was rolled back as a whole. Nothing of it was written.
type BatchError struct{ Err error }

func (e *BatchError) Error() string {
	return "store: the shared transaction was rolled back, nothing of this change was written: " + e.Err.Error()
}

func (e *BatchError) Unwrap() error { return e.Err }

// Defaults of Config.QueueSize, Config.MaxBatch and Config.CommitDelay.
const (
	DefaultQueueSize   = 1024
	DefaultMaxBatch    = 256
	DefaultCommitDelay = time.Millisecond
)

// A batch waits for more changes (Config.CommitDelay) only when the last
// one held at least commitSiblings changes, and only until it holds
// commitTarget.
const (
	commitSiblings = 4
	commitTarget   = 16
)

// job is one change waiting for the writer.
type job struct {
	ctx   context.Context
	fn    func(context.Context, *tx) error
	locks rowLocks   // the rows it will lock, locked first (preLock)
	done  chan error // buffered: the writer never waits on a caller
	// hooks are the results of the change's hooks (tx.hook), in the order
	// it called them: a change run again (its batch fell back to
	// savepoints, or lost a deadlock) gets them again without calling its
	// hooks, failpoints among them, a second time.
	hooks  []error
	hookAt int
}

// applied is what one change of a committed batch returns and reports.
type applied struct {
	err      error
	notes    []func(Observer)
	refusals []refusal
}

// write makes one change through the writer, waiting for room in its queue,
// and returns once the transaction that holds it committed (or failed). fn
// runs on the writer goroutine with a context that is never cancelled: a
// cancelled statement would interrupt, and so roll back, every change of the
// batch. A caller whose ctx ends before its change is taken gets ctx's error
// and nothing is written; once taken, the change's outcome is always
// returned, so a caller never has to guess whether it committed.
func (s *DB) write(ctx context.Context, fn func(context.Context, *tx) error) error {
	return s.enqueue(ctx, "", rowLocks{}, fn, false)
}

// writeLocking is write for a change that locks the rows named in locks:
// the batch locks them, with every other change's, in one order before any
// change runs (see preLock).
func (s *DB) writeLocking(ctx context.Context, locks rowLocks, fn func(context.Context, *tx) error) error {
	return s.enqueue(ctx, "", locks, fn, false)
}

// writeOrShed is write that returns ErrOverloaded at once when the queue is
// full.
func (s *DB) writeOrShed(ctx context.Context, fn func(context.Context, *tx) error) error {
	return s.enqueue(ctx, "", rowLocks{}, fn, true)
}

// enqueue is write with its options: the rows the change locks, shed
// (ErrOverloaded at once when the queue is full), and change: when not "",
// the Observer is told (Answered) how long a change that committed took
// from here to its answer.
func (s *DB) enqueue(ctx context.Context, change string, locks rowLocks, fn func(context.Context, *tx) error, shed bool) (err error) {
	if change != "" {
		start := time.Now()
		defer func() {
			if err == nil {
				s.obs.Answered(change, time.Since(start))
			}
		}()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	j := &job{ctx: ctx, fn: fn, locks: locks, done: make(chan error, 1)}
	if shed {
		select {
		case s.queue <- j:
		case <-s.quit:
			return ErrClosed
		default:
			return ErrOverloaded
		}
	} else {
		select {
		case s.queue <- j:
		case <-s.quit:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case err := <-j.done:
		return err
	case <-s.stopped:
		// The writer answers every job it took before it stops.
		select {
		case err := <-j.done:
			return err
		default:
			return ErrClosed
		}
	}
}

// runWriter is the writer goroutine: it gathers and commits batches until
// the store closes.
func (s *DB) runWriter() {
	defer close(s.stopped)
	defer s.dropWriterConn()
	batch := make([]*job, 0, s.maxBatch)
	var delay *time.Timer
	last := 0 // the last batch's changes
	for {
		select {
		case j := <-s.queue:
			batch = append(batch[:0], j)
		case <-s.quit:
			return
		}
	gather:
		for len(batch) < s.maxBatch {
			select {
			case j := <-s.queue:
				batch = append(batch, j)
			default:
				break gather
			}
		}
		if s.commitDelay > 0 && last >= commitSiblings && len(batch) < commitTarget {
			if s.delaying != nil {
				s.delaying(len(batch))
			}
			if delay == nil {
				delay = time.NewTimer(s.commitDelay)
			} else {
				delay.Reset(s.commitDelay)
			}
		wait:
			for len(batch) < commitTarget {
				select {
				case j := <-s.queue:
					batch = append(batch, j)
				case <-delay.C:
					break wait
				case <-s.quit:
					break wait
				}
			}
			delay.Stop()
		}
		last = len(batch)
		if s.caps.ListsDevicesInBulk && !s.now().Before(s.listedAt.Add(deviceListEvery)) {
			s.listedAt = s.now()
			batch = slices.Insert(batch, 0, &job{ctx: context.Background(), fn: s.listDevices, done: make(chan error, 1)})
		}
		s.commitBatch(batch)
		clear(batch)
		if s.caps.Prepares {
			s.wstmts.prepareMissed(context.Background())
		}
	}
}

// deviceListEvery is how often the writer moves the pending operations
// and commands into the lists' device indexes (ListsDevicesInBulk): first
// in the first batch once this long has passed on the store's clock, a
// full one included (one change beyond MaxBatch), so that a writer whose
// batches are always full still moves them.
// A list by device reads the pending rows by a walk of their own index,
// so they are kept to about this long's worth; and the move runs in a
// batch others wait for, 6 to 9 ms for the 1,300 rows of a second at
// 1,300 operations a second, so it runs twice a second rather than once.
const deviceListEvery = 500 * time.Millisecond

// listDevices is the change that moves every pending operation and
// command into the lists' device indexes (migration 0014 of SQLite). Nobody
// waits for it: if its batch fails, the rows stay pending, which the lists
// read as well, until the next one.
func (s *DB) listDevices(ctx context.Context, t *tx) error {
	if s.beforeListMove != nil {
		if err := t.hook(s.beforeListMove); err != nil {
			return err
		}
	}
	for _, q := range []string{s.q.DeviceListOperations, s.q.DeviceListCommands} {
		s.moveTrips.Add(1)
		if _, err := t.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// commitBatch applies, commits and answers one batch. Observations are
// reported before the callers are answered, so a caller that returns sees
// its change counted.
func (s *DB) commitBatch(batch []*job) {
	start := time.Now()
	res := make([]applied, len(batch))
	fellBack, err := s.applyBatch(batch, res)
	for run := 1; err != nil && s.d.Conflict(err); run++ {
		s.obs.Deadlock()
		if run == maxConflictRuns {
			break
		}
		// Nothing of it committed and no caller was answered: run it again,
		// after the other instance's batch that won.
		clear(res)
		fellBack, err = s.applyBatch(batch, res)
	}
	if err != nil {
		berr := &BatchError{Err: err}
		for _, j := range batch {
			j.done <- berr
		}
		return
	}
	s.obs.Batch(len(batch), time.Since(start), fellBack)
	for i, j := range batch {
		s.report(res[i].notes, res[i].refusals)
		j.done <- res[i].err
	}
}

// applyBatch runs every change of the batch in one transaction and commits
// it. It returns an error only when the transaction as a whole failed; each
// change's own error is in res; fellBack says it ran a second time.
//
// A batch runs first without savepoints: most changes stand, and a
// SAVEPOINT and a RELEASE each cost a statement. At the first change that
// fails, that transaction is rolled back and the batch runs again with a
// savepoint for each change, the failed one answered with the error it
// met (and its refusals recorded) without running it again, unless it
// asked to run again (errRunCarefully). The changes before it run twice;
// their hooks are called once (tx.hook).
func (s *DB) applyBatch(batch []*job, res []applied) (fellBack bool, err error) {
	failed, err := s.runBatch(batch, res, nil)
	if err != nil || failed == nil {
		return false, err
	}
	clear(res)
	_, err = s.runBatch(batch, res, failed)
	return true, err
}

// errRunCarefully is a change's answer to an optimistic run that it must
// not be answered from: one of its parts failed, and it runs again under
// savepoints (tx.careful) that let its other parts stand.
var errRunCarefully = errors.New("store: the change runs again under savepoints")

// failedChange is the change an optimistic run stopped at.
type failedChange struct {
	index int
	run   changeRun
}

// runBatch runs the batch in one transaction and commits it. With failed
// nil it runs the changes without savepoints and, at the first one that
// fails, rolls back and returns it (nothing committed); with failed set it
// runs each under a savepoint and answers the failed one from its run.
func (s *DB) runBatch(batch []*job, res []applied, failed *failedChange) (*failedChange, error) {
	// Once a file of the store left its path (guard.go), nothing more is
	// committed: it would go into a file nobody opens again.
	if err := s.files.failed(); err != nil {
		return nil, err
	}
	ctx := context.Background()
	conn, err := s.writerConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("writer connection: %w", err)
	}
	bt := &tx{c: conn, s: s}
	if err := bt.execFixed(ctx, s.d.Begin()); err != nil {
		// A transaction left open on the connection ends here, and a dead
		// connection is given up: the next batch begins afresh.
		s.rollback(ctx, bt)
		return nil, fmt.Errorf("begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			s.rollback(ctx, bt)
		}
	}()
	if err := s.preLock(ctx, bt, batch); err != nil {
		return nil, err
	}
	// The batch's lists reuse the writer's buffers of the last batch.
	wakes, events, receipts := s.scratch.wakes[:0], s.scratch.events[:0], s.scratch.receipts[:0]
	defer func() {
		clear(wakes)
		clear(events)
		clear(receipts)
		s.scratch.wakes, s.scratch.events, s.scratch.receipts = wakes[:0], events[:0], receipts[:0]
	}()
	for i, j := range batch {
		if err := j.ctx.Err(); err != nil {
			res[i].err = err // the caller gave up before its turn: nothing written
			continue
		}
		var t changeRun
		switch {
		case failed == nil:
			if t, err = s.runOptimistic(ctx, conn, j); err == nil && t.err != nil {
				return &failedChange{index: i, run: t}, nil
			}
		case i == failed.index && !errors.Is(failed.run.err, errRunCarefully):
			t = failed.run
			t.notes, t.wakes, t.events, t.receipts = nil, nil, nil, nil // rolled back with its run
			t.recordRefusals()
		default:
			t, err = s.applyChange(ctx, conn, j)
		}
		if err != nil {
			return nil, err
		}
		if t.err == nil {
			wakes = append(wakes, t.wakes...)
			receipts = append(receipts, t.receipts...)
		}
		events = append(events, t.events...)
		res[i] = applied{err: t.err, notes: t.notes, refusals: t.refusals}
	}
	// The events and receipt rows of the whole batch in a few multi-row
	// statements: a failure here is the transaction's, like a failed
	// COMMIT, and every caller is told to try again.
	if err := bt.insertEvents(ctx, events); err != nil {
		return nil, err
	}
	if err := bt.insertReceipts(ctx, receipts); err != nil {
		return nil, err
	}
	sent, err := s.d.Notify(ctx, conn, wakes)
	if sent {
		s.trips.Add(1)
	}
	if err != nil {
		return nil, fmt.Errorf("notify: %w", err)
	}
	// The store's files are checked on both sides of the COMMIT (guard.go):
	// before it, so that a batch is not committed into a file that left its
	// path; after it, so that no caller hears of a commit that may have
	// gone into one (the file left during the commit).
	if err := s.files.check(); err != nil {
		return nil, fmt.Errorf("before commit: %w", err)
	}
	if err := bt.execFixed(ctx, "COMMIT"); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	committed = true
	if err := s.files.check(); err != nil {
		return nil, fmt.Errorf("after commit: %w", err)
	}
	return nil, nil
}

// rowLocks names the rows a change will lock: commands by command_id, the
// open commands of operations and of devices, devices' own rows (inserted
// first if missing), and devices' queues (device_queues, likewise).
type rowLocks struct {
	commands, operations, devices []string
	deviceRows                    []string
	queues                        []string
}

// lockCommands is rowLocks of command ids.
func lockCommands(ids ...string) rowLocks { return rowLocks{commands: ids} }

// preLock locks, before any change of the batch runs, the rows its changes
// said they would lock: the commands in command_id order, then the
// devices in device_id order (PostgreSQL; SQLite's one writer needs no row
// locks). Batches of several instances lock the rows they share in the
// same order, so they wait for each other instead of deadlocking: without
// it, two batches that each held a receipt for the other's command (the
// shared subscription spreads one command's receipts over the instances)
// each locked one, waited for the other, and one of them lost a deadlock,
// a second of waiting each time (the server's deadlock_timeout) before it
// ran again. An instance alone (SetAlone) takes none: on PostgreSQL each
// row lock writes its tuple, and the pre-lock was the server's second
// costliest statement (4.5 to 5 ms a batch at saturation).
func (s *DB) preLock(ctx context.Context, t *tx, batch []*job) error {
	if !s.caps.RowLocks || s.isAlone() {
		return nil
	}
	var cmds, ops, devs, devRows, queues []string
	for _, j := range batch {
		cmds = append(cmds, j.locks.commands...)
		ops = append(ops, j.locks.operations...)
		devs = append(devs, j.locks.devices...)
		devRows = append(devRows, j.locks.deviceRows...)
		queues = append(queues, j.locks.queues...)
	}
	if len(cmds)+len(ops)+len(devs) > 0 {
		if err := lockRows(ctx, t, s.q.PreLockCommands, cmds, ops, devs); err != nil {
			return fmt.Errorf("lock the batch's commands: %w", err)
		}
	}
	if len(devRows) > 0 {
		// A device seen for the first time is inserted here, in the same
		// order: two instances inserting the same new devices (every
		// instance applies every presence) wait on the same key first.
		if _, err := t.ExecContext(ctx, s.q.PreLockInsertDevices, ms(s.now()), devRows); err != nil {
			return fmt.Errorf("insert the batch's devices: %w", err)
		}
		if err := lockRows(ctx, t, s.q.PreLockDevices, devRows); err != nil {
			return fmt.Errorf("lock the batch's devices: %w", err)
		}
	}
	if len(queues) > 0 {
		// Last, in device order, each once (a statement may not update a
		// row twice): the queues of the batch's serial submits.
		slices.Sort(queues)
		if _, err := t.ExecContext(ctx, s.q.PreLockQueues, slices.Compact(queues)); err != nil {
			return fmt.Errorf("lock the batch's queues: %w", err)
		}
	}
	return nil
}

// lockRows runs a locking query to its end (its rows are locked as they
// are read).
func lockRows(ctx context.Context, t *tx, query string, args ...any) error {
	rows, err := t.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

// maxConflictRuns bounds how often a batch that lost a deadlock (or a
// serialisation failure) to another instance's batch is run again.
const maxConflictRuns = 5

// changeRun is one change as it stood at its RELEASE: its own error (nil,
// refused or failed), and what it reports.
type changeRun struct {
	*tx
	err error
}

// applyChange runs one change under its savepoint. A change that fails is
// rolled back to its savepoint, its refusals recorded there. The error
// returned ends the whole batch: one that ends the transaction, and a
// conflict with another instance's batch (the rows this batch locked
// earlier stay locked until it rolls back, so the change alone cannot win
// by running again; the whole batch runs again instead).
func (s *DB) applyChange(ctx context.Context, conn *sql.Conn, j *job) (changeRun, error) {
	t := s.newTx(conn, j)
	t.careful = true
	ferr, err := t.savepoint(ctx, "change", func() error { return runChange(ctx, j.fn, t) }, func() error {
		// A refused transition is on record whether or not its change stood.
		t.recordRefusals()
		return nil
	})
	if err != nil {
		return changeRun{}, err
	}
	return changeRun{tx: t, err: ferr}, nil
}

// runOptimistic runs one change without a savepoint. Its own error is in
// the changeRun; the error returned is one that ends the whole batch, as
// for applyChange.
func (s *DB) runOptimistic(ctx context.Context, conn *sql.Conn, j *job) (changeRun, error) {
	t := s.newTx(conn, j)
	ferr := runChange(ctx, j.fn, t)
	if ferr != nil && (s.d.EndsTransaction(ferr) || s.d.Conflict(ferr)) {
		return changeRun{}, ferr
	}
	return changeRun{tx: t, err: ferr}, nil
}

// newTx is a change's view of the batch's transaction, with its own "now".
func (s *DB) newTx(conn *sql.Conn, j *job) *tx {
	j.hookAt = 0
	return &tx{c: conn, s: s, now: s.now().UTC(), instance: s.instance, j: j}
}

// hook calls h, a change's hook (a failpoint), once per change however
// often the change runs: a run again gets the result of the first call.
func (t *tx) hook(h func() error) error {
	j := t.j
	if j.hookAt < len(j.hooks) {
		j.hookAt++
		return j.hooks[j.hookAt-1]
	}
	err := h()
	j.hooks = append(j.hooks, err)
	j.hookAt++
	return err
}

// savepoint runs fn under the savepoint name. When fn fails, the
// transaction is rolled back to the savepoint and the notes and wake-ups fn
// added are dropped; then release runs (nil: nothing), still inside the
// savepoint, and the savepoint is released. It returns fn's own error, and
// apart from it an error that ends the whole batch: one that ends the
// transaction, a conflict with another instance's batch, or a failed
// savepoint statement.
func (t *tx) savepoint(ctx context.Context, name string, fn, release func() error) (ferr, batchErr error) {
	if err := t.execFixed(ctx, `SAVEPOINT `+name); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	notes, wakes, events, receipts := len(t.notes), len(t.wakes), len(t.events), len(t.receipts)
	if ferr = fn(); ferr != nil {
		if t.s.d.EndsTransaction(ferr) || t.s.d.Conflict(ferr) {
			return ferr, ferr
		}
		if err := t.execFixed(ctx, `ROLLBACK TO SAVEPOINT `+name); err != nil {
			return ferr, fmt.Errorf("rollback to savepoint: %w (after %v)", err, ferr)
		}
		t.notes, t.wakes, t.events, t.receipts = t.notes[:notes], t.wakes[:wakes], t.events[:events], t.receipts[:receipts]
	}
	if release != nil {
		if err := release(); err != nil {
			return ferr, err
		}
	}
	if err := t.execFixed(ctx, `RELEASE SAVEPOINT `+name); err != nil {
		return ferr, fmt.Errorf("release savepoint: %w", err)
	}
	return ferr, nil
}

// execFixed runs one of the writer's own statements (no arguments), through
// its prepared statement where the backend prepares: go-sqlite3 parses a
// statement without arguments afresh on every run.
func (t *tx) execFixed(ctx context.Context, query string) error {
	t.s.trips.Add(1)
	if st := t.stmt(query); st != nil {
		_, err := st.ExecContext(ctx)
		return err
	}
	_, err := t.c.ExecContext(ctx, query)
	return err
}

// The writer's connection. The writer sends BEGIN, COMMIT and ROLLBACK on
// it itself: every query of a *sql.Tx started a goroutine that watched the
// transaction's context for its rows (database/sql), and a statement had
// to be bound to the transaction before each run; the two cost about a
// fifth of the CPU of the store's batched benchmark.

// writerConn is the writer's connection, taken from its pool of one when
// it has none: at the first batch, and after one that broke it.
func (s *DB) writerConn(ctx context.Context) (*sql.Conn, error) {
	if s.wconn != nil {
		return s.wconn, nil
	}
	c, err := s.w.Conn(ctx)
	if err != nil {
		return nil, err
	}
	s.wconn = c
	s.wstmts.reset(c)
	return c, nil
}

// rollback ends a batch's transaction that did not commit. A dead
// connection (database/sql closed it on the driver's ErrBadConn) is given
// up, and the next batch takes a new one. Any other failure to roll back
// is SQLite's when the error that stopped the batch already ended the
// transaction (a full disk, an I/O error), and the connection stays:
// closed while no reader holds the file open, SQLite's writer would take
// the WAL with it, and the store's file guard (guard.go) refuses the new
// WAL of the next connection.
func (s *DB) rollback(ctx context.Context, t *tx) {
	err := t.execFixed(ctx, "ROLLBACK")
	if errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		s.dropWriterConn()
	}
}

// dropWriterConn gives the writer's connection up, its statements closed:
// back to its pool, or nowhere when database/sql already closed it.
func (s *DB) dropWriterConn() {
	if s.wconn == nil {
		return
	}
	s.wstmts.reset(nil)
	_ = s.wconn.Close()
	s.wconn = nil
}

// runChange runs one change, turning a panic into its error: one broken
// change must not take the writer, and every other caller, down with it.
func runChange(ctx context.Context, fn func(context.Context, *tx) error, t *tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store: change panicked: %v", p)
		}
	}()
	return fn(ctx, t)
}
