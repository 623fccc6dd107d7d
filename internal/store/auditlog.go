package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// The audit log: who did what. Every change a person causes writes one row
// of the audit table, in the transaction of the change (tx.audit): the
// change and its row commit together or not at all. Only a change that
// changed something writes one: a refused change writes none, and neither
// does an idempotent repeat that finds the change already made (the same
// cancel, resolve, approval, rejection, plan, create or grant again, a
// revoke of a revoked grant, a rollout moved to the state it is in). A
// resolve that lost the race to the device's final receipt is kept as the
// command's late outcome, a change: it is audited, with "late": true. A
// presence reset has no idempotency of its own (it rewrites the rank and
// writes its event each time): each is audited.
//
// The events such a change writes carry the person's principal too
// (tx.by), so a command's, operation's or task's events say who moved it.
// Distinct from Audit (audit.go), the invariant checker's read-only view.

// Kinds of entity an audit entry names.
const (
	EntityOperation = "operation"
	EntityCommand   = "command"
	EntityDevice    = "device"
	EntityTask      = "task"
	EntityGrant     = "grant"
	EntityRollout   = "rollout"
)

// Actions an audit entry records (with its kind).
const (
	ActCancel        = "cancel"         // command; rollout
	ActResolve       = "resolve"        // command
	ActCompensate    = "compensate"     // operation (the compensation's)
	ActPlan          = "plan"           // task: a new plan version
	ActApprove       = "approve"        // task, rollout
	ActReject        = "reject"         // task
	ActCreate        = "create"         // task, rollout
	ActGrant         = "grant"          // grant: created
	ActRevoke        = "revoke"         // grant
	ActPresenceReset = "presence_reset" // device
	ActPause         = "pause"          // rollout
	ActResume        = "resume"         // rollout
)

// AuditEntry is one person's change.
type AuditEntry struct {
	ID        int64 // the row's, for paging
	At        time.Time
	Principal string
	Action    string
	Kind      string // EntityOperation, EntityCommand, ...
	EntityID  string
	// Detail is what changed, a JSON object (a resolve's outcome and note,
	// an approval's version, a grant's action and devices).
	Detail json.RawMessage
}

// by marks the change as a person's: its events carry who, and its audit
// row (tx.audit) names who.
func (t *tx) by(who string) { t.principal = who }

// audit writes the audit row of the person's change (tx.by), in the
// change's transaction: rolled back with the change, its savepoint
// included.
func (t *tx) audit(action, kind, id string, detail map[string]any) error {
	if detail == nil {
		detail = map[string]any{}
	}
	b, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("audit %s %s %s: %w", action, kind, id, err)
	}
	if _, err := t.Exec(t.s.q.AuditInsert, ms(t.now), t.principal, action, kind, id, string(b)); err != nil {
		return fmt.Errorf("audit %s %s %s: %w", action, kind, id, err)
	}
	return nil
}

// ParseAuditCursor is ParseStartCursor for the audit log, whose ids are
// the rows' integers (compared as numbers: each backend converts the
// cursor's digits to the column's type).
func ParseAuditCursor(s string) (StartCursor, error) {
	c, err := ParseStartCursor(s)
	if err != nil {
		return c, err
	}
	if n, err := strconv.ParseInt(c.ID, 10, 64); err != nil || n < 1 {
		return c, badCursor(s)
	}
	return c, nil
}

// AuditFilter narrows the audit log: one principal's ("" everyone's),
// from Since (inclusive) until Until (exclusive); a zero time is unbounded.
type AuditFilter struct {
	Principal    string
	Since, Until time.Time
}

// ListAudit lists one page of the audit log, newest first (at, then id),
// served by the indexes audit_at and audit_principal; it pages as the
// operator lists do (StartPage, an opaque cursor of at and id).
func (s *DB) ListAudit(ctx context.Context, f AuditFilter, p StartPage) (Listed[AuditEntry], error) {
	l := startList[AuditEntry]{from: "audit", start: "at", key: "id", parse: ParseAuditCursor,
		columns: "id, at, principal, action, kind, entity_id, detail",
		scan: func(row interface{ Scan(...any) error }) (AuditEntry, error) {
			var (
				e      AuditEntry
				at     int64
				detail string
			)
			err := row.Scan(&e.ID, &at, &e.Principal, &e.Action, &e.Kind, &e.EntityID, &detail)
			e.At, e.Detail = fromMS(at), json.RawMessage(detail)
			return e, err
		},
		cursor: func(e AuditEntry) StartCursor {
			return StartCursor{Start: e.At.UnixMilli(), ID: strconv.FormatInt(e.ID, 10)}
		}}
	if f.Principal != "" {
		l.filter("principal = ?", f.Principal)
	}
	l.bounds(f.Since, f.Until)
	return l.read(ctx, s, p)
}

// StatusCounts are the number of operations and of commands in each state:
// every state of the fsm tables present (0 when none), or with open only
// the open ones.
type StatusCounts struct {
	Operations map[string]int64
	Commands   map[string]int64
}

// CountByStatus counts operations and commands by state, in one read
// snapshot, each a GROUP BY over an index that starts with status
// (operations_status_started, commands_status_created): a scan of the whole index, or with
// open only of its range of open states, which stays small however many
// finished rows the database holds.
func (s *DB) CountByStatus(ctx context.Context, open bool) (StatusCounts, error) {
	out := StatusCounts{Operations: map[string]int64{}, Commands: map[string]int64{}}
	for _, st := range fsm.Operation.States() {
		if !open || !st.Terminal() {
			out.Operations[string(st)] = 0
		}
	}
	for _, st := range fsm.Command.States() {
		if !open || !st.Terminal() {
			out.Commands[string(st)] = 0
		}
	}
	opsQ, cmdsQ := s.q.OperationStatusCounts, s.q.CommandStatusCounts
	if open {
		opsQ, cmdsQ = s.q.OperationOpenStatusCounts, s.q.CommandOpenStatusCounts
	}
	rtx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return out, fmt.Errorf("count by status: %w", err)
	}
	defer rtx.Rollback()
	for _, c := range []struct {
		query string
		into  map[string]int64
	}{{opsQ, out.Operations}, {cmdsQ, out.Commands}} {
		rows, err := rtx.QueryContext(ctx, c.query)
		if err != nil {
			return out, fmt.Errorf("count by status: %w", err)
		}
		for rows.Next() {
			var st string
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return out, fmt.Errorf("count by status: %w", err)
			}
			c.into[st] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return out, fmt.Errorf("count by status: %w", err)
		}
	}
	return out, nil
}
