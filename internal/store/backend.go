package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync"
)

// A backend is what differs between the two databases the store runs on:
// how the pools open, the schema's migrations, the placeholder syntax,
// which errors end a whole transaction, how an instance id is held
// exclusively and how instances wake each other. Everything else (the
// conditional writes, the group commit, the state machines) is the same
// code on both, with statements written in the SQL that both speak.
type backend interface {
	// name is "sqlite" or "postgres" (the bench's and the logs' word).
	name() string
	// open opens the writer pool (one connection: the group commit's) and
	// the read pool.
	open(ctx context.Context, dsn string, readers int) (w, r *sql.DB, err error)
	// migrations is the directory of this backend's files in migrationFS.
	migrations() string
	// beginMigrations starts the transaction that applies the migrations,
	// serialised against instances starting at the same moment.
	beginMigrations(ctx context.Context, w *sql.DB) (*sql.Tx, error)
	// schemaTable creates the table of applied migrations if missing.
	schemaTable() string
	// rebind turns the store's ? placeholders into the backend's own.
	rebind(query string) string
	// arg turns a Go value into what the backend stores (flags are 0/1
	// integers and JSON is text on both backends).
	arg(v any) any
	// forUpdate is the clause that locks the rows a change reads before it
	// writes them: another instance applying a fact about the same command
	// (or deciding about it) waits for this change's commit, then reads
	// what it committed. On PostgreSQL it is FOR NO KEY UPDATE, the lock a
	// plain UPDATE takes: it excludes the other writers of the row but not
	// a fence (fenceLock) or a foreign key's check. Empty with SQLite, whose
	// one writer is the lock.
	forUpdate() string
	// fenceLock is the clause with which a decision's fence reads its
	// operation's row: held until the commit, it keeps out the writes that
	// change an operation's owner or token (tokenLock: a takeover, a
	// reclaim, a retry by another instance) and nothing else, so the facts
	// that finish an operation never wait for it. Empty with SQLite.
	fenceLock() string
	// tokenLock is the clause with which a change that moves an
	// operation's lease to a new token reads the row first: it waits for
	// (or, with skipLocked, passes over) the decisions whose fence holds
	// the row. Empty with SQLite.
	tokenLock() string
	// skipLocked is the clause of a bulk change's row selection that passes
	// over rows another instance's transaction holds (a heartbeat, a
	// takeover sweep, an unconfirm), a fence included: they are taken at
	// the next round instead of deadlocking with that transaction, or
	// being taken from under a decision. Empty with SQLite.
	skipLocked() string
	// prepares says whether the store keeps its own prepared statements
	// (pgx caches them per connection by itself).
	prepares() bool
	// endsTransaction reports whether err may have ended the whole
	// transaction, so that every change of the batch must fail.
	endsTransaction(err error) bool
	// conflict reports whether err is a deadlock or serialisation failure
	// that rolled back only the change's own statement: the change is then
	// run again inside the same batch.
	conflict(err error) bool
	// notify sends the batch's wake-ups inside its transaction, so that
	// other instances hear of them exactly when they commit; sent says
	// whether it took a round trip.
	notify(ctx context.Context, t *sql.Tx, payloads []string) (sent bool, err error)
	// lockInstance holds the instance id exclusively for this process.
	lockInstance(ctx context.Context, s *DB, id string) (*Instance, error)
	// files are the files of the database at dsn whose paths must keep
	// naming the files the store opened (guard.go), the database first;
	// none with PostgreSQL.
	files(dsn string) []guardedFile
}

// backendFor picks the backend from the --db value: a postgres:// URL or
// an SQLite file path.
func backendFor(dsn string) backend {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return &postgresBackend{}
	}
	return sqliteBackend{}
}

// IsPostgres reports whether a --db value names a PostgreSQL database.
func IsPostgres(dsn string) bool { return backendFor(dsn).name() == "postgres" }

// Backend is the name of the store's backend: "sqlite" or "postgres".
func (s *DB) Backend() string { return s.b.name() }

// rebinder caches a backend's rewritten statements by their text.
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

// lockingRead is query with the backend's row lock when q is a write
// transaction (reads outside one take no lock).
func lockingRead(q queryer, query string) string {
	if t, ok := q.(*tx); ok {
		return query + t.s.b.forUpdate()
	}
	return query
}

// args converts a statement's arguments for the backend.
func (s *DB) args(args []any) []any {
	for i, a := range args {
		args[i] = s.b.arg(a)
	}
	return args
}
