package device_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

func statuses(rs []testenv.ProbeReceipt) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(string(r.Status))
		b.WriteByte('/')
		b.WriteString(string(rune('0' + r.Seq)))
		b.WriteByte(' ')
	}
	return strings.TrimSpace(b.String())
}

// A command runs once: received, executing, succeeded with the handler's
// result, seq 1 to 3, carrying its command_id and operation_id.
func TestCommandRunsOnceWithOrderedReceipts(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	start(t, e.options("dev-1", &runs))
	cmd := command("")
	e.probe.Command("dev-1", cmd)
	f := e.final(cmd.CommandID)
	assert.Equal(t, "received/1 executing/2 succeeded/3", statuses(e.receipts(cmd.CommandID)))
	assert.Equal(t, cmd.OperationID, f.OperationID)
	assert.JSONEq(t, `{"restarted":true,"runs":1}`, string(f.Result))
	assert.EqualValues(t, 1, runs.Load())
}

// A repeat of the command_id (attempt 2), and a new command_id of the same
// operation_id, are answered with the latest receipt of the one that ran,
// unchanged, and nothing runs again.
func TestRepeatsAnsweredFromTheRecord(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	start(t, e.options("dev-1", &runs))
	cmd := command("")
	e.probe.Command("dev-1", cmd)
	first := e.final(cmd.CommandID)

	again := cmd
	again.Attempt = 2
	e.probe.Command("dev-1", again)
	other := command(cmd.OperationID)
	e.probe.Command("dev-1", other)
	e.barrier(t, "dev-1")

	rs := e.receipts(cmd.CommandID)
	require.Len(t, rs, 5, statuses(rs)) // the three of the run, then two answers
	for _, r := range rs[3:] {
		assert.Equal(t, first.Receipt.CommandID, r.CommandID, "the answer carries the command that ran")
		assert.Equal(t, wire.ReceiptSucceeded, r.Status)
		assert.Equal(t, 3, r.Seq)
		assert.Equal(t, string(first.Result), string(r.Result))
		assert.True(t, first.At.Equal(r.At), "the latest receipt, unchanged")
	}
	assert.Empty(t, e.receipts(other.CommandID), "nothing about the new command_id: it did not run")
	assert.EqualValues(t, 1, runs.Load())
}

// A new command past its expires_at is rejected "expired" (seq 1) and does
// not run; a repeat of an executed command past its expiry still gets its
// latest receipt (the dedupe check comes first).
func TestExpiry(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	clk := &clock{}
	o := e.options("dev-1", &runs)
	o.Clock = clk.now
	start(t, o)

	old := command("")
	old.ExpiresAt = time.Now().Add(-time.Second)
	e.probe.Command("dev-1", old)
	f := e.final(old.CommandID)
	assert.Equal(t, wire.ReceiptRejected, f.Status)
	assert.Equal(t, device.ErrorExpired, f.Error)
	assert.Equal(t, 1, f.Seq)
	assert.Zero(t, runs.Load())

	ran := command("")
	e.probe.Command("dev-1", ran)
	e.final(ran.CommandID)
	clk.advance(2 * time.Minute) // past ran's expires_at, by the device's clock
	again := ran
	again.Attempt = 2
	e.probe.Command("dev-1", again)
	e.probe.WaitReceipts(4, testenv.ForCommand(ran.CommandID))
	e.barrier(t, "dev-1")
	rs := e.receipts(ran.CommandID)
	require.Len(t, rs, 4, statuses(rs))
	assert.Equal(t, wire.ReceiptSucceeded, rs[3].Status, "not rejected/expired")
	assert.Equal(t, 3, rs[3].Seq)
	assert.EqualValues(t, 1, runs.Load())
}

// Queries: a known command gets its latest receipt, an unseen command_id of
// an operation that ran gets the receipt of the one that ran (its
// command_id), an unknown one "unknown" seq 0; each with the query_id.
func TestQueries(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	start(t, e.options("dev-1", &runs))
	cmd := command("")
	e.probe.Command("dev-1", cmd)
	e.final(cmd.CommandID)

	e.probe.Query("dev-1", wire.Query{QueryID: "q-known", CommandID: cmd.CommandID, OperationID: cmd.OperationID})
	e.probe.Query("dev-1", wire.Query{QueryID: "q-byop", CommandID: "c-unseen", OperationID: cmd.OperationID})
	e.probe.Query("dev-1", wire.Query{QueryID: "q-unknown", CommandID: "c-never", OperationID: "op-never"})
	known := e.probe.WaitReceipt(testenv.ForQuery("q-known"))
	byop := e.probe.WaitReceipt(testenv.ForQuery("q-byop"))
	unknown := e.probe.WaitReceipt(testenv.ForQuery("q-unknown"))

	for _, r := range []testenv.ProbeReceipt{known, byop} {
		assert.Equal(t, cmd.CommandID, r.CommandID)
		assert.Equal(t, wire.ReceiptSucceeded, r.Status)
		assert.Equal(t, 3, r.Seq)
	}
	assert.Equal(t, wire.ReceiptUnknown, unknown.Status)
	assert.Equal(t, 0, unknown.Seq)
	assert.Equal(t, "c-never", unknown.CommandID)
	assert.Equal(t, "op-never", unknown.OperationID)
}

// Presence: a retained birth with a session that grows across runs, a
// clean offline presence of the same session before a clean disconnect,
// and after a crash the broker's last will carrying the same session.
func TestPresenceSessionsBirthAndWill(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	o := e.options("dev-1", &runs)

	r := start(t, o)
	birth := e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return p.Online })
	require.EqualValues(t, 1, birth.Session)
	require.NotNil(t, birth.Capabilities)
	assert.Equal(t, wire.Capabilities{Dedupe: true, Query: true}, *birth.Capabilities)
	require.NoError(t, r.halt(t))
	off := e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return !p.Online && p.Session == 1 })
	assert.NotNil(t, off.At, "the device's own offline message carries at")
	assert.Equal(t, wire.Presence{Online: false, Session: 1, At: off.At}, testenv.RetainedPresence(t, e.broker.URL(), root, "dev-1")["dev-1"])

	r = start(t, o)
	e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return p.Online && p.Session == 2 })
	ret := testenv.RetainedPresence(t, e.broker.URL(), root, "dev-1")["dev-1"]
	assert.True(t, ret.Online)
	assert.EqualValues(t, 2, ret.Session)

	r.kill(t)
	will := e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return !p.Online && p.Session == 2 })
	assert.Nil(t, will.At, "the last will, from the broker")

	r = start(t, o)
	e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return p.Online && p.Session == 3 })
	// A dropped connection: the broker publishes the will, and the device
	// comes back at once with a new session.
	r.d.DropConnection()
	e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return !p.Online && p.Session == 3 })
	e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return p.Online && p.Session == 4 })
}

// Receipts leave in the order they were emitted, across a reconnect too: a
// command's final receipt, emitted while the new connection is online but
// before the receipts that waited for it are flushed, queues behind them.
// The connection drops once "received" is recorded; the device stays away
// until "received" and "executing" wait for it; the action ends from inside
// Hooks.Online, that is before the flush. The broker's redelivery of the
// command (its PUBACK went with the connection) is dropped, so that no
// answer to a repeat joins the receipts.
func TestReceiptsWaitingForAReconnectLeaveBeforeLaterOnes(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	o := e.options("dev-1", &runs)
	var (
		d        *device.Device
		dropped  atomic.Bool
		commands atomic.Int64
		gate     = make(chan struct{}) // closed: the device may reconnect
		release  = make(chan struct{}) // closed: the action may end
		emitted  = make(chan device.Receipt, 8)
		finalOut = make(chan struct{})
	)
	o.Actions["restart"] = func(ctx context.Context, _ *device.Command) (any, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return map[string]bool{"restarted": true}, nil
	}
	o.Hooks = &device.Hooks{
		Command: func(device.Command) bool { return commands.Add(1) > 1 },
		Point: func(p device.Point, _ device.Command) {
			if p == device.PointReceived && dropped.CompareAndSwap(false, true) {
				d.DropConnection()
			}
		},
		Connect: func(done <-chan struct{}) bool {
			if !dropped.Load() {
				return true
			}
			select {
			case <-gate:
				return true
			case <-done:
				return false
			}
		},
		Receipt: func(r device.Receipt, send func(device.Receipt)) {
			send(r)
			emitted <- r
			if r.Status == device.Succeeded {
				close(finalOut)
			}
		},
		Online: func(session int64) {
			if session != 2 {
				return
			}
			close(release)
			select {
			case <-finalOut:
			case <-time.After(10 * time.Second):
				t.Error("the final receipt was not emitted")
			}
		},
	}
	r := start(t, o)
	d = r.d

	cmd := command("")
	e.probe.Command("dev-1", cmd)
	e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return !p.Online && p.Session == 1 })
	for _, want := range []device.Status{device.Received, device.Executing} {
		select {
		case got := <-emitted:
			require.Equal(t, want, got.Status, "emitted while offline")
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s receipt emitted", want)
		}
	}
	close(gate)
	e.probe.WaitReceipts(3, func(p testenv.ProbeReceipt) bool { return p.CommandID == cmd.CommandID })
	assert.Equal(t, "received/1 executing/2 succeeded/3", statuses(e.receipts(cmd.CommandID)))
}

// TestExample runs Example's device against a test broker: online, a
// command answered, a clean stop.
func TestExample(t *testing.T) {
	e := newEnv(t)
	d, err := device.New(device.Options{
		ID:       "pump-17",
		Broker:   e.broker.URL(),
		StateDir: e.dir,
		Actions: map[string]device.Handler{
			"restart": func(ctx context.Context, cmd *device.Command) (any, error) {
				return map[string]any{"restarted": true}, nil
			},
		},
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	e.probe.WaitPresence("pump-17", func(p testenv.ProbePresence) bool { return p.Online })
	cmd := command("")
	e.probe.Command("pump-17", cmd)
	f := e.final(cmd.CommandID)
	assert.JSONEq(t, `{"restarted":true}`, string(f.Result))
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	e.probe.WaitPresence("pump-17", func(p testenv.ProbePresence) bool { return !p.Online && p.At != nil })
}

// A broker URL the device cannot dial is refused by New, naming the
// schemes it can.
func TestNewRefusesOtherBrokerSchemes(t *testing.T) {
	opts := func(broker string) device.Options {
		return device.Options{ID: "dev-1", Broker: broker, StateDir: t.TempDir(), Actions: map[string]device.Handler{
			"restart": func(context.Context, *device.Command) (any, error) { return nil, nil }}}
	}
	_, err := device.New(opts("ws://127.0.0.1:1"))
	require.ErrorContains(t, err, `scheme "ws": want tcp://, mqtt://, ssl://, tls://, mqtts:// or tcps://`)
	for _, ok := range []string{"tcp", "mqtt", "ssl", "tls", "mqtts", "tcps"} {
		_, err := device.New(opts(ok + "://127.0.0.1:1"))
		require.NoError(t, err, ok)
	}
}
