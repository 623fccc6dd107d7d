// Package postgres is the store's backend for a PostgreSQL 15+ database
// shared by any number of controller instances, through pgx (package
// driver). Transactions are READ COMMITTED: every state change is a
// conditional UPDATE, which PostgreSQL re-checks against the newest row
// version when another instance changed the row first, so a lost race is
// a zero-row update, as with SQLite's single writer. synchronous_commit is
// forced on for the writer: a commit is on the server's disk before any
// caller hears of it.
//
// Its statements (queries.sql) carry their row locks: FOR NO KEY UPDATE on
// the rows a change reads before it writes them (the lock a plain UPDATE
// takes: it excludes the other writers of the row but not a fence or a
// foreign key's check); FOR KEY SHARE on a decision's fence, which keeps
// out only the writes that move an operation's owner or token; FOR UPDATE
// on the change that moves a lease to a new token; FOR UPDATE SKIP LOCKED
// on a bulk change's row selection, which passes over rows another
// instance's transaction holds (a fence included) rather than deadlock.
// Instances wake each other with LISTEN/NOTIFY and hold their ids with
// session advisory locks.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fleetctl/fleetctl/internal/store/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

//go:embed queries.sql
var queries string

var statements = driver.MustParse(queries)

// wakeChannel is the LISTEN/NOTIFY channel instances wake each other on.
const wakeChannel = "fleetctl_wake"

// migrationLock is the advisory lock key that serialises migrations of
// instances starting at once.
const migrationLock = 0x666c656574637401 // "fleetct" 1

// Driver is the PostgreSQL backend.
type Driver struct {
	rb rebinder
}

// New returns the PostgreSQL backend.
func New() *Driver { return &Driver{} }

var _ driver.Driver = (*Driver)(nil)

func (*Driver) Name() string { return "postgres" }

// Capabilities: several instances share the database (each applies the
// receipts of its own devices, a device's that queued up together as one
// change, their commands locked first in command_id order like every
// batch's), wake each other by notification and lock rows; pgx caches
// prepared statements per connection by itself; a submit's two inserts,
// and a final receipt's two updates, go in one statement each.
func (*Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{SharedWriters: true, GroupReceipts: true, Notifications: true, RowLocks: true, WritesTogether: true}
}

func (*Driver) Migrations() fs.FS {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

func (*Driver) Statements() *driver.Statements { return statements }
func (*Driver) Placeholder(n int) string       { return "$" + strconv.Itoa(n) }
func (d *Driver) Rebind(q string) string       { return d.rb.dollar(q) }

// Files: a PostgreSQL store has no files of its own to guard.
func (*Driver) Files(string) []driver.File { return nil }

// Arg stores flags as 0/1 and JSON as text, as the SQLite schema does.
func (*Driver) Arg(v any) any {
	switch x := v.(type) {
	case bool:
		if x {
			return int64(1)
		}
		return int64(0)
	case json.RawMessage:
		if x == nil {
			return nil
		}
		return string(x)
	case []byte:
		if x == nil {
			return nil
		}
		return string(x)
	}
	return v
}

func config(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("--db: %w", err)
	}
	cfg.RuntimeParams["synchronous_commit"] = "on"
	cfg.RuntimeParams["application_name"] = "fleetctl-controller"
	return cfg, nil
}

func (*Driver) Open(ctx context.Context, dsn string, readers int) (w, r *sql.DB, err error) {
	cfg, err := config(dsn)
	if err != nil {
		return nil, nil, err
	}
	w = stdlib.OpenDB(*cfg)
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.PingContext(pingCtx); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	r = stdlib.OpenDB(*cfg)
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers) // a new connection costs a handshake and its prepares
	return w, r, nil
}

// OpenSnapshot: a READ ONLY REPEATABLE READ transaction.
func (*Driver) OpenSnapshot(_ context.Context, dsn string) (*sql.DB, *sql.TxOptions, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("--db: %w", err)
	}
	return stdlib.OpenDB(*cfg), &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, nil
}

// BeginMigrations takes a transaction-scoped advisory lock, so that two
// instances starting at once apply each migration once.
func (*Driver) BeginMigrations(ctx context.Context, w *sql.DB) (*sql.Tx, error) {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// EndsTransaction: a lost connection, the server shutting down, a full disk
// or an internal error. Any other error of a statement is rolled back with
// the change's savepoint; a dead connection also fails the ROLLBACK TO or
// the COMMIT that follows, which fails the batch as well.
func (*Driver) EndsTransaction(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return pgconn.SafeToRetry(err) || pgconn.Timeout(err)
	}
	switch pe.Code[:2] {
	case "08", "53", "57", "58", "XX":
		return true
	}
	return pe.Code == "25P02" // the transaction is already aborted
}

// Conflict: a deadlock between two instances' batches, or a serialisation
// failure, rolled back the statement only.
func (*Driver) Conflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// Begin: READ COMMITTED, the server's default, as every statement of the
// writer expects (each locks or conditions what it changes).
func (*Driver) Begin() string { return "BEGIN" }

func (*Driver) Notify(ctx context.Context, t driver.Execer, payloads []string) (bool, error) {
	if len(payloads) == 0 {
		return false, nil
	}
	_, err := t.ExecContext(ctx, `SELECT pg_notify('`+wakeChannel+`', p) FROM unnest($1::text[]) AS p`, payloads)
	return true, err
}

// instanceKey is the advisory lock key of an instance id.
func instanceKey(id string) int64 {
	h := fnv.New64a()
	h.Write([]byte("fleetctl instance " + id))
	return int64(h.Sum64())
}

// LockInstance holds a session advisory lock on its own connection, which
// also LISTENs for wake-ups. The server drops the lock when the connection
// dies, so a restarted instance starts at once. If the connection drops
// while this process lives (PostgreSQL restarted), it connects again and
// takes the lock back (ev.Missed: what was sent meanwhile is lost); if
// another process took it meanwhile, ev.Lost.
func (*Driver) LockInstance(ctx context.Context, dsn, id string, ev driver.HoldEvents) (*driver.Hold, error) {
	cfg, err := config(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := holdLock(ctx, cfg, id)
	if err != nil {
		return nil, err
	}
	lctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		listen(lctx, cfg, id, ev, conn)
	}()
	return &driver.Hold{Release: func() {
		stop()
		<-done
	}}, nil
}

// holdLock connects, takes the instance's advisory lock and LISTENs.
func holdLock(ctx context.Context, cfg *pgx.ConnConfig, id string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("instance lock: connect to PostgreSQL: %w", err)
	}
	var held bool
	if err := conn.QueryRow(cctx, `SELECT pg_try_advisory_lock($1)`, instanceKey(id)).Scan(&held); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("instance lock: %w", err)
	}
	if !held {
		conn.Close(context.Background())
		return nil, fmt.Errorf("instance %q (advisory lock %d): %w", id, instanceKey(id), driver.ErrInstanceRunning)
	}
	if _, err := conn.Exec(cctx, `LISTEN `+wakeChannel); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("listen: %w", err)
	}
	return conn, nil
}

// listen delivers notifications until ctx ends, reconnecting (and taking
// the lock back) when the connection drops.
func listen(ctx context.Context, cfg *pgx.ConnConfig, id string, ev driver.HoldEvents, conn *pgx.Conn) {
	defer func() {
		if conn != nil {
			conn.Close(context.Background()) // drops the lock
		}
	}()
	for {
		n, err := conn.WaitForNotification(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			ev.Notification(n.Payload)
			continue
		}
		conn.Close(context.Background())
		conn = nil
		for conn == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
			conn, err = holdLock(ctx, cfg, id)
			if errors.Is(err, driver.ErrInstanceRunning) {
				ev.Lost(fmt.Errorf("lost the instance lock while PostgreSQL was unreachable: %w", err))
				return
			}
		}
		ev.Missed()
	}
}

// rebinder caches rewritten statements by their text (transitional: see
// driver.Driver.Rebind).
type rebinder struct {
	m sync.Map // string → string
}

// dollar rewrites ? placeholders as $1, $2, ... outside string literals and
// quoted identifiers (the store's statements never use ? otherwise).
func (rb *rebinder) dollar(query string) string {
	if v, ok := rb.m.Load(query); ok {
		return v.(string)
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	var quote byte
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	out := b.String()
	rb.m.Store(query, out)
	return out
}
