package sim_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// syncGate decides the fsyncs of the fleet's files whose name ends with
// suffix: it can fail them (all, or the next n) and hold them until
// released.
type syncGate struct {
	suffix string

	mu       sync.Mutex
	fail     bool
	failNext int
	failures int
	hold     chan struct{} // non-nil: matching fsyncs wait until it is closed
	held     chan struct{} // gets a token when a matching fsync starts waiting
}

var errInjected = errors.New("injected fsync failure")

func newSyncGate(t *testing.T, suffix string) *syncGate {
	g := &syncGate{suffix: suffix, held: make(chan struct{}, 1)}
	t.Cleanup(g.release)
	return g
}

func (g *syncGate) hook(file string) error {
	if !strings.HasSuffix(file, g.suffix) {
		return nil
	}
	g.mu.Lock()
	hold := g.hold
	fail := g.fail || g.failNext > 0
	if fail {
		g.failures++
		if g.failNext > 0 {
			g.failNext--
		}
	}
	g.mu.Unlock()
	if hold != nil {
		select {
		case g.held <- struct{}{}:
		default:
		}
		<-hold
	}
	if fail {
		return errInjected
	}
	return nil
}

func (g *syncGate) setFail(v bool) { g.mu.Lock(); g.fail = v; g.mu.Unlock() }
func (g *syncGate) failCount(n int) {
	g.mu.Lock()
	g.failNext = n
	g.mu.Unlock()
}
func (g *syncGate) failuresSoFar() int { g.mu.Lock(); defer g.mu.Unlock(); return g.failures }

func (g *syncGate) block() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hold == nil {
		g.hold = make(chan struct{})
	}
}

func (g *syncGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hold != nil {
		close(g.hold)
		g.hold = nil
	}
}

// consistent checks what was published about a command against itself and
// the device: no seq carries two statuses, and the final one is the
// device's latest receipt.
func consistent(t *testing.T, b *bundle, device, commandID string) testenv.ProbeReceipt {
	t.Helper()
	rs := b.probe.Receipts(testenv.ForCommand(commandID))
	bySeq := map[int]wire.ReceiptStatus{}
	for _, r := range rs {
		if s, ok := bySeq[r.Seq]; ok {
			require.Equal(t, s, r.Status, "seq %d published with two statuses: %v", r.Seq, statuses(rs))
		}
		bySeq[r.Seq] = r.Status
	}
	fin := b.probe.WaitReceipt(final(commandID))
	latest, ok := b.dev(device).LatestReceipt(commandID)
	require.True(t, ok)
	require.Equal(t, []any{fin.Status, fin.Seq, fin.Error}, []any{latest.Status, latest.Seq, latest.Error})
	require.True(t, fin.At.Equal(latest.At))
	return fin
}

// While the journal cannot be fsynced nothing about a command is published
// or acknowledged: the device crashes on the failed batch and cannot come
// back. Once fsync works again the command is resolved at most once and
// what was published agrees with the device's durable state and witness.
func TestNoReceiptBeforeItsRecordIsDurable(t *testing.T) {
	t.Parallel()
	g := newSyncGate(t, sim.JournalExt)
	b := setup(t, func(c *sim.Config) { sim.SetSyncHook(c, g.hook) })
	d := b.dev("device-1")

	g.setFail(true)
	b.probe.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	// The first failure is the "received" record; the device crashes,
	// boots a second later and fails to save its next session number.
	eventually(t, "crashed and failing to come back", func() bool {
		return d.Stats().Crashes >= 1 && g.failuresSoFar() >= 3
	})
	require.Empty(t, b.probe.Receipts(testenv.ForCommand("c-1")), "nothing published while nothing is durable")
	require.Empty(t, executions(t, b.dir, "c-1"))

	g.setFail(false)
	waitOnline(t, d)
	fin := consistent(t, b, "device-1", "c-1")
	// Each boot resumes the command, and a boot whose "executing" record
	// also met a failed fsync finds it never ran: failed "interrupted".
	// Either way the witness agrees.
	switch fin.Status {
	case wire.ReceiptSucceeded:
		require.Len(t, executions(t, b.dir, "c-1"), 1)
	case wire.ReceiptFailed:
		require.Equal(t, sim.ErrInterrupted, fin.Error)
		require.Empty(t, executions(t, b.dir, "c-1"))
	default:
		t.Fatalf("final %s", fin.Status)
	}

	// The state survives a restart as published.
	require.NoError(t, d.Restart())
	waitOnline(t, d)
	consistent(t, b, "device-1", "c-1")
}

// A failed fsync of executions.jsonl fails its whole batch: the final state
// is not recorded and the final receipt not published; the device crashes,
// finds the line on boot and reports the execution once.
func TestFailedExecutionLineHoldsTheFinalReceipt(t *testing.T) {
	t.Parallel()
	g := newSyncGate(t, witness.ExecutionsFile)
	b := setup(t, func(c *sim.Config) { sim.SetSyncHook(c, g.hook) })
	d := b.dev("device-1")

	g.failCount(1)
	b.probe.Command("device-1", command("c-1", "op-1", sim.ActionSetConfig, map[string]any{"k": 1}))
	fin := consistent(t, b, "device-1", "c-1")
	require.Equal(t, wire.ReceiptSucceeded, fin.Status)
	require.Equal(t, 1, g.failuresSoFar())
	require.Equal(t, int64(1), d.Stats().Crashes, "crashed on the failed batch")
	require.Equal(t, int64(1), d.Stats().Recovered, "the boot resolved the execution")
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	cfg, err := json.Marshal(d.Config())
	require.NoError(t, err)
	require.JSONEq(t, `{"k":1}`, string(cfg))
}

// A device killed while its batch is being fsynced published nothing of
// it; after the batch lands it boots from it and the command runs once.
func TestCrashWhileTheBatchIsInFlight(t *testing.T) {
	t.Parallel()
	g := newSyncGate(t, sim.JournalExt)
	b := setup(t, func(c *sim.Config) {
		c.Devices = 2
		sim.SetSyncHook(c, g.hook)
	})
	d := b.dev("device-1")

	g.block()
	b.probe.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	b.probe.Command("device-2", command("c-2", "op-2", sim.ActionRestart, nil))
	<-g.held
	require.Empty(t, b.probe.Receipts(testenv.ForCommand("c-1")), "nothing published while its batch is not durable")
	d.Crash()
	g.release()
	require.NoError(t, d.Restart())
	waitOnline(t, d)

	for dev, id := range map[string]string{"device-1": "c-1", "device-2": "c-2"} {
		fin := consistent(t, b, dev, id)
		require.Equal(t, wire.ReceiptSucceeded, fin.Status, id)
		require.Len(t, executions(t, b.dir, id), 1, id)
	}
}
