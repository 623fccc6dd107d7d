package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mattn/go-sqlite3"
)

// Group commit. Every change goes through one writer goroutine that owns the
// writer connection. It takes what is waiting in its queue (up to
// MaxBatch changes), applies each inside one IMMEDIATE transaction under a
// savepoint of its own, commits once and only then answers every caller.
// A change that fails or is refused rolls back to its savepoint and records
// its refusals there, so its neighbours never see it; an error that ends
// the whole transaction (SQLITE_FULL, IOERR, BUSY, INTERRUPT, NOMEM,
// CORRUPT, or a failed COMMIT) fails every change of the batch with a
// *BatchError, and each caller retries as it would after any store error.
// The queue is FIFO, so the changes of one caller (and of one command, which
// its callers apply in order) commit in the order they were made.

var (
	// ErrOverloaded: the writer's queue was full; the change was not made.
	// Submits get it (503 overloaded with Retry-After); every other change
	// waits for room instead.
	ErrOverloaded = errors.New("store: write queue full, retry later")
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

// Defaults of Config.QueueSize and Config.MaxBatch.
const (
	DefaultQueueSize = 1024
	DefaultMaxBatch  = 256
)

// job is one change waiting for the writer.
type job struct {
	ctx  context.Context
	fn   func(context.Context, *tx) error
	done chan error // buffered: the writer never waits on a caller
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
func (s *SQLite) write(ctx context.Context, fn func(context.Context, *tx) error) error {
	return s.enqueue(ctx, fn, false)
}

// writeOrShed is write that returns ErrOverloaded at once when the queue is
// full.
func (s *SQLite) writeOrShed(ctx context.Context, fn func(context.Context, *tx) error) error {
	return s.enqueue(ctx, fn, true)
}

func (s *SQLite) enqueue(ctx context.Context, fn func(context.Context, *tx) error, shed bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j := &job{ctx: ctx, fn: fn, done: make(chan error, 1)}
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
func (s *SQLite) runWriter() {
	defer close(s.stopped)
	batch := make([]*job, 0, s.maxBatch)
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
		s.commitBatch(batch)
		clear(batch)
		s.wstmts.prepareMissed(context.Background())
	}
}

// commitBatch applies, commits and answers one batch. Observations are
// reported before the callers are answered, so a caller that returns sees
// its change counted.
func (s *SQLite) commitBatch(batch []*job) {
	start := time.Now()
	res := make([]applied, len(batch))
	if err := s.applyBatch(batch, res); err != nil {
		berr := &BatchError{Err: err}
		for _, j := range batch {
			j.done <- berr
		}
		return
	}
	s.obs.Batch(len(batch), time.Since(start))
	for i, j := range batch {
		s.report(res[i].notes, res[i].refusals)
		j.done <- res[i].err
	}
}

// applyBatch runs every change of the batch in one transaction and commits
// it. It returns an error only when the transaction as a whole failed; each
// change's own error is in res.
func (s *SQLite) applyBatch(batch []*job, res []applied) error {
	ctx := context.Background()
	sqlTx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer sqlTx.Rollback()
	for i, j := range batch {
		if err := j.ctx.Err(); err != nil {
			res[i].err = err // the caller gave up before its turn: nothing written
			continue
		}
		if _, err := sqlTx.ExecContext(ctx, `SAVEPOINT change`); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		t := &tx{Tx: sqlTx, stmts: s.wstmts, now: s.now().UTC(), instance: s.instance}
		ferr := runChange(ctx, j.fn, t)
		if ferr != nil {
			if endsTransaction(ferr) {
				return ferr
			}
			if _, err := sqlTx.ExecContext(ctx, `ROLLBACK TO change`); err != nil {
				return fmt.Errorf("rollback to savepoint: %w (after %v)", err, ferr)
			}
			t.notes = nil
		}
		// A refused transition is on record whether or not its change stood.
		if err := insertRefusals(sqlTx, t.now, s.instance, t.refusals); err != nil {
			return err
		}
		if _, err := sqlTx.ExecContext(ctx, `RELEASE change`); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		res[i] = applied{err: ferr, notes: t.notes, refusals: t.refusals}
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
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

// endsTransaction reports whether err may have rolled back the whole
// transaction (SQLite does so on these codes), so the batch must fail.
func endsTransaction(err error) bool {
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code {
	case sqlite3.ErrFull, sqlite3.ErrIoErr, sqlite3.ErrBusy, sqlite3.ErrInterrupt,
		sqlite3.ErrNomem, sqlite3.ErrCorrupt, sqlite3.ErrNotADB:
		return true
	}
	return false
}
