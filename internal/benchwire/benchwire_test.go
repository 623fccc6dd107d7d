package benchwire_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fleetctl/fleetctl/internal/benchwire"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// paho leaves a goroutine behind for up to its reconnect back-off when a
// client is disconnected while reconnecting; it ends by itself.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).reconnect"),
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*connectionStatus).Disconnecting"))
}

// A memory device speaks the protocol as a simulated device does: a
// retained birth with capabilities, three receipts per command with seq
// 1..3, the latest receipt again for a repeat and for a query, "unknown"
// for a command it never saw, and a retained offline presence at stop.
func TestMemoryFleetSpeaksTheWireProtocol(t *testing.T) {
	t.Parallel()
	const root, n = "bw", 3
	b := testenv.StartBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fleet, err := benchwire.StartMemoryFleet(ctx, b.URL(), root, n)
	require.NoError(t, err)
	defer fleet.Stop()
	require.Equal(t, []string{"device-1", "device-2", "device-3"}, fleet.IDs())

	births := testenv.RetainedPresence(t, b.URL(), root, fleet.IDs()...)
	for _, id := range fleet.IDs() {
		require.True(t, births[id].Online, id)
		require.Equal(t, &wire.Capabilities{Dedupe: true, Query: true}, births[id].Capabilities, id)
		require.NotNil(t, births[id].At, id)
	}

	probe := testenv.NewProbe(t, b.URL(), root)
	cmd := wire.Command{CommandID: "c-1", OperationID: "t:restart:device-2:v1", Action: benchwire.ActionRestart,
		Params: json.RawMessage(`{}`), IssuedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Minute).UTC(), Attempt: 1}
	probe.Command("device-2", cmd)
	got := probe.WaitReceipts(3, testenv.ForCommand("c-1"))
	for i, want := range []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting, wire.ReceiptSucceeded} {
		require.Equal(t, "device-2", got[i].Device)
		require.Equal(t, want, got[i].Status)
		require.Equal(t, i+1, got[i].Seq)
		require.Equal(t, cmd.OperationID, got[i].OperationID)
		require.NoError(t, got[i].Validate())
		require.False(t, got[i].At.IsZero())
	}
	require.JSONEq(t, `{"restarted":true,"boots":1}`, string(got[2].Result))

	// The same operation under a new command_id: answered, not run again.
	again := cmd
	again.CommandID = "c-2"
	probe.Command("device-2", again)
	dup := probe.WaitReceipts(4, testenv.ForCommand("c-1"))[3]
	require.Equal(t, wire.ReceiptSucceeded, dup.Status)
	require.Equal(t, 3, dup.Seq)

	probe.Query("device-2", wire.Query{QueryID: "q-1", CommandID: "c-1", OperationID: cmd.OperationID})
	qa := probe.WaitReceipt(testenv.ForQuery("q-1"))
	require.Equal(t, wire.ReceiptSucceeded, qa.Status)
	probe.Query("device-2", wire.Query{QueryID: "q-2", CommandID: "c-none", OperationID: "none"})
	require.Equal(t, wire.ReceiptUnknown, probe.WaitReceipt(testenv.ForQuery("q-2")).Status)

	expired := cmd
	expired.CommandID, expired.OperationID, expired.ExpiresAt = "c-3", "t:restart:device-1:v1", time.Now().Add(-time.Second).UTC()
	probe.Command("device-1", expired)
	rej := probe.WaitReceipt(testenv.ForCommand("c-3"))
	require.Equal(t, wire.ReceiptRejected, rej.Status)
	require.Equal(t, "expired", rej.Error)

	fleet.Stop()
	gone := testenv.RetainedPresence(t, b.URL(), root, fleet.IDs()...)
	for _, id := range fleet.IDs() {
		require.False(t, gone[id].Online, id)
		require.Equal(t, births[id].Session, gone[id].Session, id)
	}
	s := fleet.Stats()
	require.Equal(t, int64(3), s.Commands)
	require.Equal(t, int64(1), s.Duplicates)
	require.Equal(t, int64(0), s.PublishErrors)
}

// The Commander gets each command's succeeded receipt back, concurrently
// and to every device, and a set-config's result carries the config.
func TestCommanderRoundTrips(t *testing.T) {
	t.Parallel()
	const root, n = "bc", 4
	b := testenv.StartBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fleet, err := benchwire.StartMemoryFleet(ctx, b.URL(), root, n)
	require.NoError(t, err)
	defer fleet.Stop()
	c, err := benchwire.DialCommander(ctx, b.URL(), root, "bench-test")
	require.NoError(t, err)
	defer c.Close()

	errs := make(chan error, 40)
	for k := range 40 {
		go func() {
			dev := benchwire.DeviceID(k%n + 1)
			_, err := c.Do(ctx, dev, fmt.Sprintf("t-%d:restart:%s:v1", k, dev), benchwire.ActionRestart, nil)
			errs <- err
		}()
	}
	for range 40 {
		require.NoError(t, <-errs)
	}
	r, err := c.Do(ctx, "device-1", "t-x:set-config:device-1:v1", benchwire.ActionSetConfig, json.RawMessage(`{"fw":"4.2"}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"config":{"fw":"4.2"},"previous":{}}`, string(r.Result))
	_, err = c.Do(ctx, "device-1", "t-y:reboot:device-1:v1", "reboot", nil)
	require.ErrorIs(t, err, benchwire.ErrNotSucceeded)
	require.Equal(t, int64(42*3-2), c.Stats().Receipts)
}
