package e2e

// The defects a hostile black-box probe found (issue 11), each reproduced
// against the real binaries.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// handDevice is a device played by the test: it sees every command and
// query the controller sends it, and answers only when told to.
type handDevice struct {
	t        *testing.T
	id       string
	c        mqtt.Client
	commands chan wire.Command
	queries  chan wire.Query
}

func newHandDevice(t *testing.T, b *bundle, id string) *handDevice {
	return newHandDeviceWith(t, b, id, `{"dedupe":true,"query":true}`)
}

// newHandDeviceWith is newHandDevice announcing the given capabilities.
func newHandDeviceWith(t *testing.T, b *bundle, id, capabilities string) *handDevice {
	h := &handDevice{t: t, id: id, c: rawClient(t, b.broker.URL(), id),
		commands: make(chan wire.Command, 100), queries: make(chan wire.Query, 100)}
	sub := func(kind wire.Kind, f func([]byte)) {
		tok := h.c.Subscribe(wire.Topic("fleet", id, kind), 1, func(_ mqtt.Client, m mqtt.Message) { f(m.Payload()) })
		require.True(t, tok.WaitTimeout(5*time.Second))
		require.NoError(t, tok.Error())
	}
	sub(wire.KindCommands, func(p []byte) {
		var c wire.Command
		if json.Unmarshal(p, &c) == nil {
			h.commands <- c
		}
	})
	sub(wire.KindQueries, func(p []byte) {
		var q wire.Query
		if json.Unmarshal(p, &q) == nil {
			h.queries <- q
		}
	})
	tok := h.c.Publish(wire.Topic("fleet", id, wire.KindPresence), 1, true,
		`{"online":true,"session":1,"capabilities":`+capabilities+`}`)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	b.waitDevice(id, true)
	return h
}

func (h *handDevice) nextCommand() wire.Command {
	h.t.Helper()
	select {
	case c := <-h.commands:
		return c
	case <-time.After(30 * time.Second):
		h.t.Fatalf("%s: no command within 30s", h.id)
	}
	return wire.Command{}
}

func (h *handDevice) nextQuery(within time.Duration) (wire.Query, bool) {
	h.t.Helper()
	select {
	case q := <-h.queries:
		return q, true
	case <-time.After(within):
		return wire.Query{}, false
	}
}

func (h *handDevice) receipt(c wire.Command, status string, seq int, queryID string) {
	h.t.Helper()
	r := map[string]any{"command_id": c.CommandID, "operation_id": c.OperationID, "status": status, "seq": seq,
		"at": time.Now().UTC().Format(time.RFC3339Nano)}
	if status == "succeeded" {
		r["result"] = map[string]any{"restarted": true}
	}
	if queryID != "" {
		r["query_id"] = queryID
	}
	payload, _ := json.Marshal(r)
	publish(h.t, h.c, wire.Topic("fleet", h.id, wire.KindReceipts), string(payload))
}

// Item 1: the instance that got the succeeded receipt died before committing
// it (then the PUBACK-before-commit window; since acknowledgements follow
// the commit, TestReceiptUncommittedAtACrashIsDeliveredAgain covers that
// window) and the next ask went unanswered. The asks after a reconnect do
// not use the budget, and a command the device said it is executing is
// asked about again until expires_at, so the finished action is found, not
// reported failed_retryable at the ttl.
func TestFinishedActionFoundAfterAnUnansweredReconnectAsk(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1, args: []string{"--max-attempts", "2", "--ack-timeout", "1s",
		"--command-ttl", "40s", "--sweep-interval", "200ms"}})
	h := newHandDevice(t, b, "hand-1")
	op, _, err := b.client.Submit(b.ctx(), req("task-reask", "hand-1"), "")
	require.NoError(t, err)
	cmd := h.nextCommand()
	h.receipt(cmd, "received", 1, "")
	h.receipt(cmd, "executing", 2, "")
	for i := 0; i < 2; i++ { // the sweeper asks twice; nobody answers
		_, ok := h.nextQuery(20 * time.Second)
		require.True(t, ok, "ask %d", i+1)
	}
	eventually(t, "two asks counted", 10*time.Second, func() bool { return b.command(cmd.CommandID).Queries == 2 })

	for restart := 1; restart <= 2; restart++ { // each reconnect ask is left unanswered
		b.ctl.Kill()
		b.ctl.Restart()
		_, ok := h.nextQuery(20 * time.Second)
		require.True(t, ok, "asked after restart %d", restart)
	}
	q, ok := h.nextQuery(25 * time.Second) // asked again, slowly, before expires_at
	require.True(t, ok, "the executing command is asked about again")
	h.receipt(cmd, "succeeded", 3, q.QueryID)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status)
	c := b.command(cmd.CommandID)
	t.Logf("command %s: %s after %d counted asks (budget 2), reconnect asks not counted", c.CommandID, c.Status, c.Queries)
	b.verify()
}

// Item 1, the burst: 10 devices with dropped, duplicated and slow receipts
// and dropped commands, 300 submissions, 10 kill -9s of the controller in
// a few seconds. Every final receipt a device published is reflected
// (invariant 4) and no operation whose action ran ends failed_retryable.
func TestKill9BurstWithDeviceFaults(t *testing.T) {
	t.Parallel()
	const ops, devices, kills = 300, 10, 10
	profile := sim.Profile{Seed: 42, Defaults: sim.Faults{
		DropReceipt:      sim.ReceiptFault{Trigger: sim.Trigger{P: 0.2}, Statuses: []string{sim.ClassFinal}},
		DuplicateReceipt: sim.ReceiptFault{Trigger: sim.Trigger{P: 0.1}},
		DropCommand:      sim.Trigger{P: 0.05},
		SlowExecution:    sim.ActionFault{Trigger: sim.Trigger{P: 0.5}, Delay: sim.Duration(800 * time.Millisecond)},
	}}
	b := setup(t, setupOpts{devices: devices, faults: profile, args: []string{"--lease-ttl", "2s"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				b.submitUntilAnswered(ctx, req(fmt.Sprintf("burst-%03d", i), fmt.Sprintf("device-%d", i%devices+1)))
			}
		}()
	}
	go func() {
		defer close(work)
		for i := 0; i < ops && ctx.Err() == nil; i++ {
			work <- i
		}
	}()
	rng := rand.New(rand.NewSource(7))
	start := time.Now()
	for k := 0; k < kills; k++ {
		select { // the chaos schedule: kill at random moments
		case <-ctx.Done():
			t.Fatal("timed out during the kills")
		case <-time.After(time.Duration(300+rng.Intn(300)) * time.Millisecond):
		}
		b.ctl.Kill()
		b.ctl.Restart()
	}
	burst := time.Since(start)
	wg.Wait()
	final := map[string]int{}
	for i := 0; i < ops; i++ {
		id := fmt.Sprintf("burst-%03d:restart:device-%d:v1", i, i%devices+1)
		if op, err := b.client.Operation(b.ctx(), id, 20*time.Second); err == nil && op.Status == "started" {
			c := b.command(op.CommandID)
			t.Logf("%s still started: command %s %s attempt %d queries %d next %s expires %s receipts %d", id, c.CommandID, c.Status,
				c.Attempt, c.Queries, c.NextCheckAt.Format(time.RFC3339Nano), c.ExpiresAt.Format(time.RFC3339), len(c.Receipts))
		}
		op := b.waitFinal(id)
		final[op.Status]++
	}
	t.Logf("%d kill -9s in %s during %d submissions over %d devices: final %v", kills, burst.Round(time.Millisecond), ops, devices, final)
	require.Equal(t, ops, final["succeeded"], "every action the devices ran is reported succeeded")
	b.verify()
}

// Item 2: params are never HTML-escaped on the wire, so a body of "<"
// stays its size; a command over --max-command-bytes is refused at submit
// (413) and nothing is stored or published.
func TestLargeParamsKeepTheirSizeAndOversizedCommandsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 2})
	sniff := rawClient(t, b.broker.URL(), "tester-sniff")
	var mu sync.Mutex
	var seen []int
	escaped := 0 // payloads with an HTML escape; asserted on the test goroutine
	tok := sniff.Subscribe("fleet/+/commands", 1, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		seen = append(seen, len(m.Payload()))
		if strings.Contains(string(m.Payload()), `\u003c`) {
			escaped++
		}
		mu.Unlock()
	})
	require.True(t, tok.WaitTimeout(5*time.Second))

	big := apiwire.SubmitRequest{OperationID: "big-1", Target: "device-1", Action: "restart",
		Params: json.RawMessage(`{"s":"` + strings.Repeat("<", 200<<10) + `"}`)}
	op, status, err := b.client.Submit(b.ctx(), big, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status, "a 200 KiB command reaches the device and runs")
	mu.Lock()
	require.Len(t, seen, 1)
	require.Zero(t, escaped, "no HTML escaping on the wire")
	require.Less(t, seen[0], 201<<10, "one byte per '<' on the wire")
	mu.Unlock()

	tooBig := apiwire.SubmitRequest{OperationID: "big-2", Target: "device-1", Action: "restart",
		Params: json.RawMessage(`{"s":"` + strings.Repeat("x", 300<<10) + `"}`)}
	_, status, err = b.client.Submit(b.ctx(), tooBig, "")
	require.Error(t, err)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Contains(t, err.Error(), "too_large")
	_, err = b.client.Operation(b.ctx(), "big-2", 0)
	require.ErrorContains(t, err, "not_found")

	// Ordinary operations go on as fast as ever: no publish loop.
	start := time.Now()
	for i := 0; i < 20; i++ {
		op, _, err := b.client.Submit(b.ctx(), req(fmt.Sprintf("after-big-%d", i), "device-2"), "")
		require.NoError(t, err)
		require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	}
	t.Logf("200 KiB of '<' sent as %d bytes; 20 ordinary operations after it in %s", seen[0], time.Since(start).Round(time.Millisecond))
	require.Equal(t, 0.0, b.metric(`controller_publish_failures_total{kind="command"}`))
}

// Item 3: one retained presence with a huge session poisons the rank; the
// ignored births are visible on the device, and an admin's reset lets the
// next birth apply.
func TestPoisonedPresenceRankIsVisibleAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 2})
	raw := rawClient(t, b.broker.URL(), "tester-forger")
	tok := raw.Publish("fleet/device-2/presence", 1, true, `{"online":false,"session":9007199254740000}`)
	require.True(t, tok.WaitTimeout(5*time.Second))
	b.waitDevice("device-2", false)

	dev := b.fleet.Devices()[1]
	require.Equal(t, "device-2", dev.ID())
	dev.DropConnection(100 * time.Millisecond) // the device reconnects with a new birth: ignored
	eventually(t, "the ignored birth is counted", 30*time.Second, func() bool {
		d, err := b.client.Device(b.ctx(), "device-2")
		return err == nil && d.StalePresence >= 1 && !d.Online
	})
	d, _ := b.client.Device(b.ctx(), "device-2")
	t.Logf("device-2 after the forged rank: online %v, stale_presence %d, last_stale_session %d", d.Online, d.StalePresence, d.LastStaleSession)
	require.Positive(t, d.LastStaleSession)

	out, err := b.run("device", "reset-presence", "device-2")
	require.NoError(t, err, out)
	dev.DropConnection(100 * time.Millisecond)
	b.waitDevice("device-2", true)
	op, _, err := b.client.Submit(b.ctx(), req("after-reset", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
}

// Item 4: C_old times out, the retry asks, the device says unknown, C_new is
// minted; then the device publishes succeeded for C_old. The success the
// controller holds is adopted: the operation succeeds.
func TestLateSuccessOfAnEarlierCommandIsAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1, args: []string{"--command-ttl", "6s", "--max-attempts", "1"}})
	h := newHandDevice(t, b, "hand-2")
	r := req("task-adopt", "hand-2")
	op, _, err := b.client.Submit(b.ctx(), r, "")
	require.NoError(t, err)
	old := h.nextCommand() // never answered
	eventually(t, "failed_retryable at the ttl", 30*time.Second, func() bool {
		o, err := b.client.Operation(b.ctx(), op.OperationID, 0)
		return err == nil && o.Status == "failed_retryable"
	})
	for len(h.queries) > 0 { // the asks before the timeout are not the retry's question
		<-h.queries
	}
	_, status, err := b.client.Submit(b.ctx(), r, "") // the caller's retry
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	for {
		q, ok := h.nextQuery(20 * time.Second)
		require.True(t, ok, "the retry asks about the old command")
		if q.CommandID == old.CommandID {
			publish(t, h.c, "fleet/hand-2/receipts", fmt.Sprintf(`{"command_id":%q,"operation_id":%q,"status":"unknown","seq":0,"query_id":%q}`,
				old.CommandID, old.OperationID, q.QueryID))
			break
		}
	}
	newer := h.nextCommand()
	require.NotEqual(t, old.CommandID, newer.CommandID, "a new command_id after unknown")
	h.receipt(old, "succeeded", 3, "") // the old one ran after all
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status, "the device's success decides the operation")
	require.Equal(t, "succeeded", b.command(old.CommandID).LateOutcome)
}

// Item 7 and 9: values that would change on their way, duplicate keys, ids
// of dots, string results, and the Bearer scheme in lower case.
func TestInputEdges(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.json"),
		[]byte(`[{"token":"t-op","principal":"op","roles":["operator"]}]`), 0o600))
	b := setup(t, setupOpts{devices: 1, token: "t-op", args: []string{"--tokens", filepath.Join(dir, "tokens.json")}})
	post := func(body, auth string) (int, string) {
		rq, _ := http.NewRequest(http.MethodPost, b.ctl.URL+"/v1/operations", strings.NewReader(body))
		rq.Header.Set("Content-Type", "application/json")
		rq.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(rq)
		require.NoError(t, err)
		defer resp.Body.Close()
		var e apiwire.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Code + " " + e.Message
	}
	for _, tc := range []struct{ body, why string }{
		{`{"operation_id":"n-1","target":"device-1","action":"restart","params":{"n":9007199254740993}}`, "beyond 2^53"},
		{`{"operation_id":"n-2","target":"device-1","action":"restart","params":{"n":1` + strings.Repeat("0", 99) + `}}`, "100 digits"},
		{`{"operation_id":"n-3","target":"device-1","target":"device-2","action":"restart"}`, "duplicate top-level key"},
		{`{"operation_id":"n-4","target":"device-1","action":"restart","params":{"a":1,"a":2}}`, "duplicate key in params"},
		{`{"operation_id":"n-5","target":"..","action":"restart"}`, "a device id of dots"},
		{`{"operation_id":"n-6","target":".","action":"restart"}`, "a device id of one dot"},
	} {
		status, msg := post(tc.body, "Bearer t-op")
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", tc.why, msg)
	}
	status, msg := post(`{"operation_id":"n-7","target":"device-1","action":"restart","params":{"n":9007199254740991,"s":"<b>"}}`, "bearer t-op")
	require.Equal(t, http.StatusForbidden, status, "a lower-case scheme authenticates (then no grant): %s", msg)
	require.Contains(t, msg, "permission_denied")
	status, _ = post(`{}`, "Bearer wrong")
	require.Equal(t, http.StatusUnauthorized, status)
	for _, id := range []string{"n-1", "n-2", "n-3", "n-4", "n-5", "n-6", "n-7"} {
		_, err := b.client.Operation(b.ctx(), id, 0)
		require.ErrorContains(t, err, "not_found", "nothing stored for %s", id)
	}
}

// Item 7: the device receives the params as the caller sent them.
func TestDeviceReceivesParamsAsSent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1})
	sniff := rawClient(t, b.broker.URL(), "tester-params")
	got := make(chan string, 4)
	tok := sniff.Subscribe("fleet/device-1/commands", 1, func(_ mqtt.Client, m mqtt.Message) { got <- string(m.Payload()) })
	require.True(t, tok.WaitTimeout(5*time.Second))
	r := apiwire.SubmitRequest{OperationID: "as-sent", Target: "device-1", Action: "restart",
		Params: json.RawMessage(`{"z": "<b>&", "n": 9007199254740991, "f": 1.50}`)}
	op, _, err := b.client.Submit(b.ctx(), r, "")
	require.NoError(t, err)
	select {
	case p := <-got:
		require.Contains(t, p, `"params":{"z":"<b>&","n":9007199254740991,"f":1.50}`)
	case <-time.After(20 * time.Second):
		t.Fatal("no command on the wire")
	}
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
}

// Item 8 and 9: after succeeded, a failed or another result is a late
// conflict, kept; a string result is refused as malformed and changes nothing.
func TestContradictingFinalReceiptsAndStringResults(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1})
	op, _, err := b.client.Submit(b.ctx(), req("task-conflict", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	before := b.command(op.CommandID)
	raw := rawClient(t, b.broker.URL(), "tester-conflict")
	rc := func(status string, seq int, extra string) string {
		return fmt.Sprintf(`{"command_id":%q,"operation_id":%q,"status":%q,"seq":%d,"at":"2026-12-03T10:00:00Z"%s}`,
			op.CommandID, op.OperationID, status, seq, extra)
	}
	publish(t, raw, "fleet/device-1/receipts", rc("succeeded", 9, `,"result":"done"`))
	publish(t, raw, "fleet/device-1/receipts", rc("failed", 4, `,"error":"disk_full"`))
	publish(t, raw, "fleet/device-1/receipts", rc("succeeded", 5, `,"result":{"other":true}`))
	eventually(t, "two late receipts", 10*time.Second, func() bool { return len(b.command(op.CommandID).Receipts) == len(before.Receipts)+2 })
	after := b.command(op.CommandID)
	require.True(t, after.LateConflict)
	require.Equal(t, "succeeded", after.Status)
	for _, r := range after.Receipts[len(before.Receipts):] {
		require.Equal(t, "late", r.Effect, "never filed as a duplicate")
	}
	require.GreaterOrEqual(t, b.metric(`controller_receipts_total{effect="malformed"}`), 1.0, "a string result is malformed")
	final, err := b.client.Operation(b.ctx(), op.OperationID, 0)
	require.NoError(t, err)
	require.Equal(t, "succeeded", final.Status)
	require.NotContains(t, string(final.Result), "done")
}
