package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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

// AuditFilter narrows the audit log: one principal's ("" everyone's),
// from Since (inclusive) until Until (exclusive); nil is unbounded.
type AuditFilter struct {
	Principal    string
	Since, Until *time.Time
}

// AuditCursor is where a page of the audit log starts: after the entry
// at At with ID, in the order newest first (at, then id).
type AuditCursor struct {
	At time.Time
	ID int64
}

// AuditPage asks for one page of the audit log: after After (nil: the
// newest), at most Limit entries (1..MaxPageLimit; DefaultPageLimit when 0).
type AuditPage struct {
	After *AuditCursor
	Limit int
}

// AuditList is one page of the audit log.
type AuditList struct {
	Items []AuditEntry // never nil
	// Total counts the entries that match the filter, read in the same
	// snapshot as Items.
	Total int64
	// Next is where the next page starts; nil on the last one.
	Next *AuditCursor
}

// ListAudit lists one page of the audit log, newest first (at, then id),
// served by the indexes audit_at and audit_principal.
func (s *DB) ListAudit(ctx context.Context, f AuditFilter, p AuditPage) (AuditList, error) {
	out := AuditList{Items: []AuditEntry{}}
	limit := Page{Limit: p.Limit}.limit()
	var where []string
	var args []any
	if f.Principal != "" {
		where = append(where, "principal = ?")
		args = append(args, f.Principal)
	}
	if f.Since != nil {
		where = append(where, "at >= ?")
		args = append(args, ms(*f.Since))
	}
	if f.Until != nil {
		where = append(where, "at < ?")
		args = append(args, ms(*f.Until))
	}
	countQ := `SELECT count(*) FROM audit`
	if len(where) > 0 {
		countQ += ` WHERE ` + strings.Join(where, " AND ")
	}
	pageWhere, pageArgs := where, args
	if p.After != nil {
		at := ms(p.After.At)
		pageWhere = append(append([]string(nil), where...), "at <= ?", "(at < ? OR id < ?)")
		pageArgs = append(append([]any(nil), args...), at, at, p.After.ID)
	}
	pageQ := `SELECT id, at, principal, action, kind, entity_id, detail FROM audit`
	if len(pageWhere) > 0 {
		pageQ += ` WHERE ` + strings.Join(pageWhere, " AND ")
	}
	pageQ += ` ORDER BY at DESC, id DESC LIMIT ?`
	pageArgs = append(pageArgs, limit+1)

	rtx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return out, fmt.Errorf("list audit: %w", err)
	}
	defer rtx.Rollback()
	if err := rtx.QueryRowContext(ctx, s.d.Rebind(countQ), s.args(args)...).Scan(&out.Total); err != nil {
		return out, fmt.Errorf("count audit: %w", err)
	}
	rows, err := rtx.QueryContext(ctx, s.d.Rebind(pageQ), s.args(pageArgs)...)
	if err != nil {
		return out, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e AuditEntry
		var at int64
		var detail string
		if err := rows.Scan(&e.ID, &at, &e.Principal, &e.Action, &e.Kind, &e.EntityID, &detail); err != nil {
			return out, fmt.Errorf("list audit: %w", err)
		}
		e.At, e.Detail = fromMS(at), json.RawMessage(detail)
		out.Items = append(out.Items, e)
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("list audit: %w", err)
	}
	if len(out.Items) > limit {
		out.Items = out.Items[:limit]
		last := out.Items[limit-1]
		out.Next = &AuditCursor{At: last.At, ID: last.ID}
	}
	return out, nil
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
