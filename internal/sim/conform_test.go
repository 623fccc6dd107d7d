package sim_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

func TestNormalCommandReceiptsAndWitness(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe

	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipt(final("c-1"))
	rs := p.Receipts(testenv.ForCommand("c-1"))
	require.Equal(t, []string{"received/1", "executing/2", "succeeded/3"}, statuses(rs))
	for _, r := range rs {
		require.Equal(t, "device-1", r.Device)
		require.Equal(t, "op-1", r.OperationID)
		require.NoError(t, r.Validate())
	}
	require.JSONEq(t, `{"restarted":true,"boots":2}`, string(rs[2].Result))

	ex := executions(t, b.dir, "c-1")
	require.Len(t, ex, 1)
	require.Equal(t, witness.Execution{DeviceID: "device-1", CommandID: "c-1", OperationID: "op-1", Action: "restart", At: ex[0].At}, ex[0])
	eventually(t, "final receipt witnessed", func() bool { return len(witnessedReceipts(t, b.dir, "c-1")) == 1 })
	w := witnessedReceipts(t, b.dir, "c-1")[0]
	require.Equal(t, witness.PublishedReceipt{DeviceID: "device-1", CommandID: "c-1", OperationID: "op-1", Status: wire.ReceiptSucceeded, Seq: 3, At: rs[2].At}, w)

	// set-config merges (null removes a key) and reports a summary of the
	// config, with the config while it is small.
	p.Command("device-1", command("c-2", "op-2", sim.ActionSetConfig, map[string]any{"a": 1, "b": "x"}))
	r := p.WaitReceipt(final("c-2"))
	require.Equal(t, wire.ReceiptSucceeded, r.Status)
	require.JSONEq(t, `{"config":{"a":1,"b":"x"},"config_keys":2,"changed_keys":2,
		"config_sha256":"`+sha256Hex(`{"a":1,"b":"x"}`)+`"}`, string(r.Result))
	p.Command("device-1", command("c-3", "op-3", sim.ActionSetConfig, map[string]any{"a": nil, "c": true}))
	r = p.WaitReceipt(final("c-3"))
	require.JSONEq(t, `{"config":{"b":"x","c":true},"config_keys":2,"changed_keys":2,
		"config_sha256":"`+sha256Hex(`{"b":"x","c":true}`)+`"}`, string(r.Result))
	// A config larger than the echo limit is summarised, never echoed: the
	// receipt stays within the protocol's result limit (it grew past 64 KiB
	// of merged config here).
	for i := range 3 {
		p.Command("device-1", command(fmt.Sprintf("c-big-%d", i), fmt.Sprintf("op-big-%d", i), sim.ActionSetConfig,
			map[string]any{fmt.Sprintf("k%d", i): strings.Repeat("x", 30<<10)}))
		r = p.WaitReceipt(final(fmt.Sprintf("c-big-%d", i)))
		require.Equal(t, wire.ReceiptSucceeded, r.Status)
		require.Less(t, len(r.Result), 200, "%s", r.Result)
		require.NotContains(t, string(r.Result), `"config":`)
	}
	cfg, _ := json.Marshal(b.dev("device-1").Config())
	require.Contains(t, string(cfg), `"b":"x","c":true`)
	require.Greater(t, len(cfg), 90<<10)

	// Unknown action and invalid params: rejected, nothing runs.
	p.Command("device-1", command("c-4", "op-4", "self-destruct", nil))
	r = p.WaitReceipt(final("c-4"))
	require.Equal(t, []any{wire.ReceiptRejected, 1, sim.ErrUnsupportedAction}, []any{r.Status, r.Seq, r.Error})
	p.Command("device-1", command("c-5", "op-5", sim.ActionSetConfig, []int{1}))
	r = p.WaitReceipt(final("c-5"))
	require.Equal(t, []any{wire.ReceiptRejected, 1, sim.ErrInvalidParams}, []any{r.Status, r.Seq, r.Error})
	require.Empty(t, executions(t, b.dir, "c-4"))
	require.Empty(t, executions(t, b.dir, "c-5"))

	s := b.dev("device-1").Stats()
	require.Equal(t, int64(6), s.Executions, "a restart and five set-configs")
	require.Equal(t, int64(2), s.Rejected)
}

func TestRepeatedCommandIDExecutesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	c := command("c-1", "op-1", sim.ActionRestart, nil)
	p.Command("device-1", c)
	first := p.WaitReceipt(final("c-1"))

	c.Attempt = 2
	p.Command("device-1", c)
	rs := p.WaitReceipts(2, final("c-1"))
	require.Equal(t, first.Receipt, rs[1].Receipt, "a repeat gets the same latest receipt")
	require.Len(t, p.Receipts(testenv.ForCommand("c-1")), 4)
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	require.Equal(t, int64(1), b.dev("device-1").Stats().DuplicatesSuppressed)
	// One witness line per publish of a final receipt.
	eventually(t, "two witnessed finals", func() bool { return len(witnessedReceipts(t, b.dir, "c-1")) == 2 })
}

func TestRepeatWhileExecutingGetsExecuting(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *sim.Config) {
		c.Faults.Defaults.SlowExecution = sim.ActionFault{Trigger: sim.Trigger{Count: 1}, Delay: sim.Duration(time.Second)}
	})
	p := b.probe
	c := command("c-1", "op-1", sim.ActionRestart, nil)
	p.Command("device-1", c)
	isExec := func(r testenv.ProbeReceipt) bool { return r.CommandID == "c-1" && r.Status == wire.ReceiptExecuting }
	p.WaitReceipt(isExec)
	p.Command("device-1", c)
	rs := p.WaitReceipts(2, isExec)
	require.Equal(t, rs[0].Receipt, rs[1].Receipt)
	p.WaitReceipt(final("c-1"))
	require.Equal(t, []string{"received/1", "executing/2", "executing/2", "succeeded/3"}, statuses(p.Receipts(testenv.ForCommand("c-1"))))
	require.Len(t, executions(t, b.dir, "c-1"), 1)
}

func TestSecondCommandOfOperationGetsFirstReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	first := p.WaitReceipt(final("c-1"))

	p.Command("device-1", command("c-2", "op-1", sim.ActionRestart, nil))
	rs := p.WaitReceipts(2, final("c-1"))
	require.Equal(t, first.Receipt, rs[1].Receipt, "carries the command_id that ran, same seq")
	require.Empty(t, p.Receipts(testenv.ForCommand("c-2")))
	require.Empty(t, executions(t, b.dir, "c-2"))
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	_, known := b.dev("device-1").LatestReceipt("c-2")
	require.False(t, known)
}

func TestExpiredCommandIsRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	c := command("c-1", "op-1", sim.ActionRestart, nil)
	c.ExpiresAt = time.Now().Add(-time.Second)
	p.Command("device-1", c)
	r := p.WaitReceipt(final("c-1"))
	require.Equal(t, []any{wire.ReceiptRejected, 1, sim.ErrExpired}, []any{r.Status, r.Seq, r.Error})
	require.Empty(t, executions(t, b.dir, "c-1"))

	// Nothing ran, so the operation is free: a new command of it runs.
	p.Command("device-1", command("c-2", "op-1", sim.ActionRestart, nil))
	r = p.WaitReceipt(final("c-2"))
	require.Equal(t, wire.ReceiptSucceeded, r.Status)
	require.Len(t, executions(t, b.dir, "c-2"), 1)
	require.Equal(t, int64(1), b.dev("device-1").Stats().Expired)
}

func TestDedupeComesBeforeExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	d := b.dev("device-1")
	c := command("c-1", "op-1", sim.ActionRestart, nil)
	p.Command("device-1", c)
	first := p.WaitReceipt(final("c-1"))

	// Move the device's clock past the command's expiry.
	require.NoError(t, d.SetFaults(sim.Faults{ClockSkew: sim.Duration(2 * time.Hour)}))
	p.Command("device-1", c)
	rs := p.WaitReceipts(2, final("c-1"))
	require.Equal(t, first.Receipt, rs[1].Receipt, "the repeat of an executed, since expired command gets its receipt")
	// Another command of the same operation: the same.
	p.Command("device-1", command("c-2", "op-1", sim.ActionRestart, nil))
	rs = p.WaitReceipts(3, final("c-1"))
	require.Equal(t, first.Receipt, rs[2].Receipt)
	// A new command with the same expiry is expired by the device's clock.
	p.Command("device-1", command("c-3", "op-3", sim.ActionRestart, nil))
	r := p.WaitReceipt(final("c-3"))
	require.Equal(t, sim.ErrExpired, r.Error)
	require.Len(t, executions(t, b.dir, ""), 0)
	all, err := witness.ReadExecutions(b.dir)
	require.NoError(t, err)
	require.Len(t, all, 1)
}

func TestQueryAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	ran := p.WaitReceipt(final("c-1"))

	// Known command_id: its latest receipt with the query_id.
	p.Query("device-1", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: "op-1"})
	r := p.WaitReceipt(testenv.ForQuery("q-1"))
	want := ran.Receipt
	want.QueryID = "q-1"
	require.Equal(t, want, r.Receipt)

	// Another command of the same operation: the one that ran.
	p.Query("device-1", wire.Query{QueryID: "q-2", CommandID: "c-9", OperationID: "op-1"})
	r = p.WaitReceipt(testenv.ForQuery("q-2"))
	want.QueryID = "q-2"
	require.Equal(t, want, r.Receipt)

	// Never seen: unknown, seq 0.
	p.Query("device-1", wire.Query{QueryID: "q-3", CommandID: "c-x", OperationID: "op-x"})
	r = p.WaitReceipt(testenv.ForQuery("q-3"))
	require.Equal(t, []any{"c-x", "op-x", wire.ReceiptUnknown, 0}, []any{r.CommandID, r.OperationID, r.Status, r.Seq})
	require.NoError(t, r.Validate())

	// The final answers are witnessed with their query_id; unknown is not.
	eventually(t, "query answers witnessed", func() bool {
		n := 0
		for _, w := range witnessedReceipts(t, b.dir, "c-1") {
			if w.QueryID != "" {
				n++
			}
		}
		return n == 2
	})
	require.Empty(t, witnessedReceipts(t, b.dir, "c-x"))
}

func TestPresenceSessionsAcrossReconnectsRestartsAndStop(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	d := b.dev("device-1")

	birth1 := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online })
	require.NotNil(t, birth1.Capabilities)
	require.Equal(t, wire.Capabilities{Dedupe: true, Query: true}, *birth1.Capabilities)
	require.NotNil(t, birth1.At)
	s1 := birth1.Session
	require.Equal(t, s1, testenv.RetainedPresence(t, b.broker.URL(), root, "device-1")["device-1"].Session)

	// Abrupt drop: the broker publishes the LWT with the same session.
	d.DropConnection(0)
	lwt := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.Session == s1 })
	require.Nil(t, lwt.At, "an LWT is fixed at connect: no at")
	require.False(t, d.Online())
	ret := testenv.RetainedPresence(t, b.broker.URL(), root, "device-1")["device-1"]
	require.Equal(t, wire.Presence{Online: false, Session: s1}, ret)

	d.Reconnect()
	birth2 := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session > s1 })
	waitOnline(t, d)

	// Crash and restart: LWT of the old session, birth of a larger one.
	require.NoError(t, d.Restart())
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.Session == birth2.Session })
	birth3 := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session > birth2.Session })
	waitOnline(t, d)
	require.Equal(t, birth3.Session, d.Session())
	require.Equal(t, birth3.Rank(), testenv.RetainedPresence(t, b.broker.URL(), root, "device-1")["device-1"].Rank())

	// Clean stop: the device's own offline presence, retained.
	b.fleet.Stop()
	off := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.Session == birth3.Session })
	require.NotNil(t, off.At, "the device's own offline presence carries at")
	ret = testenv.RetainedPresence(t, b.broker.URL(), root, "device-1")["device-1"]
	require.False(t, ret.Online)
	require.Equal(t, birth3.Session, ret.Session)

	// Sessions only grow, across process restarts too.
	b.startFleet(t)
	birth4 := p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session > birth3.Session })
	require.Greater(t, birth4.Rank(), off.Rank())
	for i, pr := range p.Presences("device-1") {
		if i > 0 && !pr.Retained {
			require.GreaterOrEqual(t, pr.Session, p.Presences("device-1")[i-1].Session)
		}
	}
}

func TestCrashRestartKeepsDurableState(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.probe
	d := b.dev("device-1")
	p.Command("device-1", command("c-1", "op-1", sim.ActionSetConfig, map[string]any{"mode": "eco"}))
	ran := p.WaitReceipt(final("c-1"))
	boots := d.Boots()

	require.NoError(t, d.Restart())
	waitOnline(t, d)
	require.Equal(t, boots+1, d.Boots())
	cfg, _ := json.Marshal(d.Config())
	require.JSONEq(t, `{"mode":"eco"}`, string(cfg))

	p.Command("device-1", command("c-1", "op-1", sim.ActionSetConfig, map[string]any{"mode": "eco"}))
	p.Command("device-1", command("c-2", "op-1", sim.ActionSetConfig, map[string]any{"mode": "eco"}))
	rs := p.WaitReceipts(3, final("c-1"))
	require.Equal(t, ran.Receipt, rs[1].Receipt)
	require.Equal(t, ran.Receipt, rs[2].Receipt)
	require.Len(t, executions(t, b.dir, "c-1"), 1)
	require.Empty(t, executions(t, b.dir, "c-2"))

	// Crash, stay down, come back: the same.
	d.Crash()
	require.False(t, d.Running())
	p.Command("device-1", command("c-1", "op-1", sim.ActionSetConfig, map[string]any{"mode": "eco"}))
	require.NoError(t, d.Restart())
	rs = p.WaitReceipts(4, final("c-1"))
	require.Equal(t, ran.Receipt, rs[3].Receipt, "the command queued at the broker while down is answered from the record")
	require.Len(t, executions(t, b.dir, "c-1"), 1)
}

func TestCleanStopInterruptsSlowExecution(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *sim.Config) {
		c.Faults.Defaults.SlowExecution = sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(time.Minute)}
	})
	p := b.probe
	p.Command("device-1", command("c-1", "op-1", sim.ActionRestart, nil))
	p.WaitReceipt(func(r testenv.ProbeReceipt) bool { return r.CommandID == "c-1" && r.Status == wire.ReceiptExecuting })
	b.fleet.Stop()
	r := p.WaitReceipt(final("c-1"))
	require.Equal(t, []any{wire.ReceiptFailed, 3, sim.ErrInterrupted}, []any{r.Status, r.Seq, r.Error})
	require.Empty(t, executions(t, b.dir, "c-1"))
	require.Len(t, witnessedReceipts(t, b.dir, "c-1"), 1)
	p.WaitPresence("device-1", func(pr testenv.ProbePresence) bool { return !pr.Online && pr.At != nil })
}

// A broker restart drops every connection: the devices come back with new
// sessions and their dedupe record intact.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *sim.Config) { c.Devices = 3 })
	p := b.probe
	p.Command("device-2", command("c-1", "op-1", sim.ActionRestart, nil))
	ran := p.WaitReceipt(final("c-1"))
	sessions := map[string]int64{}
	for _, d := range b.fleet.Devices() {
		sessions[d.ID()] = d.Session()
	}

	b.broker.Restart(true)
	for _, d := range b.fleet.Devices() {
		p.WaitPresence(d.ID(), func(pr testenv.ProbePresence) bool { return pr.Online && pr.Session > sessions[d.ID()] })
		waitOnline(t, d)
	}
	p.Command("device-2", command("c-1", "op-1", sim.ActionRestart, nil))
	require.Equal(t, ran.Receipt, p.WaitReceipts(2, final("c-1"))[1].Receipt)
	require.Len(t, executions(t, b.dir, "c-1"), 1)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
