package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// postgresBackend is a PostgreSQL 15+ database shared by any number of
// controller instances, through pgx. Transactions are READ COMMITTED: every
// state change is a conditional UPDATE, which PostgreSQL re-checks against
// the newest row version when another instance changed the row first, so
// a lost race is a zero-row update, as with SQLite's single writer.
// synchronous_commit is forced on for the writer: a commit is on the
// server's disk before any caller hears of it.
type postgresBackend struct {
	rb rebinder
}

// wakeChannel is the LISTEN/NOTIFY channel instances wake each other on.
const wakeChannel = "fleetctl_wake"

// migrationLock is the advisory lock key that serialises migrations of
// instances starting at once.
const migrationLock = 0x666c656574637401 // "fleetct" 1

func (*postgresBackend) name() string             { return "postgres" }
func (*postgresBackend) migrations() string       { return "migrations/postgres" }
func (*postgresBackend) prepares() bool           { return false }
func (b *postgresBackend) rebind(q string) string { return b.rb.dollar(q) }

// files: a PostgreSQL store has no files of its own to guard.
func (*postgresBackend) files(string) []guardedFile { return nil }

func (*postgresBackend) forUpdate() string  { return " FOR NO KEY UPDATE" }
func (*postgresBackend) fenceLock() string  { return " FOR KEY SHARE" }
func (*postgresBackend) tokenLock() string  { return " FOR UPDATE" }
func (*postgresBackend) skipLocked() string { return " FOR UPDATE SKIP LOCKED" }

// arg stores flags as 0/1 and JSON as text, as the SQLite schema does.
func (*postgresBackend) arg(v any) any {
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

func (*postgresBackend) config(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("--db: %w", err)
	}
	cfg.RuntimeParams["synchronous_commit"] = "on"
	cfg.RuntimeParams["application_name"] = "fleetctl-controller"
	return cfg, nil
}

func (b *postgresBackend) open(ctx context.Context, dsn string, readers int) (w, r *sql.DB, err error) {
	cfg, err := b.config(dsn)
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

// beginMigrations takes a transaction-scoped advisory lock, so that two
// instances starting at once apply each migration once.
func (*postgresBackend) beginMigrations(ctx context.Context, w *sql.DB) (*sql.Tx, error) {
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

func (*postgresBackend) schemaTable() string {
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
		version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)`
}

// endsTransaction: a lost connection, the server shutting down, a full disk
// or an internal error. Any other error of a statement is rolled back with
// the change's savepoint; a dead connection also fails the ROLLBACK TO or
// the COMMIT that follows, which fails the batch as well.
func (*postgresBackend) endsTransaction(err error) bool {
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

// conflict: a deadlock between two instances' batches, or a serialisation
// failure, rolled back the statement only.
func (*postgresBackend) conflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

func (*postgresBackend) notify(ctx context.Context, t *sql.Tx, payloads []string) (bool, error) {
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

// lockInstance holds a session advisory lock on its own connection, which
// also LISTENs for wake-ups. The server drops the lock when the connection
// dies, so a restarted instance starts at once. If the connection drops
// while this process lives (PostgreSQL restarted), it connects again and
// takes the lock back; if another process took it meanwhile, Lost fires.
func (b *postgresBackend) lockInstance(ctx context.Context, s *DB, id string) (*Instance, error) {
	cfg, err := b.config(s.dsn)
	if err != nil {
		return nil, err
	}
	conn, err := b.holdLock(ctx, cfg, id)
	if err != nil {
		return nil, err
	}
	lctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	inst := newInstance(id, s.feed, func() {
		stop()
		<-done
	})
	go func() {
		defer close(done)
		b.listen(lctx, cfg, inst, conn)
	}()
	return inst, nil
}

// holdLock connects, takes the instance's advisory lock and LISTENs.
func (b *postgresBackend) holdLock(ctx context.Context, cfg *pgx.ConnConfig, id string) (*pgx.Conn, error) {
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
		return nil, fmt.Errorf("instance %q (advisory lock %d): %w", id, instanceKey(id), ErrInstanceRunning)
	}
	if _, err := conn.Exec(cctx, `LISTEN `+wakeChannel); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("listen: %w", err)
	}
	return conn, nil
}

// listen delivers wake-ups until ctx ends, reconnecting (and taking the lock
// back) when the connection drops.
func (b *postgresBackend) listen(ctx context.Context, cfg *pgx.ConnConfig, inst *Instance, conn *pgx.Conn) {
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
			if w, ok := parseWake(n.Payload, inst.ID); ok {
				inst.deliver(w)
			}
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
			conn, err = b.holdLock(ctx, cfg, inst.ID)
			if errors.Is(err, ErrInstanceRunning) {
				inst.fail(fmt.Errorf("lost the instance lock while PostgreSQL was unreachable: %w", err))
				return
			}
		}
		inst.deliver(Wake{Kind: WakeAll}) // what was sent meanwhile is lost
	}
}

// wakePayload is one NOTIFY payload: "instance kind id" (ids have no spaces).
func wakePayload(instance, kind, id string) string { return instance + " " + kind + " " + id }

// parseWake reads a payload, skipping the instance's own.
func parseWake(payload, self string) (Wake, bool) {
	parts := strings.SplitN(payload, " ", 3)
	if len(parts) != 3 || parts[0] == self {
		return Wake{}, false
	}
	return Wake{Kind: parts[1], ID: parts[2]}, true
}
