package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The directory holding the SQLite database is removed under a running
// controller (issue 24 item 5). Before, it went on answering 201 and
// `succeeded` into unlinked files, /healthz stayed ok, nothing was logged,
// and the instance lock went with the directory. Now the first commit after
// the removal is refused (503, nothing acknowledged), /healthz fails with
// the reason, an ERROR names the path, and the process exits non-zero
// within a few seconds; only then can a controller with the same instance
// id start, on a fresh database where the directory is made again.
//
// Two ways in: a submit right after the removal (the writer's check around
// its commit notices), and a controller left alone (the once-a-second
// check, or the check around its own next commit, a lease heartbeat,
// notices; the submit, made once the process is gone, finds no one).
func TestRemovedDatabaseDirectoryStopsTheController(t *testing.T) {
	t.Parallel()
	for _, idle := range []bool{false, true} {
		name := "submit"
		if idle {
			name = "idle"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			removedDatabaseDirectory(t, idle)
		})
	}
}

func removedDatabaseDirectory(t *testing.T, idle bool) {
	dir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(dir, 0o755))
	db := filepath.Join(dir, "controller.db")
	b := setup(t, setupOpts{db: db})

	op, status, err := b.client.Submit(b.ctx(), req("task-1", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)

	require.NoError(t, os.RemoveAll(dir))
	removed := time.Now()

	// A submit made after the removal is not acknowledged: the store's
	// writer checks its files around each commit, so this holds even
	// before its once-a-second check has run.
	submitAfter := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		after, status, err := b.client.Submit(ctx, req("task-2", "device-2"), "")
		require.Error(t, err, "a submit after the removal answered %d: %+v", status, after)
		require.NotContains(t, []int{http.StatusCreated, http.StatusOK}, status)
	}
	// /healthz fails (503 with the reason while the process still serves),
	// or the port is closed. Idle, it is asked only once the process is
	// gone: asking checks the files, which would notice for the ticker.
	var reason string
	healthzFails := func() {
		eventually(t, "/healthz to fail", 5*time.Second, func() bool {
			resp, err := http.Get(b.ctl.URL + "/healthz")
			if err != nil {
				return true
			}
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return false
			}
			var body struct{ Status, Reason string }
			raw, _ := io.ReadAll(resp.Body)
			require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
			require.Equal(t, "failing", body.Status)
			reason = body.Reason
			return true
		})
	}

	if !idle {
		submitAfter()
		healthzFails()
		if reason != "" {
			require.Contains(t, reason, db)
		}
	}

	// The process exits non-zero within a few seconds, and says why.
	select {
	case <-b.ctl.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("the controller still runs 5s after its database directory was removed\n%s", b.ctl.Output())
	}
	t.Logf("exited %s after the removal; /healthz reason: %q", time.Since(removed).Round(time.Millisecond), reason)
	require.NotZero(t, b.ctl.ExitCode())
	if idle {
		healthzFails()
		submitAfter()
	}
	out := b.ctl.Output()
	var logged string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, `msg="instance stops"`) &&
			strings.Contains(line, "no longer at its path") && strings.Contains(line, db) {
			logged = line
		}
	}
	require.NotEmpty(t, logged, "no ERROR naming %s:\n%s", db, out)
	t.Logf("logged: %s", logged)

	// Nothing of the refused submit reached a device.
	require.Zero(t, b.executions()["task-2:restart:device-2:v1"])

	// Only now may an instance with the same id start: where the directory
	// is made again, on a fresh database (what the removal took is gone).
	require.NoError(t, os.Mkdir(dir, 0o755))
	b.ctl.Restart()
	_, status, err = b.client.Submit(b.ctx(), req("task-1", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, "a fresh database")
}
