package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the sqlite3 driver
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Errors returned by the store. Handlers map them to HTTP codes in one place.
var (
	ErrNotFound = errors.New("not found")
	// ErrKeyReused: the operation_id exists with another request_hash.
	ErrKeyReused = errors.New("idempotency key reused with other parameters")
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
}

type nopObserver struct{}

func (nopObserver) Transition(string, string, string) {}
func (nopObserver) Refused(string, string)            {}
func (nopObserver) Receipt(string)                    {}
func (nopObserver) Fenced()                           {}

// Config configures a Store.
type Config struct {
	Path     string
	Instance string           // written into events and receipts
	Now      func() time.Time // injectable clock; time.Now by default
	Observer Observer
	Readers  int // read pool size; 4 by default
}

// Store is the SQLite store. It is safe for concurrent use.
type Store struct {
	w, r     *sql.DB
	now      func() time.Time
	obs      Observer
	instance string
}

// Open opens (creating if needed) the database at cfg.Path and applies the
// embedded migrations that are not yet applied.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("store: empty database path")
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
	path := url.PathEscape(cfg.Path)
	params := "_journal_mode=WAL&_busy_timeout=10000&_synchronous=FULL&_foreign_keys=on"
	w, err := sql.Open("sqlite3", "file:"+path+"?"+params+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open writer: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w, now: cfg.Now, obs: cfg.Observer, instance: cfg.Instance}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, err
	}
	r, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&"+params)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open readers: %w", err)
	}
	r.SetMaxOpenConns(cfg.Readers)
	s.r = r
	return s, nil
}

// Close closes both pools.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migration %s: name must start with a number", base)
		}
		if v <= current {
			continue
		}
		body, err := migrationFS.ReadFile(name)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", base, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			v, base, ms(s.now())); err != nil {
			return fmt.Errorf("migration %s: %w", base, err)
		}
	}
	return tx.Commit()
}

// tx is one write transaction with its single "now", the refusals it
// recorded and the observations to report once it commits.
type tx struct {
	*sql.Tx
	now      time.Time
	instance string
	refusals []refusal
	notes    []func(Observer)
}

type refusal struct {
	machine, id, from, to, reason string
	token                         int64
}

// write runs fn in an IMMEDIATE transaction on the writer connection. The
// observations fn made are reported only after a successful commit. The
// refusals it recorded are written in the same transaction when fn succeeds,
// and in a transaction of their own when fn fails (its changes rolled back),
// so a refused transition is always on record and never half-applied.
func (s *Store) write(ctx context.Context, fn func(*tx) error) error {
	sqlTx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	t := &tx{Tx: sqlTx, now: s.now().UTC(), instance: s.instance}
	defer sqlTx.Rollback()
	if ferr := fn(t); ferr != nil {
		sqlTx.Rollback()
		if len(t.refusals) > 0 {
			if err := s.recordRefusals(ctx, t.refusals); err != nil {
				return errors.Join(ferr, err)
			}
		}
		return ferr
	}
	if err := insertRefusals(t.Tx, t.now, s.instance, t.refusals); err != nil {
		return err
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	s.report(t.notes, t.refusals)
	return nil
}

func (s *Store) recordRefusals(ctx context.Context, refs []refusal) error {
	sqlTx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("record refusals: %w", err)
	}
	defer sqlTx.Rollback()
	if err := insertRefusals(sqlTx, s.now().UTC(), s.instance, refs); err != nil {
		return err
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("record refusals: %w", err)
	}
	s.report(nil, refs)
	return nil
}

func insertRefusals(t *sql.Tx, now time.Time, instance string, refs []refusal) error {
	for _, r := range refs {
		if _, err := t.Exec(`INSERT INTO events (at, machine, entity_id, from_state, to_state, reason, instance, fencing_token, refused)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)`, ms(now), r.machine, r.id, r.from, r.to, r.reason, instance, r.token); err != nil {
			return fmt.Errorf("record refusal: %w", err)
		}
	}
	return nil
}

func (s *Store) report(notes []func(Observer), refs []refusal) {
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

// event appends to the events log and notes the transition for the observer.
func (t *tx) event(machine, id, from, to, reason string, token int64) error {
	_, err := t.Exec(`INSERT INTO events (at, machine, entity_id, from_state, to_state, reason, instance, fencing_token, refused)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)`, ms(t.now), machine, id, from, to, reason, t.instance, token)
	if err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	if from != to && from != "" {
		t.notes = append(t.notes, func(o Observer) { o.Transition(machine, from, to) })
	}
	return nil
}

// refuse records a refused transition (written whether or not the
// transaction commits) and returns it as a *RefusedError for the caller to
// return or absorb.
func (t *tx) refuse(machine, id, from, to, reason string, token int64) error {
	t.refusals = append(t.refusals, refusal{machine, id, from, to, reason, token})
	return &RefusedError{Machine: machine, ID: id, Reason: reason, Fenced: reason == ReasonFenced}
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

func fromNullMS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMS(v.Int64)
	return &t
}
