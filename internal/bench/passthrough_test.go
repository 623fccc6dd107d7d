package bench_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/bench"
	"github.com/fleetctl/fleetctl/internal/benchwire"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// The pass-through against a real broker and in-memory devices: a submit
// is answered 201 started, its GET ?wait= answers at the device's final
// receipt (succeeded, or failed_final for a device's rejection), a final
// state is answered once and then forgotten, and bad input gets 400.
func TestPassthroughRoutes(t *testing.T) {
	broker := testenv.StartBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fleet, err := benchwire.StartMemoryFleet(ctx, broker.URL(), wire.DefaultTopicRoot, 2)
	require.NoError(t, err)
	defer fleet.Stop()

	srvCtx, stop := context.WithCancel(ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- bench.RunPassthrough(srvCtx, bench.PassthroughConfig{BrokerURL: broker.URL(), TopicRoot: wire.DefaultTopicRoot,
			ClientID: "passthrough-test", HTTP: "127.0.0.1:0", Ready: func(addr string) { ready <- addr }})
	}()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr
	case err := <-done:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("the pass-through did not listen")
	}
	c := &http.Client{Timeout: 20 * time.Second}
	defer c.CloseIdleConnections()
	call := func(method, path, body string) (int, map[string]string) {
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
