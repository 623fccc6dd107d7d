package store

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// opsFixture submits n operations, two per millisecond-distinct start (so
// that ids break ties), with targets, actions, submitters and tasks in
// turn; every fifth is cancelled (its command cancelled, the operation
// failed_final). It returns the operations as stored.
func opsFixture(t *testing.T, b *testBundle, n int) []domain.Operation {
	t.Helper()
	var out []domain.Operation
	for i := range n {
		if i%2 == 0 {
			b.clk.Advance(time.Second)
		}
		op := newOp(fmt.Sprintf("op-%03d", i), fmt.Sprintf("c-%03d", i))
		op.Target = fmt.Sprintf("device-%d", i%3)
		op.Action = []string{"restart", "set-config"}[i%2]
		op.SubmittedBy = []string{"alice", "bob", "carol"}[i%3]
		op.Via = domain.ViaAPI
		if i%4 == 0 {
			op.TaskID = fmt.Sprintf("task-%d", i%8)
			op.Via, op.ApprovedBy, op.ApprovedVersion = domain.ViaTask, "dave", i+1
		}
		_, err := b.s.Submit(b.ctx, op, nil)
		require.NoError(t, err)
		if i%5 == 0 {
			_, err := b.s.Cancel(b.ctx, op.CommandID, "alice")
			require.NoError(t, err)
		}
	}
	for i := range n {
		op, err := b.s.GetOperation(b.ctx, fmt.Sprintf("op-%03d", i))
		require.NoError(t, err)
		out = append(out, op)
	}
	return out
}

// newestFirst sorts operations as the list does.
func newestFirst(ops []domain.Operation) []string {
	ops = slices.Clone(ops)
	sort.Slice(ops, func(i, j int) bool {
		if !ops[i].StartedAt.Equal(ops[j].StartedAt) {
			return ops[i].StartedAt.After(ops[j].StartedAt)
		}
		return ops[i].OperationID > ops[j].OperationID
	})
	ids := make([]string, len(ops))
	for i, op := range ops {
		ids[i] = op.OperationID
	}
	return ids
}

func where(ops []domain.Operation, keep func(domain.Operation) bool) []domain.Operation {
	var out []domain.Operation
	for _, op := range ops {
		if keep(op) {
			out = append(out, op)
		}
	}
	return out
}

// walkOperations follows Next from the start; it checks that every page
// reports the same total.
func walkOperations(t *testing.T, b *testBundle, f OperationFilter, limit int) (ids []string, total int64, pages int) {
	t.Helper()
	p := StartPage{Limit: limit}
	total = -1
	for {
		pages++
		require.Less(t, pages, 1000, "Next never ends")
		got, err := b.s.ListOperations(b.ctx, f, p)
		require.NoError(t, err)
		if total >= 0 {
			require.Equal(t, total, got.Total, "every page reports the same total")
		}
		total = got.Total
		for _, op := range got.Items {
			ids = append(ids, op.OperationID)
		}
		if got.Next == "" {
			return ids, total, pages
		}
		require.Len(t, got.Items, limit, "a page with a next one is full")
		p.After = got.Next
	}
}

func TestListOperationsNewestFirstFilteredAndPaged(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		ops := opsFixture(t, b, 30)
		first := ops[0].StartedAt

		// Attribution is stored and read back; none is '' and NULL.
		require.Equal(t, []any{"bob", domain.ViaTask, "dave", 5}, []any{ops[4].SubmittedBy, ops[4].Via, ops[4].ApprovedBy, ops[4].ApprovedVersion})
		require.Equal(t, []any{"bob", domain.ViaAPI, "", 0}, []any{ops[1].SubmittedBy, ops[1].Via, ops[1].ApprovedBy, ops[1].ApprovedVersion})

		ids, total, pages := walkOperations(t, b, OperationFilter{}, 7)
		require.Equal(t, newestFirst(ops), ids)
		require.EqualValues(t, 30, total)
		require.Equal(t, 5, pages)

		got, err := b.s.ListOperations(b.ctx, OperationFilter{}, StartPage{Limit: 1})
		require.NoError(t, err)
		require.Equal(t, "op-029", got.Items[0].OperationID)
		require.Equal(t, []string{"c-029"}, got.Items[0].CommandIDs, "the same record GetOperation reads")
		require.Equal(t, "carol", got.Items[0].SubmittedBy)
		require.Equal(t, domain.ViaAPI, got.Items[0].Via)

		cases := []struct {
			name string
			f    OperationFilter
			keep func(domain.Operation) bool
		}{
			{"status", OperationFilter{Statuses: []fsm.OperationState{fsm.OpFailedFinal}},
				func(op domain.Operation) bool { return op.Status == fsm.OpFailedFinal }},
			{"statuses", OperationFilter{Statuses: []fsm.OperationState{fsm.OpStarted, fsm.OpFailedFinal}},
				func(domain.Operation) bool { return true }},
			{"device", OperationFilter{Device: "device-1"},
				func(op domain.Operation) bool { return op.Target == "device-1" }},
			{"action", OperationFilter{Action: "set-config"},
				func(op domain.Operation) bool { return op.Action == "set-config" }},
			{"task", OperationFilter{TaskID: "task-4"},
				func(op domain.Operation) bool { return op.TaskID == "task-4" }},
			{"submitted_by", OperationFilter{SubmittedBy: "carol"},
				func(op domain.Operation) bool { return op.SubmittedBy == "carol" }},
			{"since until", OperationFilter{Since: first.Add(3 * time.Second), Until: first.Add(9 * time.Second)},
				func(op domain.Operation) bool {
					return !op.StartedAt.Before(first.Add(3*time.Second)) && op.StartedAt.Before(first.Add(9*time.Second))
				}},
			{"combined", OperationFilter{Statuses: []fsm.OperationState{fsm.OpStarted}, Device: "device-2", Action: "restart"},
				func(op domain.Operation) bool {
					return op.Status == fsm.OpStarted && op.Target == "device-2" && op.Action == "restart"
				}},
			{"nothing", OperationFilter{SubmittedBy: "mallory"}, func(domain.Operation) bool { return false }},
		}
		for _, c := range cases {
			want := newestFirst(where(ops, c.keep))
			ids, total, _ := walkOperations(t, b, c.f, 3)
			require.Equal(t, want, append([]string{}, ids...), c.name)
			require.EqualValues(t, len(want), total, c.name)
		}
	})
}

// TestListOperationsPagesWhileNewOnesArrive: operations submitted between
// pages are newer than every page's cursor; the walk still holds each
// operation that existed at its first page exactly once.
func TestListOperationsPagesWhileNewOnesArrive(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		ops := opsFixture(t, b, 20)
		want := newestFirst(ops)
		var ids []string
		p := StartPage{Limit: 6}
		for i := 0; ; i++ {
			got, err := b.s.ListOperations(b.ctx, OperationFilter{}, p)
			require.NoError(t, err)
			require.EqualValues(t, 20+3*i, got.Total)
			for _, op := range got.Items {
				ids = append(ids, op.OperationID)
			}
			if got.Next == "" {
				break
			}
			p.After = got.Next
			for k := range 3 { // in the same millisecond as the newest, and later
				if k == 2 {
					b.clk.Advance(time.Millisecond)
				}
				_, err := b.s.Submit(b.ctx, newOp(fmt.Sprintf("new-%d-%d", i, k), fmt.Sprintf("cn-%d-%d", i, k)), nil)
				require.NoError(t, err)
			}
		}
		require.Equal(t, want, ids)
	})
}

func TestListCommandsNewestFirstFilteredAndPaged(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		ops := opsFixture(t, b, 12)
		walk := func(f CommandFilter, limit int) (ids []string, total int64) {
			p := StartPage{Limit: limit}
			for i := 0; ; i++ {
				require.Less(t, i, 100)
				got, err := b.s.ListCommands(b.ctx, f, p)
				require.NoError(t, err)
				total = got.Total
				for _, c := range got.Items {
					ids = append(ids, c.CommandID)
				}
				if got.Next == "" {
					return ids, total
				}
				p.After = got.Next
			}
		}
		cmdIDs := func(keep func(domain.Operation) bool) []string {
			var out []string
			for _, id := range newestFirst(where(ops, keep)) {
				out = append(out, "c-"+strings.TrimPrefix(id, "op-"))
			}
			return out
		}
		ids, total := walk(CommandFilter{}, 5)
		require.Equal(t, cmdIDs(func(domain.Operation) bool { return true }), ids)
		require.EqualValues(t, 12, total)

		ids, total = walk(CommandFilter{Statuses: []fsm.CommandState{fsm.CmdCancelled}}, 2)
		require.Equal(t, []string{"c-010", "c-005", "c-000"}, ids)
		require.EqualValues(t, 3, total)

		ids, _ = walk(CommandFilter{Statuses: []fsm.CommandState{fsm.CmdPending, fsm.CmdCancelled}, Device: "device-2"}, 2)
		require.Equal(t, cmdIDs(func(op domain.Operation) bool { return op.Target == "device-2" }), ids)

		ids, _ = walk(CommandFilter{Action: "restart", OperationID: "op-004"}, 2)
		require.Equal(t, []string{"c-004"}, ids)

		first := ops[0].StartedAt
		ids, _ = walk(CommandFilter{Since: first.Add(2 * time.Second), Until: first.Add(4 * time.Second)}, 100)
		require.Equal(t, []string{"c-007", "c-006", "c-005", "c-004"}, ids)

		got, err := b.s.ListCommands(b.ctx, CommandFilter{}, StartPage{Limit: 1})
		require.NoError(t, err)
		want, err := b.s.GetCommand(b.ctx, "c-011")
		require.NoError(t, err)
		require.Equal(t, want, got.Items[0], "the same record GetCommand reads")
	})
}

// TestListsByDeviceTakeNewRowsInBulk (SQLite, Capabilities.ListsDevicesInBulk):
// new operations and commands wait outside the device indexes until the
// writer moves them in, once half a second of the store's clock has passed,
// with the next batch; a list by device holds them the same before and after,
// and a walk across a move neither repeats nor skips one.
func TestListsByDeviceTakeNewRowsInBulk(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite")
	require.True(t, b.s.caps.ListsDevicesInBulk)
	pending := func() (ops, cmds int) {
		t.Helper()
		require.NoError(t, b.s.r.QueryRowContext(b.ctx, `SELECT (SELECT count(*) FROM operations WHERE device_listed = 0),
			(SELECT count(*) FROM commands WHERE device_listed = 0)`).Scan(&ops, &cmds))
		return ops, cmds
	}
	submit := func(i int) {
		t.Helper()
		op := newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i))
		op.Target = fmt.Sprintf("device-%d", i%2)
		_, err := b.s.Submit(b.ctx, op, nil)
		require.NoError(t, err)
		b.clk.Advance(time.Millisecond)
	}
	// The store's first batch moved nothing (none yet) and set the clock.
	for i := range 6 {
		submit(i)
	}
	ops, cmds := pending()
	require.Equal(t, []int{6, 6}, []int{ops, cmds}, "within half a second, every new row waits")

	byDevice := func(limit int, between func(page int)) (opIDs, cmdIDs []string, opTotal, cmdTotal int64) {
		t.Helper()
		p := StartPage{Limit: limit}
		for page := 0; ; page++ {
			require.Less(t, page, 20)
			got, err := b.s.ListOperations(b.ctx, OperationFilter{Device: "device-1"}, p)
			require.NoError(t, err)
			opTotal = got.Total
			for _, op := range got.Items {
				opIDs = append(opIDs, op.OperationID)
			}
			if got.Next == "" {
				break
			}
			p.After = got.Next
			between(page)
		}
		got, err := b.s.ListCommands(b.ctx, CommandFilter{Device: "device-1"}, StartPage{Limit: 100})
		require.NoError(t, err)
		for _, c := range got.Items {
			cmdIDs = append(cmdIDs, c.CommandID)
		}
		return opIDs, cmdIDs, opTotal, got.Total
	}
	nothing := func(int) {}
	opIDs, cmdIDs, opTotal, cmdTotal := byDevice(2, nothing)
	require.Equal(t, []string{"op-5", "op-3", "op-1"}, opIDs, "pending rows are listed")
	require.Equal(t, []string{"c-5", "c-3", "c-1"}, cmdIDs)
	require.Equal(t, []int64{3, 3}, []int64{opTotal, cmdTotal})

	// A second later (half a second would do) the next batch moves them
	// first, then writes its own (pending). A walk that began before the
	// move goes on across it.
	b.clk.Advance(time.Second)
	opIDs, _, opTotal, _ = byDevice(1, func(page int) {
		if page == 0 {
			submit(7)
			ops, cmds := pending()
			require.Equal(t, []int{1, 1}, []int{ops, cmds}, "the six moved, the new one waits")
		}
	})
	require.Equal(t, []string{"op-5", "op-3", "op-1"}, opIDs, "the walk neither repeats nor skips")
	require.EqualValues(t, 4, opTotal, "op-7 counted (newer than the walk's first page)")

	opIDs, cmdIDs, opTotal, cmdTotal = byDevice(100, nothing)
	require.Equal(t, []string{"op-7", "op-5", "op-3", "op-1"}, opIDs, "listed and pending together")
	require.Equal(t, []string{"c-7", "c-5", "c-3", "c-1"}, cmdIDs)
	require.Equal(t, []int64{4, 4}, []int64{opTotal, cmdTotal})
	all, err := b.s.ListOperations(b.ctx, OperationFilter{Device: "device-0"}, StartPage{})
	require.NoError(t, err)
	require.EqualValues(t, 3, all.Total)
}

// TestFullBatchesStillMoveTheDeviceLists: a writer whose batches are
// always full (here MaxBatch 1) moves the pending rows all the same, one
// change beyond the bound; otherwise they would pile up for as long as the
// load lasts, and every list by device read them all.
func TestFullBatchesStillMoveTheDeviceLists(t *testing.T) {
	t.Parallel()
	b := setupConfig(t, "sqlite", func(c *Config) { c.MaxBatch = 1 })
	pending := func() (n int) {
		t.Helper()
		require.NoError(t, b.s.r.QueryRowContext(b.ctx, `SELECT count(*) FROM operations WHERE device_listed = 0`).Scan(&n))
		return n
	}
	for i := range 3 {
		if i == 2 {
			b.clk.Advance(time.Second)
		}
		_, err := b.s.Submit(b.ctx, newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil)
		require.NoError(t, err)
	}
	require.Equal(t, 1, pending(), "the two before moved in the third's batch of one")
}

func TestOperatorListCursor(t *testing.T) {
	t.Parallel()
	c := StartCursor{Start: 1764669600123, ID: "task-1:step:device-1:approval-v2"}
	back, err := ParseStartCursor(c.String())
	require.NoError(t, err)
	require.Equal(t, c, back)
	require.NotContains(t, c.String(), c.ID, "opaque")
	for _, bad := range []string{"x", "!!!", StartCursor{Start: 1, ID: "a,b"}.String(),
		StartCursor{Start: -1, ID: "a"}.String(), StartCursor{Start: 1, ID: ""}.String(), "MTIzNDU"} {
		_, err := ParseStartCursor(bad)
		require.ErrorIs(t, err, domain.ErrInvalid, bad)
	}
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, err := b.s.ListOperations(b.ctx, OperationFilter{}, StartPage{After: "nope!"})
		require.ErrorIs(t, err, domain.ErrInvalid)
		_, err = b.s.ListCommands(b.ctx, CommandFilter{}, StartPage{After: "nope!"})
		require.ErrorIs(t, err, domain.ErrInvalid)
	})
}

// scansTable reports a step of plan that walks operations (o) or commands
// whole: a SCAN of either (the page's own subqueries, k0 and k1, are
// SCANs of the few rows they keep).
func scansTable(plan string) bool {
	for _, line := range strings.Split(plan, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "SCAN" && (f[1] == "o" || f[1] == "commands") {
			return true
		}
	}
	return false
}

// queryPlan is SQLite's plan of q, a line for each step.
func queryPlan(t *testing.T, b *testBundle, q string, args ...any) string {
	t.Helper()
	rows, err := b.s.r.QueryContext(b.ctx, "EXPLAIN QUERY PLAN "+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
		lines = append(lines, detail)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// TestOperatorListsUseAnIndex (SQLite's plans; PostgreSQL's are checked
// over a million rows by BenchmarkOperatorLists, which logs them): each
// filter's page is a range of an index in the list's order (no sort of
// the rows that match), and its count reads an index alone.
func TestOperatorListsUseAnIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite")
	plan := func(q string, args ...any) string { return queryPlan(t, b, q, args...) }
	cursor := &StartCursor{Start: 1, ID: "x"}
	check := func(name string, l interface {
		queries(*StartCursor, int) (string, []any, string, []any)
	}, index string) {
		t.Helper()
		count, countArgs, page, pageArgs := l.queries(cursor, 101)
		p := plan(page, pageArgs...)
		require.Contains(t, p, "USING INDEX "+index, name+": the page\n"+p)
		require.NotContains(t, p, "TEMP B-TREE FOR ORDER BY", name+": no sort\n"+p)
		c := plan(count, countArgs...)
		require.Contains(t, c, "COVERING INDEX", name+": the count\n"+c)
	}
	na := []fsm.OperationState{fsm.OpStarted}
	check("operations", operationList(OperationFilter{}, true), "operations_started")
	check("operations status", operationList(OperationFilter{Statuses: na}, true), "operations_status_started")
	check("operations action", operationList(OperationFilter{Action: "a"}, true), "operations_action_started")
	check("operations task", operationList(OperationFilter{TaskID: "t"}, true), "operations_task_started")
	check("operations submitted_by", operationList(OperationFilter{SubmittedBy: "p"}, true), "operations_submitted_by_started")
	check("operations since", operationList(OperationFilter{Since: time.UnixMilli(5), Until: time.UnixMilli(9)}, true), "operations_started")
	cs := []fsm.CommandState{fsm.CmdNeedsAttention}
	check("commands", commandList(CommandFilter{}, true), "commands_created")
	check("commands status", commandList(CommandFilter{Statuses: cs}, true), "commands_status_created")
	check("commands action", commandList(CommandFilter{Action: "a"}, true), "commands_action_created")
	check("commands since", commandList(CommandFilter{Since: time.UnixMilli(5)}, true), "commands_created")
	// One operation's commands: a handful, found by commands_operation.
	_, _, page, args := commandList(CommandFilter{OperationID: "o"}, true).queries(cursor, 101)
	require.Contains(t, plan(page, args...), "commands_operation")

	// Several statuses: each one's range of the status index, newest
	// first and limited, then only those rows sorted; the count reads the
	// index's ranges.
	open := []fsm.CommandState{fsm.CmdPending, fsm.CmdSent, fsm.CmdNeedsAttention}
	count, countArgs, page, args := commandList(CommandFilter{Statuses: open, Device: "d"}, true).queries(cursor, 101)
	p := plan(page, args...)
	require.Equal(t, 3, strings.Count(p, "USING INDEX commands_status_created (status=? AND (created_at,command_id)<(?,?))")+
		strings.Count(p, "USING INDEX commands_device_created (device_id=? AND (created_at,command_id)<(?,?))"), p)
	require.NotContains(t, p, "SCAN commands", p)
	require.Contains(t, plan(count, countArgs...), "INDEX")

	// A list by device, its new rows listed in bulk: the device index's
	// range and the pending rows' index, each walked newest first and
	// limited, then those rows sorted; the count reads the device index
	// alone and the pending rows (at most about half a second of them).
	for _, c := range []struct {
		name, listed, pending string
		l                     interface {
			queries(*StartCursor, int) (string, []any, string, []any)
		}
	}{
		{"operations device", "operations_target_started (target=? AND (started_at,operation_id)<(?,?))",
			"operations_device_pending (device_listed=? AND (started_at,operation_id)<(?,?))", operationList(OperationFilter{Device: "d"}, true)},
		{"commands device", "commands_device_created (device_id=? AND (created_at,command_id)<(?,?))",
			"commands_device_pending (device_listed=? AND (created_at,command_id)<(?,?))", commandList(CommandFilter{Device: "d"}, true)},
	} {
		count, countArgs, page, args := c.l.queries(cursor, 101)
		p := plan(page, args...)
		require.Contains(t, p, "INDEX "+c.listed, c.name+"\n"+p)
		require.Contains(t, p, "INDEX "+c.pending, c.name+"\n"+p)
		require.False(t, scansTable(p), c.name+": no table or index walked whole\n"+p)
		p = plan(count, countArgs...)
		require.Contains(t, p, "COVERING INDEX "+strings.Fields(c.listed)[0], c.name+": the count\n"+p)
		require.Contains(t, p, "INDEX "+strings.Fields(c.pending)[0], c.name+": the count\n"+p)
		require.False(t, scansTable(p), c.name+": the count walks nothing whole\n"+p)
	}
}
