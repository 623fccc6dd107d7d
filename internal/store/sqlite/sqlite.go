// Package sqlite is the store's embedded default backend: a file in WAL
// mode with synchronous=FULL, one writer connection taking IMMEDIATE
// transactions and a read-only pool beside it (package driver).
//
// One writer is the lock: no statement needs a row lock, and instances
// sharing the file poll rather than notify.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/fleetctl/fleetctl/internal/store/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

//go:embed queries.sql
var queries string

var statements = driver.MustParse(queries)

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
		if _, err := c.Exec("PRAGMA temp_store = MEMORY", nil); err != nil {
			return err
		}
		// The WAL is checkpointed beside the writer (StartCheckpoints);
		// the writer's own checkpoint, inside the commit that crosses this
		// many frames, only bounds the WAL when those fall behind.
		_, err := c.Exec(fmt.Sprintf("PRAGMA wal_autocheckpoint = %d", WriterCheckpointFrames), nil)
		return err
	}})
}

// fileParams are the DSN parameters of every connection the store opens
// on the file: the writer's, the readers' and the checkpoints'.
const fileParams = "_journal_mode=WAL&_busy_timeout=10000&_synchronous=FULL&_foreign_keys=on"

// WriterCheckpointFrames is the WAL's length, in frames (pages), at which
// the writer checkpoints it itself (SQLite's default is 1,000): about
// 32 MiB of 4 KiB pages.
const WriterCheckpointFrames = 8000

// StartCheckpoints copies the WAL into the database every interval, on a
// connection of its own, so that the writer's commits no longer do it:
// with SQLite's default, the commit that crossed 1,000 frames did (at
// half load about one commit in eighteen, 3 ms at p50), holding its
// batch's answers and the next batch. A checkpoint beside the writer is
// PASSIVE: it copies what no reader still needs and never waits for the
// writer or a reader, which may go on meanwhile. The WAL begins again from
// its start at a writer's next transaction once every frame is copied;
// while commits follow each other closely that takes the writer's own
// checkpoint, past WriterCheckpointFrames, which finds most frames copied
// already. A failed checkpoint is tried again at the next interval, as
// SQLite's own automatic one is: a checkpoint loses nothing, the WAL
// only grows until one succeeds.
func (*Driver) StartCheckpoints(path string, every time.Duration) (stop func() error, err error) {
	cp, err := sql.Open(driverName, "file:"+url.PathEscape(path)+"?"+fileParams)
	if err != nil {
		return nil, fmt.Errorf("open checkpointer: %w", err)
	}
	cp.SetMaxOpenConns(1)
	cp.SetConnMaxIdleTime(0)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				_, _ = cp.Exec("PRAGMA wal_checkpoint(PASSIVE)")
			}
		}
	}()
	return sync.OnceValue(func() error {
		close(quit)
		<-done
		return cp.Close()
	}), nil
}

// Driver is the SQLite backend.
type Driver struct{}

// New returns the SQLite backend.
func New() *Driver { return &Driver{} }

var (
	_ driver.Driver       = (*Driver)(nil)
	_ driver.Checkpointer = (*Driver)(nil)
)

func (*Driver) Name() string { return "sqlite" }

// Capabilities: one writer applies every receipt (several to a batch),
// prepared statements kept by the store (go-sqlite3 prepares each string
// afresh), a query's arguments bound at once, no notifications and no row
// locks.
func (*Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{GroupReceipts: true, Prepares: true, BindsQueriesAtOnce: true, ListsDevicesInBulk: true}
}

func (*Driver) Migrations() fs.FS {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

func (*Driver) Statements() *driver.Statements { return statements }
func (*Driver) Placeholder(int) string         { return "?" }
func (*Driver) Rebind(q string) string         { return q }
func (*Driver) Arg(v any) any                  { return v }

func (*Driver) Open(_ context.Context, path string, readers int) (w, r *sql.DB, err error) {
	file, params := url.PathEscape(path), fileParams
	// The writer keeps up to 64 MiB of pages in its cache (allocated as
	// they are read): SQLite's default of 2 MiB is less than the working
	// set of a busy fleet (the 100-device bench's file reaches 5 MiB in
	// 10 s), and a page read again from the file is a system call. Its
	// WAL writes are gathered (gatherVFS): it is the only connection that
	// writes the WAL.
	if w, err = sql.Open(driverName, "file:"+file+"?"+params+"&_txlock=immediate&_cache_size=-65536"+writerVFS()); err != nil {
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

// OpenSnapshot: mode=ro neither creates the file nor applies migrations;
// a transaction of SQLite reads one snapshot.
func (*Driver) OpenSnapshot(_ context.Context, path string) (*sql.DB, *sql.TxOptions, error) {
	db, err := sql.Open("sqlite3", "file:"+url.PathEscape(path)+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		return nil, nil, fmt.Errorf("open %s read-only: %w", path, err)
	}
	return db, nil, nil
}

func (*Driver) BeginMigrations(ctx context.Context, w *sql.DB) (*sql.Tx, error) {
	return w.BeginTx(ctx, nil) // IMMEDIATE (_txlock): one migrator at a time
}

// EndsTransaction: SQLite rolls the whole transaction back on these codes.
func (*Driver) EndsTransaction(err error) bool {
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

// Conflict: one writer never deadlocks with itself.
func (*Driver) Conflict(error) bool { return false }

// Begin: IMMEDIATE takes the file's write lock at once, so that a batch
// never fails half-way to upgrade a read lock (another process's writer).
func (*Driver) Begin() string { return "BEGIN IMMEDIATE" }

// Notify: instances sharing one SQLite file poll; there is no channel.
func (*Driver) Notify(context.Context, driver.Execer, []string) (bool, error) { return false, nil }

// Files: the database, its WAL and its shared-memory index.
func (*Driver) Files(path string) []driver.File {
	return []driver.File{{What: "database", Path: path}, {What: "database WAL", Path: path + "-wal"},
		{What: "database shared-memory index", Path: path + "-shm"}}
}

// LockInstance takes an flock on a file beside the database: the kernel
// drops it when the holder dies (kill -9 included), so a restarted instance
// starts at once. The lock holds only while its path names the locked file:
// the hold hands the file to the store, which guards it with the
// database's files (its Lost fires when any of them left its path).
func (*Driver) LockInstance(_ context.Context, dsn, id string, _ driver.HoldEvents) (*driver.Hold, error) {
	path := dsn + ".instance-" + id + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("instance lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("instance %q (lock %s): %w", id, filepath.Base(path), driver.ErrInstanceRunning)
	}
	return &driver.Hold{
		Files:   []driver.File{{What: "instance lock", Path: path, Open: f}},
		Release: func() { f.Close() },
	}, nil
}
