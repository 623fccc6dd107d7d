package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
)

func TestSubmitToSucceeded(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be})
		op, status, err := b.client.Submit(b.ctx(), req("task-1", "device-1"), "")
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, "task-1:restart:device-1:v1", op.OperationID)
		require.Equal(t, "started", op.Status)
		require.NotEmpty(t, op.CommandID)
		require.Len(t, op.RequestHash, 64)

		start := time.Now()
		done, err := b.client.Operation(b.ctx(), op.OperationID, 30*time.Second)
		require.NoError(t, err)
		waited := time.Since(start)
		require.Equal(t, "succeeded", done.Status)
		require.Less(t, waited, 10*time.Second, "?wait= returns as soon as the operation is done")
		var result map[string]any
		require.NoError(t, json.Unmarshal(done.Result, &result))
		require.Equal(t, true, result["restarted"], "the device's result is copied: %s", done.Result)

		cmd, err := b.client.Command(b.ctx(), op.CommandID)
		require.NoError(t, err)
		require.Equal(t, "succeeded", cmd.Status)
		var statuses []string
		for _, r := range cmd.Receipts {
			require.Equal(t, "applied", r.Effect)
			statuses = append(statuses, r.Status)
		}
		require.Equal(t, []string{"received", "executing", "succeeded"}, statuses)
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())

		// The same POST again: 200, the stored record, nothing runs again.
		again, status, err := b.client.Submit(b.ctx(), req("task-1", "device-1"), "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, op.CommandID, again.CommandID)
		require.Equal(t, "succeeded", again.Status)
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
		require.GreaterOrEqual(t, b.metric(`controller_receipts_total{effect="applied"}`), 3.0)
		require.GreaterOrEqual(t, b.metric(`controller_publishes_total{kind="command"}`), 1.0)
	})
}

func TestConcurrentSubmitsOfOneOperation(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be})
		const n = 100
		type answer struct {
			op     apiwire.Operation
			status int
			err    error
		}
		answers := make([]answer, n)
		var wg sync.WaitGroup
		startGate := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-startGate
				c := client.New(b.ctl.URL, "")
				op, status, err := c.Submit(b.ctx(), req("task-100", "device-2"), "")
				answers[i] = answer{op, status, err}
			}()
		}
		close(startGate)
		wg.Wait()
		created := 0
		for _, a := range answers {
			require.NoError(t, a.err)
			require.Equal(t, "task-100:restart:device-2:v1", a.op.OperationID)
			require.Equal(t, answers[0].op.CommandID, a.op.CommandID, "every caller gets the same command_id")
			if a.status == http.StatusCreated {
				created++
			} else {
				require.Equal(t, http.StatusOK, a.status)
			}
		}
		require.Equal(t, 1, created, "exactly one 201")
		final := b.waitFinal("task-100:restart:device-2:v1")
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, []string{"1"}, b.rows(`SELECT COUNT(*) FROM operations`))
		require.Equal(t, []string{"1"}, b.rows(`SELECT COUNT(*) FROM commands`))
		require.Equal(t, map[string]int{"task-100:restart:device-2:v1": 1}, b.executions())
		b.verify()
	})
}

func TestKeyReusedWithOtherParams(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	op, _, err := b.client.Submit(b.ctx(), req("task-2", "device-1"), "")
	require.NoError(t, err)
	b.waitFinal(op.OperationID)
	before := append(b.rows(`SELECT * FROM operations`), b.rows(`SELECT * FROM commands`)...)

	other := req("task-2", "device-1")
	other.Params = []byte(`{"reason":"something else"}`)
	_, status, err := b.client.Submit(b.ctx(), other, "")
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "idempotency_key_reused", client.Code(err))

	// Key order and number spelling are not other params.
	same := req("task-2", "device-1")
	same.Params = []byte(`{ "reason" : "stuck" }`)
	_, status, err = b.client.Submit(b.ctx(), same, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)

	after := append(b.rows(`SELECT * FROM operations`), b.rows(`SELECT * FROM commands`)...)
	require.Equal(t, before, after, "rows identical before and after the reused key")
	require.Equal(t, 1, b.executions()[op.OperationID])
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	post := func(body string, header map[string]string) (int, string) {
		r, _ := http.NewRequest(http.MethodPost, b.ctl.URL+"/v1/operations", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			r.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		var e apiwire.Error
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		require.NotEmpty(t, e.Message)
		return resp.StatusCode, e.Code
	}
	good := `{"task_id":"t","step":"s","target":"device-1","business_version":"v1","action":"restart"}`
	cases := []struct {
		name, body string
		header     map[string]string
		status     int
		code       string
	}{
		{"malformed JSON", `{"task_id":`, nil, 400, "invalid_json"},
		{"unknown field", `{"operation_id":"a","target":"device-1","action":"restart","colour":1}`, nil, 400, "invalid_request"},
		{"trailing data", good + `{}`, nil, 400, "invalid_json"},
		{"params not an object", `{"operation_id":"a","target":"device-1","action":"restart","params":[1]}`, nil, 400, "invalid_request"},
		{"colon in a part", `{"task_id":"t:x","step":"s","target":"device-1","business_version":"v1","action":"restart"}`, nil, 400, "invalid_request"},
		{"missing parts", `{"task_id":"t","target":"device-1","action":"restart"}`, nil, 400, "invalid_request"},
		{"no id at all", `{"target":"device-1","action":"restart"}`, nil, 400, "invalid_request"},
		{"bad target", `{"operation_id":"a","target":"controller-x","action":"restart"}`, nil, 400, "invalid_request"},
		{"bad action", `{"operation_id":"a","target":"device-1","action":"re start"}`, nil, 400, "invalid_request"},
		{"id too long", fmt.Sprintf(`{"operation_id":"%s","target":"device-1","action":"restart"}`, strings.Repeat("a", 201)), nil, 400, "invalid_request"},
		{"reserved id", `{"operation_id":"task-88:s:device-1:approval-v3","target":"device-1","action":"restart"}`, nil, 403, "reserved_operation_id"},
		{"reserved by parts", `{"task_id":"t","step":"s","target":"device-1","business_version":"approval-v2","action":"restart"}`, nil, 403, "reserved_operation_id"},
		{"header differs", `{"operation_id":"a","target":"device-1","action":"restart"}`, map[string]string{"Idempotency-Key": "b"}, 400, "idempotency_key_mismatch"},
		{"too large", `{"operation_id":"a","target":"device-1","action":"restart","params":{"x":"` + strings.Repeat("x", 1<<20) + `"}}`, nil, 413, "too_large"},
	}
	for _, c := range cases {
		status, code := post(c.body, c.header)
		require.Equal(t, c.status, status, c.name)
		require.Equal(t, c.code, code, c.name)
		// A retry gets the same answer.
		status, code = post(c.body, c.header)
		require.Equal(t, c.status, status, c.name+" (retry)")
		require.Equal(t, c.code, code, c.name+" (retry)")
	}
	require.Equal(t, []string{"0"}, b.rows(`SELECT COUNT(*) FROM operations`))
	require.Equal(t, []string{"0"}, b.rows(`SELECT COUNT(*) FROM commands`))

	for _, path := range []string{"/v1/operations/nope", "/v1/commands/nope", "/v1/nothing"} {
		resp, err := http.Get(b.ctl.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 404, resp.StatusCode, path)
	}
	for _, w := range []string{"61s", "abc", "-1s"} {
		resp, err := http.Get(b.ctl.URL + "/v1/operations/x?wait=" + w)
		require.NoError(t, err)
		var e apiwire.Error
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode)
		require.Equal(t, "invalid_wait", e.Code)
	}
	// The Idempotency-Key header alone supplies the operation_id.
	status, _ := postOK(t, b.ctl.URL, `{"target":"device-1","action":"restart"}`, "key-1")
	require.Equal(t, 201, status)
	require.Equal(t, "succeeded", b.waitFinal("key-1").Status)
	b.verify()
}

func postOK(t *testing.T, url, body, key string) (int, apiwire.Operation) {
	r, _ := http.NewRequest(http.MethodPost, url+"/v1/operations", bytes.NewReader([]byte(body)))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	var op apiwire.Operation
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&op))
	return resp.StatusCode, op
}

// A raw MQTT client playing a misbehaving device.
func rawClient(t *testing.T, url, id string) mqtt.Client {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID(id).SetAutoReconnect(false))
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func publish(t *testing.T, c mqtt.Client, topic string, payload string) {
	tok := c.Publish(topic, 1, false, payload)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
}

func TestDuplicateStaleUnknownAndMalformedReceipts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	op, _, err := b.client.Submit(b.ctx(), req("task-3", "device-3"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	before, err := b.client.Command(b.ctx(), op.CommandID)
	require.NoError(t, err)
	opBefore := b.rows(`SELECT * FROM operations`)

	raw := rawClient(t, b.broker.URL(), "tester-receipts")
	rcpt := func(status string, seq int, cmdID, opID string) string {
		return fmt.Sprintf(`{"command_id":%q,"operation_id":%q,"status":%q,"seq":%d,"at":"2026-12-02T10:00:00Z","result":{"x":1}}`,
			cmdID, opID, status, seq)
	}
	topic := "fleet/device-3/receipts"
	// A duplicate repeats the device's own result (another result would be a late conflict).
	publish(t, raw, topic, strings.Replace(rcpt("succeeded", 3, op.CommandID, op.OperationID), `{"x":1}`, string(before.Result), 1))
	publish(t, raw, topic, rcpt("executing", 2, op.CommandID, op.OperationID))                  // stale after succeeded
	publish(t, raw, topic, rcpt("succeeded", 1, "c-unknown", op.OperationID))                   // unknown command
	publish(t, raw, "fleet/device-2/receipts", rcpt("failed", 9, op.CommandID, op.OperationID)) // wrong device
	publish(t, raw, topic, `{"command_id":`)                                                    // malformed
	publish(t, raw, topic, `{"command_id":"x","status":"exploded","seq":1}`)                    // invalid status
	eventually(t, "receipts recorded", 10*time.Second, func() bool {
		return b.metric(`controller_receipts_total{effect="malformed"}`) == 2 &&
			b.metric(`controller_receipts_total{effect="unknown_command"}`) == 1 &&
			b.metric(`controller_receipts_total{effect="mismatch"}`) == 1
	})
	eventually(t, "duplicate and stale recorded", 10*time.Second, func() bool {
		c, err := b.client.Command(b.ctx(), op.CommandID)
		return err == nil && len(c.Receipts) == len(before.Receipts)+3
	})
	after, err := b.client.Command(b.ctx(), op.CommandID)
	require.NoError(t, err)
	require.Equal(t, before.Status, after.Status)
	require.Equal(t, string(before.Result), string(after.Result))
	require.Empty(t, after.LateOutcome)
	var effects []string
	for _, r := range after.Receipts[len(before.Receipts):] {
		effects = append(effects, r.Effect)
	}
	require.ElementsMatch(t, []string{"duplicate", "stale", "mismatch"}, effects)
	require.Equal(t, opBefore, b.rows(`SELECT * FROM operations`))
	require.Equal(t, 1.0, b.metric(`controller_receipts_total{effect="duplicate"}`))
	require.Equal(t, 1.0, b.metric(`controller_receipts_total{effect="stale"}`))

	// Still serving.
	op2, _, err := b.client.Submit(b.ctx(), req("task-3b", "device-3"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(op2.OperationID).Status)
	b.verify()
}
