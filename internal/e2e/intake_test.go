package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// Device accounts that join the shared-subscription group the controllers
// once used for receipts, and others like it, take nothing away from the
// controllers: two instances on PostgreSQL, on the secure profile, with
// six intruders subscribed to $share/controllers/fleet/+/receipts (and
// other groups), finish 20 operations over four devices in their normal
// time, every receipt applied by one instance, without a single query.
// With the controllers in a broker-side shared group, the broker gave each
// intruder its share of the receipts and dropped them (it may not read
// them): 12 of 20 operations needed a query, and with the ack timeout
// longer than here they stayed sent for minutes.
func TestIntrudersInASharedGroupTakeNoReceipts(t *testing.T) {
	t.Parallel()
	requireMosquittoClients(t)
	intruders := []string{"intruder-1", "intruder-2", "intruder-3", "intruder-4", "intruder-5", "intruder-6"}
	// An ack timeout far above an operation's normal time: a query is then
	// asked only about a receipt that never came, not about one a loaded
	// machine delayed past a second.
	const ack = "10s"
	b := setup(t, setupOpts{backend: "postgres", devices: 4, secure: true, controllers: []string{"i2"}, accounts: intruders,
		args: []string{"--ack-timeout", ack}})
	i2 := testenv.StartController(t, testenv.ControllerOpts{DB: b.db, MQTT: b.broker.URL(), InstanceID: "i2",
		Args: []string{"--ack-timeout", ack, "--sweep-interval", "100ms",
			"--mqtt-password-file", creds.PasswordFile(b.creds, "i2"), "--mqtt-ca", b.broker.TLS.CA}})
	instances := []*client.Client{b.client, client.New(i2.URL, "")}
	urls := []string{b.ctl.URL, i2.URL}
	for k, user := range intruders {
		group := "$share/controllers/fleet/+/receipts"
		if k%3 == 2 {
			group = "$share/g" + user + "/fleet/+/receipts"
		}
		mosquittoSub(t, b.mosqArgs(user, "-q", "1", "-t", group)...)
	}
	// Each instance's probe came back, and its pass after the connect (which
	// asks about every open command: a query by design) is behind it.
	for _, u := range urls {
		eventually(t, "the receipt subscription probe came back", 20*time.Second, func() bool {
			return metricAt(t, u, "controller_receipt_subscription_ok") == 1
		})
		eventually(t, "the reconcile after the connect ran", 20*time.Second, func() bool {
			return metricAt(t, u, "controller_reconciles_total") >= 1
		})
	}

	// The instances divide the receipts between them before the first
	// operation: a division that changes while a device's receipts are in
	// flight lets the new owner apply a later receipt before the former
	// one applied an earlier one (then stale), and this test counts each
	// receipt applied once (red once on a loaded machine without this).
	// i1 logs the change when it sees i2; i2, started second, sees both
	// from its first view (and applies every receipt until it has one).
	eventually(t, "i1 divides the receipts with i2", 20*time.Second, func() bool {
		return strings.Contains(b.ctl.Output(), `msg="receipts divided among new membership" instances="[i1 i2]"`)
	})

	const ops = 20
	start := time.Now()
	var wg sync.WaitGroup
	final := make([]apiwire.Operation, ops)
	took := make([]time.Duration, ops)
	for i := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := instances[i%2]
			op, _, err := c.Submit(b.ctx(), req(fmt.Sprintf("shared-%02d", i), fmt.Sprintf("device-%d", i%4+1)), "")
			if !assertNoErr(t, err) {
				return
			}
			for time.Since(start) < 45*time.Second {
				got, err := c.Operation(b.ctx(), op.OperationID, 10*time.Second)
				if err == nil && got.Status != "started" {
					final[i], took[i] = got, time.Since(start)
					return
				}
			}
		}()
	}
	wg.Wait()
	slowest := time.Duration(0)
	for i, op := range final {
		require.Equal(t, "succeeded", op.Status, "operation %d", i)
		slowest = max(slowest, took[i])
	}
	var queries, applied, forPeers float64
	for _, u := range urls {
		queries += metricAt(t, u, `controller_publishes_total{kind="query"}`)
		applied += metricAt(t, u, `controller_receipts_total{effect="applied"}`)
		forPeers += metricAt(t, u, "controller_receipts_for_peers_total")
	}
	t.Logf("%d operations through 2 instances with %d intruders in shared groups: all succeeded within %s; "+
		"%g queries, %g receipts applied, %g left to the other instance", ops, len(intruders), slowest.Round(time.Millisecond),
		queries, applied, forPeers)
	require.Zero(t, queries, "no outcome needed a query")
	for _, u := range urls {
		require.Zero(t, metricAt(t, u, `controller_inputs_refused_total{reason="bad_id",source="receipts"}`),
			"the other instance's probe is no refused message")
	}
	require.EqualValues(t, 3*ops, applied, "each receipt (received, executing, succeeded) applied once")
	require.Positive(t, forPeers, "the instances divide the receipts")
	require.Less(t, slowest, 10*time.Second, "every operation ends in its normal time, before any ack timeout")
	b.verify()
}

// assertNoErr reports err to t from any goroutine.
func assertNoErr(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("%v", err)
		return false
	}
	return true
}

// A controller whose receipt subscription delivers nothing says so at
// start, loudly: here the broker's ACL lets the controller connect and
// command, but not read receipts.
func TestReceiptSubscriptionThatDeliversNothingIsNoticed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := creds.Write(creds.Options{Dir: dir, Devices: []string{"device-1"}, Controllers: []string{"i1"}})
	require.NoError(t, err)
	// The controller's account loses its read right on the receipts.
	aclPath := filepath.Join(dir, creds.ACLFile)
	acl, err := os.ReadFile(aclPath)
	require.NoError(t, err)
	require.Contains(t, string(acl), "topic read fleet/+/receipts\n")
	require.NoError(t, os.WriteFile(aclPath, []byte(strings.Replace(string(acl), "topic read fleet/+/receipts\n", "", 1)), 0o600))
	broker := testenv.StartSecureBroker(t, dir)
	ctl := testenv.StartController(t, testenv.ControllerOpts{DB: filepath.Join(t.TempDir(), "c.db"), MQTT: broker.URL(),
		Args: []string{"--mqtt-password-file", creds.PasswordFile(dir, "i1"), "--mqtt-ca", broker.TLS.CA}})
	eventually(t, "the controller says its receipt subscription delivers nothing", 20*time.Second, func() bool {
		return strings.Contains(ctl.Output(), "RECEIPT SUBSCRIPTION DELIVERS NOTHING")
	})
	require.Zero(t, metricAt(t, ctl.URL, "controller_receipt_subscription_ok"))
}

// The limits fit together: a set-config of 70 KB of params succeeds (the
// device's result is a summary, not the merged config), and so does a
// small one after it; every final receipt is reflected (invariant 4). A
// device that breaks the result limit anyway has its status applied, its
// result replaced by a marker, and the refusal counted. Before, the 70 KB
// set-config ran on the device, its receipts and every query answer were
// refused as too_large, the command timed out, and every later set-config
// to that device was lost the same way.
func TestLargeSetConfigAndOversizedReceipts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 2})
	big := map[string]string{}
	for i := range 7 {
		big[fmt.Sprintf("blob-%d", i)] = strings.Repeat("x", 10_000)
	}
	params, err := json.Marshal(big)
	require.NoError(t, err)
	require.Greater(t, len(params), 70_000)
	for i, p := range []json.RawMessage{params, json.RawMessage(`{"k":1}`), params, json.RawMessage(`{"k":2}`)} {
		r := apiwire.SubmitRequest{TaskID: fmt.Sprintf("cfg-%d", i), Step: "set", Target: "device-1", BusinessVersion: "v1",
			Action: "set-config", Params: p}
		op, status, err := b.client.Submit(b.ctx(), r, "")
		require.NoError(t, err)
		require.Equal(t, 201, status)
		final := b.waitFinal(op.OperationID)
		require.Equal(t, "succeeded", final.Status, "set-config %d (%d bytes of params)", i, len(p))
		require.Less(t, len(final.Result), 1024, "the result is a summary: %s", final.Result)
	}
	require.Zero(t, b.metric(`controller_inputs_refused_total{reason="too_large",source="receipts"}`))

	// A device that breaks the result limit.
	raw := rawClient(t, b.broker.URL(), "raw-1")
	publish(t, raw, "fleet/raw-1/presence", `{"online":true,"session":1,"capabilities":{"dedupe":true,"query":true}}`)
	b.waitDevice("raw-1", true)
	op, _, err := b.client.Submit(b.ctx(), req("oversized", "raw-1"), "")
	require.NoError(t, err)
	huge := fmt.Sprintf(`{"command_id":%q,"operation_id":%q,"status":"succeeded","seq":1,"result":{"dump":%q}}`,
		op.CommandID, op.OperationID, strings.Repeat("y", 100_000))
	publish(t, raw, "fleet/raw-1/receipts", huge)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status, "the status of an oversized receipt is not lost")
	require.Contains(t, string(final.Result), `"result_too_large"`)
	require.EqualValues(t, 1, b.metric(`controller_inputs_refused_total{reason="result_too_large",source="receipts"}`))
	b.verify()
}

// A device that reconnects in a burst (41 presence messages in a few
// milliseconds, the last a birth of session 21) is shown online at session
// 21 as soon as its presence rate allows, not offline at an older session
// for as long as it stays connected: presence over the rate is coalesced
// (the highest rank kept), never dropped. Before, the messages past the
// burst of 20 were dropped and the device stayed offline at session 10.
func TestFlappingDeviceIsShownAtItsLatestSession(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1})
	raw := rawClient(t, b.broker.URL(), "flap-1")
	birth := func(s int) string {
		return fmt.Sprintf(`{"online":true,"session":%d,"capabilities":{"dedupe":true,"query":true}}`, s)
	}
	for s := 1; s <= 20; s++ {
		publish(t, raw, "fleet/flap-1/presence", birth(s))
		publish(t, raw, "fleet/flap-1/presence", fmt.Sprintf(`{"online":false,"session":%d}`, s))
	}
	publish(t, raw, "fleet/flap-1/presence", birth(21))
	sent := time.Now()
	var d apiwire.DeviceDetail
	eventually(t, "flap-1 online at session 21", 10*time.Second, func() bool {
		d, _ = b.client.Device(b.ctx(), "flap-1")
		return d.Online && d.Session == 21
	})
	t.Logf("41 presence messages: flap-1 online at session 21 %s after the last, %g coalesced, %g refused",
		time.Since(sent).Round(time.Millisecond), b.metric(`controller_presence_total{effect="coalesced"}`),
		b.metric(`controller_inputs_refused_total{reason="rate_limited",source="presence"}`))
	require.Less(t, time.Since(sent), 3*time.Second, "within a second of the rate allowing (5/s after a burst of 20)")
	require.Zero(t, b.metric(`controller_inputs_refused_total{reason="rate_limited",source="presence"}`))
	require.Positive(t, b.metric(`controller_presence_total{effect="coalesced"}`))
}
