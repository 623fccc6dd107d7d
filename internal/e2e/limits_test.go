package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// refusedCounts reads every sample of controller_inputs_refused_total from
// the controller's /metrics, by (source, reason).
func (b *bundle) refusedCounts() map[[2]string]int {
	b.t.Helper()
	return refusedAt(b.t, b.ctl.URL)
}

// refusedAt is refusedCounts of the controller at url.
func refusedAt(t testing.TB, url string) map[[2]string]int {
	t.Helper()
	out := map[[2]string]int{}
	for _, m := range scrape(t, url)["controller_inputs_refused_total"].GetMetric() {
		l := labelsOf(m)
		out[[2]string{l["source"], l["reason"]}] = int(valueOf(m))
	}
	return out
}

// controllerPID finds the controller process of b by its --http address.
func (b *bundle) controllerPID() int {
	b.t.Helper()
	listen := strings.TrimPrefix(b.ctl.URL, "http://")
	dirs, err := os.ReadDir("/proc")
	require.NoError(b.t, err)
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(raw), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "--http" && args[i+1] == listen && len(args) > 1 && args[1] == "serve" {
				return pid
			}
		}
	}
	b.t.Fatalf("no controller process serving %s", listen)
	return 0
}

// procStatus reads one field of /proc/PID/status, in kB.
func procStatus(t testing.TB, pid int, field string) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			require.NoError(t, err, line)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// hostile is one request that the controller must refuse.
type hostile struct {
	name         string
	method, path string
	body         string
	header       map[string]string // "Host" sets the Host; "" deletes a header
	status       int
	code, reason string
	// mayReset: a body refused before it is read may meet a closed
	// connection while the client still writes it; the refusal is counted
	// all the same.
	mayReset bool
}

// send sends h with a JSON Content-Type unless h says otherwise.
func send(ctx context.Context, hc *http.Client, base string, h hostile) (int, string, error) {
	var body io.Reader
	if h.body != "" {
		body = strings.NewReader(h.body)
	}
	r, err := http.NewRequestWithContext(ctx, h.method, base+h.path, body)
	if err != nil {
		return 0, "", err
	}
	if h.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range h.header {
		switch {
		case k == "Host":
			r.Host = v
		case v == "":
			r.Header.Del(k)
		default:
			r.Header.Set(k, v)
		}
	}
	resp, err := hc.Do(r)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var e apiwire.Error
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &e); err != nil {
		return resp.StatusCode, "", fmt.Errorf("answer %d is not an API error: %q", resp.StatusCode, raw)
	}
	return resp.StatusCode, e.Code, nil
}

func deepJSON(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// hostileRequests builds the refused requests of every route with a body
// (each one change away from a request that would change something), and
// reads with a bad id or a foreign Host, for the controller at port.
func hostileRequests(port, cmdWaiting, grantID string) []hostile {
	type route struct {
		method, path string
		valid        string // a body that would be accepted (and change something), "" for none
		// mutate is the route's own wrong-typed field and bad id, as bodies.
		wrongType, badID string
		params           bool // the body carries params
	}
	routes := []route{
		{"POST", "/v1/operations", `{"operation_id":"hostile-op","target":"device-1","action":"restart","params":{"reason":"x"}}`,
			`{"operation_id":"hostile-op","target":"device-1","action":"restart","params":{"reason":"x"},"task_id":5}`,
			`{"operation_id":"hostile op","target":"device-1","action":"restart"}`, true},
		{"POST", "/v1/operations/base-op/compensations", `{"action":"restart","business_version":"v9","reason":"undo","params":{}}`,
			`{"action":["restart"],"business_version":"v9","reason":"undo"}`,
			`{"action":"restart","business_version":"v:9","reason":"undo"}`, true},
		{"POST", "/v1/commands/" + cmdWaiting + "/cancel", `{}`, `[]`, ``, false},
		{"POST", "/v1/commands/" + cmdWaiting + "/resolve", `{"outcome":"failed","note":"n"}`,
			`{"outcome":"failed","note":{"n":1}}`, ``, false},
		{"POST", "/v1/devices/device-1/presence/reset", `{}`, `"reset"`, ``, false},
		{"POST", "/v1/tasks", `{"task_id":"hostile-task","steps":[{"step":"s1","action":"restart","target":"device-1","params":{}}]}`,
			`{"task_id":"hostile-task","steps":{"step":"s1"}}`,
			`{"task_id":"hostile-task","steps":[{"step":"s1","action":"restart","target":"controller-1","params":{}}]}`, true},
		{"PUT", "/v1/tasks/base-task/plan", `{"steps":[{"step":"s2","action":"restart","target":"device-2","params":{}}]}`,
			`{"steps":[{"step":"s2","action":"restart","target":"device-2","params":{}}],"base_version":"1"}`,
			`{"steps":[{"step":"s 2","action":"restart","target":"device-2","params":{}}]}`, true},
		{"POST", "/v1/tasks/base-task/approvals", `{"version":1}`, `{"version":"1"}`, ``, false},
		{"POST", "/v1/tasks/base-task/rejections", `{"reason":"no"}`, `{"reason":false}`, ``, false},
		{"POST", "/v1/grants", `{"principal":"eve","action":"restart","devices":"device-*"}`,
			`{"principal":"eve","action":"restart","devices":["device-*"]}`, ``, false},
	}
	invalidJSON, invalidReq, tooLarge := "invalid_json", "invalid_request", "too_large"
	var out []hostile
	for _, rt := range routes {
		add := func(name, body string, header map[string]string, status int, code, reason string) {
			out = append(out, hostile{name: rt.method + " " + rt.path + ": " + name, method: rt.method, path: rt.path,
				body: body, header: header, status: status, code: code, reason: reason})
		}
		v := rt.valid
		with := func(member string) string { // v with one more member
			if v == `{}` {
				return `{` + member + `}`
			}
			return v[:len(v)-1] + `,` + member + `}`
		}
		add("bad JSON", v[:len(v)-1], nil, 400, invalidJSON, "invalid_json")
		add("trailing data", v+`{}`, nil, 400, invalidJSON, "invalid_json")
		add("deep JSON", deepJSON(40), nil, 400, invalidReq, "too_deep")
		add("body over 1 MiB", `{"x":"`+strings.Repeat("x", 3<<19)+`"}`, nil, 413, tooLarge, "too_large")
		out[len(out)-1].mayReset = true
		add("unknown field", with(`"zzz":1`), nil, 400, invalidReq, "unknown_field")
		add("duplicate key", with(`"zzz":1,"zzz":2`), nil, 400, invalidReq, "duplicate_key")
		add("number no double holds", with(`"zzz":1e999`), nil, 400, invalidReq, "bad_number")
		add("wrong type", rt.wrongType, nil, 400, invalidReq, "wrong_type")
		if rt.badID != "" {
			code := invalidReq
			if strings.Contains(rt.badID, `"steps"`) {
				code = "invalid_plan" // a step's id, refused as the plan's other rules are
			}
			add("bad id", rt.badID, nil, 400, code, "bad_id")
		}
		if rt.params {
			base := v[:strings.LastIndex(v, `"params":`)]
			tail := `}`
			if strings.HasPrefix(rt.path, "/v1/tasks") {
				tail = `}]}`
			}
			add("params too deep", base+`"params":{"a":`+deepJSON(40)+`}`+tail, nil, 400, invalidReq, "too_deep")
			add("params over 256 KiB", base+`"params":{"x":"`+strings.Repeat("x", 300<<10)+`"}`+tail, nil, 413, tooLarge, "too_large")
			add("unsafe integer in params", base+`"params":{"n":9007199254740993}`+tail, nil, 400, invalidReq, "bad_number")
		}
		add("text/plain", v, map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, 415, "unsupported_media_type", "unsupported_media_type")
		add("a form", v, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type", "unsupported_media_type")
		add("no Content-Type", v, map[string]string{"Content-Type": ""}, 415, "unsupported_media_type", "unsupported_media_type")
		add("foreign Origin", v, map[string]string{"Origin": "http://evil.example"}, 403, "forbidden_origin", "forbidden_origin")
		add("foreign Host", v, map[string]string{"Host": "rebind.evil.example:" + port}, 421, "misdirected_request", "misdirected_host")
	}
	// Reads and the bodyless revoke: bad ids, a foreign Host or Origin.
	for _, p := range []string{"/v1/operations/base%20op", "/v1/commands/c%0A1", "/v1/devices/controller-1", "/v1/tasks/base:task"} {
		out = append(out, hostile{name: "GET " + p, method: "GET", path: p, status: 400, code: invalidReq, reason: "bad_id"})
	}
	for _, p := range []string{"/v1/operations/base-op", "/v1/devices", "/v1/tasks/base-task"} {
		out = append(out,
			hostile{name: "GET " + p + " foreign Host", method: "GET", path: p, header: map[string]string{"Host": "evil.example:" + port},
				status: 421, code: "misdirected_request", reason: "misdirected_host"},
			hostile{name: "GET " + p + " foreign Origin", method: "GET", path: p, header: map[string]string{"Origin": "https://evil.example"},
				status: 403, code: "forbidden_origin", reason: "forbidden_origin"})
	}
	out = append(out,
		hostile{name: "DELETE grant foreign Origin", method: "DELETE", path: "/v1/grants/" + grantID,
			header: map[string]string{"Origin": "null"}, status: 403, code: "forbidden_origin", reason: "forbidden_origin"},
		hostile{name: "DELETE grant foreign Host", method: "DELETE", path: "/v1/grants/" + grantID,
			header: map[string]string{"Host": "evil.example:" + port}, status: 421, code: "misdirected_request", reason: "misdirected_host"},
		hostile{name: "DELETE grant bad id", method: "DELETE", path: "/v1/grants/g%20" + grantID, status: 400, code: invalidReq, reason: "bad_id"},
		hostile{name: "DELETE grant form", method: "DELETE", path: "/v1/grants/" + grantID,
			header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, status: 415, code: "unsupported_media_type", reason: "unsupported_media_type"})
	return out
}

// rawMessage is one hostile MQTT message and the (source, reason) it must
// be refused with ("" source: the controller does not read its topic).
type rawMessage struct {
	topic, payload string
	source, reason string
}

func hostileMessages(devices []string) []rawMessage {
	big := strings.Repeat("x", 100<<10)
	rcpt := func(fields string) string {
		return `{"command_id":"c-hostile","operation_id":"op-hostile","status":"succeeded","seq":1,"at":"2026-01-02T03:04:05Z"` + fields + `}`
	}
	var out []rawMessage
	for _, d := range devices {
		r, p := "fleet/"+d+"/receipts", "fleet/"+d+"/presence"
		out = append(out,
			rawMessage{r, `{"command_id":"c-1",`, "receipts", "invalid_json"},
			rawMessage{r, rcpt(``) + `[]`, "receipts", "invalid_json"},
			rawMessage{r, rcpt(`,"result":{"a":` + deepJSON(40) + `}`), "receipts", "too_deep"},
			rawMessage{r, rcpt(`,"pad":"` + big + `"`), "receipts", "too_large"},
			rawMessage{r, rcpt(`,"status":"failed"`), "receipts", "duplicate_key"},
			rawMessage{r, `{"command_id":"c-1","status":"succeeded","seq":1e30}`, "receipts", "bad_number"},
			rawMessage{r, rcpt(`,"result":{"n":1e999}`), "receipts", "bad_number"},
			rawMessage{r, `{"command_id":7,"status":"succeeded","seq":1}`, "receipts", "wrong_type"},
			rawMessage{r, `{"command_id":"c-1","status":"succeeded","seq":1,"at":"noon"}`, "receipts", "wrong_type"},
			rawMessage{r, rcpt(`,"result":"done"`), "receipts", "wrong_type"},
			rawMessage{r, `{"command_id":"c 1","status":"succeeded","seq":1}`, "receipts", "bad_id"},
			rawMessage{r, `{"command_id":"c-1","status":"exploded","seq":1}`, "receipts", "invalid_value"},
			rawMessage{p, `{"online":true,`, "presence", "invalid_json"},
			rawMessage{p, `{"online":"yes","session":99}`, "presence", "wrong_type"},
			rawMessage{p, `{"online":true,"session":-1}`, "presence", "bad_number"},
			rawMessage{p, `{"online":true,"session":99.5}`, "presence", "bad_number"},
			rawMessage{p, `{"online":true,"session":99,"session":100}`, "presence", "duplicate_key"},
			rawMessage{p, `{"online":true,"session":99,"capabilities":` + deepJSON(40) + `}`, "presence", "too_deep"},
			rawMessage{p, `{"online":true,"session":99,"pad":"` + big + `"}`, "presence", "too_large"},
			// The controller reads neither: the devices ignore garbage.
			rawMessage{"fleet/" + d + "/commands", `{"command_id":`, "", ""},
			rawMessage{"fleet/" + d + "/queries", `not json`, "", ""},
		)
	}
	out = append(out,
		rawMessage{"fleet/controller-x/receipts", `{}`, "receipts", "bad_id"},
		rawMessage{"fleet/../receipts", `{}`, "receipts", "bad_id"},
		rawMessage{"fleet/a b/presence", `{}`, "presence", "bad_id"},
		rawMessage{"fleet/" + strings.Repeat("d", 65) + "/receipts", `{}`, "receipts", "bad_id"},
	)
	return out
}

// publisher publishes QoS 1 messages with at most window unconfirmed.
type publisher struct {
	c      mqtt.Client
	window chan mqtt.Token
	errs   atomic.Int64
	wg     sync.WaitGroup
}

func newPublisher(c mqtt.Client, window int) *publisher {
	p := &publisher{c: c, window: make(chan mqtt.Token, window)}
	return p
}

func (p *publisher) publish(topic string, payload []byte) {
	tok := p.c.Publish(topic, 1, false, payload)
	p.wg.Add(1)
	p.window <- tok
	go func() {
		defer p.wg.Done()
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			p.errs.Add(1)
		}
		<-p.window
	}()
}

// wait waits for every publish and returns how many the broker did not confirm.
func (p *publisher) wait() int64 {
	p.wg.Wait()
	return p.errs.Load()
}

// opsLoad runs ordinary operations in workers, each one after another,
// the next request of a worker from next (false: that worker is done), and
// returns each one's final status and latency (submit to final state).
func (b *bundle) opsLoad(ctx context.Context, workers int, next func(worker, i int) (apiwire.SubmitRequest, bool)) (map[string]string, []time.Duration, error) {
	var mu sync.Mutex
	status := map[string]string{}
	var lat []time.Duration
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				r, ok := next(w, i)
				if !ok {
					return
				}
				start := time.Now()
				op, _, err := b.client.Submit(ctx, r, "")
				if err != nil {
					errc <- fmt.Errorf("submit %s: %w", r.TaskID, err)
					return
				}
				for op.Status == "started" && ctx.Err() == nil {
					if op, err = b.client.Operation(ctx, op.OperationID, 10*time.Second); err != nil {
						errc <- fmt.Errorf("get %s: %w", op.OperationID, err)
						return
					}
				}
				mu.Lock()
				status[op.OperationID] = op.Status
				lat = append(lat, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return status, lat, err
	}
	return status, lat, ctx.Err()
}

// normalLoad runs n operations named prefix-NNN over devices, workers at a time.
func (b *bundle) normalLoad(ctx context.Context, prefix string, n, workers int, devices []string) (map[string]string, []time.Duration, error) {
	var next atomic.Int64
	return b.opsLoad(ctx, workers, func(int, int) (apiwire.SubmitRequest, bool) {
		i := int(next.Add(1)) - 1
		return req(fmt.Sprintf("%s-%03d", prefix, i), devices[i%len(devices)]), i < n
	})
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// At least 1,000 malformed, oversized, wrongly typed, foreign and flooding
// inputs over every topic the controller reads (and the two it does not)
// and every route with a body, while 100 ordinary operations run: every
// ordinary one succeeds, nothing the hostile ones touch changes, the
// controller's memory stays bounded, and /metrics counts each refusal by
// source and reason, exactly.
func TestHostileInputsChangeNothing(t *testing.T) {
	t.Parallel()
	fleet := []string{}
	for i := 1; i <= 10; i++ {
		fleet = append(fleet, fmt.Sprintf("device-%d", i))
	}
	b := setup(t, setupOpts{devices: len(fleet)})
	ctx := b.ctx()
	port := b.ctl.URL[strings.LastIndex(b.ctl.URL, ":")+1:]

	// What the hostile requests are one change away from changing: a
	// succeeded operation, a command waiting for an unseen device, a task
	// waiting for approval, a grant.
	base, _, err := b.client.Submit(ctx, apiwire.SubmitRequest{OperationID: "base-op", Target: "device-1", Action: "restart"}, "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(base.OperationID).Status)
	waiting, _, err := b.client.Submit(ctx, apiwire.SubmitRequest{OperationID: "base-wait", Target: "device-404", Action: "restart"}, "")
	require.NoError(t, err)
	b.waitCommand(waiting.CommandID, "waiting_device")
	_, _, err = b.client.CreateTask(ctx, apiwire.TaskRequest{TaskID: "base-task",
		Steps: []apiwire.Step{{Step: "s1", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`)}}})
	require.NoError(t, err)
	grant, _, err := b.client.CreateGrant(ctx, apiwire.GrantRequest{Principal: "alice", Action: "restart", Devices: "device-*"})
	require.NoError(t, err)

	stable := func() []string {
		var out []string
		for _, q := range []string{
			`SELECT * FROM tasks`, `SELECT * FROM task_versions`, `SELECT * FROM approvals`, `SELECT * FROM task_history`,
			`SELECT * FROM grants`,
			`SELECT operation_id, status, request_hash, attempt, result, reason, command_id FROM operations WHERE operation_id NOT LIKE 'normal-%' ORDER BY operation_id`,
			`SELECT command_id, operation_id, status, attempt, result, reason, late_outcome FROM commands WHERE operation_id NOT LIKE 'normal-%' ORDER BY command_id`,
			`SELECT COUNT(*) FROM receipts WHERE operation_id NOT LIKE 'normal-%'`,
			`SELECT device_id, online, session, presence_rank, dedupe, query, seen, stale_presence, last_stale_session FROM devices ORDER BY device_id`,
		} {
			out = append(out, q)
			out = append(out, b.rows(q)...)
		}
		return out
	}
	before := stable()
	require.Empty(t, b.refusedCounts(), "nothing refused before the test")
	pid := b.controllerPID()
	rssBefore := procStatus(t, pid, "VmRSS")

	requests := hostileRequests(port, waiting.CommandID, grant.GrantID)
	messages := hostileMessages(append(append([]string{}, fleet...), func() []string {
		var fake []string
		for i := 1; i <= 30; i++ {
			fake = append(fake, fmt.Sprintf("hostile-%d", i))
		}
		return fake
	}()...))
	// The requests go round until the ordinary operations are done, at
	// least minRounds and at most maxRounds times, the bodies over 1 MiB in
	// the first round only (they are refused before they are read, and the
	// machine is shared); each one sent is counted in want.
	const minRounds, maxRounds, flood = 3, 6, 2000
	want := map[[2]string]int{}
	for _, m := range messages {
		if m.source != "" {
			want[[2]string{m.source, m.reason}]++
		}
	}

	raw := rawClient(t, b.broker.URL(), "tester-hostile")
	var (
		wg                    sync.WaitGroup
		mu                    sync.Mutex
		failures              []string
		httpSent, mqttSent    atomic.Int64
		resets                atomic.Int64
		normal                map[string]string
		latencies             []time.Duration
		normalErr             error
		floodStart, floodDone time.Time
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	start := time.Now()
	normalDone := make(chan struct{})
	wg.Add(1)
	go func() { // the ordinary work
		defer wg.Done()
		defer close(normalDone)
		normal, latencies, normalErr = b.normalLoad(ctx, "normal", 100, 8, fleet)
	}()
	rounds := 0
	for w := range 4 { // the hostile requests, each round's share in four callers
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 30 * time.Second}
			for round := 0; ; round++ {
				finished := round >= maxRounds
				select {
				case <-normalDone:
					finished = finished || round >= minRounds
				default:
				}
				if finished {
					mu.Lock()
					rounds = max(rounds, round)
					mu.Unlock()
					return
				}
				for i, h := range requests {
					if i%4 != w || h.mayReset && round > 0 {
						continue
					}
					status, code, err := send(ctx, hc, b.ctl.URL, h)
					httpSent.Add(1)
					mu.Lock()
					want[[2]string{"http", h.reason}]++
					mu.Unlock()
					if err != nil && h.mayReset && ctx.Err() == nil {
						resets.Add(1)
						continue
					}
					if err != nil || status != h.status || code != h.code {
						fail("round %d, %s: got %d %s (err %v), want %d %s", round, h.name, status, code, err, h.status, h.code)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the hostile messages, then a flood of malformed receipts from one device
		defer wg.Done()
		p := newPublisher(raw, 50)
		for _, m := range messages {
			p.publish(m.topic, []byte(m.payload))
			mqttSent.Add(1)
		}
		floodStart = time.Now()
		for i := range flood {
			p.publish("fleet/hostile-flood/receipts", []byte(fmt.Sprintf(`{"command_id":"c-flood-%d",`, i)))
			mqttSent.Add(1)
		}
		if n := p.wait(); n > 0 {
			fail("%d publishes the broker did not confirm", n)
		}
		floodDone = time.Now()
	}()
	wg.Wait()
	require.NoError(t, normalErr)
	require.Empty(t, failures, "%d hostile requests answered otherwise:\n%s", len(failures), strings.Join(failures, "\n"))

	// Every ordinary operation succeeded.
	require.Len(t, normal, 100)
	for id, st := range normal {
		require.Equal(t, "succeeded", st, id)
	}

	// Every hostile message is counted once processed: what was refused
	// for its own reason, exactly; the flood's messages as invalid_json
	// (within the device's rate) or rate_limited (the excess).
	var got map[[2]string]int
	eventually(t, "every hostile message counted", 60*time.Second, func() bool {
		got = b.refusedCounts()
		total, wantTotal := 0, flood
		for k, n := range got {
			if k[0] != "http" {
				total += n
			}
		}
		for k, n := range want {
			if k[0] != "http" {
				wantTotal += n
			}
		}
		return total == wantTotal
	})
	counted := time.Now()
	limited := got[[2]string{"receipts", "rate_limited"}]
	admitted := got[[2]string{"receipts", "invalid_json"}] - want[[2]string{"receipts", "invalid_json"}]
	require.Equal(t, flood, limited+admitted)
	maxAdmitted := 100 + int(50*counted.Sub(floodStart).Seconds()) + 1
	require.GreaterOrEqual(t, admitted, 100, "the burst passes")
	require.LessOrEqual(t, admitted, maxAdmitted, "no more than the burst and the rate pass")
	want[[2]string{"receipts", "invalid_json"}] += admitted
	want[[2]string{"receipts", "rate_limited"}] = limited
	require.Equal(t, want, got, "refused inputs by source and reason")

	// Nothing the hostile inputs touched changed.
	require.Equal(t, before, stable())
	require.Equal(t, []string{"0"}, b.rows(`SELECT COUNT(*) FROM receipts WHERE device_id LIKE 'hostile%'`))
	require.Equal(t, []string{"100"}, b.rows(`SELECT COUNT(*) FROM operations WHERE operation_id LIKE 'normal-%'`))
	require.Equal(t, "waiting_device", b.command(waiting.CommandID).Status)
	task, err := b.client.Task(ctx, "base-task")
	require.NoError(t, err)
	require.Equal(t, "waiting_approval", task.Status)
	require.Equal(t, 1, task.Version)
	grants, err := b.client.Grants(ctx, true)
	require.NoError(t, err)
	require.Len(t, grants, 1)
	require.Nil(t, grants[0].RevokedAt)

	rssAfter := procStatus(t, pid, "VmRSS")
	hwm := procStatus(t, pid, "VmHWM")
	require.Less(t, rssAfter-rssBefore, 50<<10, "RSS grew by more than 50 MB")
	sum := func(source string) (n int) {
		for k, v := range got {
			if k[0] == source {
				n += v
			}
		}
		return n
	}
	t.Logf("hostile inputs: %d HTTP requests (%d kinds over every route, up to %d rounds) and %d MQTT messages (%d of them a flood from one device in %s) in %s, beside 100 ordinary operations (p50 %s, p99 %s, max %s): all succeeded",
		httpSent.Load(), len(requests), rounds, mqttSent.Load(), flood, floodDone.Sub(floodStart).Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
		percentile(latencies, 0.5).Round(time.Millisecond), percentile(latencies, 0.99).Round(time.Millisecond), percentile(latencies, 1).Round(time.Millisecond))
	t.Logf("refused: http %d, receipts %d, presence %d; flood: %d passed the rate as invalid_json, %d rate_limited; %d bodies over 1 MiB met a closed connection before their 413",
		sum("http"), sum("receipts"), sum("presence"), admitted, limited, resets.Load())
	keys := make([][2]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		t.Logf("  controller_inputs_refused_total{source=%q,reason=%q} %d", k[0], k[1], got[k])
	}
	t.Logf("controller RSS %d kB before, %d kB after (%+d kB), peak %d kB", rssBefore, rssAfter, rssAfter-rssBefore, hwm)
	b.verify()
}

// One device sending 6,000 receipts at 2,000 a second does not starve ten
// others, each running operations one after another all the while: they
// succeed, each well inside the ack timeout (no receipt of
// theirs lost or throttled), while the flood's excess is dropped and
// counted as rate_limited.
func TestFloodingDeviceDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	var fleet []string
	for i := 1; i <= 10; i++ {
		fleet = append(fleet, fmt.Sprintf("device-%d", i))
	}
	// A long ack timeout: a receipt lost or throttled would show as an
	// operation slower than it.
	b := setup(t, setupOpts{devices: len(fleet), args: []string{"--ack-timeout", "20s"}})
	ctx := b.ctx()

	quiet, quietLat, err := b.normalLoad(ctx, "quiet", 20, 4, fleet)
	require.NoError(t, err)
	require.Len(t, quiet, 20)

	raw := rawClient(t, b.broker.URL(), "tester-flood")
	// A fixed count, not a time: Mosquitto holds at most
	// max_queued_messages (10,000) for the controller beyond its in-flight
	// window, the other devices' receipts included, and drops the rest
	// silently. 6,000 at 2,000/s fits with room for theirs on a machine too
	// busy to keep up, so every flood message can be accounted for.
	const rate, total = 2000, 6000
	var sent atomic.Int64
	floodDone := make(chan int64, 1)
	var flooding atomic.Bool
	flooding.Store(true)
	var floodTook time.Duration // written before floodDone is sent
	floodStart := time.Now()
	go func() {
		defer flooding.Store(false)
		p := newPublisher(raw, 200)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for sent.Load() < total {
			<-tick.C
			// Catch up to rate × elapsed: the ticker's pace, not its count.
			due := min(int64(time.Since(floodStart).Seconds()*rate), total)
			for sent.Load() < due {
				i := sent.Add(1)
				p.publish("fleet/device-flood/receipts", fmt.Appendf(nil,
					`{"command_id":"c-flood-%d","operation_id":"op-flood","status":"succeeded","seq":1,"at":"2026-01-02T03:04:05Z"}`, i))
			}
		}
		unconfirmed := p.wait()
		floodTook = time.Since(floodStart)
		floodDone <- unconfirmed
	}()
	// Each of the ten devices runs operations one after another for as
	// long as the flood lasts (at least ten each).
	loadCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	loadStart := time.Now()
	status, lat, err := b.opsLoad(loadCtx, len(fleet), func(w, i int) (apiwire.SubmitRequest, bool) {
		// Paced at 10 operations a second per device at most (30 receipts,
		// under the limit of 50): on a fast machine back-to-back operations
		// would be throttled by the same limit, and their drops would be
		// counted with the flood's.
		if d := time.Until(loadStart.Add(time.Duration(i) * 100 * time.Millisecond)); d > 0 {
			<-time.After(d) // pacing of the load, not a wait for a condition
		}
		return req(fmt.Sprintf("busy-%d-%03d", w, i), fleet[w]), i < 10 || flooding.Load()
	})
	loadTook := time.Since(loadStart)
	require.Zero(t, <-floodDone, "publishes the broker did not confirm")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(status), 100)
	for id, st := range status {
		require.Equal(t, "succeeded", st, id)
	}
	n, took := int(sent.Load()), floodTook
	require.GreaterOrEqual(t, float64(n)/took.Seconds(), 1000.0, "the flood reached only %.0f/s", float64(n)/took.Seconds())

	// Every flood message is processed: applied (an unknown command, logged)
	// within the rate, or dropped as rate_limited.
	var limited, applied int
	deadline := time.Now().Add(2 * time.Minute)
	for {
		limited = b.refusedCounts()[[2]string{"receipts", "rate_limited"}]
		applied = int(b.metric(`controller_receipts_total{effect="unknown_command"}`))
		if limited+applied == n {
			break
		}
		require.False(t, time.Now().After(deadline), "after 2 min, of %d flood messages %d were rate_limited and %d applied", n, limited, applied)
		<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
	processed := time.Since(floodStart)
	require.Equal(t, []string{strconv.Itoa(applied)}, b.rows(`SELECT COUNT(*) FROM receipts WHERE device_id = 'device-flood'`))
	require.GreaterOrEqual(t, applied, 100)
	require.LessOrEqual(t, applied, 100+int(50*processed.Seconds())+1)
	require.Greater(t, limited, n/2)

	p50, p99, worst := percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1)
	require.Less(t, worst, 10*time.Second, "an operation came near the ack timeout (20 s): its receipts were starved")
	t.Logf("flood: %d receipts from device-flood in %s (%.0f/s): %d applied (the burst of 100 and 50/s), %d rate_limited",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), applied, limited)
	t.Logf("10 other devices, %d operations in %s during the flood, all succeeded: p50 %s, p99 %s, max %s (without the flood, 20 operations: p50 %s, max %s)",
		len(status), loadTook.Round(time.Millisecond), p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond),
		percentile(quietLat, 0.5).Round(time.Millisecond), percentile(quietLat, 1).Round(time.Millisecond))
	b.verify()
}

// The browser rules against the binary: text/plain and form bodies are
// refused (415) and create nothing, a foreign Origin gets 403, a foreign
// Host 421; same-origin and Origin-less requests work, and so do the names
// given in CONTROLLER_HTTP_HOST (--http-host).
func TestBrowserRulesOnTheBinary(t *testing.T) {
	t.Parallel()
	// The names from the environment, comma-separated (the repeated flag is
	// checked in internal/cli).
	b := setup(t, setupOpts{env: []string{"CONTROLLER_HTTP_HOST=ctl.test,ctl2.test:8443"}})
	ctx := b.ctx()
	port := b.ctl.URL[strings.LastIndex(b.ctl.URL, ":")+1:]
	hc := &http.Client{Timeout: 10 * time.Second}
	body := func(id string) string { return `{"operation_id":"` + id + `","target":"device-1","action":"restart"}` }
	type tc struct {
		name   string
		h      hostile
		status int
	}
	post := func(id string, header map[string]string) hostile {
		return hostile{method: "POST", path: "/v1/operations", body: body(id), header: header}
	}
	cases := []tc{
		{"text/plain", post("b-1", map[string]string{"Content-Type": "text/plain"}), 415},
		{"a form", post("b-2", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}), 415},
		{"multipart", post("b-3", map[string]string{"Content-Type": "multipart/form-data; boundary=zz"}), 415},
		{"foreign Origin", post("b-4", map[string]string{"Origin": "http://attacker.test"}), 403},
		{"foreign Origin on a read", hostile{method: "GET", path: "/v1/devices", header: map[string]string{"Origin": "http://attacker.test"}}, 403},
		{"foreign Host", post("b-5", map[string]string{"Host": "attacker.test:" + port}), 421},
		{"foreign Host on a read", hostile{method: "GET", path: "/v1/devices", header: map[string]string{"Host": "attacker.test:" + port}}, 421},
		{"same origin", post("ok-1", map[string]string{"Origin": "http://127.0.0.1:" + port}), 201},
		{"localhost", post("ok-2", map[string]string{"Host": "localhost:" + port, "Origin": "http://localhost:" + port}), 201},
		{"utf-8 charset", post("ok-3", map[string]string{"Content-Type": "application/json; charset=utf-8"}), 201},
		{"--http-host name", post("ok-4", map[string]string{"Host": "ctl.test", "Origin": "https://ctl.test"}), 201},
		{"--http-host name:port", post("ok-5", map[string]string{"Host": "ctl2.test:8443"}), 201},
		{"--http-host name, wrong port", post("b-6", map[string]string{"Host": "ctl2.test:9443"}), 421},
		{"localhost, no Origin", post("ok-6", map[string]string{"Host": "localhost:" + port}), 201},
		{"/metrics for a scraper's name", hostile{method: "GET", path: "/metrics", header: map[string]string{"Host": "controller.monitoring.svc:" + port}}, 200},
	}
	for _, c := range cases {
		var body io.Reader
		if c.h.body != "" {
			body = strings.NewReader(c.h.body)
		}
		r, err := http.NewRequestWithContext(ctx, c.h.method, b.ctl.URL+c.h.path, body)
		require.NoError(t, err)
		if c.h.body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		for k, v := range c.h.header {
			if k == "Host" {
				r.Host = v
			} else {
				r.Header.Set(k, v)
			}
		}
		resp, err := hc.Do(r)
		require.NoError(t, err, c.name)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, "%s: %s", c.name, raw)
	}
	// Nothing refused was created; what was accepted runs.
	require.Equal(t, []string{"0"}, b.rows(`SELECT COUNT(*) FROM operations WHERE operation_id LIKE 'b-%'`))
	for i := 1; i <= 6; i++ {
		require.Equal(t, "succeeded", b.waitFinal(fmt.Sprintf("ok-%d", i)).Status)
	}
	// The CLI and the client (no Origin, JSON bodies) work as before.
	out, err := b.run("op", "submit", "--operation-id", "ok-cli", "--target", "device-2", "--action", "restart", "--wait", "20s")
	require.NoError(t, err, out)
	require.Equal(t, "succeeded", b.waitFinal("ok-cli").Status)
	got := b.refusedCounts()
	require.Equal(t, map[[2]string]int{
		{"http", "unsupported_media_type"}: 3,
		{"http", "forbidden_origin"}:       2,
		{"http", "misdirected_host"}:       3,
	}, got)
	b.verify()
}
