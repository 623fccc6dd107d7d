// Package driver is the contract between the store and its database
// backends, as riverdriver is River's: package store holds everything the
// two databases share (the records, the compare-and-set with its recorded
// refusals, the group commit, the one test suite), and each backend
// package (internal/store/sqlite, internal/store/postgres) implements
// Driver with what differs: how its pools open, its migrations, its whole
// statements in its own dialect, its lock clauses and placeholders, which
// errors end a transaction, how instances wake each other and how one
// holds its instance id. This package imports no database driver, so
// neither does the store; package internal/store/backend picks the
// backend from a --db value.
package driver

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"time"
)

// ErrInstanceRunning: another live process holds this instance id.
var ErrInstanceRunning = errors.New("an instance with this id is already running")

// Execer runs a statement: the writer's connection, inside its open
// transaction.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Driver is one database backend.
type Driver interface {
	// Name is "sqlite" or "postgres": the bench's and the logs' word,
	// never a thing to branch on (Capabilities is).
	Name() string
	// Capabilities is what the rest of the controller may rely on.
	Capabilities() Capabilities

	// Open opens the writer pool (one connection: the group commit's) and
	// the read pool of readers connections.
	Open(ctx context.Context, dsn string, readers int) (w, r *sql.DB, err error)
	// OpenSnapshot opens a one-connection read-only pool and the options
	// of the transaction that reads one consistent snapshot (the audit's).
	// It neither creates the database nor applies migrations.
	OpenSnapshot(ctx context.Context, dsn string) (*sql.DB, *sql.TxOptions, error)
	// Migrations holds the backend's numbered migration files (NNNN_*.sql)
	// at its root.
	Migrations() fs.FS
	// BeginMigrations starts the transaction that applies the migrations,
	// serialised against instances starting at the same moment.
	BeginMigrations(ctx context.Context, w *sql.DB) (*sql.Tx, error)

	// Statements are the backend's whole statements, by name.
	Statements() *Statements
	// Placeholder is the n-th (from 1) placeholder of a statement the
	// store builds at run time (lists of variable length, filters).
	Placeholder(n int) string
	// Rebind turns a statement written with ? placeholders into the
	// backend's own: for the statements the store builds at run time (the
	// list pages' filters; see the store's doc.go), none of which takes a
	// row lock. A named statement is already in the backend's dialect and
	// passes unchanged.
	Rebind(query string) string
	// Arg turns a Go value into what the backend stores (flags are 0/1
	// integers and JSON is text on both backends).
	Arg(v any) any

	// EndsTransaction reports whether err may have ended the whole
	// transaction, so that every change of the batch must fail.
	EndsTransaction(err error) bool
	// Conflict reports whether err is a deadlock or serialisation failure
	// that rolled back only the change's own statement: the change is then
	// run again inside the same batch.
	Conflict(err error) bool

	// Begin is the statement that opens the writer's transaction on its
	// connection: the store sends BEGIN, COMMIT and ROLLBACK itself rather
	// than through a *sql.Tx, whose rows each start a goroutine that
	// watches the transaction's context.
	Begin() string
	// Notify sends a batch's wake-ups inside its transaction, so that
	// other instances hear of them exactly when they commit; sent says
	// whether it took a round trip. Without Capabilities.Notifications it
	// sends nothing.
	Notify(ctx context.Context, tx Execer, payloads []string) (sent bool, err error)
	// LockInstance holds the instance id exclusively for this process (an
	// flock beside an SQLite file, a session advisory lock on PostgreSQL),
	// or fails with an error wrapping ErrInstanceRunning while another
	// live process holds it. The hold reports through ev until released.
	LockInstance(ctx context.Context, dsn, id string, ev HoldEvents) (*Hold, error)
	// Files are the files of the database at dsn whose paths must keep
	// naming the files the store opened (the store's guard.go), the
	// database first; none when the database has no files of its own.
	Files(dsn string) []File
}

// Checkpointer is a backend whose log the store has copied into the
// database beside its writer, rather than by the writer inside a commit
// (SQLite's WAL). StartCheckpoints begins on a connection of its own, a
// checkpoint each every; stop ends them and closes the connection (once,
// however often it is called).
type Checkpointer interface {
	StartCheckpoints(dsn string, every time.Duration) (stop func() error, err error)
}

// Capabilities is what a backend lets the rest rely on, so that nothing
// outside the store asks which database it is.
type Capabilities struct {
	// SharedWriters: several instances may write the database at once.
	// Each then takes the receipts of the devices it owns (the peers'
	// division) from a clean MQTT session; without it one instance
	// applies every receipt, from a persistent session.
	SharedWriters bool
	// GroupReceipts: receipts may be applied in groups, several to one
	// batch of the group commit.
	GroupReceipts bool
	// Notifications: instances wake each other by notification (they
	// reach the store's feed as remote facts); without it they only poll.
	Notifications bool
	// RowLocks: a change locks the rows it reads before it writes them
	// (the batch's pre-lock); without it the one writer is the lock.
	RowLocks bool
	// Prepares: the store keeps its own prepared statements (the driver
	// would otherwise prepare each statement afresh).
	Prepares bool
	// BindsQueriesAtOnce: the driver binds a query's arguments in one call
	// (go-sqlite3: with its first step, in one call into C) but an Exec's
	// one call each, so the batch's multi-row INSERTs run as queries.
	BindsQueriesAtOnce bool
	// WritesTogether: a change's two writes go in one statement (a
	// data-modifying WITH), one round trip instead of two: a submit's
	// operation and command (OperationCommandInsert), a final receipt's
	// command and operation (CommandAdvanceFinish).
	WritesTogether bool
	// ListsDevicesInBulk: new operations and commands are written outside
	// the lists' device indexes (device_listed = 0, in an index of pending
	// rows in time order), and the writer moves them in about twice a
	// second (DeviceListOperations, DeviceListCommands); a list by device
	// reads both. On SQLite each commit otherwise rewrote a leaf of each
	// device index per device it touched.
	ListsDevicesInBulk bool
}

// File is one file of the database, or of its instance lock, whose path
// must keep naming the file the store opened.
type File struct {
	What, Path string
	// Open is the file the hold keeps open (the instance lock), or nil.
	Open *os.File
}

// HoldEvents is how an instance hold reports.
type HoldEvents struct {
	// Notification delivers a wake-up another instance sent (its payload,
	// the instance's own included).
	Notification func(payload string)
	// Missed says notifications may have been lost (the channel was down
	// and is back).
	Missed func()
	// Lost says the hold was lost and could not be taken back.
	Lost func(error)
}

// Hold is an instance's hold on its id.
type Hold struct {
	// Files are the hold's own files the store must guard (the lock
	// file), if any.
	Files []File
	// Release gives the id back; called once.
	Release func()
}
