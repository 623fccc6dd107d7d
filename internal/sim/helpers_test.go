package sim_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

const root = "fleet"

// bundle is what one test runs against: a broker of its own, a fleet and a
// probe playing the controller.
type bundle struct {
	broker *testenv.Broker
	dir    string
	cfg    sim.Config
	fleet  *sim.Fleet
	probe  *testenv.Probe
}

// setup starts a broker, a probe and a fleet of one device (device-1)
// unless mod changes the config, and waits until every device is online.
func setup(t *testing.T, mod func(*sim.Config)) *bundle {
	t.Helper()
	b := &bundle{broker: testenv.StartBroker(t), dir: t.TempDir()}
	b.probe = testenv.NewProbe(t, b.broker.URL(), root)
	b.cfg = sim.Config{
		MQTT:                 b.broker.URL(),
		Devices:              1,
		StateDir:             b.dir,
		KeepAlive:            2 * time.Second,
		MaxReconnectInterval: 100 * time.Millisecond,
		Logger:               testLogger(),
	}
	if mod != nil {
		mod(&b.cfg)
	}
	b.startFleet(t)
	return b
}

func (b *bundle) startFleet(t *testing.T) {
	t.Helper()
	f, err := sim.Start(context.Background(), b.cfg)
	require.NoError(t, err)
	t.Cleanup(f.Stop)
	b.fleet = f
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.WaitOnline(ctx))
}

func (b *bundle) dev(id string) *sim.Device { return b.fleet.Device(id) }

// waitOnline waits until a device is online again.
func waitOnline(t *testing.T, d *sim.Device) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, d.WaitOnline(ctx), "%s online", d.ID())
}

func testLogger() *slog.Logger {
	if os.Getenv("SIM_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// command makes a command that expires in a minute.
func command(id, op, action string, params any) wire.Command {
	now := time.Now().UTC()
	var raw json.RawMessage
	if params != nil {
		raw, _ = json.Marshal(params)
	}
	return wire.Command{CommandID: id, OperationID: op, Action: action, Params: raw, IssuedAt: now, ExpiresAt: now.Add(time.Minute), Attempt: 1}
}

// final matches the final receipts of a command (not answers to queries).
func final(id string) func(testenv.ProbeReceipt) bool {
	return func(r testenv.ProbeReceipt) bool { return r.CommandID == id && r.Status.Final() && r.QueryID == "" }
}

// statuses lists the statuses (with seq) of receipts in arrival order.
func statuses(rs []testenv.ProbeReceipt) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Status) + "/" + itoa(r.Seq)
	}
	return out
}

// firstOfEach keeps the first of each equal string, in order.
func firstOfEach(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// executions returns the witness lines of one command.
func executions(t *testing.T, dir, commandID string) []witness.Execution {
	t.Helper()
	all, err := witness.ReadExecutions(dir)
	require.NoError(t, err)
	var out []witness.Execution
	for _, e := range all {
		if e.CommandID == commandID {
			out = append(out, e)
		}
	}
	return out
}

// witnessedReceipts returns the receipts.jsonl lines of one command.
func witnessedReceipts(t *testing.T, dir, commandID string) []witness.PublishedReceipt {
	t.Helper()
	all, err := witness.ReadReceipts(dir)
	require.NoError(t, err)
	var out []witness.PublishedReceipt
	for _, r := range all {
		if r.CommandID == commandID {
			out = append(out, r)
		}
	}
	return out
}

// eventually waits for cond with a deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 10*time.Millisecond, what)
}
