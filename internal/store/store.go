package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store/driver"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// The store's own errors; its refusals a caller can be told of are the
// domain's (domain.ErrNotFound, domain.ErrKeyReused, ...), which the API
// maps to HTTP codes in one place.
var (
	// ErrRefused: a conditional update matched no row (see RefusedError).
	ErrRefused = errors.New("transition refused")
	// ErrFenced: a decision carried a stale fencing token or an expired lease.
	ErrFenced = errors.New("stale fencing token")
)

// RefusedError is a zero-row conditional update: the row was not in the
// state (or version, or rank) the write expected.
type RefusedError struct {
	Machine string // operation, command
	ID      string
	Reason  string // stale, duplicate, illegal, fenced, lost_race
	Fenced  bool
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s %s: transition refused (%s)", e.Machine, e.ID, e.Reason)
}

// Is makes errors.Is(err, ErrRefused) and, for a fenced refusal, ErrFenced hold.
func (e *RefusedError) Is(target error) bool {
	return target == ErrRefused || (e.Fenced && target == ErrFenced)
}

// Observer is told of every transition, refused transition and receipt
// effect, after the transaction that made it committed. The metrics package
// implements it.
type Observer interface {
	Transition(machine, from, to string)
	Refused(machine, reason string)
	Receipt(effect string)
	Fenced()
	// Batch is told of each committed group of changes: how many, how
	// long, and whether it fell back to a savepoint per change (one of its
	// changes failed, see applyBatch).
	Batch(changes int, took time.Duration, fellBack bool)
	// Deadlock is told of each batch that lost a deadlock to another
	// instance's transaction (PostgreSQL) and is run again, or failed.
	Deadlock()
	// Answered is told, for each submit (ChangeSubmit) and each call
	// applying receipts (ChangeReceipts) whose change committed, how long
	// its caller waited for the answer: the writer's queue, the batch and
	// its commit.
	Answered(change string, took time.Duration)
}

// The changes Observer.Answered is told of: the two commits on an
// operation's path.
const (
	ChangeSubmit   = "submit"
	ChangeReceipts = "receipts"
)

// Change is one committed change of an entity: a row of its events log, or
// of a task's history. From and To are equal for a change that keeps the
// state (a late outcome, a new plan version, a presence reset).
type Change struct {
	Machine  string // operation, command, device, task (and lease)
	ID       string // the entity's id: operation_id, command_id, device_id, task_id
	From, To string
	At       time.Time // the transaction's now
	// Principal is the person whose change it is (tx.by); "" for the
	// controller's own.
	Principal string
	// Operation is an operation as the change committed it, when the
	// change read it back (an outcome from a final receipt); nil otherwise.
	Operation *domain.Operation
}

// Fact is one thing the store tells the rest of the controller once it is
// true: a committed change, a command made due, a person's action on a
// rollout, or (Remote) another instance's wake-up. Package feed routes
// facts to the services that act on them.
type Fact struct {
	Kind FactKind
	// Remote: the fact came from another instance's wake-up (PostgreSQL
	// NOTIFY), not from this instance's commit.
	Remote bool
	// ID is the entity: the command_id of FactDue, the rollout_id of
	// FactRollout, the operation_id of a remote FactChanged (whose Change
	// holds only its Machine and ID: the status is read back).
	ID     string
	Change Change // FactChanged
	// Inserted is a new submit's command as inserted (FactDue), so that
	// its first decision needs no read; nil otherwise.
	Inserted *OpenCommand
	// Token is the lease token of a rollout this instance created
	// (FactRollout): it drives it under that fence; 0 otherwise.
	Token int64
}

// FactKind says what a Fact tells.
type FactKind uint8

// Kinds of Fact.
const (
	// FactChanged: a change committed (Change, one line of the events
	// log); remote: an operation left started on another instance.
	FactChanged FactKind = iota + 1
	// FactDue: a command needs its lease holder's decision now (a submit,
	// a retry, a receipt that asks for one, its device's presence changed).
	FactDue
	// FactRollout: a person created, approved, paused, resumed or
	// cancelled a rollout here: its scheduler looks at it now.
	FactRollout
	// FactReset: wake-ups from other instances may have been missed.
	FactReset
	// FactQueue: a serial command of device ID ended: the device's queue
	// moves, and its new head is read after the commit (QueueHead) and
	// decided about by its lease holder.
	FactQueue
)

// Feed receives the store's facts: those of each commit after it, in
// commit order, on the writer's goroutine; those of other instances'
// wake-ups on the goroutine that receives them. Publish must return at
// once and never block (package feed routes inline to consumers that
// never wait).
type Feed interface {
	Publish(Fact)
}

type nopObserver struct{}

func (nopObserver) Transition(string, string, string) {}
func (nopObserver) Refused(string, string)            {}
func (nopObserver) Receipt(string)                    {}
func (nopObserver) Fenced()                           {}
func (nopObserver) Batch(int, time.Duration, bool)    {}
func (nopObserver) Deadlock()                         {}
func (nopObserver) Answered(string, time.Duration)    {}

// Config configures a Store.
type Config struct {
	// Driver is the database backend (package backend picks it from a
	// --db value); Path is its DSN: an SQLite file or a postgres:// URL.
	Driver   driver.Driver
	Path     string
	Instance string           // written into events and receipts
	Now      func() time.Time // injectable clock; time.Now by default
	Observer Observer
	// Feed is told every fact the store computes (see Fact); nil: nobody.
	Feed    Feed
	Readers int // read pool size; 4 by default
	// QueueSize bounds the changes waiting for the writer
	// (DefaultQueueSize); MaxBatch bounds the changes of one commit
	// (DefaultMaxBatch).
	QueueSize, MaxBatch int
	// CommitDelay is how long the writer may wait for more changes before
	// it commits a small batch while others are in flight (runWriter);
	// DefaultCommitDelay when 0, never when negative.
	CommitDelay time.Duration
	// BeforeListMove runs inside the writer's move of pending rows into
	// the lists' device indexes (Capabilities.ListsDevicesInBulk), before
	// its statements (the before-device-list-move failpoint); an error
	// fails the move alone. Nil: nothing.
	BeforeListMove func() error
	// CheckpointEvery is how often a backend that checkpoints beside its
	// writer (driver.Checkpointer: SQLite) does; DefaultCheckpointEvery
	// when 0, never when negative (the writer's own checkpoints remain).
	CheckpointEvery time.Duration
}

// DefaultCheckpointEvery is Config.CheckpointEvery's default: 1,000 to
// 1,400 frames of the WAL a checkpoint at the bench's saturation (logged,
// 7 Dec), as many as the writer's commit checkpointed before, and at half
// load about 2,500 (derived from 17 frames an operation at 1,500/s), where
// the writer checkpointed every 1,000.
const DefaultCheckpointEvery = 100 * time.Millisecond

// DB is the store, on either backend. It is safe for concurrent use.
type DB struct {
	d    driver.Driver
	q    *driver.Statements // d's statements
	caps driver.Capabilities
	// eventInserts and receiptInserts are the multi-row INSERTs of the
	// events log and of the receipt log, by rows.
	eventInserts, receiptInserts map[int]string

	dsn      string
	w, r     *sql.DB
	now      func() time.Time
	obs      Observer
	feed     Feed // nil: no facts
	instance string

	// The writer goroutine (writer.go) owns w once Open returns: wconn is
	// its one connection (nil until needed, and after it broke), wstmts
	// the statements prepared on it.
	queue       chan *job
	wconn       *sql.Conn
	wstmts      *stmtCache
	rq          readers
	maxBatch    int
	commitDelay time.Duration // Config.CommitDelay; never when negative
	// scratch holds the writer goroutine's buffers, reused from one batch
	// to the next (cleared, so they keep no row alive): a batch's lists of
	// wake-ups, events and receipt rows, and a multi-row insert's arguments.
	scratch struct {
		wakes    []string
		events   []eventRow
		receipts [][]any
		args     []any
	}
	delaying      func(n int) // tests: called as a batch of n begins to wait for more
	quit, stopped chan struct{}
	trips         atomic.Int64 // statements sent to the database
	moveTrips     atomic.Int64 // of which the writer's moves into the device lists (listDevices)
	// listedAt is when the writer last moved the pending rows into the
	// lists' device indexes (Capabilities.ListsDevicesInBulk), on the
	// store's clock: the writer goroutine's own.
	listedAt       time.Time
	beforeListMove func() error // Config.BeforeListMove
	// stopCheckpoints ends the checkpoints beside the writer
	// (driver.Checkpointer), if any.
	stopCheckpoints func() error
	// touched is when a committed change of this store last touched each
	// device (touchDevice), in ms: the writer goroutine's own.
	touched map[string]int64
	// alone, once set (SetAlone), reports that no other instance writes
	// the database.
	alone atomic.Pointer[func() bool]
	// files are the SQLite files whose paths must keep naming them
	// (guard.go); nil with PostgreSQL.
	files *fileGuard
}

// SetAlone tells the store how to know that no other instance writes its
// database now (package peers' membership): a batch then takes no
// pre-lock (preLock), which only orders the locks of several instances'
// batches. An instance that joins unseen costs at worst a deadlock, which
// the server breaks and the writer runs again; no change depends on the
// pre-lock for its conditions.
func (s *DB) SetAlone(alone func() bool) { s.alone.Store(&alone) }

func (s *DB) isAlone() bool {
	f := s.alone.Load()
	return f != nil && (*f)()
}

// RoundTrips counts the statements the store sent to its database so far:
// every read and write, and each BEGIN, SAVEPOINT, RELEASE and COMMIT.
func (s *DB) RoundTrips() int64 { return s.trips.Load() }

// Open opens the database cfg.Path names (an SQLite file, created if
// needed, or a postgres:// URL) and applies the embedded migrations that are
// not yet applied.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	if cfg.Path == "" {
		return nil, errors.New("store: empty database path")
	}
	if cfg.Driver == nil {
		return nil, errors.New("store: no driver (open through package internal/store/backend)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Readers <= 0 {
		cfg.Readers = 4
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.CommitDelay == 0 {
		cfg.CommitDelay = DefaultCommitDelay
	}
	if cfg.CheckpointEvery == 0 {
		cfg.CheckpointEvery = DefaultCheckpointEvery
	}
	d := cfg.Driver
	w, r, err := d.Open(ctx, cfg.Path, cfg.Readers)
	if err != nil {
		return nil, err
	}
	q := d.Statements()
	s := &DB{d: d, q: q, caps: d.Capabilities(), eventInserts: rowInserts(d, q.EventsInsertHead), receiptInserts: rowInserts(d, q.ReceiptsInsertHead), dsn: cfg.Path, w: w, r: r, now: cfg.Now, obs: cfg.Observer, instance: cfg.Instance,
		feed: cfg.Feed, queue: make(chan *job, cfg.QueueSize), maxBatch: cfg.MaxBatch, commitDelay: cfg.CommitDelay,
		quit: make(chan struct{}), stopped: make(chan struct{}), touched: map[string]int64{},
		beforeListMove: cfg.BeforeListMove}
	opened := false
	defer func() {
		if !opened { // a failed Open closes what it opened (the guard is nil-safe)
			s.files.close()
			w.Close()
			r.Close()
		}
	}()
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	if s.files, err = newFileGuard(guardedFiles(d.Files(cfg.Path)), guardInterval); err != nil {
		return nil, err
	}
	if c, ok := d.(driver.Checkpointer); ok && cfg.CheckpointEvery > 0 {
		if s.stopCheckpoints, err = c.StartCheckpoints(cfg.Path, cfg.CheckpointEvery); err != nil {
			return nil, err
		}
	}
	s.rq = readers{s: s, db: r, c: newStmtCache(r)}
	s.wstmts = newStmtCache(nil) // on the writer's connection, once it has one
	go s.runWriter()
	opened = true
	return s, nil
}

// Close stops the writer once its current batch is answered (changes still
// queued get ErrClosed, nothing of them written) and closes both pools.
func (s *DB) Close() error {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.stopped
	var cerr error
	if s.stopCheckpoints != nil {
		cerr = s.stopCheckpoints()
	}
	s.files.close()
	s.rq.c.close() // the writer's statements went with its connection (runWriter)
	return errors.Join(cerr, s.r.Close(), s.w.Close())
}

func (s *DB) migrate(ctx context.Context) error {
	tx, err := s.d.BeginMigrations(ctx, s.w)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q.SchemaTable); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, s.q.SchemaVersion).Scan(&current); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	migrations := s.d.Migrations()
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		base := name
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migration %s: name must start with a number", base)
		}
		if v <= current {
			continue
		}
		body, err := fs.ReadFile(migrations, name)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", base, err)
		}
		if _, err := tx.ExecContext(ctx, s.q.SchemaApplied,
			v, base, ms(s.now())); err != nil {
			return fmt.Errorf("migration %s: %w", base, err)
		}
	}
	return tx.Commit()
}

// tx is one write transaction with its single "now", the refusals it
// recorded and the observations to report once it commits.
type tx struct {
	c        *sql.Conn // the writer's connection, in its open transaction
	s        *DB
	now      time.Time
	instance string
	refusals []refusal
	notes    []func(Observer)
	wakes    []string   // NOTIFY payloads for other instances
	events   []eventRow // its lines of the events log, written at the batch's end
	receipts [][]any    // its rows of the receipt log (a value per column of ReceiptsInsertHead), likewise
	// careful: the change runs under a savepoint of its own, after an
	// optimistic run of its batch failed (applyChange); a change may then
	// take the slower way that isolates its parts (ApplyReceipts).
	careful bool
	j       *job // the change's job (its hooks' results)
	// principal is the person whose change this is (tx.by): written on
	// its events and its audit row; "" for the controller's own changes.
	principal string
}

// wake tells the other instances, once this change commits, that kind id
// changed under them; a command made due is this instance's fact too.
func (t *tx) wake(kind, id string) {
	t.wakes = append(t.wakes, wakePayload(t.instance, kind, id))
	switch kind {
	case WakeCommand:
		t.publish(Fact{Kind: FactDue, ID: id})
	case WakeQueue:
		t.publish(Fact{Kind: FactQueue, ID: id})
	}
}

// publish tells the feed f once this change commits (a change rolled back
// to its savepoint drops it with its notes).
func (t *tx) publish(f Fact) {
	feed := t.s.feed
	if feed == nil {
		return
	}
	g := f // only a published fact goes to the heap (with its note: a Fact fits in one)
	t.notes = append(t.notes, func(Observer) { feed.Publish(g) })
}

// submitted publishes a submit's command as due for its first decision: a
// new one with its copy as inserted (res's own, which the dispatcher copies
// before the submit's caller is answered), a retry's without. A new serial
// one queued behind another has nothing to decide (its fallback check is
// set at insert, NewOperation.QueuedCheck): its device's queue is told it
// moved instead, so that its head is read after this commit, since the one
// ahead may have ended meanwhile in a transaction that could not see it
// (see DB.QueueHead).
func (t *tx) submitted(res *SubmitResult) {
	switch {
	case t.s.feed == nil:
	case res.Created && res.Inserted.QueuedBehind == "":
		t.publish(Fact{Kind: FactDue, ID: res.Operation.CommandID, Inserted: &res.Inserted})
	case res.Created && res.Inserted.QueuedBehind != "":
		t.publish(Fact{Kind: FactQueue, ID: res.Inserted.DeviceID})
	case res.Retried:
		t.publish(Fact{Kind: FactDue, ID: res.Operation.CommandID})
	}
}

type refusal struct {
	machine, id, from, to, reason string
	token                         int64
}

// recordRefusals adds the change's refused transitions to its events, after
// a rollback to its savepoint took back the rest.
func (t *tx) recordRefusals() {
	for _, r := range t.refusals {
		t.events = append(t.events, eventRow{at: ms(t.now), machine: r.machine, id: r.id, from: r.from, to: r.to,
			reason: r.reason, instance: t.instance, token: r.token, refused: 1, principal: t.principal})
	}
}

// eventRow is one line of the events log.
type eventRow struct {
	at                                      int64
	machine, id, from, to, reason, instance string
	token, refused                          int64
	principal                               string
}

// insertChunks are the row counts of the multi-row INSERTs that write a
// batch's lines of the events log and of the receipt log: a few fixed
// statements, each prepared once.
var insertChunks = []int{256, 64, 16, 8, 4, 2, 1}

// rowInserts builds the INSERT of each chunk size from head (the backend's
// EventsInsertHead or ReceiptsInsertHead, which names the columns), in the
// backend's placeholders (a statement of N rows is built here, not named:
// the one thing that differs is the placeholders' numbering).
func rowInserts(d driver.Driver, head string) map[int]string {
	list, _, _ := strings.Cut(head[strings.IndexByte(head, '(')+1:], ")")
	columns := strings.Count(list, ",") + 1
	m := map[int]string{}
	for _, n := range insertChunks {
		var b strings.Builder
		b.WriteString(head)
		b.WriteByte(' ')
		p := 0
		for row := 0; row < n; row++ {
			if row > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('(')
			for col := 0; col < columns; col++ {
				if col > 0 {
					b.WriteString(", ")
				}
				p++
				b.WriteString(d.Placeholder(p))
			}
			b.WriteByte(')')
		}
		m[n] = b.String()
	}
	return m
}

// insertEvents writes a batch's events in their order, in as few
// statements as the chunk sizes allow. Only the lines of changes that stood
// (and the refusals of those that did not) are left to write by then, so
// the log keeps the order in which the changes were applied.
func (t *tx) insertEvents(ctx context.Context, rows []eventRow) error {
	err := t.insertRows(ctx, t.s.eventInserts, len(rows), func(args []any, i int) []any {
		r := rows[i]
		return append(args, r.at, r.machine, r.id, r.from, r.to, r.reason, r.instance, r.token, r.refused, r.principal)
	})
	if err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	return nil
}

// insertReceipts writes the receipt log's rows of a batch's changes that
// stood, in their order, as insertEvents does the events.
func (t *tx) insertReceipts(ctx context.Context, rows [][]any) error {
	err := t.insertRows(ctx, t.s.receiptInserts, len(rows), func(args []any, i int) []any {
		return append(args, rows[i]...)
	})
	if err != nil {
		return fmt.Errorf("log receipts: %w", err)
	}
	return nil
}

// insertRows writes n rows through stmts (rowInserts), the largest chunk
// that fits first; row appends row i's columns to args. The writer's
// batches call it, in the writer goroutine (its arguments are scratch.args).
func (t *tx) insertRows(ctx context.Context, stmts map[int]string, n int, row func(args []any, i int) []any) error {
	for done := 0; done < n; {
		k := insertChunks[len(insertChunks)-1]
		for _, c := range insertChunks {
			if c <= n-done {
				k = c
				break
			}
		}
		args := t.s.scratch.args[:0]
		for i := done; i < done+k; i++ {
			args = row(args, i)
		}
		err := t.execRows(ctx, stmts[k], args...)
		clear(args)
		t.s.scratch.args = args[:0]
		if err != nil {
			return err
		}
		done += k
	}
	return nil
}

func (s *DB) report(notes []func(Observer), refs []refusal) {
	for _, n := range notes {
		n(s.obs)
	}
	for _, r := range refs {
		s.obs.Refused(r.machine, r.reason)
		if r.reason == ReasonFenced {
			s.obs.Fenced()
		}
	}
}

// Reasons a conditional update is refused.
const (
	ReasonStale     = "stale"     // the row moved on since it was read (state, version or rank)
	ReasonDuplicate = "duplicate" // the same change again
	ReasonIllegal   = "illegal"   // not in the fsm table
	ReasonFenced    = "fenced"    // stale fencing token, or the lease ran out
)

// event appends to the events log (with the batch's other lines, see
// insertEvents) and notes the transition for the observer.
func (t *tx) event(machine, id, from, to, reason string, token int64) error {
	t.logEvent(machine, id, from, to, reason, token)
	t.changed(machine, id, from, to)
	return nil
}

// logEvent is event without its fact, for a change that publishes its own.
func (t *tx) logEvent(machine, id, from, to, reason string, token int64) {
	t.events = append(t.events, eventRow{at: ms(t.now), machine: machine, id: id, from: from, to: to,
		reason: reason, instance: t.instance, token: token, principal: t.principal})
	if from != to && from != "" {
		t.notes = append(t.notes, func(o Observer) { o.Transition(machine, from, to) })
	}
}

// changed publishes a change once the transaction commits.
func (t *tx) changed(machine, id, from, to string) {
	t.publish(Fact{Kind: FactChanged, Change: Change{Machine: machine, ID: id, From: from, To: to, At: t.now, Principal: t.principal}})
}

// refuse records a refused transition (written whether or not the
// transaction commits) and returns it as a *RefusedError for the caller to
// return or absorb.
func (t *tx) refuse(machine, id, from, to, reason string, token int64) error {
	t.refusals = append(t.refusals, refusal{machine, id, from, to, reason, token})
	return &RefusedError{Machine: machine, ID: id, Reason: reason, Fenced: reason == ReasonFenced}
}

// change names one conditional write: the entity, the move it makes, and
// the fencing token it is made under (0 for facts and a person's actions).
type change struct {
	machine, id, from, to string
	token                 int64
	// explain says why a zero-row write was refused (ReasonStale when nil);
	// decisions read the lease to tell a stale row from a lost fence.
	explain func() (string, error)
}

// cas is the store's one compare-and-set: it runs a conditional write
// (an UPDATE whose WHERE names the state, version, rank or fence it
// expects). Zero rows is a refused transition: explained, recorded in the
// events log and returned as a *RefusedError, never an overwrite. When scan
// is set the write ends in RETURNING and scan reads the row it returned, so
// the caller never reads the row again.
func (t *tx) cas(ctx context.Context, ch change, scan func(rowScanner) error, query string, args ...any) error {
	applied := false
	if scan == nil {
		r, err := t.ExecContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("%s %s %s → %s: %w", ch.machine, ch.id, ch.from, ch.to, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return fmt.Errorf("%s %s %s → %s: %w", ch.machine, ch.id, ch.from, ch.to, err)
		}
		applied = n > 0
	} else {
		switch err := scan(t.QueryRowContext(ctx, query, args...)); {
		case err == nil:
			applied = true
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("%s %s %s → %s: %w", ch.machine, ch.id, ch.from, ch.to, err)
		}
	}
	if applied {
		return nil
	}
	reason := ReasonStale
	if ch.explain != nil {
		var err error
		if reason, err = ch.explain(); err != nil {
			return err
		}
	}
	return t.refuse(ch.machine, ch.id, ch.from, ch.to, reason, ch.token)
}

// fenceExplainer explains a refused decision: fenced when the caller's
// fence no longer holds on the row that held (held: a statement of one
// id argument, then the fence's, such as CommandFenceHeld), stale when the
// fence holds but the row moved on.
func (t *tx) fenceExplainer(ctx context.Context, held, id string, f domain.Fence) func() (string, error) {
	return func() (string, error) {
		var ok bool
		if err := t.QueryRowContext(ctx, held, append([]any{id}, fenceArgs(f, t.now)...)...).Scan(&ok); err != nil {
			return "", fmt.Errorf("read lease of %s: %w", id, err)
		}
		if ok {
			return ReasonStale, nil
		}
		return ReasonFenced, nil
	}
}

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(dest ...any) error }

// The one fence condition, on an operations row, is the caller's owner and
// token with a lease that has not run out by the transaction's clock; the
// backends' fenced statements write it out, with Fence.args as its
// arguments:
//
//	owner = ? AND fencing_token = ? AND lease_expires_at > ?

// fenceArgs are a fence's arguments to a fenced statement: the owner,
// the token and the holder's now (its lease must run past it).
func fenceArgs(f domain.Fence, now time.Time) []any { return []any{f.Owner, f.Token, ms(now)} }

// sqlList renders states as an SQL list: ('a','b').
func sqlList[S ~string](states []S) string {
	q := make([]string, len(states))
	for i, s := range states {
		q[i] = "'" + string(s) + "'"
	}
	return "(" + strings.Join(q, ",") + ")"
}

// State lists, derived once from the fsm tables.
var (
	terminalCommands = sqlList(fsm.TerminalCommandStates())
)

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

func fromNullMS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMS(v.Int64)
	return &t
}

// Store is what the controller needs of its database, whichever backend
// holds it. Every method that changes state is one transaction of
// conditional writes; a refused one returns a *RefusedError
// (errors.Is ErrRefused). *DB implements it.
type Store interface {
	// Operations: the idempotency record, its first command (the outbox)
	// and its retry.
	Submit(ctx context.Context, n NewOperation, beforeCommit func() error) (SubmitResult, error)
	GetOperation(ctx context.Context, id string) (domain.Operation, error)
	Ended(ctx context.Context, ids []string) ([]string, error)
	RetryingOf(ctx context.Context, commandID, owner string) (Retrying, error)
	RetryingCommands(ctx context.Context, owner string, limit int) ([]string, error)
	MintCommand(ctx context.Context, r Retrying, f domain.Fence, commandID string, ttl time.Duration, qos int, serial bool) error
	AbandonRetry(ctx context.Context, r Retrying, f domain.Fence, reason string) error

	// Commands: the lease holder's fenced decisions, and a person's.
	GetCommand(ctx context.Context, id string) (domain.Command, error)
	OpenCommand(ctx context.Context, commandID string) (OpenCommand, error)
	DueCommands(ctx context.Context, owner string, now time.Time, all bool, limit int) ([]OpenCommand, error)
	ClaimSend(ctx context.Context, commandID string, expect fsm.CommandState, expectAttempt int, qos int, f domain.Fence, nextCheck time.Time) (Decision, error)
	ClaimQuery(ctx context.Context, commandID, queryID string, expect fsm.CommandState, expectQueries int, counted bool, f domain.Fence, nextCheck time.Time) (Decision, error)
	Postpone(ctx context.Context, commandID string, expectVersion int64, f domain.Fence, next time.Time) error
	Move(ctx context.Context, commandID string, from fsm.CommandState, expectVersion int64, to fsm.CommandState, reason string, f domain.Fence, nextCheck time.Time) (domain.Command, error)
	Wake(ctx context.Context, device string) ([]string, error)
	Cancel(ctx context.Context, commandID, who string) (domain.Command, error)
	Resolve(ctx context.Context, commandID string, outcome fsm.CommandState, note, who string) (ResolveOutcome, error)
	Receipts(ctx context.Context, commandID string) ([]domain.ReceiptRecord, error)
	Queries(ctx context.Context, commandID string) ([]domain.Query, error)
	Events(ctx context.Context, entityID string) ([]domain.Event, error)

	// The operators' lists (oplists.go): newest first, keyset paged.
	ListOperations(ctx context.Context, f OperationFilter, p StartPage) (Listed[domain.Operation], error)
	ListCommands(ctx context.Context, f CommandFilter, p StartPage) (Listed[domain.Command], error)

	// Facts from devices, applied by any instance.
	ApplyReceipt(ctx context.Context, device string, r wire.Receipt, beforeCommit func() error) (ReceiptOutcome, error)
	ApplyReceipts(ctx context.Context, device string, rs []wire.Receipt, beforeCommit func() error) ([]ReceiptResult, error)
	ApplyPresence(ctx context.Context, device string, p wire.Presence) (PresenceOutcome, error)
	GetDevice(ctx context.Context, id string) (domain.Device, error)
	DeviceQueue(ctx context.Context, device string) (DeviceQueue, error)
	QueueHead(ctx context.Context, device string) (head string, unpublished, ok bool, err error)
	QueuedBehind(ctx context.Context, c domain.Command) (string, error)
	ListDevices(ctx context.Context, f DeviceFilter, p Page) (Listed[domain.Device], error)
	UnconfirmAll(ctx context.Context) error
	ResetPresence(ctx context.Context, device, who string) (domain.Device, error)

	// Leases.
	RenewLeases(ctx context.Context, owner string, ttl time.Duration) (int64, time.Time, error)
	ReclaimOwn(ctx context.Context, owner string, ttl time.Duration) (int64, error)
	TakeOver(ctx context.Context, owner string, ttl time.Duration, limit int) ([]string, error)
	ListInstances(ctx context.Context) ([]domain.InstanceInfo, error)

	// Tasks, approvals and grants.
	CreateTask(ctx context.Context, n NewTask) (domain.Task, bool, error)
	UpdatePlan(ctx context.Context, taskID string, steps json.RawMessage, planHash, author string, baseVersion *int) (domain.Task, bool, error)
	Approve(ctx context.Context, taskID string, version int, planHash, approver string, fourEyes bool) (domain.Approval, bool, error)
	Reject(ctx context.Context, taskID, reason, who string) (domain.Task, error)
	ActiveTasks(ctx context.Context) ([]TaskLease, error)
	AcquireTask(ctx context.Context, id, owner string, ttl time.Duration, reclaim bool) (domain.Fence, error)
	TaskPass(ctx context.Context, id string, f domain.Fence, ttl time.Duration, cand *TaskCandidate, rules TaskRules) (TaskPassResult, error)
	ListTasks(ctx context.Context, f TaskFilter, p Page) (Listed[domain.Task], error)
	GetTask(ctx context.Context, id string) (domain.Task, error)
	CreateGrant(ctx context.Context, id, principal, action, devices, by string) (domain.Grant, bool, error)
	RevokeGrant(ctx context.Context, id, who string) (domain.Grant, error)
	ListGrants(ctx context.Context, f GrantFilter, p Page) (Listed[domain.Grant], error)
	Allowed(ctx context.Context, principal, action, device string) (bool, error)

	// Rollouts (rollouts.go).
	Rollouts

	// The audit log and the state gauges' counts (auditlog.go).
	ListAudit(ctx context.Context, f AuditFilter, p StartPage) (Listed[AuditEntry], error)
	CountByStatus(ctx context.Context, open bool) (StatusCounts, error)

	Close() error
}

var _ Store = (*DB)(nil)
