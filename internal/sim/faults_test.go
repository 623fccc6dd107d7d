package sim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// withFaults configures device-1's faults.
func withFaults(f sim.Faults) func(*sim.Config) {
	return func(c *sim.Config) { c.Faults = sim.Profile{Defaults: f} }
}

func isStatus(id string, s wire.ReceiptStatus) func(testenv.ProbeReceipt) bool {
	return func(r testenv.ProbeReceipt) bool { return r.CommandID == id && r.Status == s && r.QueryID == "" }
}

// Crash points: whatever the point, an operation never runs twice, and
// after the restart the command ends in a truthful final state.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	cases := []struct {
		at         sim.Point
		executions int
		final      wire.ReceiptStatus
		errStr     string
		published  bool // the final receipt is published without being asked
	}{
		{sim.PointCommand, 1, wire.ReceiptSucceeded, "", true},  // redelivered by the broker
		{sim.PointReceived, 1, wire.ReceiptSucceeded, "", true}, // resumed at boot
		{sim.PointExecuting, 0, wire.ReceiptFailed, "interrupted", true},
		{sim.PointExecuted, 1, wire.ReceiptSucceeded, "", true}, // the witness proves it ran
		{sim.PointFinal, 1, wire.ReceiptSucceeded, "", false},   // durable, found by a query
	}
	for _, tc := range cases {
		t.Run(string(tc.at), func(t *testing.T) {
			t.Parallel()
			b := setup(t, withFaults(sim.Faults{Crash: sim.OutageFault{Trigger: sim.Trigger{Count: 1}, At: tc.at, For: sim.Duration(50 * time.Millisecond)}}))
			p, d := b.probe, b.dev("device-1")
			p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
			eventually(t, "crashed", func() bool { return d.Stats().Crashes == 1 })
			p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.Session == 1 })
			p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session == 2 })
			waitOnline(t, d)

			var r testenv.ProbeReceipt
			if tc.published {
				r = p.WaitReceipt(final("c-1"))
			} else {
				p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
				r = p.WaitReceipt(testenv.ForQuery("q-1"))
			}
			require.Equal(t, tc.final, r.Status)
			require.Equal(t, 3, r.Seq)
			require.Equal(t, tc.errStr, r.Error)
			require.Len(t, executions(t, b.dir, "c-1"), tc.executions)

			// A repeat after all that does not run it again.
			p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
			p.Command("device-1", command("c-2", "op-1", sim.ActionRestart, nil))
			p.Query("device-1", wire.Query{QueryID: "q-barrier", CommandID: "c-2", OperationID: "op-1"})
			p.WaitReceipt(testenv.ForQuery("q-barrier"))
			require.Len(t, executions(t, b.dir, "c-1"), tc.executions)
			if tc.executions == 1 {
				require.Empty(t, executions(t, b.dir, "c-2"), "the operation ran once")
			}
		})
	}
}

func TestFaultDropCommand(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{DropCommand: sim.Trigger{Count: 1}}))
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	// The device handles messages in order: the query's answer proves the
	// command before it was dropped.
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
	require.Equal(t, wire.ReceiptUnknown, p.WaitReceipt(testenv.ForQuery("q-1")).Status)
	require.Len(t, p.Receipts(testenv.ForCommand("c-1")), 1)
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	require.Equal(t, wire.ReceiptSucceeded, p.WaitReceipt(final("c-1")).Status)
	require.Equal(t, int64(1), b.dev("device-1").Stats().CommandsDropped)
}

func TestFaultDropFinalReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{DropReceipt: sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{sim.ClassFinal}}}))
	p, d := b.probe, b.dev("device-1")
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipt(isStatus("c-1", wire.ReceiptExecuting))
	eventually(t, "final dropped", func() bool { return d.Stats().ReceiptsDropped == 1 })
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	require.Empty(t, witnessedReceipts(t, b.dir, "c-1"), "a dropped receipt is not witnessed")
	// Still the latest receipt: a query finds it.
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
	r := p.WaitReceipt(testenv.ForQuery("q-1"))
	require.Equal(t, []any{wire.ReceiptSucceeded, 3}, []any{r.Status, r.Seq})
	require.Empty(t, p.Receipts(final("c-1")))
	eventually(t, "query answer witnessed", func() bool { return len(witnessedReceipts(t, b.dir, "c-1")) == 1 })
}

func TestFaultDropReceivedAndExecutingReceipts(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{DropReceipt: sim.ReceiptFault{Trigger: sim.Trigger{P: 1}, Statuses: []string{"received", "executing"}}}))
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipt(final("c-1"))
	require.Equal(t, []string{"succeeded/3"}, statuses(p.Receipts(testenv.ForCommand("c-1"))))
}

func TestFaultDuplicateReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{DuplicateReceipt: sim.ReceiptFault{Trigger: sim.Trigger{P: 1}}}))
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipts(2, final("c-1"))
	require.Equal(t, []string{"received/1", "received/1", "executing/2", "executing/2", "succeeded/3", "succeeded/3"},
		statuses(p.Receipts(testenv.ForCommand("c-1"))))
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	eventually(t, "both finals witnessed", func() bool { return len(witnessedReceipts(t, b.dir, "c-1")) == 2 })
}

func TestFaultDelayReceipt(t *testing.T) {
	t.Parallel()
	const delay = 700 * time.Millisecond
	b := setup(t, withFaults(sim.Faults{DelayReceipt: sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{"received"}, Delay: sim.Duration(delay)}}))
	p := b.probe
	sent := time.Now()
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	r := p.WaitReceipt(isStatus("c-1", wire.ReceiptReceived))
	require.GreaterOrEqual(t, r.ReceivedAt.Sub(sent), delay)
	require.Equal(t, []string{"executing/2", "succeeded/3", "received/1"}, statuses(p.Receipts(testenv.ForCommand("c-1"))))
	require.Equal(t, int64(1), b.dev("device-1").Stats().ReceiptsDelayed)
}

func TestFaultReorderReceipts(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{ReorderReceipt: sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{"received"}, Delay: sim.Duration(10 * time.Second)}}))
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipts(3, testenv.ForCommand("c-1"))
	require.Equal(t, []string{"executing/2", "received/1", "succeeded/3"}, statuses(p.Receipts(testenv.ForCommand("c-1"))))
	require.Equal(t, int64(1), b.dev("device-1").Stats().ReceiptsReordered)
}

func TestFaultDropConnectionAtPoint(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{DropConnection: sim.OutageFault{Trigger: sim.Trigger{Count: 1}, At: sim.PointReceived, For: sim.Duration(300 * time.Millisecond)}}))
	p, d := b.probe, b.dev("device-1")
	sent := time.Now()
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	lwt := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online })
	require.Equal(t, wire.Presence{Online: false, Session: 1}, lwt.Presence)
	birth := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session == 2 })
	require.GreaterOrEqual(t, birth.ReceivedAt.Sub(sent), 300*time.Millisecond, "stayed away for the duration")
	// The device kept working offline; its receipts follow the new birth,
	// in order, even when the action ends as the device comes back. The
	// broker may redeliver the command (its PUBACK went with the
	// connection): the answer to that repeat is the latest receipt again.
	r := p.WaitReceipt(final("c-1"))
	require.False(t, r.ReceivedAt.Before(birth.ReceivedAt))
	require.Equal(t, []string{"received/1", "executing/2", "succeeded/3"}, firstOfEach(statuses(p.Receipts(testenv.ForCommand("c-1")))))
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	require.Equal(t, int64(1), d.Stats().ConnectionDrops)
	// The command's PUBACK was lost with the connection, so the broker may
	// redeliver it: a repeat, answered from the record. Either way each
	// witnessed final is one the controller got.
	witnessMatchesProbe(t, b, "c-1")
}

// witnessMatchesProbe waits until receipts.jsonl holds exactly the final
// receipts of a command that the probe received.
func witnessMatchesProbe(t *testing.T, b *bundle, id string) {
	t.Helper()
	key := func(status wire.ReceiptStatus, seq int, q string) string { return fmt.Sprint(status, seq, q) }
	eventually(t, "witness = received finals", func() bool {
		var got, want []string
		for _, w := range witnessedReceipts(t, b.dir, id) {
			got = append(got, key(w.Status, w.Seq, w.QueryID))
		}
		for _, r := range b.probe.Receipts(func(r testenv.ProbeReceipt) bool { return r.CommandID == id && r.Status.Final() }) {
			want = append(want, key(r.Status, r.Seq, r.QueryID))
		}
		return len(want) > 0 && fmt.Sprint(got) == fmt.Sprint(want)
	})
}

func TestFaultDropConnectionEvery(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{DropConnection: sim.OutageFault{Trigger: sim.Trigger{Count: 2}, Every: sim.Duration(100 * time.Millisecond)}}))
	p, d := b.probe, b.dev("device-1")
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.Session == 2 })
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session == 3 })
	eventually(t, "two drops", func() bool { return d.Stats().ConnectionDrops == 2 })
}

func TestFaultCrashEvery(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{Crash: sim.OutageFault{Trigger: sim.Trigger{Count: 1}, Every: sim.Duration(100 * time.Millisecond), For: sim.Duration(100 * time.Millisecond)}}))
	p, d := b.probe, b.dev("device-1")
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.Session == 1 })
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session == 2 })
	waitOnline(t, d)
	require.Equal(t, int64(1), d.Stats().Crashes)
	require.Equal(t, 2, d.Boots())
}

func TestFaultFail(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{Fail: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Actions: []string{sim.ActionSetConfig}, Error: "disk_full"}}))
	p, d := b.probe, b.dev("device-1")
	p.Command("device-1", command("c-1", "op-1", sim.ActionSetConfig, map[string]any{"a": 1}))
	r := p.WaitReceipt(final("c-1"))
	require.Equal(t, []any{wire.ReceiptFailed, 3, "disk_full"}, []any{r.Status, r.Seq, r.Error})
	require.Len(t, executions(t, b.dir, "c-1"), 1, "a failed action ran")
	require.Empty(t, d.Config(), "and changed nothing")
	// It took the operation: a second command of it gets its receipt.
	p.Command("device-1", command("c-2", "op-1", sim.ActionSetConfig, map[string]any{"a": 1}))
	require.Equal(t, r.Receipt, p.WaitReceipts(2, final("c-1"))[1].Receipt)
	// Another action is not affected.
	p.Command("device-1", command("c-3", "op-3", sim.ActionRestart, nil))
	require.Equal(t, wire.ReceiptSucceeded, p.WaitReceipt(final("c-3")).Status)
}

func TestFaultReject(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{Reject: sim.ActionFault{Trigger: sim.Trigger{Count: 1}, Error: "busy"}}))
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	r := p.WaitReceipt(final("c-1"))
	require.Equal(t, []any{wire.ReceiptRejected, 1, "busy"}, []any{r.Status, r.Seq, r.Error})
	require.Empty(t, executions(t, b.dir, "c-1"))
	// Rejected before acceptance: the operation is still free.
	p.Command("device-1", command("c-2", "op-1", sim.ActionRestart, nil))
	require.Equal(t, wire.ReceiptSucceeded, p.WaitReceipt(final("c-2")).Status)
	require.Len(t, executions(t, b.dir, "c-2"), 1)
}

func TestFaultIgnoreQueries(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{IgnoreQueries: sim.Trigger{Count: 1}}))
	p := b.probe
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
	p.Query("device-1", wire.Query{QueryID: "q-2", CommandID: "c-1", OperationID: "op-1"})
	p.WaitReceipt(testenv.ForQuery("q-2"))
	require.Empty(t, p.Receipts(testenv.ForQuery("q-1")))
	require.Equal(t, int64(1), b.dev("device-1").Stats().QueriesIgnored)
}

func TestFaultClockSkew(t *testing.T) {
	t.Parallel()
	const skew = time.Hour
	b := setup(t, withFaults(sim.Faults{ClockSkew: sim.Duration(skew)}))
	p := b.probe
	birth := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online })
	require.InDelta(t, skew.Seconds(), birth.At.Sub(birth.ReceivedAt).Seconds(), 60)

	c := command("c-1", "op-1", sim.ActionRestart, nil)
	c.ExpiresAt = time.Now().Add(30 * time.Minute) // not expired by our clock, expired by the device's
	p.Command("device-1", c)
	r := p.WaitReceipt(final("c-1"))
	require.Equal(t, sim.ErrExpired, r.Error)
	require.InDelta(t, skew.Seconds(), r.At.Sub(r.ReceivedAt).Seconds(), 60)

	p.Command("device-1", command("c-2", "op-2", sim.ActionRestart, nil)) // expires in a minute: too late as well
	require.Equal(t, sim.ErrExpired, p.WaitReceipt(final("c-2")).Error)
	c3 := command("c-3", "op-3", sim.ActionRestart, nil)
	c3.ExpiresAt = time.Now().Add(2 * skew)
	p.Command("device-1", c3)
	require.Equal(t, wire.ReceiptSucceeded, p.WaitReceipt(final("c-3")).Status)
	ex := executions(t, b.dir, "c-3")
	require.Len(t, ex, 1)
	require.InDelta(t, skew.Seconds(), time.Until(ex[0].At).Seconds(), 60, "witness at is by the device's clock")
}

func TestFaultLegacyExecutesEveryDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{Legacy: sim.Legacy{Enabled: true}}))
	p := b.probe
	birth := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online })
	require.Equal(t, wire.Capabilities{Dedupe: false, Query: false}, *birth.Capabilities)

	c := command("c-1", "op-1", sim.ActionRestart, nil)
	p.Publish("device-1", wire.KindCommands, 0, c)
	p.WaitReceipt(final("c-1"))
	p.Publish("device-1", wire.KindCommands, 0, c)
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
	p.Publish("device-1", wire.KindCommands, 0, command("c-2", "op-1", sim.ActionRestart, nil))
	p.WaitReceipt(final("c-2"))
	require.Equal(t, []string{"received/1", "executing/2", "succeeded/3", "received/4", "executing/5", "succeeded/6"},
		statuses(p.Receipts(testenv.ForCommand("c-1"))))
	require.Len(t, executions(t, b.dir, "c-1"), 2, "the repeat ran again")
	require.Len(t, executions(t, b.dir, "c-2"), 1, "no operation dedupe either")
	require.Empty(t, p.Receipts(testenv.ForQuery("q-1")), "no queries")
	require.Equal(t, int64(0), b.dev("device-1").Stats().DuplicatesSuppressed)
}

func TestFaultLegacyWithQueries(t *testing.T) {
	t.Parallel()
	b := setup(t, withFaults(sim.Faults{Legacy: sim.Legacy{Enabled: true, Query: true}}))
	p := b.probe
	birth := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online })
	require.Equal(t, wire.Capabilities{Dedupe: false, Query: true}, *birth.Capabilities)
	p.Publish("device-1", wire.KindCommands, 0, command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipt(final("c-1"))
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
	require.Equal(t, wire.ReceiptSucceeded, p.WaitReceipt(testenv.ForQuery("q-1")).Status)
}

// Changing faults at run time: turning a device legacy makes it reconnect
// with a birth that says so.
func TestSetFaultsAtRunTime(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p, d := b.probe, b.dev("device-1")
	require.NoError(t, d.SetFaults(sim.Faults{Legacy: sim.Legacy{Enabled: true}}))
	birth := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session == 2 })
	require.False(t, birth.Capabilities.Dedupe)
	require.Error(t, d.SetFaults(sim.Faults{DropCommand: sim.Trigger{P: 2}}))

	require.NoError(t, d.SetFaults(sim.Faults{DropCommand: sim.Trigger{P: 1}}))
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session == 3 })
	waitOnline(t, d)
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1"})
	require.Equal(t, wire.ReceiptUnknown, p.WaitReceipt(testenv.ForQuery("q-1")).Status)
}

// Fault decisions repeat with the seed: two fleets with the same seed and
// the same traffic drop the same commands.
func TestSeedRepeatsFaultDecisions(t *testing.T) {
	t.Parallel()
	run := func(seed int64) []string {
		b := setup(t, func(c *sim.Config) {
			c.Seed = seed
			c.Faults = sim.Profile{Defaults: sim.Faults{DropCommand: sim.Trigger{P: 0.5}}}
		})
		for i := range 20 {
			b.probe.Command("device-1", command(fmt.Sprintf("c-%d", i), fmt.Sprintf("op-%d", i), sim.ActionRestart, nil))
		}
		b.probe.Query("device-1", wire.Query{QueryID: "q-barrier", CommandID: "none"})
		b.probe.WaitReceipt(testenv.ForQuery("q-barrier"))
		var got []string
		for _, r := range b.probe.Receipts(func(r testenv.ProbeReceipt) bool { return r.Status == wire.ReceiptReceived }) {
			got = append(got, r.CommandID)
		}
		return got
	}
	a, b, c := run(7), run(7), run(8)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
	require.NotEmpty(t, a)
	require.Less(t, len(a), 20)
}
