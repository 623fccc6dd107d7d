package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// The operators' lists (GET /v1/operations, GET /v1/commands) are newest
// first: by start, then id, both descending. An operation starts at its
// started_at, a command at its created_at (its insert, when its operation
// or its retry minted it); neither is ever updated, so a record keeps its
// place in the order for good. They page by keyset on that pair: the
// cursor of a page is its last record's (start, id), opaque to callers,
// and the next page holds what sorts strictly after it. A record that
// existed when the first page was read is therefore on exactly one page,
// however many records arrive meanwhile (they sort first, being newer).
//
// Each filter is served by an index (migration 0009): the filter's column
// first, then (start, id), so that a page is one range of it walked
// backwards and the count reads the index alone. Several filters at once
// use one of those indexes (the planner picks the narrowest) and check the
// others on its rows.

// Page sizes of the operators' lists, as the contract fixes them.
const (
	DefaultOperatorLimit = 100
	MaxOperatorLimit     = 1000
)

// OperationFilter selects operations; zero fields select everything.
type OperationFilter struct {
	Statuses    []fsm.OperationState // any of them
	Device      string               // target
	Action      string
	TaskID      string
	SubmittedBy string
	// Since and Until bound the start: Since <= started_at < Until, at
	// millisecond precision (the stored one). Zero: unbounded.
	Since, Until time.Time
}

// CommandFilter selects commands; zero fields select everything.
type CommandFilter struct {
	Statuses    []fsm.CommandState // any of them
	Device      string
	Action      string
	OperationID string
	// Since and Until bound created_at, as OperationFilter's bound a start.
	Since, Until time.Time
}

// StartCursor is a position in a list ordered by (start, id) descending:
// the last record of a page.
type StartCursor struct {
	Start int64 // milliseconds since the epoch
	ID    string
}

// cursorID is the charset of the ids these lists are keyed by (command
// ids, and operation ids up to a compensation's 400 characters).
func cursorID(id string) bool { return wire.IDChars(id, 400, true) }

// String is the cursor as callers see it: base64url of "start,id". Ids
// never hold a comma.
func (c StartCursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.Start, 10) + "," + c.ID))
}

// ParseStartCursor reads a cursor String made; anything else is
// domain.ErrInvalid.
func ParseStartCursor(s string) (StartCursor, error) {
	bad := badCursor(s)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return StartCursor{}, bad
	}
	start, id, ok := strings.Cut(string(raw), ",")
	if !ok || !cursorID(id) {
		return StartCursor{}, bad
	}
	ms, err := strconv.ParseInt(start, 10, 64)
	if err != nil || ms < 0 {
		return StartCursor{}, bad
	}
	return StartCursor{Start: ms, ID: id}, nil
}

func badCursor(s string) error {
	return fmt.Errorf("%w: after %q is not a cursor of this list (take it from the Link header of the previous page)", domain.ErrInvalid, shortCursor(s))
}

func shortCursor(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// StartPage asks for one page of an operator list: the records after the
// cursor After ("" is the newest), at most Limit of them (1 to
// MaxOperatorLimit; DefaultOperatorLimit when 0 or less, MaxOperatorLimit
// when more).
type StartPage struct {
	After string
	Limit int
}

func (p StartPage) limit() int {
	switch {
	case p.Limit <= 0:
		return DefaultOperatorLimit
	case p.Limit > MaxOperatorLimit:
		return MaxOperatorLimit
	}
	return p.Limit
}

// startList is one operator list's read: the filter, ANDed, for the count
// and the page; the page newest first by (start, key).
type startList[T any] struct {
	from, start, key, columns string
	where                     []string
	args                      []any
	// anyOf is a filter on several values of one column (several
	// statuses), which no index returns in the list's order: the page
	// reads each value's range of its index apart (see queries).
	anyOf struct {
		column string
		vals   []any
	}
	// parts split the list into disjoint sets, each read apart (a branch
	// of the page's UNION ALL, a term of the count's sum): a list by device
	// whose newest rows wait outside the device index
	// (Capabilities.ListsDevicesInBulk) reads the index and the pending
	// rows.
	parts  []listPart
	scan   func(interface{ Scan(...any) error }) (T, error)
	cursor func(T) StartCursor
	// parse reads an After (nil: ParseStartCursor).
	parse func(string) (StartCursor, error)
}

// listPart is one of a list's disjoint sets: a condition and its args.
type listPart struct {
	cond string
	args []any
}

func (l *startList[T]) filter(cond string, args ...any) {
	l.where, l.args = append(l.where, cond), append(l.args, args...)
}

// inFilter adds "column = ?" for one value, anyOf for several.
func inFilter[S ~string, T any](l *startList[T], column string, vals []S) {
	switch len(vals) {
	case 0:
	case 1:
		l.filter(column+" = ?", string(vals[0]))
	default:
		l.anyOf.column = column
		for _, v := range vals {
			l.anyOf.vals = append(l.anyOf.vals, string(v))
		}
	}
}

func (l *startList[T]) bounds(since, until time.Time) {
	if !since.IsZero() {
		l.filter(l.start+" >= ?", since.UnixMilli())
	}
	if !until.IsZero() {
		l.filter(l.start+" < ?", until.UnixMilli())
	}
}

// queries returns the count and the page statements, and their args
// (after: the cursor's start and id; limit: the rows to read).
//
// With anyOf, the page is a UNION ALL of one branch per value, each the
// newest rows of that value's range of its index (at most limit), and the
// outer query orders those few: an IN list on the index's first column
// would otherwise be a sort of every matching row, or a walk of the
// whole (start, id) index filtering rows. With parts, likewise one branch
// per part (per part and value with both), and the count is the sum of
// each part's.
func (l startList[T]) queries(after *StartCursor, limit int) (count string, countArgs []any, page string, pageArgs []any) {
	conds := append([]string(nil), l.where...)
	whereArgs := append([]any(nil), l.args...)
	if l.anyOf.column != "" {
		conds = append(conds, l.anyOf.column+" IN (?"+strings.Repeat(", ?", len(l.anyOf.vals)-1)+")")
		whereArgs = append(whereArgs, l.anyOf.vals...)
	}
	parts := l.parts
	if len(parts) == 0 {
		parts = []listPart{{}}
	}
	counts := make([]string, len(parts))
	for i, p := range parts {
		counts[i] = `SELECT count(*) FROM ` + l.from + whereOf(withCond(conds, p.cond))
		countArgs = append(append(countArgs, whereArgs...), p.args...)
	}
	count = counts[0]
	if len(counts) > 1 {
		count = `SELECT (` + strings.Join(counts, `) + (`) + `)`
	}

	order := ` ORDER BY ` + l.start + ` DESC, ` + l.key + ` DESC LIMIT ?`
	rangeConds, rangeArgs := append([]string(nil), l.where...), append([]any(nil), l.args...)
	if after != nil {
		rangeConds = append(rangeConds, "("+l.start+", "+l.key+") < (?, ?)")
		rangeArgs = append(rangeArgs, after.Start, after.ID)
	}
	if l.anyOf.column == "" && len(l.parts) == 0 {
		return count, countArgs, `SELECT ` + l.columns + ` FROM ` + l.from + whereOf(rangeConds) + order,
			append(rangeArgs, limit)
	}
	vals := l.anyOf.vals
	if l.anyOf.column == "" {
		vals = []any{nil}
	}
	var branches []string
	for _, v := range vals {
		for _, p := range parts {
			var bconds []string
			if l.anyOf.column != "" {
				bconds = append(bconds, l.anyOf.column+" = ?")
				pageArgs = append(pageArgs, v)
			}
			bconds = append(withCond(bconds, p.cond), rangeConds...)
			pageArgs = append(append(append(pageArgs, p.args...), rangeArgs...), limit)
			k := `k` + strconv.Itoa(len(branches))
			branches = append(branches, `SELECT `+k+`.id FROM (SELECT `+l.key+` AS id FROM `+l.from+
				whereOf(bconds)+order+`) `+k)
		}
	}
	page = `SELECT ` + l.columns + ` FROM ` + l.from + ` WHERE ` + l.key + ` IN (` +
		strings.Join(branches, ` UNION ALL `) + `)` + order
	return count, countArgs, page, append(pageArgs, limit)
}

// withCond is conds and cond, when there is one.
func withCond(conds []string, cond string) []string {
	if cond == "" {
		return conds
	}
	return append(append([]string(nil), conds...), cond)
}

func whereOf(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// read reads the total and one page in one read transaction (one
// snapshot), one row more than the limit to know whether a next page
// exists.
func (l startList[T]) read(ctx context.Context, s *DB, p StartPage) (Listed[T], error) {
	out := Listed[T]{Items: []T{}}
	var after *StartCursor
	if p.After != "" {
		parse := l.parse
		if parse == nil {
			parse = ParseStartCursor
		}
		c, err := parse(p.After)
		if err != nil {
			return out, err
		}
		after = &c
	}
	limit := p.limit()
	countQ, countArgs, pageQ, pageArgs := l.queries(after, limit+1)
	rtx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return out, fmt.Errorf("list %s: %w", l.from, err)
	}
	defer rtx.Rollback()
	s.trips.Add(2)
	if err := rtx.QueryRowContext(ctx, s.d.Rebind(countQ), s.args(countArgs)...).Scan(&out.Total); err != nil {
		return out, fmt.Errorf("count %s: %w", l.from, err)
	}
	rows, err := rtx.QueryContext(ctx, s.d.Rebind(pageQ), s.args(pageArgs)...)
	if err != nil {
		return out, fmt.Errorf("list %s: %w", l.from, err)
	}
	defer rows.Close()
	for rows.Next() {
		v, err := l.scan(rows)
		if err != nil {
			return out, fmt.Errorf("list %s: %w", l.from, err)
		}
		out.Items = append(out.Items, v)
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("list %s: %w", l.from, err)
	}
	if len(out.Items) > limit {
		out.Items = out.Items[:limit]
		out.Next = l.cursor(out.Items[limit-1]).String()
	}
	return out, nil
}

// operationListColumns are OperationGet's columns, on alias o.
const operationListColumns = `o.operation_id, o.action, o.target, o.params, o.request_hash, o.status, o.result, o.reason,
	o.attempt, o.command_id, o.version, o.owner, o.lease_expires_at, o.fencing_token, o.task_id, o.step,
	o.business_version, COALESCE(o.compensates, ''), o.started_at, o.updated_at,
	o.submitted_by, o.via, o.approved_by, COALESCE(o.approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = o.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = o.operation_id), '')`

// operationList is the list f selects; inBulk: the backend lists devices
// in bulk (Capabilities.ListsDevicesInBulk).
func operationList(f OperationFilter, inBulk bool) startList[domain.Operation] {
	l := startList[domain.Operation]{from: "operations o", start: "o.started_at", key: "o.operation_id",
		columns: operationListColumns,
		scan:    scanWholeOperation,
		cursor: func(op domain.Operation) StartCursor {
			return StartCursor{Start: op.StartedAt.UnixMilli(), ID: op.OperationID}
		}}
	inFilter(&l, "o.status", f.Statuses)
	if f.Device != "" {
		byDevice(&l, "o.target", "o.device_listed", f.Device, inBulk)
	}
	if f.Action != "" {
		l.filter("o.action = ?", f.Action)
	}
	if f.TaskID != "" {
		// task_id <> '' names operations_task_started's (partial) condition.
		l.filter("o.task_id = ? AND o.task_id <> ''", f.TaskID)
	}
	if f.SubmittedBy != "" {
		l.filter("o.submitted_by = ?", f.SubmittedBy)
	}
	l.bounds(f.Since, f.Until)
	return l
}

// byDevice filters a list on its device column. When the backend lists
// devices in bulk, it reads two parts: the rows already in the device
// index (listed, the column 1), and the pending ones (0), about half a
// second of rows, walked in time order by their own index.
func byDevice[T any](l *startList[T], column, listed, device string, inBulk bool) {
	if !inBulk {
		l.filter(column+" = ?", device)
		return
	}
	l.parts = []listPart{
		{cond: column + " = ? AND " + listed + " = 1", args: []any{device}},
		{cond: listed + " = 0 AND " + column + " = ?", args: []any{device}},
	}
}

// ListOperations lists one page of operations, newest first, with the
// number that match the filter.
func (s *DB) ListOperations(ctx context.Context, f OperationFilter, p StartPage) (Listed[domain.Operation], error) {
	return operationList(f, s.caps.ListsDevicesInBulk).read(ctx, s, p)
}

// commandListColumns are CommandGet's columns.
const commandListColumns = `command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq`

// commandList is operationList's twin for commands.
func commandList(f CommandFilter, inBulk bool) startList[domain.Command] {
	l := startList[domain.Command]{from: "commands", start: "created_at", key: "command_id",
		columns: commandListColumns, scan: scanCommand,
		cursor: func(c domain.Command) StartCursor {
			return StartCursor{Start: c.CreatedAt.UnixMilli(), ID: c.CommandID}
		}}
	inFilter(&l, "status", f.Statuses)
	if f.Device != "" {
		byDevice(&l, "device_id", "device_listed", f.Device, inBulk)
	}
	if f.Action != "" {
		l.filter("action = ?", f.Action)
	}
	if f.OperationID != "" {
		l.filter("operation_id = ?", f.OperationID)
	}
	l.bounds(f.Since, f.Until)
	return l
}

// ListCommands lists one page of commands, newest first, with the number
// that match the filter.
func (s *DB) ListCommands(ctx context.Context, f CommandFilter, p StartPage) (Listed[domain.Command], error) {
	return commandList(f, s.caps.ListsDevicesInBulk).read(ctx, s, p)
}
