package device_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

const root = "fleet"

// env is what one test runs against: a broker of its own and a probe
// playing the controller.
type env struct {
	broker *testenv.Broker
	probe  *testenv.Probe
	dir    string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{broker: testenv.StartBroker(t), dir: t.TempDir()}
	e.probe = testenv.NewProbe(t, e.broker.URL(), root)
	return e
}

// options are a device's options for the test broker: quick keepalive and
// reconnects, the restart action counting its runs in runs.
func (e *env) options(id string, runs *atomic.Int64) device.Options {
	return device.Options{
		ID: id, Broker: e.broker.URL(), StateDir: e.dir,
		KeepAlive: 2 * time.Second, MaxReconnectInterval: 100 * time.Millisecond,
		Logger: testLogger(),
		Actions: map[string]device.Handler{
			"restart": func(_ context.Context, _ *device.Command) (any, error) {
				n := runs.Add(1)
				return map[string]any{"restarted": true, "runs": n}, nil
			},
		},
	}
}

// running is a device running in the background.
type running struct {
	d    *device.Device
	stop context.CancelFunc
	err  chan error
}

// start runs a device until the test ends (or stop/kill) and waits until
// it is online.
func start(t *testing.T, o device.Options) *running {
	t.Helper()
	d, err := device.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, stop: cancel, err: make(chan error, 1)}
	go func() { r.err <- d.Run(ctx) }()
	t.Cleanup(func() { r.halt(t) })
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	require.NoError(t, d.WaitOnline(wctx), "%s online", o.ID)
	return r
}

// halt stops the device cleanly (if it still runs) and returns Run's error.
func (r *running) halt(t *testing.T) error {
	t.Helper()
	r.stop()
	select {
	case err := <-r.err:
		r.err <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("device did not stop")
		return nil
	}
}

// kill crashes the device and waits until Run returned ErrKilled.
func (r *running) kill(t *testing.T) {
	t.Helper()
	r.d.Kill()
	require.ErrorIs(t, r.halt(t), device.ErrKilled)
}

var cmdSeq atomic.Int64

// command makes a restart command that expires in a minute.
func command(op string) wire.Command {
	n := cmdSeq.Add(1)
	now := time.Now().UTC()
	if op == "" {
		op = fmt.Sprintf("op-%d", n)
	}
	return wire.Command{CommandID: fmt.Sprintf("c-%d-%d", time.Now().UnixNano(), n), OperationID: op,
		Action: "restart", Params: json.RawMessage(`{}`), IssuedAt: now, ExpiresAt: now.Add(time.Minute), Attempt: 1}
}

// receipts returns the receipts seen about a command_id, without query
// answers.
func (e *env) receipts(id string) []testenv.ProbeReceipt {
	return e.probe.Receipts(func(r testenv.ProbeReceipt) bool { return r.CommandID == id && r.QueryID == "" })
}

// final waits for a final receipt about a command_id.
func (e *env) final(id string) testenv.ProbeReceipt {
	return e.probe.WaitReceipt(func(r testenv.ProbeReceipt) bool { return r.CommandID == id && r.Status.Final() })
}

// barrier sends a query about a command never seen and waits for its
// answer: the device handles its commands and queries one at a time in
// arrival order, so everything published before it was handled by then
// (a repeat that were accepted again would have had its "received" out).
func (e *env) barrier(t *testing.T, dev string) {
	t.Helper()
	q := wire.Query{QueryID: fmt.Sprintf("q-barrier-%d", cmdSeq.Add(1)), CommandID: "c-never", OperationID: "op-never"}
	e.probe.Query(dev, q)
	e.probe.WaitReceipt(testenv.ForQuery(q.QueryID))
}

func testLogger() *slog.Logger {
	if os.Getenv("DEVICE_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

var errBoom = errors.New("boom")
