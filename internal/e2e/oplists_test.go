package e2e

import (
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// listRows is how many operations (with one command each)
// TestOperatorListsPageWhileSubmitting writes straight into the database.
const listRows = 3000

// fillOperations writes listRows finished operations and their commands in
// one transaction, one a millisecond ending an hour ago, so that every
// operation submitted during the test is newer: on device-1..5, restart
// and set-config, submitted by alice, bob or carol; succeeded, failed
// (failed_final), timed out (failed_retryable) or cancelled (failed_final).
// None is open, so the controller has nothing to do with them.
func (b *bundle) fillOperations() {
	b.t.Helper()
	start := time.Now().Add(-time.Hour).UnixMilli() - listRows
	series := fmt.Sprintf(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < %d) `, listRows-1)
	cmdStatus := `CASE i % 4 WHEN 0 THEN 'succeeded' WHEN 1 THEN 'failed' WHEN 2 THEN 'timeout' ELSE 'cancelled' END`
	ops := series + fmt.Sprintf(`INSERT INTO operations (operation_id, action, target, params, request_hash, status, reason,
		attempt, command_id, version, owner, lease_expires_at, fencing_token, task_id, started_at, updated_at, submitted_by, via)
		SELECT 'fill-' || i, CASE WHEN i %% 3 = 0 THEN 'restart' ELSE 'set-config' END, 'device-' || (1 + i %% 5), '{}', 'h',
			CASE i %% 4 WHEN 0 THEN 'succeeded' WHEN 2 THEN 'failed_retryable' ELSE 'failed_final' END, '',
			1, 'fill-c-' || i, 2, 'i1', %[1]d + i, 1, CASE WHEN i %% 10 = 0 THEN 'task-' || (i %% 30) ELSE '' END,
			%[1]d + i, %[1]d + i, CASE i %% 3 WHEN 0 THEN 'alice' WHEN 1 THEN 'bob' ELSE 'carol' END, 'api' FROM n`, start)
	cmds := series + fmt.Sprintf(`INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, version, next_check_at, created_at, updated_at)
		SELECT 'fill-c-' || i, 'fill-' || i, 'device-' || (1 + i %% 5), CASE WHEN i %% 3 = 0 THEN 'restart' ELSE 'set-config' END,
			'{}', %[1]d + i, %[1]d + i + 60000, %[2]s, 1, 3, %[1]d + i, %[1]d + i, %[1]d + i FROM n`, start, cmdStatus)
	driver, dsn := "sqlite3", "file:"+b.db+"?_busy_timeout=10000&_txlock=immediate"
	if testenv.MadeDatabase(b.db) {
		driver, dsn = "pgx", b.db
	}
	db, err := sql.Open(driver, dsn)
	require.NoError(b.t, err)
	defer db.Close()
	tx, err := db.Begin()
	require.NoError(b.t, err)
	defer tx.Rollback()
	for _, q := range []string{ops, cmds} {
		_, err := tx.Exec(q)
		require.NoError(b.t, err)
	}
	require.NoError(b.t, tx.Commit())
}

// count reads one number straight from the database.
func (b *bundle) count(query string, args ...any) int64 {
	b.t.Helper()
	rows := b.rows(query, args...)
	require.Len(b.t, rows, 1)
	n, err := strconv.ParseInt(rows[0], 10, 64)
	require.NoError(b.t, err)
	return n
}

// TestOperatorListsPageWhileSubmitting: 3,000 operations in the database,
// read through GET /v1/operations a hundred at a time while another
// goroutine keeps submitting new ones: every operation that existed at the
// first page comes exactly once, none is skipped, and X-Total-Count is the
// database's count as the page was read. Then, with the submissions over,
// each filter of both lists against the same rows and count read straight
// from the database.
func TestOperatorListsPageWhileSubmitting(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be})
		b.fillOperations()
		before := map[string]bool{}
		for _, id := range b.rows(`SELECT operation_id FROM operations`) {
			before[id] = true
		}
		require.GreaterOrEqual(t, len(before), listRows)

		// The submitter: new operations on the fleet while the pages are
		// read; bounded in count, and stopped once the walk ends.
		stop := make(chan struct{})
		var submitted atomic.Int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _, err := b.client.Submit(b.ctx(), apiwire.SubmitRequest{OperationID: fmt.Sprintf("live-%04d", i),
					Target: fmt.Sprintf("device-%d", 1+i%3), Action: "set-config"}, "")
				if err != nil {
					t.Errorf("submit live-%04d: %v", i, err)
					return
				}
				submitted.Add(1)
			}
		}()
		// The walk waits for the first submissions, so that they do
		// arrive while it reads.
		eventually(t, "the first live submissions", 30*time.Second, func() bool { return submitted.Load() >= 5 })
		atStart := submitted.Load()
		seen := map[string]int{}
		path := "/v1/operations?limit=100"
		for pages := 0; path != ""; pages++ {
			require.Less(t, pages, 100, "the links never end")
			low := b.count(`SELECT count(*) FROM operations`)
			items, p, err := b.client.OperationsPage(b.ctx(), path)
			require.NoError(t, err)
			high := b.count(`SELECT count(*) FROM operations`)
			require.LessOrEqual(t, len(items), 100)
			require.True(t, low <= p.Total && p.Total <= high, "X-Total-Count %d, the database held %d then %d", p.Total, low, high)
			for _, op := range items {
				seen[op.OperationID]++
			}
			path = p.Next
		}
		atEnd := submitted.Load()
		close(stop)
		wg.Wait()
		require.Greater(t, atEnd, atStart, "submissions went on during the walk")
		t.Logf("%s: %d operations read while %d more were submitted", be, len(seen), atEnd-atStart)
		for id, n := range seen {
			require.Equal(t, 1, n, "%s listed %d times", id, n)
		}
		for id := range before {
			require.Equal(t, 1, seen[id], "%s, there at the first page, was skipped", id)
		}

		// Every live operation settles, so that the lists and the
		// database hold still for the filters.
		eventually(t, "every live operation final", 60*time.Second, func() bool {
			return b.count(`SELECT count(*) FROM operations WHERE status = 'started'`) == 0
		})
		last := time.Now().Add(-time.Hour).UnixMilli() - 1000
		lastAt := time.UnixMilli(last).UTC().Format(time.RFC3339Nano)
		opFilters := []struct {
			query string // the API's filters
			where string // the same, in SQL
		}{
			{"", "1 = 1"},
			{"status=failed_final", "status = 'failed_final'"},
			{"status=open", "status IN ('started', 'failed_retryable')"},
			{"status=succeeded&status=failed_retryable", "status IN ('succeeded', 'failed_retryable')"},
			{"device=device-2", "target = 'device-2'"},
			{"action=restart", "action = 'restart'"},
			{"task_id=task-10", "task_id = 'task-10'"},
			{"submitted_by=bob", "submitted_by = 'bob'"},
			{"submitted_by=anonymous", "submitted_by = 'anonymous'"},
			{"since=" + url.QueryEscape(lastAt), fmt.Sprintf("started_at >= %d", last)},
			{"until=" + url.QueryEscape(lastAt), fmt.Sprintf("started_at < %d", last)},
			{"status=failed_final&device=device-4&action=set-config&submitted_by=carol",
				"status = 'failed_final' AND target = 'device-4' AND action = 'set-config' AND submitted_by = 'carol'"},
		}
		for _, f := range opFilters {
			want := b.rows(`SELECT operation_id FROM operations WHERE ` + f.where + ` ORDER BY started_at DESC, operation_id DESC`)
			total := b.count(`SELECT count(*) FROM operations WHERE ` + f.where)
			got, totals := walkOperations(t, b, "/v1/operations?limit=100&"+f.query)
			require.Equal(t, want, got, f.query)
			require.EqualValues(t, len(want), total)
			for _, n := range totals {
				require.Equal(t, total, n, "X-Total-Count of %s", f.query)
			}
		}
		cmdFilters := []struct{ query, where string }{
			{"", "1 = 1"},
			{"status=cancelled", "status = 'cancelled'"},
			{"status=timeout,failed", "status IN ('timeout', 'failed')"},
			{"status=open", "status NOT IN ('succeeded', 'failed', 'timeout', 'cancelled')"},
			{"device=device-3&action=restart", "device_id = 'device-3' AND action = 'restart'"},
			{"operation_id=fill-17", "operation_id = 'fill-17'"},
			{"since=" + url.QueryEscape(lastAt), fmt.Sprintf("created_at >= %d", last)},
		}
		for _, f := range cmdFilters {
			want := b.rows(`SELECT command_id FROM commands WHERE ` + f.where + ` ORDER BY created_at DESC, command_id DESC`)
			total := b.count(`SELECT count(*) FROM commands WHERE ` + f.where)
			var got []string
			path := "/v1/commands?limit=1000&" + f.query
			for path != "" {
				items, p, err := b.client.CommandsPage(b.ctx(), path)
				require.NoError(t, err)
				require.Equal(t, total, p.Total, "X-Total-Count of %s", f.query)
				for _, c := range items {
					got = append(got, c.CommandID)
				}
				path = p.Next
			}
			require.Equal(t, want, got, f.query)
		}
	})
}

// walkOperations follows the Link headers from path and returns the ids in
// the order read and each page's X-Total-Count.
func walkOperations(t *testing.T, b *bundle, path string) (ids []string, totals []int64) {
	t.Helper()
	path = strings.TrimSuffix(path, "&")
	for pages := 0; path != ""; pages++ {
		require.Less(t, pages, 100, "the links never end")
		var items []apiwire.Operation
		var p client.Page
		var err error
		items, p, err = b.client.OperationsPage(b.ctx(), path)
		require.NoError(t, err)
		for _, op := range items {
			ids = append(ids, op.OperationID)
		}
		totals = append(totals, p.Total)
		path = p.Next
	}
	return ids, totals
}
