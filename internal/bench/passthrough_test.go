package bench_test

import (
	"bytes"
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

	"github.com/fleetctl/fleetctl/internal/bench"
	"github.com/fleetctl/fleetctl/internal/benchwire"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// startPassthrough runs the pass-through (the durable floor with a log)
// against a real broker and two in-memory devices until the test ends, and
// returns a function that calls it and decodes the answer.
func startPassthrough(ctx context.Context, t *testing.T, log string) func(method, path, body string) (int, map[string]string) {
	broker := testenv.StartBroker(t)
	fleet, err := benchwire.StartMemoryFleet(ctx, broker.URL(), wire.DefaultTopicRoot, 2)
	require.NoError(t, err)
	t.Cleanup(fleet.Stop)

	srvCtx, stop := context.WithCancel(ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- bench.RunPassthrough(srvCtx, bench.PassthroughConfig{BrokerURL: broker.URL(), TopicRoot: wire.DefaultTopicRoot,
			ClientID: "passthrough-test", HTTP: "127.0.0.1:0", Log: log, Ready: func(addr string) { ready <- addr }})
	}()
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr
	case err := <-done:
		stop()
		t.Fatal(err)
	case <-ctx.Done():
		stop()
		t.Fatal("the pass-through did not listen")
	}
	c := &http.Client{Timeout: 20 * time.Second}
	t.Cleanup(func() {
		c.CloseIdleConnections()
		stop()
		require.NoError(t, <-done)
	})
	return func(method, path, body string) (int, map[string]string) {
		req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var got map[string]string
		require.NoError(t, json.Unmarshal(raw, &got), string(raw))
		return resp.StatusCode, got
	}
}

// The pass-through against a real broker and in-memory devices: a submit
// is answered 201 started, its GET ?wait= answers at the device's final
// receipt (succeeded, or failed_final for a device's rejection), a final
// state is answered once and then forgotten, and bad input gets 400.
func TestPassthroughRoutes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := startPassthrough(ctx, t, "")

	status, got := call("POST", "/v1/operations",
		`{"task_id":"t1","step":"restart","target":"device-1","business_version":"v1","action":"restart","params":{}}`)
	require.Equal(t, http.StatusCreated, status, got)
	require.Equal(t, "t1:restart:device-1:v1", got["operation_id"])
	require.Contains(t, []string{"started", "succeeded"}, got["status"])
	status, got = call("GET", "/v1/operations/t1:restart:device-1:v1?wait=10s", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "succeeded", got["status"], got)
	status, got = call("GET", "/v1/operations/t1:restart:device-1:v1", "")
	require.Equal(t, http.StatusNotFound, status, "a final state is answered once: %v", got)

	// The in-memory device rejects an action it does not know.
	status, _ = call("POST", "/v1/operations",
		`{"task_id":"t2","step":"s","target":"device-2","business_version":"v1","action":"no-such-action"}`)
	require.Equal(t, http.StatusCreated, status)
	status, got = call("GET", "/v1/operations/t2:s:device-2:v1?wait=10s", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "failed_final", got["status"], got)
	require.Contains(t, got["reason"], "rejected")

	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/v1/operations", `{"task_id":`},
		{"POST", "/v1/operations", `{"task_id":"t3","step":"s","target":"device-1","action":"restart"}`},
		{"GET", "/v1/operations/x?wait=soon", ""},
	} {
		status, got := call(bad.method, bad.path, bad.body)
		require.Equal(t, http.StatusBadRequest, status, "%v: %v", bad, got)
		require.Equal(t, "invalid_request", got["error"])
	}
	status, got = call("GET", "/v1/operations/nobody?wait=1ms", "")
	require.Equal(t, http.StatusNotFound, status)
	require.Equal(t, "not_found", got["error"])
}

// The durable floor: the command is in its log when the submit is
// answered, and the device's final receipt when the GET is; the routes
// answer as the pass-through's.
func TestDurableFloorLogsBeforeAnswering(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := filepath.Join(t.TempDir(), "floor.log")
	call := startPassthrough(ctx, t, log)
	lines := func() []string {
		raw, err := os.ReadFile(log)
		require.NoError(t, err)
		return strings.Split(string(bytes.TrimRight(raw, "\x00")), "\n")
	}
	require.Equal(t, []string{""}, lines(), "nothing logged before the first submit")

	status, got := call("POST", "/v1/operations",
		`{"task_id":"t1","step":"restart","target":"device-1","business_version":"v1","action":"restart","params":{}}`)
	require.Equal(t, http.StatusCreated, status, got)
	logged := lines()
	require.GreaterOrEqual(t, len(logged), 2, "the command and its newline")
	var cmd wire.Command
	require.NoError(t, wire.Decode([]byte(logged[0]), &cmd), logged[0])
	require.Equal(t, "t1:restart:device-1:v1", cmd.OperationID)

	status, got = call("GET", "/v1/operations/t1:restart:device-1:v1?wait=10s", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "succeeded", got["status"], got)
	logged = lines()
	require.Len(t, logged, 3, "the command, the final receipt and the last newline: %q", logged)
	var rc wire.Receipt
	require.NoError(t, wire.Decode([]byte(logged[1]), &rc), logged[1])
	require.Equal(t, cmd.CommandID, rc.CommandID)
	require.Equal(t, wire.ReceiptSucceeded, rc.Status)
}
