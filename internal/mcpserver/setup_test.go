package mcpserver_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/controller"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
	"github.com/fleetctl/fleetctl/internal/mcpserver/mcptest"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// TestMain: a scratch directory, and nothing left behind (testenv.Main).
func TestMain(m *testing.M) { testenv.Main(m) }

// bundle is a real controller, in process (its API and its /mcp), on a
// real Mosquitto with a simulated fleet, with auth on: restart needs
// approval; agent and bob are operators with grants on device-*, carol an
// operator without grants, alice an approver, viewer has no role.
type bundle struct {
	t        *testing.T
	url      string
	stateDir string
	admin    *client.Client
	alice    *client.Client
}

var tokens = `[{"token":"t-agent","principal":"agent","roles":["operator"]},
	{"token":"t-bob","principal":"bob","roles":["operator"]},
	{"token":"t-carol","principal":"carol","roles":["operator"]},
	{"token":"t-alice","principal":"alice","roles":["approver"]},
	{"token":"t-admin","principal":"admin","roles":["admin"]},
	{"token":"t-viewer","principal":"viewer","roles":[]}]`

var deviceIDs = []string{"device-1", "device-2", "device-3"}

func start(t *testing.T) *bundle {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.json"), []byte(tokens), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "policy.json"), []byte(`{"actions":{"restart":{"approval":"required"}}}`), 0o600))
	broker := testenv.StartBroker(t)
	cfg := controller.DefaultConfig()
	cfg.DB, cfg.MQTT, cfg.HTTP, cfg.InstanceID = filepath.Join(dir, "controller.db"), broker.URL(), "127.0.0.1:0", "m1"
	cfg.Tokens, cfg.PolicyFile = filepath.Join(dir, "tokens.json"), filepath.Join(dir, "policy.json")
	cfg.AckTimeout, cfg.SweepInterval = time.Second, 100*time.Millisecond
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	c, err := controller.New(ctx, cfg, quiet, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case <-c.Ready():
	case err := <-done:
		t.Fatalf("controller stopped before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("controller not ready within 20s")
	}
	b := &bundle{t: t, url: "http://" + c.HTTPAddr(), stateDir: t.TempDir()}
	b.admin, b.alice = client.New(b.url, "t-admin"), client.New(b.url, "t-alice")
	fleet, err := sim.Start(context.Background(), sim.Config{MQTT: broker.URL(), IDs: deviceIDs, StateDir: b.stateDir, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(fleet.Stop)
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	require.NoError(t, fleet.WaitOnline(wctx))
	for _, who := range []string{"agent", "bob"} {
		for _, action := range []string{"restart", "set-config"} {
			_, _, err := b.admin.CreateGrant(wctx, apiwire.GrantRequest{Principal: who, Action: action, Devices: "device-*"})
			require.NoError(t, err)
		}
	}
	// Tasks need devices the controller has seen.
	for _, id := range deviceIDs {
		for {
			d, err := b.admin.Device(wctx, id)
			if err == nil && d.Seen && d.Online {
				break
			}
			select {
			case <-wctx.Done():
				t.Fatalf("the controller has not seen %s within 20s", id)
			case <-time.After(20 * time.Millisecond): // poll interval of a deadline-bounded wait
			}
		}
	}
	return b
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// session connects the SDK's client to a tool server over in-memory
// transports; the server calls the API with token.
func (b *bundle) session(t *testing.T, token string) (*mcp.ClientSession, *mcptest.Lossy) {
	return sessionTo(t, b.url, token)
}

func sessionTo(t *testing.T, url, token string) (*mcp.ClientSession, *mcptest.Lossy) {
	t.Helper()
	srv := mcpserver.New(mcpserver.Config{Client: func(*mcp.CallToolRequest) *client.Client { return client.New(url, token) }})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx(t), st, nil)
	require.NoError(t, err)
	lossy := &mcptest.Lossy{Transport: ct}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v0"}, nil).Connect(ctx(t), lossy, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs, lossy
}

// httpSession connects the SDK's client to the controller's /mcp over
// streamable HTTP with token.
func (b *bundle) httpSession(t *testing.T, token string, rt http.RoundTripper) *mcp.ClientSession {
	t.Helper()
	if rt == nil {
		rt = http.DefaultTransport
	}
	hc := &http.Client{Transport: bearer{token: token, next: rt}, Timeout: 90 * time.Second}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v0"}, nil).Connect(ctx(t),
		&mcp.StreamableClientTransport{Endpoint: b.url + "/mcp", HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	return cs
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// executions counts the devices' witness lines per operation_id.
func (b *bundle) executions() map[string]int {
	b.t.Helper()
	ex, err := witness.ReadExecutions(b.stateDir)
	require.NoError(b.t, err)
	out := map[string]int{}
	for _, e := range ex {
		out[e.OperationID]++
	}
	return out
}

// call calls a tool once and decodes its structured content.
func call[T any](t *testing.T, cs *mcp.ClientSession, name string, args any) (T, *mcp.CallToolResult) {
	t.Helper()
	res, err := cs.CallTool(ctx(t), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	out, err := mcptest.Decode[T](res)
	require.NoError(t, err)
	return out, res
}

// ok calls a tool that must succeed.
func ok[T any](t *testing.T, cs *mcp.ClientSession, name string, args any) T {
	t.Helper()
	out, res := call[T](t, cs, name, args)
	require.False(t, res.IsError, "%s: %s", name, mcptest.Text(res))
	return out
}

// toolErr calls a tool that must fail, and checks that the API's status and
// code are in the text and in the structured content.
func toolErr(t *testing.T, cs *mcp.ClientSession, name string, args any, status int, code string) mcpserver.ToolError {
	t.Helper()
	out, res := call[mcpserver.Failure](t, cs, name, args)
	require.True(t, res.IsError, "%s: want a tool error %s, got: %s", name, code, mcptest.Text(res))
	require.NotNil(t, out.Error, mcptest.Text(res))
	require.Equal(t, code, out.Error.Code, mcptest.Text(res))
	require.Equal(t, status, out.Error.Status, mcptest.Text(res))
	prefix := code + ":"
	if status != 0 {
		prefix = strconv.Itoa(status) + " " + code + ":"
	}
	require.True(t, strings.HasPrefix(mcptest.Text(res), prefix), "text %q lacks %q", mcptest.Text(res), prefix)
	return *out.Error
}
