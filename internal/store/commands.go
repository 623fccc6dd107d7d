package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// The columns the backends' command statements read (CommandGet and the
// others RETURNING a command), in scanCommand's order:
//
//	command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
//	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
//	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

func scanCommand(row interface{ Scan(...any) error }) (domain.Command, error) {
	var r commandRow
	if err := row.Scan(r.dests()...); err != nil {
		return domain.Command{}, err
	}
	return r.command(), nil
}

// commandRow holds scanCommand's columns while they are scanned, for a row
// that holds more than a command's (CommandAdvanceFinish).
type commandRow struct {
	c                             domain.Command
	params, result, lateResult    sql.NullString
	issued, expires, next, cr, up int64
	lastSent, serial              sql.NullInt64
}

func (r *commandRow) dests() []any {
	c := &r.c
	return []any{&c.CommandID, &c.OperationID, &c.DeviceID, &c.Action, &r.params, &r.issued, &r.expires, &c.Status,
		&c.StatusRank, &c.Attempt, &c.Queries, &c.QoS, &c.Version, &c.Reason, &r.result, &c.LastSeq, &c.ExecutedAs,
		&c.ResolvedBy, &c.LateOutcome, &r.lateResult, &c.LateConflict, &c.LastQueryID, &c.LastAnswer, &r.next, &r.lastSent,
		&r.cr, &r.up, &r.serial}
}

// command is the command scanned.
func (r *commandRow) command() domain.Command {
	c := r.c
	c.SerialSeq = r.serial.Int64
	c.Params = json.RawMessage(r.params.String)
	if r.result.Valid {
		c.Result = json.RawMessage(r.result.String)
	}
	if r.lateResult.Valid {
		c.LateResult = json.RawMessage(r.lateResult.String)
	}
	c.IssuedAt, c.ExpiresAt, c.NextCheckAt = fromMS(r.issued), fromMS(r.expires), fromMS(r.next)
	c.CreatedAt, c.UpdatedAt, c.LastSentAt = fromMS(r.cr), fromMS(r.up), fromNullMS(r.lastSent)
	return c
}

func getCommand(ctx context.Context, q queryer, id string) (domain.Command, error) {
	st, locking := statementsOf(q)
	query := st.CommandGet
	if locking {
		query = st.CommandGetForUpdate
	}
	c, err := scanCommand(q.QueryRowContext(ctx, query, id))
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Command{}, fmt.Errorf("command %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Command{}, fmt.Errorf("get command %s: %w", id, err)
	}
	return c, nil
}

// GetCommand reads one command.
func (s *DB) GetCommand(ctx context.Context, id string) (domain.Command, error) {
	return getCommand(ctx, s.rq, id)
}

// Receipts lists the receipt log of one command, oldest first.
// Queries lists the queries sent about a command, by the time they were
// sent, each with its answer if one came.
func (s *DB) Queries(ctx context.Context, commandID string) ([]domain.Query, error) {
	return listQueries(ctx, s.rq, commandID)
}

func listQueries(ctx context.Context, q queryer, commandID string) ([]domain.Query, error) {
	rows, err := q.QueryContext(ctx, stmts(q).AuditQueries, commandID)
	if err != nil {
		return nil, fmt.Errorf("list queries of %s: %w", commandID, err)
	}
	defer rows.Close()
	out := []domain.Query{}
	for rows.Next() {
		var (
			qr       domain.Query
			sent     int64
			answered sql.NullInt64
		)
		if err := rows.Scan(&qr.QueryID, &qr.CommandID, &qr.Instance, &qr.FencingToken, &sent, &answered, &qr.Answer); err != nil {
			return nil, fmt.Errorf("list queries of %s: %w", commandID, err)
		}
		qr.SentAt, qr.AnsweredAt = fromMS(sent), fromNullMS(answered)
		out = append(out, qr)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list queries of %s: %w", commandID, err)
	}
	return out, nil
}

func (s *DB) Receipts(ctx context.Context, commandID string) ([]domain.ReceiptRecord, error) {
	return listReceipts(ctx, s.rq, commandID)
}

func listReceipts(ctx context.Context, q queryer, commandID string) ([]domain.ReceiptRecord, error) {
	rows, err := q.QueryContext(ctx, stmts(q).ReceiptList, commandID)
	if err != nil {
		return nil, fmt.Errorf("list receipts of %s: %w", commandID, err)
	}
	defer rows.Close()
	out := []domain.ReceiptRecord{}
	for rows.Next() {
		var (
			r      domain.ReceiptRecord
			recv   int64
			result sql.NullString
		)
		if err := rows.Scan(&r.CommandID, &r.SentAs, &r.DeviceID, &r.Status, &r.Seq, &r.At, &recv, &r.QueryID,
			&r.Effect, &r.Error, &result, &r.Instance); err != nil {
			return nil, fmt.Errorf("list receipts of %s: %w", commandID, err)
		}
		r.ReceivedAt = fromMS(recv)
		if result.Valid {
			r.Result = json.RawMessage(result.String)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Events lists the events log of one entity (operation or command id), oldest first.
func (s *DB) Events(ctx context.Context, entityID string) ([]domain.Event, error) {
	return listEvents(ctx, s.rq, s.q.EventListOfBy, entityID)
}

// AllEvents lists the whole events log, oldest first (for verification).
func (s *DB) AllEvents(ctx context.Context) ([]domain.Event, error) {
	return listEvents(ctx, s.rq, s.q.EventList)
}

// listEvents lists the events a statement of the EventList family
// selects, oldest first.
func listEvents(ctx context.Context, q queryer, query string, args ...any) ([]domain.Event, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	// EventListOfBy selects the principal too (migration 0010); the
	// audit's statements do not, so that it reads a database from before.
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out := []domain.Event{}
	for rows.Next() {
		var (
			e  domain.Event
			at int64
		)
		dest := []any{&e.ID, &at, &e.Machine, &e.EntityID, &e.From, &e.To, &e.Reason, &e.Instance,
			&e.FencingToken, &e.Refused}
		if len(cols) > len(dest) {
			dest = append(dest, &e.Principal)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Decision is a committed decision: the command as the write left it and
// the lease expiry the write checked, for the trust-window check the holder
// makes right before acting.
type Decision struct {
	Command        domain.Command
	LeaseExpiresAt time.Time
}

// decision is the change of a fenced decision about a command.
func (t *tx) decision(ctx context.Context, commandID string, from, to fsm.CommandState, f domain.Fence) change {
	return change{machine: "command", id: commandID, from: string(from), to: string(to), token: f.Token,
		explain: t.fenceExplainer(ctx, t.s.q.CommandFenceHeld, commandID, f)}
}

// scanInto reads a RETURNING row of commandColumns into c.
func scanInto(c *domain.Command) func(rowScanner) error {
	return func(row rowScanner) (err error) {
		*c, err = scanCommand(row)
		return err
	}
}

// decided reads, inside the decision's transaction, the command as the
// write left it (RETURNING) and the lease it checked.
func (t *tx) decided(ctx context.Context, d *Decision) func(rowScanner) error {
	return func(row rowScanner) error {
		c, err := scanCommand(row)
		if err != nil {
			return err
		}
		var lease int64
		if err := t.QueryRowContext(ctx, t.s.q.OperationLeaseExpiry, c.OperationID).Scan(&lease); err != nil {
			return fmt.Errorf("read lease of %s: %w", c.OperationID, err)
		}
		d.Command, d.LeaseExpiresAt = c, fromMS(lease)
		return nil
	}
}

// ClaimSend commits the decision to publish a command: pending or
// waiting_device → sent with attempt 0 → 1, or a re-send of a command in
// expect with attempt n → n+1. Only one caller can win a given (state,
// attempt); the others get a *RefusedError. nextCheck is when the sweeper
// looks at the command again if no final receipt arrives.
func (s *DB) ClaimSend(ctx context.Context, commandID string, expect fsm.CommandState, expectAttempt int, qos int, f domain.Fence, nextCheck time.Time) (Decision, error) {
	var d Decision
	err := s.writeLocking(ctx, lockCommands(commandID), func(ctx context.Context, t *tx) error {
		to := expect
		if expect == fsm.CmdPending || expect == fsm.CmdWaitingDevice {
			to = fsm.CmdSent
		}
		if expect != to {
			if err := fsm.Command.Transition(expect, to); err != nil {
				return t.refuse("command", commandID, string(expect), string(to), ReasonIllegal, f.Token)
			}
		}
		now := ms(t.now)
		ch := t.decision(ctx, commandID, expect, to, f)
		ch.explain = t.queueExplainer(ctx, commandID, ch.explain)
		err := t.cas(ctx, ch, t.decided(ctx, &d), t.s.q.CommandClaimSend,
			append([]any{to, qos, ms(nextCheck), now, now, commandID, expect, expectAttempt}, fenceArgs(f, t.now)...)...)
		if err != nil {
			return err
		}
		return t.event("command", commandID, string(expect), string(to), fmt.Sprintf("publish attempt %d", expectAttempt+1), f.Token)
	})
	return d, err
}

// ClaimQuery commits the decision to ask the device about a command: the
// query row and, when counted, the command's query count (its budget,
// max_attempts; the asks after a reconnect are not counted), fenced like
// every decision and conditioned on the command still being in the state and
// count the caller saw.
func (s *DB) ClaimQuery(ctx context.Context, commandID, queryID string, expect fsm.CommandState, expectQueries int, counted bool, f domain.Fence, nextCheck time.Time) (Decision, error) {
	var d Decision
	err := s.writeLocking(ctx, lockCommands(commandID), func(ctx context.Context, t *tx) error {
		now := ms(t.now)
		err := t.cas(ctx, t.decision(ctx, commandID, expect, expect, f), t.decided(ctx, &d), t.s.q.CommandClaimQuery,
			append([]any{counted, queryID, ms(nextCheck), now, commandID, expect, expectQueries}, fenceArgs(f, t.now)...)...)
		if err != nil {
			return err
		}
		if _, err := t.Exec(s.q.QueryInsert,
			queryID, commandID, t.instance, f.Token, now); err != nil {
			return fmt.Errorf("insert query %s: %w", queryID, err)
		}
		return nil
	})
	return d, err
}

// Postpone moves a command's next check without any other change (nothing to
// do yet). It is fenced like a decision; a refusal is not recorded (nothing
// was decided), only returned.
func (s *DB) Postpone(ctx context.Context, commandID string, expectVersion int64, f domain.Fence, next time.Time) error {
	return s.writeLocking(ctx, lockCommands(commandID), func(ctx context.Context, t *tx) error {
		r, err := t.Exec(t.s.q.CommandPostpone,
			append([]any{ms(next), commandID, expectVersion}, fenceArgs(f, t.now)...)...)
		if err != nil {
			return fmt.Errorf("postpone %s: %w", commandID, err)
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return &RefusedError{Machine: "command", ID: commandID, Reason: ReasonStale}
		}
		return nil
	})
}

// Move commits a decision that changes a command's state without a
// device's word: timeout (expires_at passed), failed by policy
// (device_offline), waiting_device, needs_attention. It names the state and
// version the caller saw, and the fence; a terminal state ends the
// operation by the contract's outcome mapping. nextCheck is when the
// sweeper looks again (ignored for terminal states).
func (s *DB) Move(ctx context.Context, commandID string, from fsm.CommandState, expectVersion int64, to fsm.CommandState, reason string, f domain.Fence, nextCheck time.Time) (domain.Command, error) {
	var out domain.Command
	err := s.writeLocking(ctx, lockCommands(commandID), func(ctx context.Context, t *tx) error {
		if err := fsm.Command.Transition(from, to); err != nil {
			return t.refuse("command", commandID, string(from), string(to), ReasonIllegal, f.Token)
		}
		// Going to waiting_device forgets the last question: when the device
		// is back, a command published before is asked about afresh.
		forget := to == fsm.CmdWaitingDevice
		var d Decision
		err := t.cas(ctx, t.decision(ctx, commandID, from, to, f), t.decided(ctx, &d), t.s.q.CommandMove,
			append([]any{to, reason, ms(nextCheck), ms(t.now), forget, forget, commandID, from, expectVersion}, fenceArgs(f, t.now)...)...)
		if err != nil {
			return err
		}
		if err := t.event("command", commandID, string(from), string(to), reason, f.Token); err != nil {
			return err
		}
		out = d.Command
		return t.finishOperation(ctx, out, to, reason, nil, false)
	})
	return out, err
}

// Wake makes a device's open commands due now after a presence change, and
// bumps their version: a decision the lease holder computed from the old
// presence (a move to waiting_device, a postpone) then fails its version
// condition and is taken again with the new presence. No state changes.
func (s *DB) Wake(ctx context.Context, device string) ([]string, error) {
	var ids []string
	err := s.writeLocking(ctx, rowLocks{devices: []string{device}}, func(ctx context.Context, t *tx) error {
		var err error
		ids, err = queryStrings(ctx, t, s.q.CommandWakeDevice, ms(t.now), device)
		for _, id := range ids {
			t.wake(WakeCommand, id) // their holders may be other instances
		}
		return err
	})
	return ids, err
}

// OpenCommand is a non-terminal command with the lease of its operation,
// for the sweeper and for reconciliation.
type OpenCommand struct {
	domain.Command
	Fence          domain.Fence
	LeaseExpiresAt time.Time
	// Claimed: its publish decision committed with its submit
	// (NewOperation.FromDevice) and the publish is still to be made.
	// Only a submit's copy as inserted has it; a read never does.
	Claimed bool
}

// DueCommands lists up to limit non-terminal commands whose operation owner
// holds a live lease and whose next check (or expiry) has come by now. With
// all set it lists every open command of owner regardless of time (the
// ask-after-reconnect).
func (s *DB) DueCommands(ctx context.Context, owner string, now time.Time, all bool, limit int) ([]OpenCommand, error) {
	if all {
		return s.openCommands(ctx, s.q.CommandListOpen, owner, ms(now), limit)
	}
	return s.openCommands(ctx, s.q.CommandListDue, owner, ms(now), ms(now), ms(now), limit)
}

// OpenCommand reads one non-terminal command of a started operation with
// its operation's lease; domain.ErrNotFound if it is terminal or unknown.
func (s *DB) OpenCommand(ctx context.Context, commandID string) (OpenCommand, error) {
	out, err := s.openCommands(ctx, s.q.CommandOpen, commandID)
	if err != nil {
		return OpenCommand{}, err
	}
	if len(out) == 0 {
		return OpenCommand{}, fmt.Errorf("open command %s: %w", commandID, domain.ErrNotFound)
	}
	return out[0], nil
}

// openCommands runs a statement of the CommandOpen family: commandColumns,
// the serial command just ahead (QueuedBehind), then the operation's
// owner, token and lease.
func (s *DB) openCommands(ctx context.Context, query string, args ...any) ([]OpenCommand, error) {
	rows, err := s.rq.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("open commands: %w", err)
	}
	defer rows.Close()
	var out []OpenCommand
	for rows.Next() {
		var (
			oc     OpenCommand
			behind string
			lease  int64
		)
		oc.Command, err = scanCommand(scanFunc(func(dest ...any) error {
			return rows.Scan(append(dest, &behind, &oc.Fence.Owner, &oc.Fence.Token, &lease)...)
		}))
		if err != nil {
			return nil, err
		}
		oc.QueuedBehind = behind
		oc.LeaseExpiresAt = fromMS(lease)
		out = append(out, oc)
	}
	return out, rows.Err()
}

type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }
