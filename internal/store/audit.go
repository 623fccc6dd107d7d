package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store/driver"
)

// Audit reads a controller's database for the invariant checker (verify),
// the HTML report and the demo's summary: the store's read-only door for
// code that judges a run, so that no code outside the store opens the file
// or writes SQL against it.
//
// An Audit is one read transaction on a read-only connection: every method
// sees the same snapshot, the database as it was at OpenAudit, even while a
// controller goes on writing (SQLite's WAL keeps the snapshot readable).
// Open a new Audit to see later commits; Close it promptly, since the WAL
// cannot be checkpointed past an open snapshot. Use an Audit from one
// goroutine at a time.
type Audit struct {
	db *sql.DB
	tx *sql.Tx
	q  auditQueries
}

// OpenAudit opens the database that dsn names (an SQLite file, read-only:
// mode=ro neither creates the file nor applies migrations; or a postgres://
// URL, in a READ ONLY REPEATABLE READ transaction) and takes its snapshot.
// A missing or unreadable database is an error here, not at the first read.
func OpenAudit(ctx context.Context, d driver.Driver, dsn string) (*Audit, error) {
	if dsn == "" {
		return nil, errors.New("store: empty database path")
	}
	db, opts, err := d.OpenSnapshot(ctx, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // the transaction's connection; no query runs outside it
	// The transaction outlives ctx: it ends at Close, not when ctx is done.
	tx, err := db.BeginTx(context.Background(), opts)
	if err == nil {
		// The snapshot is taken at the first read; the schema must be there.
		var n int
		err = tx.QueryRowContext(ctx, d.Statements().SchemaCount).Scan(&n)
		if err != nil {
			tx.Rollback()
		}
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s read-only: %w", redact(dsn), err)
	}
	return &Audit{db: db, tx: tx, q: auditQueries{tx: tx, d: d}}, nil
}

// redact hides a URL's password in messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return dsn
}

// auditQueries runs the audit's statements in its transaction, in the
// backend's placeholders.
type auditQueries struct {
	tx *sql.Tx
	d  driver.Driver
}

func (q auditQueries) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return q.tx.QueryContext(ctx, q.d.Rebind(query), args...)
}

func (q auditQueries) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return q.tx.QueryRowContext(ctx, q.d.Rebind(query), args...)
}

// Close ends the snapshot and closes the connection. Calling it again does
// nothing.
func (a *Audit) Close() error {
	err := a.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		err = nil
	}
	return errors.Join(err, a.db.Close())
}

// AuditCount is one row of a count by state (or by receipt effect).
type AuditCount struct {
	Name string
	N    int
}

// OperationsByStatus counts the operations in each status, by status name;
// statuses with no operation are absent.
func (a *Audit) OperationsByStatus(ctx context.Context) ([]AuditCount, error) {
	return a.counts(ctx, "operations by status", stmts(a.q).AuditOperationsByStatus)
}

// CommandsByStatus counts the commands in each status, by status name;
// statuses with no command are absent.
func (a *Audit) CommandsByStatus(ctx context.Context) ([]AuditCount, error) {
	return a.counts(ctx, "commands by status", stmts(a.q).AuditCommandsByStatus)
}

// ReceiptsByInstance counts the receipt log's lines by the instance that
// applied them: how instances sharing a database divided the receipts.
func (a *Audit) ReceiptsByInstance(ctx context.Context) ([]AuditCount, error) {
	return a.counts(ctx, "receipts by instance", stmts(a.q).AuditReceiptsByInstance)
}

// ReceiptsByEffect counts the receipt log's lines by effect (EffectApplied,
// EffectDuplicate, ...), by effect name; effects never recorded are absent.
func (a *Audit) ReceiptsByEffect(ctx context.Context) ([]AuditCount, error) {
	return a.counts(ctx, "receipts by effect", stmts(a.q).AuditReceiptsByEffect)
}

func (a *Audit) counts(ctx context.Context, what, query string) ([]AuditCount, error) {
	rows, err := a.q.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("audit: count %s: %w", what, err)
	}
	defer rows.Close()
	out := []AuditCount{}
	for rows.Next() {
		var c AuditCount
		if err := rows.Scan(&c.Name, &c.N); err != nil {
			return nil, fmt.Errorf("audit: count %s: %w", what, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: count %s: %w", what, err)
	}
	return out, nil
}

// AuditOperation is an operation as the invariant checks read it: its
// request and its status.
type AuditOperation struct {
	OperationID string
	Action      string
	Target      string
	Params      json.RawMessage // as stored: RFC 8785 canonical JSON
	Status      fsm.OperationState
}

// Operations lists every operation, by operation_id.
func (a *Audit) Operations(ctx context.Context) ([]AuditOperation, error) {
	rows, err := a.q.QueryContext(ctx, stmts(a.q).AuditOperations)
	if err != nil {
		return nil, fmt.Errorf("audit: list operations: %w", err)
	}
	defer rows.Close()
	out := []AuditOperation{}
	for rows.Next() {
		var (
			o      AuditOperation
			params string
		)
		if err := rows.Scan(&o.OperationID, &o.Action, &o.Target, &params, &o.Status); err != nil {
			return nil, fmt.Errorf("audit: list operations: %w", err)
		}
		o.Params = json.RawMessage(params)
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: list operations: %w", err)
	}
	return out, nil
}

// AuditCommand is a command as the invariant checks and the demo read it.
type AuditCommand struct {
	CommandID   string
	OperationID string
	DeviceID    string
	Action      string
	Params      json.RawMessage // as stored, copied from the operation at submit
	Status      fsm.CommandState
	ExpiresAt   time.Time
	Attempt     int    // committed publish decisions
	Queries     int    // committed query decisions
	ExecutedAs  string // the command_id the device ran it as, when another
	LateOutcome string // a final receipt that came after a terminal state
	CreatedAt   time.Time
}

// Commands lists every command, oldest first (by created_at, then command_id).
func (a *Audit) Commands(ctx context.Context) ([]AuditCommand, error) {
	rows, err := a.q.QueryContext(ctx, stmts(a.q).AuditCommands)
	if err != nil {
		return nil, fmt.Errorf("audit: list commands: %w", err)
	}
	defer rows.Close()
	out := []AuditCommand{}
	for rows.Next() {
		var (
			c                AuditCommand
			params           string
			expires, created int64
		)
		if err := rows.Scan(&c.CommandID, &c.OperationID, &c.DeviceID, &c.Action, &params, &c.Status, &expires,
			&c.Attempt, &c.Queries, &c.ExecutedAs, &c.LateOutcome, &created); err != nil {
			return nil, fmt.Errorf("audit: list commands: %w", err)
		}
		c.Params, c.ExpiresAt, c.CreatedAt = json.RawMessage(params), fromMS(expires), fromMS(created)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: list commands: %w", err)
	}
	return out, nil
}

// LegacyDevices lists, by id, the devices that announced themselves (a
// birth was applied) without the dedupe capability: devices that may run a
// re-sent command twice, which invariant 1 does not cover.
func (a *Audit) LegacyDevices(ctx context.Context) ([]string, error) {
	rows, err := a.q.QueryContext(ctx, stmts(a.q).AuditLegacyDevices)
	if err != nil {
		return nil, fmt.Errorf("audit: list legacy devices: %w", err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("audit: list legacy devices: %w", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: list legacy devices: %w", err)
	}
	return out, nil
}

// presenceMachine is the events log's machine of presence changes (the
// device has no fsm table: presence is ordered by rank, not by transitions).
const presenceMachine = "device"

// Events lists the whole events log, applied and refused lines of every
// machine, in the order they were written (by id).
func (a *Audit) Events(ctx context.Context) ([]domain.Event, error) {
	return listEvents(ctx, a.q, stmts(a.q).EventList)
}

// EventsOf lists the events log of one entity (an operation, command, task,
// device or instance id), in the order written.
func (a *Audit) EventsOf(ctx context.Context, entityID string) ([]domain.Event, error) {
	return listEvents(ctx, a.q, stmts(a.q).EventListOf, entityID)
}

// PresenceEvents lists the presence changes (online, offline) recorded for
// one device with from <= at <= to (millisecond precision), in the order
// written.
func (a *Audit) PresenceEvents(ctx context.Context, deviceID string, from, to time.Time) ([]domain.Event, error) {
	return listEvents(ctx, a.q, stmts(a.q).EventListPresence,
		presenceMachine, deviceID, ms(from), ms(to))
}

// Receipts lists the receipt log of one command (the receipts applied to it,
// or naming it), in the order received.
func (a *Audit) Receipts(ctx context.Context, commandID string) ([]domain.ReceiptRecord, error) {
	return listReceipts(ctx, a.q, commandID)
}

// AuditQuery is one query the controller sent about a command
// (domain.Query).
type AuditQuery = domain.Query

// Queries lists the queries sent about one command, by the time they were sent.
func (a *Audit) Queries(ctx context.Context, commandID string) ([]AuditQuery, error) {
	return listQueries(ctx, a.q, commandID)
}

// EventfulCommand is a command with the score EventfulCommands ranks it by.
type EventfulCommand struct {
	CommandID   string
	OperationID string
	DeviceID    string
	Status      fsm.CommandState
	Score       int
	Attempt     int
	Queries     int
	LateOutcome string
}

// troubledCommandStates are the command states that count as a bad end in
// EventfulCommands: every terminal state but succeeded, and needs_attention.
func troubledCommandStates() []fsm.CommandState {
	var out []fsm.CommandState
	for _, s := range fsm.Command.States() {
		if (s.Terminal() && s != fsm.CmdSucceeded) || s == fsm.CmdNeedsAttention {
			out = append(out, s)
		}
	}
	return out
}

// EventfulCommands lists up to limit commands, most eventful first (ties:
// the oldest first). The score adds 3 for a re-send (attempt > 1), 2 for any
// query, 4 for a late outcome, 3 for a bad end (troubledCommandStates), 2
// for running as another command_id, and 2 per refused transition.
func (a *Audit) EventfulCommands(ctx context.Context, limit int) ([]EventfulCommand, error) {
	troubled := troubledCommandStates()
	args := make([]any, 0, len(troubled)+1)
	for _, s := range troubled {
		args = append(args, string(s))
	}
	args = append(args, limit)
	in := strings.TrimSuffix(strings.Repeat("?,", len(troubled)), ",")
	rows, err := a.q.QueryContext(ctx, `SELECT c.command_id, c.operation_id, c.device_id, c.status,
		(CASE WHEN c.attempt > 1 THEN 3 ELSE 0 END) + (CASE WHEN c.queries > 0 THEN 2 ELSE 0 END)
		 + (CASE WHEN c.late_outcome != '' THEN 4 ELSE 0 END) + (CASE WHEN c.status IN (`+in+`) THEN 3 ELSE 0 END)
		 + (CASE WHEN c.executed_as != '' THEN 2 ELSE 0 END) + (SELECT COUNT(*) FROM events e WHERE e.entity_id = c.command_id AND e.refused = 1) * 2 AS score,
		c.attempt, c.queries, c.late_outcome
		FROM commands c ORDER BY score DESC, c.created_at LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("audit: rank commands: %w", err)
	}
	defer rows.Close()
	out := []EventfulCommand{}
	for rows.Next() {
		var c EventfulCommand
		if err := rows.Scan(&c.CommandID, &c.OperationID, &c.DeviceID, &c.Status, &c.Score, &c.Attempt, &c.Queries, &c.LateOutcome); err != nil {
			return nil, fmt.Errorf("audit: rank commands: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: rank commands: %w", err)
	}
	return out, nil
}
