package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"syscall"

	"github.com/mattn/go-sqlite3"
)

// driverName is go-sqlite3 with the pragmas the DSN cannot carry, run on
// every new connection.
const driverName = "sqlite3_fleetctl"

func init() {
	sql.Register(driverName, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		// Statement and savepoint journals in memory: with SQLite's
		// default (a temporary file), every change in a batch (a
		// savepoint each, and an UPDATE with CHECK constraints) wrote
		// and truncated a file, 0.5 ms of system time a receipt. They
		// only ever roll back a change inside an open transaction; the
		// commit's durability is the WAL's and unchanged.
		_, err := c.Exec("PRAGMA temp_store = MEMORY", nil)
		return err
	}})
}

// sqliteBackend is the embedded default: a file in WAL mode with
// synchronous=FULL, one writer connection taking IMMEDIATE transactions and
// a read-only pool beside it.
type sqliteBackend struct{}

func (sqliteBackend) name() string       { return "sqlite" }
func (sqliteBackend) migrations() string { return "migrations/sqlite" }
func (sqliteBackend) prepares() bool     { return true }
func (sqliteBackend) rebind(q string) string {
	return q
}

func (sqliteBackend) arg(v any) any { return v }

func (sqliteBackend) forUpdate() string  { return "" }
func (sqliteBackend) fenceLock() string  { return "" }
func (sqliteBackend) tokenLock() string  { return "" }
func (sqliteBackend) skipLocked() string { return "" }

func (sqliteBackend) open(_ context.Context, path string, readers int) (w, r *sql.DB, err error) {
	file := url.PathEscape(path)
	params := "_journal_mode=WAL&_busy_timeout=10000&_synchronous=FULL&_foreign_keys=on"
	// The writer keeps up to 64 MiB of pages in its cache (allocated as
	// they are read): SQLite's default of 2 MiB is less than the working
	// set of a busy fleet (the 100-device bench's file reaches 5 MiB in
	// 10 s), and a page read again from the file is a system call.
	if w, err = sql.Open(driverName, "file:"+file+"?"+params+"&_txlock=immediate&_cache_size=-65536"); err != nil {
		return nil, nil, fmt.Errorf("open writer: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	// The file must exist (and be in WAL mode) before a read-only
	// connection opens it.
	if err := w.Ping(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	if r, err = sql.Open(driverName, "file:"+file+"?mode=ro&"+params); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("open readers: %w", err)
	}
	r.SetMaxOpenConns(readers)
	// Every reader stays open: database/sql keeps 2 idle by default, and a
	// reader opened again reads the schema and prepares its statements anew.
	r.SetMaxIdleConns(readers)
	return w, r, nil
}

func (sqliteBackend) beginMigrations(ctx context.Context, w *sql.DB) (*sql.Tx, error) {
	return w.BeginTx(ctx, nil) // IMMEDIATE (_txlock): one migrator at a time
}

func (sqliteBackend) schemaTable() string {
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`
}

// endsTransaction: SQLite rolls the whole transaction back on these codes.
func (sqliteBackend) endsTransaction(err error) bool {
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

// conflict: one writer never deadlocks with itself.
func (sqliteBackend) conflict(error) bool { return false }

// notify: instances sharing one SQLite file poll; there is no channel.
func (sqliteBackend) notify(context.Context, *sql.Tx, []string) (bool, error) { return false, nil }

// files: the database, its WAL and its shared-memory index (guard.go).
func (sqliteBackend) files(path string) []guardedFile {
	return []guardedFile{{what: "database", path: path}, {what: "database WAL", path: path + "-wal"},
		{what: "database shared-memory index", path: path + "-shm"}}
}

// lockInstance takes an flock on a file beside the database: the kernel
// drops it when the holder dies (kill -9 included), so a restarted instance
// starts at once. The lock holds only while its path names the locked file:
// the store guards it with the database's files (guard.go), and Lost fires
// when any of them left its path.
func (sqliteBackend) lockInstance(_ context.Context, s *DB, id string) (*Instance, error) {
	path := s.dsn + ".instance-" + id + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("instance lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("instance %q (lock %s): %w", id, filepath.Base(path), ErrInstanceRunning)
	}
	if err := s.files.add("instance lock", path, f); err != nil {
		f.Close()
		return nil, err
	}
	stop, done := make(chan struct{}), make(chan struct{})
	inst := newInstance(id, nil, func() { // instances sharing a file poll
		close(stop)
		<-done
		s.files.remove(path)
		f.Close()
	})
	go func() {
		defer close(done)
		select {
		case <-s.files.lostC():
			inst.fail(s.files.failed())
		case <-stop:
		}
	}()
	return inst, nil
}
