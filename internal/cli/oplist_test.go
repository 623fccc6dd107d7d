package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
)

// realAPI is the API on a real SQLite store, auth off, with n operations
// submitted (op-00 on device-0, op-01 on device-1, ...; every third one's
// command cancelled).
func realAPI(t *testing.T, n int) string {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	policy := func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }
	svc := ops.New(ops.Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second, Policy: policy})
	srv := httptest.NewServer(api.New(api.Config{Service: svc, Store: st, Instance: "i1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "")
	for i := range n {
		op, _, err := c.Submit(ctx, apiwire.SubmitRequest{OperationID: fmt.Sprintf("op-%02d", i),
			Target: fmt.Sprintf("device-%d", i%2), Action: "restart"}, "")
		require.NoError(t, err)
		if i%3 == 0 {
			_, err := c.Cancel(ctx, op.CommandID)
			require.NoError(t, err)
		}
	}
	return srv.URL
}

func TestOpAndCmdListAgainstARealServer(t *testing.T) {
	t.Parallel()
	url := realAPI(t, 7)

	// One page by default: a table with the attribution and a line that
	// says more matched.
	code, out, stderr := run(t, "op", "list", "--limit", "3", "--server", url)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	require.Equal(t, []string{"OPERATION", "STATUS", "DEVICE", "ACTION", "STARTED", "SUBMITTED", "BY", "VIA"}, strings.Fields(lines[0]))
	require.Equal(t, "anonymous", strings.Fields(lines[1])[5])
	require.Equal(t, "api", strings.Fields(lines[1])[6])
	require.Equal(t, "3 of 7 shown; --all lists them all, --limit sets the page", lines[4])

	// --all --json: one array, every page's records, each once.
	code, out, stderr = run(t, "op", "list", "--limit", "2", "--all", "--json", "--server", url)
	require.Equal(t, 0, code, stderr)
	var all []apiwire.Operation
	require.NoError(t, json.Unmarshal([]byte(out), &all))
	seen := map[string]bool{}
	for _, op := range all {
		require.False(t, seen[op.OperationID], op.OperationID)
		seen[op.OperationID] = true
	}
	require.Len(t, seen, 7)

	// Filters as flags.
	code, out, stderr = run(t, "op", "list", "--status", "failed_final", "--device", "device-0", "--submitted-by", "anonymous",
		"--since", "1h", "--all", "--json", "--server", url)
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(out), &all))
	var ids []string
	for _, op := range all {
		ids = append(ids, op.OperationID)
	}
	require.ElementsMatch(t, []string{"op-00", "op-06"}, ids)
	code, out, stderr = run(t, "op", "list", "--status", "open", "--status", "failed_final", "--until", "2000-01-01T00:00:00Z", "--json", "--server", url)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "[]", strings.TrimSpace(out))

	code, out, stderr = run(t, "cmd", "list", "--status", "cancelled,failed", "--all", "--server", url)
	require.Equal(t, 0, code, stderr)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Contains(t, lines[1], "cancelled")
	code, out, stderr = run(t, "cmd", "list", "--operation-id", "op-04", "--json", "--server", url)
	require.Equal(t, 0, code, stderr)
	var cmds []apiwire.Command
	require.NoError(t, json.Unmarshal([]byte(out), &cmds))
	require.Len(t, cmds, 1)
	require.Equal(t, "op-04", cmds[0].OperationID)
	require.NotEmpty(t, cmds[0].Events)

	// The server refuses an unknown state (exit 1, its code and message);
	// the command line refuses what it can check itself (exit 2).
	code, _, stderr = run(t, "cmd", "list", "--status", "stuck", "--server", url)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "invalid_request")
	require.Contains(t, stderr, `"stuck" is not a state`)
	code, _, stderr = run(t, "op", "list", "--limit", "1001", "--server", url)
	require.Equal(t, 2, code, stderr)
	code, _, stderr = run(t, "op", "list", "--since", "yesterday", "--server", url)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--since")
}
