package store

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// benchStore is a store on a new SQLite file, closed when b ends.
func benchStore(b *testing.B) *DB {
	s, err := testOpen(context.Background(), Config{Path: filepath.Join(b.TempDir(), "c.db"), Instance: "i1"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkSubmit measures one submit transaction (operation, command,
// event) on a real SQLite file with synchronous=FULL.
func BenchmarkSubmit(b *testing.B) {
	s := benchStore(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i))
		if _, err := s.Submit(context.Background(), n, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimSend measures one fenced pending → sent decision.
func BenchmarkClaimSend(b *testing.B) {
	s := benchStore(b)
	for i := 0; i < b.N; i++ {
		if _, err := s.Submit(context.Background(), newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.ClaimSend(context.Background(), fmt.Sprintf("c-%d", i), fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyReceiptsBatched measures the writer's group commit on the
// receipt path: 256 callers apply each command's three receipts (received,
// executing, succeeded) at once, so that batches form as they do at
// saturation. It reports the CPU time of the whole process per receipt.
func BenchmarkApplyReceiptsBatched(b *testing.B) {
	ctx, s := context.Background(), benchStore(b)
	const callers = 256
	cmds := (b.N + 2) / 3
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		for i := 0; i < cmds; i++ {
			next <- i
		}
		close(next)
	}()
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := fmt.Sprintf("c-%d", i)
				if _, err := s.Submit(ctx, newOp(fmt.Sprintf("op-%d", i), id), nil); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.ClaimSend(ctx, id, fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	statuses := []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting, wire.ReceiptSucceeded}
	receipts := make(chan wire.Receipt, callers)
	go func() {
		for n := 0; n < b.N; n++ {
			i, k := n%cmds, n/cmds // every command's received first, then executing, then succeeded
			receipts <- wire.Receipt{CommandID: fmt.Sprintf("c-%d", i), OperationID: fmt.Sprintf("op-%d", i),
				Status: statuses[k], Seq: k + 1, At: time.Now(), Result: []byte(`{"ok":true}`)}
		}
		close(receipts)
	}()
	before := cpuTime()
	b.ResetTimer()
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range receipts {
				if _, err := s.ApplyReceipt(ctx, "device-1", r, nil); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/receipt")
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOperationBatched is one operation's writes as the controller
// makes them at saturation, 256 callers at once so that batches form: the
// submit, the fenced pending → sent decision (in a transaction of its own,
// as the dispatcher makes it; or in the submit's, as for a device online
// at submit), then the device's three receipts applied together
// (ApplyReceipts). It reports the CPU time of the whole process, the
// database statements and the commits an operation waits for.
func BenchmarkOperationBatched(b *testing.B) {
	b.Run("claim=dispatcher", func(b *testing.B) { benchOperationBatched(b, false) })
	b.Run("claim=submit", func(b *testing.B) { benchOperationBatched(b, true) })
}

func benchOperationBatched(b *testing.B, atSubmit bool) {
	ctx, s := context.Background(), benchStore(b)
	const callers = 256
	next := make(chan int)
	go func() {
		for i := 0; i < b.N; i++ {
			next <- i
		}
		close(next)
	}()
	for d := range 100 { // online, so that a submit may claim its first publish
		p := wire.Presence{Online: true, Session: 1, Capabilities: &wire.Capabilities{Dedupe: true}}
		if _, err := s.ApplyPresence(ctx, fmt.Sprintf("device-%d", d), p); err != nil {
			b.Fatal(err)
		}
	}
	statuses := []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting, wire.ReceiptSucceeded}
	before, trips := cpuTime(), s.RoundTrips()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				op, id, dev := fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i), fmt.Sprintf("device-%d", i%100)
				n := newOp(op, id)
				n.Target, n.FromDevice, n.FirstCheck = dev, atSubmit, time.Now().Add(time.Second)
				if res, err := s.Submit(ctx, n, nil); err != nil || res.Inserted.Claimed != atSubmit {
					b.Errorf("submit %s: claimed %v, want %v: %v", op, res.Inserted.Claimed, atSubmit, err)
					return
				}
				if !atSubmit {
					if _, err := s.ClaimSend(ctx, id, fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
						b.Error(err)
						return
					}
				}
				rs := make([]wire.Receipt, len(statuses))
				for k, st := range statuses {
					rs[k] = wire.Receipt{CommandID: id, OperationID: op, Status: st, Seq: k + 1, At: time.Now(), Result: []byte(`{"ok":true}`)}
				}
				res, err := s.ApplyReceipts(ctx, dev, rs, nil)
				if err == nil && (len(res) != len(rs) || res[len(res)-1].Err != nil) {
					err = fmt.Errorf("receipts of %s: %+v", id, res)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(s.RoundTrips()-trips)/float64(b.N), "statements/op")
}

// BenchmarkGetOperation measures one read of an operation with its lists
// (what every ?wait= answer costs), from the read pool.
func BenchmarkGetOperation(b *testing.B) {
	ctx, s := context.Background(), benchStore(b)
	const ops = 1000
	for i := 0; i < ops; i++ {
		if _, err := s.Submit(ctx, newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.GetOperation(ctx, fmt.Sprintf("op-%d", i%ops)); err != nil {
			b.Fatal(err)
		}
	}
}

// benchListRows is how many operations (each with one command)
// BenchmarkOperatorLists fills its database with.
const benchListRows = 1_000_000

// fillBenchRows inserts benchListRows operations and their commands in
// one transaction, generated by the database itself: one a millisecond,
// on 10,000 devices (100 each), two actions, 20 submitters; one command in
// openEvery (i % openEvery = 7) is needs_attention with its operation
// started, every hundredth (i % 100 = 3) failed, the rest succeeded.
// device-7's 100 commands are all needs_attention (openEvery divides
// 10,000).
func fillBenchRows(b *testing.B, s *DB, openEvery int) {
	ctx := context.Background()
	const base = int64(1_764_000_000_000)
	series := fmt.Sprintf(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < %d) `, benchListRows-1)
	ops := series + fmt.Sprintf(`INSERT INTO operations (operation_id, action, target, params, request_hash, status, reason,
		attempt, command_id, version, owner, lease_expires_at, fencing_token, started_at, updated_at, submitted_by, via)
		SELECT 'op-' || i, CASE WHEN i %% 2 = 0 THEN 'restart' ELSE 'set-config' END, 'device-' || (i %% 10000), '{}', 'h',
			CASE WHEN i %% %[2]d = 7 THEN 'started' WHEN i %% 100 = 3 THEN 'failed_final' ELSE 'succeeded' END,
			CASE WHEN i %% 100 = 3 THEN 'boom' ELSE '' END,
			1, 'c-' || i, 2, 'i1', %[1]d + i, 1, %[1]d + i, %[1]d + i, 'user-' || (i %% 20), 'api' FROM n`, base, openEvery)
	cmds := series + fmt.Sprintf(`INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, version, reason, next_check_at, created_at, updated_at)
		SELECT 'c-' || i, 'op-' || i, 'device-' || (i %% 10000), CASE WHEN i %% 2 = 0 THEN 'restart' ELSE 'set-config' END, '{}',
			%[1]d + i, %[1]d + i + 600000,
			CASE WHEN i %% %[2]d = 7 THEN 'needs_attention' WHEN i %% 100 = 3 THEN 'failed' ELSE 'succeeded' END,
			1, 3, CASE WHEN i %% 100 = 3 THEN 'boom' ELSE '' END, %[1]d + i, %[1]d + i, %[1]d + i FROM n`, base, openEvery)
	start := time.Now()
	qs := []string{ops, cmds}
	// Where the lists by device take new rows in bulk, the newest 3,000
	// (a second's at 3,000 a second, twice what the writer leaves) are still pending: a list by device reads
	// them apart. (Nothing is written after the fill, so they stay so.)
	if s.caps.ListsDevicesInBulk {
		pending := base + benchListRows - 3000
		qs = append(qs, fmt.Sprintf(`UPDATE operations SET device_listed = 0 WHERE started_at >= %d`, pending),
			fmt.Sprintf(`UPDATE commands SET device_listed = 0 WHERE created_at >= %d`, pending))
	}
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		for _, q := range qs {
			if _, err := t.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	// What autovacuum would have done by the time an operator lists a
	// table this size: statistics, and the visibility map that lets a
	// count read an index alone.
	if s.Backend() == "postgres" {
		for _, q := range []string{"VACUUM ANALYZE operations", "VACUUM ANALYZE commands"} {
			if _, err := s.r.ExecContext(ctx, q); err != nil { // the writer's connection is its own
				b.Fatal(err)
			}
		}
	}
	b.Logf("%s: %d operations and commands inserted in %v", s.Backend(), benchListRows, time.Since(start).Round(time.Millisecond))
}

// BenchmarkOperatorLists times pages of GET /v1/operations and GET
// /v1/commands (the store's part: the total and one page, in one
// snapshot) over a million operations and a million commands, on each
// backend: the newest page of 100, a page deep in the list (a cursor half
// way), and a filtered page (status and device) with its total. The fill
// runs once per backend, then each sub-benchmark reads. It logs the plan
// of each filtered page and of the unfiltered count (EXPLAIN).
func BenchmarkOperatorLists(b *testing.B) {
	for _, be := range backends {
		b.Run(be, func(b *testing.B) {
			ctx := context.Background()
			dsn := filepath.Join(b.TempDir(), "c.db")
			if be == "postgres" {
				dsn = testenv.SharedPostgres(b).NewDatabase(b)
			}
			s, err := testOpen(ctx, Config{Path: dsn, Instance: "i1"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			fillBenchRows(b, s, 1000)
			half := StartCursor{Start: 1_764_000_000_000 + benchListRows/2, ID: fmt.Sprintf("op-%d", benchListRows/2)}.String()
			halfCmd := StartCursor{Start: 1_764_000_000_000 + benchListRows/2, ID: fmt.Sprintf("c-%d", benchListRows/2)}.String()
			opsF := OperationFilter{Statuses: []fsm.OperationState{fsm.OpStarted}, Device: "device-7"}
			cmdF := CommandFilter{Statuses: []fsm.CommandState{fsm.CmdNeedsAttention}, Device: "device-7"}
			runs := []struct {
				name string
				read func() (int64, int, error)
				want int64
			}{
				{"operations/first-100", func() (int64, int, error) {
					l, err := s.ListOperations(ctx, OperationFilter{}, StartPage{Limit: 100})
					return l.Total, len(l.Items), err
				}, benchListRows},
				{"operations/deep-100", func() (int64, int, error) {
					l, err := s.ListOperations(ctx, OperationFilter{}, StartPage{Limit: 100, After: half})
					return l.Total, len(l.Items), err
				}, benchListRows},
				{"operations/started-device-100", func() (int64, int, error) {
					l, err := s.ListOperations(ctx, opsF, StartPage{Limit: 100})
					return l.Total, len(l.Items), err
				}, 100},
				{"operations/open-100", func() (int64, int, error) {
					l, err := s.ListOperations(ctx, OperationFilter{Statuses: []fsm.OperationState{fsm.OpStarted, fsm.OpFailedRetryable}}, StartPage{Limit: 100})
					return l.Total, len(l.Items), err
				}, benchListRows / 1000},
				{"commands/first-100", func() (int64, int, error) {
					l, err := s.ListCommands(ctx, CommandFilter{}, StartPage{Limit: 100})
					return l.Total, len(l.Items), err
				}, benchListRows},
				{"commands/deep-100", func() (int64, int, error) {
					l, err := s.ListCommands(ctx, CommandFilter{}, StartPage{Limit: 100, After: halfCmd})
					return l.Total, len(l.Items), err
				}, benchListRows},
				{"commands/needs_attention-device-100", func() (int64, int, error) {
					l, err := s.ListCommands(ctx, cmdF, StartPage{Limit: 100})
					return l.Total, len(l.Items), err
				}, 100},
				{"commands/needs_attention-100", func() (int64, int, error) {
					l, err := s.ListCommands(ctx, CommandFilter{Statuses: []fsm.CommandState{fsm.CmdNeedsAttention}}, StartPage{Limit: 100})
					return l.Total, len(l.Items), err
				}, benchListRows / 1000},
			}
			explain := "EXPLAIN QUERY PLAN "
			if be == "postgres" {
				explain = "EXPLAIN (ANALYZE, COSTS OFF) "
			}
			for _, q := range []planned{
				{"count(*) operations", "SELECT count(*) FROM operations", nil},
				pagePlan("operations started device-7 page", operationList(opsF, s.caps.ListsDevicesInBulk), nil),
				countPlan("operations started device-7 count", operationList(opsF, s.caps.ListsDevicesInBulk)),
				pagePlan("operations open page", operationList(OperationFilter{Statuses: []fsm.OperationState{fsm.OpStarted, fsm.OpFailedRetryable}}, s.caps.ListsDevicesInBulk), nil),
				pagePlan("commands needs_attention device-7 page", commandList(cmdF, s.caps.ListsDevicesInBulk), &StartCursor{Start: 1_764_000_900_000, ID: "c-900000"}),
				pagePlan("commands needs_attention page", commandList(CommandFilter{Statuses: cmdF.Statuses}, s.caps.ListsDevicesInBulk), &StartCursor{Start: 1_764_000_900_000, ID: "c-900000"}),
			} {
				rows, err := s.r.QueryContext(ctx, s.d.Rebind(explain+q.sql), q.args...)
				if err != nil {
					b.Fatal(err)
				}
				cols, _ := rows.Columns()
				var lines []string
				for rows.Next() {
					vals := make([]any, len(cols))
					ptrs := make([]any, len(cols))
					for i := range vals {
						ptrs[i] = &vals[i]
					}
					if err := rows.Scan(ptrs...); err != nil {
						b.Fatal(err)
					}
					lines = append(lines, fmt.Sprint(vals[len(vals)-1]))
				}
				rows.Close()
				b.Logf("%s plan of %s:\n\t%s", be, q.name, strings.Join(lines, "\n\t"))
			}
			for _, r := range runs {
				b.Run(r.name, func(b *testing.B) {
					for i := 0; i < b.N; i++ {
						total, n, err := r.read()
						if err != nil {
							b.Fatal(err)
						}
						if total != r.want || n != int(min(r.want, 100)) {
							b.Fatalf("total %d, %d items; want %d", total, n, r.want)
						}
					}
				})
			}
		})
	}
}

// planned is a statement whose plan BenchmarkOperatorLists logs.
type planned struct {
	name string
	sql  string
	args []any
}

func pagePlan[T any](name string, l startList[T], after *StartCursor) planned {
	_, _, page, args := l.queries(after, 101)
	return planned{name, page, args}
}

func countPlan[T any](name string, l startList[T]) planned {
	count, args, _, _ := l.queries(nil, 101)
	return planned{name, count, args}
}
