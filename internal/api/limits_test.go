package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
)

type limitsBundle struct {
	srv     *Server
	st      *store.DB
	mu      sync.Mutex
	refused map[string]int
}

// setupLimits serves the API on a real SQLite store, listening (as far as
// the Host rule knows) on listen, with the extra --http-host names.
func setupLimits(t *testing.T, listen string, extra ...string) *limitsBundle {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	svc := ops.New(ops.Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second,
		Policy: func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }})
	hosts, err := NewHostPolicy(listen, extra)
	require.NoError(t, err)
	b := &limitsBundle{st: st, refused: map[string]int{}}
	b.srv = New(Config{Service: svc, Store: st, Instance: "i1", Hosts: hosts,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Refused: func(reason string) { b.mu.Lock(); b.refused[reason]++; b.mu.Unlock() }})
	return b
}

type call struct {
	method, path, body string
	header             map[string]string
}

// do sends one request as a local client would (Host 127.0.0.1:8080, a
// JSON body), with c.header replacing or, when "", removing headers.
func (b *limitsBundle) do(t *testing.T, c call) (int, apiwire.Error) {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	r := httptest.NewRequest(c.method, "http://127.0.0.1:8080"+c.path, body)
	if c.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.header {
		if k == "Host" {
			r.Host = v
			continue
		}
		if v == "" {
			r.Header.Del(k)
			continue
		}
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, r)
	var e apiwire.Error
	if rec.Code >= 300 {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), rec.Body.String())
		require.NotEmpty(t, e.Message)
	}
	return rec.Code, e
}

func (b *limitsBundle) counts() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for k, v := range b.refused {
		out[k] = v
	}
	return out
}

func deep(n int) string { return strings.Repeat(`{"a":`, n) + `1` + strings.Repeat(`}`, n) }

// Every body rule answers its status and code, names the field, is counted
// under its reason, and creates nothing.
func TestBodyLimitsNameTheFieldAndChangeNothing(t *testing.T) {
	t.Parallel()
	b := setupLimits(t, "127.0.0.1:8080")
	op := func(extra string) string {
		return `{"operation_id":"op-bad","target":"device-1","action":"restart"` + extra + `}`
	}
	big := strings.Repeat("x", 300<<10)
	cases := []struct {
		name   string
		c      call
		status int
		code   string
		reason string
		msg    string // a part of the message
	}{
		{"malformed", call{"POST", "/v1/operations", `{"target":`, nil}, 400, "invalid_json", "invalid_json", "not JSON"},
		{"empty", call{"POST", "/v1/operations", ` `, nil}, 400, "invalid_json", "invalid_json", "empty"},
		{"trailing", call{"POST", "/v1/operations", op(``) + `[]`, nil}, 400, "invalid_json", "invalid_json", "trailing data"},
		{"unknown field", call{"POST", "/v1/operations", op(`,"colour":1`), nil}, 400, "invalid_request", "unknown_field", `unknown field "colour"`},
		{"a field's name in another case", call{"POST", "/v1/operations", op(`,"Target":"device-2"`), nil}, 400, "invalid_request", "unknown_field", `unknown field "Target"`},
		{"another case, escaped", call{"POST", "/v1/operations", op(`,"T\u0061RGET":"device-2"`), nil}, 400, "invalid_request", "unknown_field", `unknown field "TaRGET"`},
		{"another case, nested", call{"POST", "/v1/tasks", `{"task_id":"t1","steps":[{"step":"s","action":"a","target":"device-1","Params":{}}]}`, nil}, 400, "invalid_request", "unknown_field", `unknown field "Params"`},
		{"another case, folded beyond ASCII", call{"POST", "/v1/tasks", `{"task_id":"t1","ſteps":[]}`, nil}, 400, "invalid_request", "unknown_field", `unknown field "ſteps"`},
		{"unknown nested field", call{"POST", "/v1/tasks", `{"task_id":"t1","steps":[{"step":"s","action":"a","target":"device-1","oops":1}]}`, nil}, 400, "invalid_request", "unknown_field", `unknown field "oops"`},
		{"wrong type", call{"POST", "/v1/operations", `{"operation_id":"op-bad","target":7,"action":"restart"}`, nil}, 400, "invalid_request", "wrong_type", "target: want a string, got number"},
		{"wrong type nested", call{"POST", "/v1/tasks", `{"task_id":"t1","steps":[{"step":["s"],"action":"a","target":"device-1"}]}`, nil}, 400, "invalid_request", "wrong_type", "steps.step: want a string, got array"},
		{"not an object", call{"POST", "/v1/operations", `["a"]`, nil}, 400, "invalid_request", "wrong_type", "want an object, got array"},
		{"bad time", call{"POST", "/v1/tasks", `{"task_id":"t1","execute_after":"tomorrow","steps":[]}`, nil}, 400, "invalid_request", "wrong_type", "execute_after: want an RFC 3339 time"},
		{"fraction for an int", call{"POST", "/v1/tasks/t1/approvals", `{"version":2.5}`, nil}, 400, "invalid_request", "bad_number", "version: the number 2.5 does not fit an integer"},
		{"int overflow", call{"POST", "/v1/tasks/t1/approvals", `{"version":1e30}`, nil}, 400, "invalid_request", "bad_number", "version"},
		{"unsafe integer in params", call{"POST", "/v1/operations", op(`,"params":{"n":9007199254740993}`), nil}, 400, "invalid_request", "bad_number", "params.n"},
		{"no double holds it", call{"POST", "/v1/operations", op(`,"params":{"n":[1e999]}`), nil}, 400, "invalid_request", "bad_number", "params.n[0]"},
		{"duplicate key", call{"POST", "/v1/operations", op(`,"params":{"a":1,"a":2}`), nil}, 400, "invalid_request", "duplicate_key", "params.a: appears twice"},
		{"too deep", call{"POST", "/v1/operations", op(`,"params":` + deep(40)), nil}, 400, "invalid_request", "too_deep", "nested deeper than 32"},
		{"deep in a plan", call{"PUT", "/v1/tasks/t1/plan", `{"steps":[{"step":"s","action":"a","target":"device-1","params":` + deep(35) + `}]}`, nil}, 400, "invalid_request", "too_deep", "steps[0].params.a"},
		{"params too large", call{"POST", "/v1/operations", op(`,"params":{"x":"` + big + `"}`), nil}, 413, "too_large", "too_large", "params: 307208 bytes, over the limit of 262144"},
		{"step params too large", call{"POST", "/v1/tasks", `{"task_id":"t1","steps":[{"step":"s","action":"a","target":"device-1","params":{"x":"` + big + `"}}]}`, nil}, 413, "too_large", "too_large", "steps[0].params"},
		{"compensation params too large", call{"POST", "/v1/operations/op-1/compensations", `{"action":"a","business_version":"v2","params":{"x":"` + big + `"}}`, nil}, 413, "too_large", "too_large", "params"},
		{"body too large", call{"POST", "/v1/operations", op(`,"params":{"x":"` + strings.Repeat("x", 1<<20) + `"}`), nil}, 413, "too_large", "too_large", "1 MiB"},
		{"bad operation_id", call{"POST", "/v1/operations", `{"operation_id":"a b","target":"device-1","action":"restart"}`, nil}, 400, "invalid_request", "bad_id", `operation_id "a b"`},
		{"operation_id too long", call{"POST", "/v1/operations", `{"operation_id":"` + strings.Repeat("a", 201) + `","target":"device-1","action":"restart"}`, nil}, 400, "invalid_request", "bad_id", "operation_id"},
		{"bad Idempotency-Key", call{"POST", "/v1/operations", `{"target":"device-1","action":"restart"}`, map[string]string{"Idempotency-Key": "k\u00e9y"}}, 400, "invalid_request", "bad_id", "Idempotency-Key"},
		{"colon in a part", call{"POST", "/v1/operations", `{"task_id":"t:1","step":"s","business_version":"v1","target":"device-1","action":"restart"}`, nil}, 400, "invalid_request", "bad_id", "task_id"},
		{"bad target", call{"POST", "/v1/operations", `{"operation_id":"op-bad","target":"controller-1","action":"restart"}`, nil}, 400, "invalid_request", "bad_id", "target"},
		{"bad action", call{"POST", "/v1/operations", `{"operation_id":"op-bad","target":"device-1","action":"re/start"}`, nil}, 400, "invalid_request", "bad_id", "action"},
		{"bad task_id", call{"POST", "/v1/tasks", `{"task_id":"t/1","steps":[{"step":"s","action":"a","target":"device-1"}]}`, nil}, 400, "invalid_request", "bad_id", "task_id"},
		{"bad step target", call{"POST", "/v1/tasks", `{"task_id":"t1","steps":[{"step":"s","action":"a","target":"a b"}]}`, nil}, 400, "invalid_plan", "bad_id", "steps[0].target"},
		{"bad path operation id", call{"GET", "/v1/operations/a%20b", ``, nil}, 400, "invalid_request", "bad_id", `id "a b"`},
		{"bad path device id", call{"POST", "/v1/devices/controller-9/presence/reset", ``, nil}, 400, "invalid_request", "bad_id", "id"},
		{"bad path task id", call{"POST", "/v1/tasks/t:1/rejections", `{"reason":"no"}`, nil}, 400, "invalid_request", "bad_id", "id"},
		{"bad path command id", call{"POST", "/v1/commands/c%0A1/resolve", `{"outcome":"failed"}`, nil}, 400, "invalid_request", "bad_id", "id"},
		{"bad business_version", call{"POST", "/v1/operations/op-1/compensations", `{"action":"a","business_version":"v:2"}`, nil}, 400, "invalid_request", "bad_id", "business_version"},
		{"cancel with a body field", call{"POST", "/v1/commands/c-1/cancel", `{"force":true}`, nil}, 400, "invalid_request", "unknown_field", `unknown field "force"`},
		{"grant wrong type", call{"POST", "/v1/grants", `{"principal":"a","action":"restart","devices":["d"]}`, nil}, 400, "invalid_request", "wrong_type", "devices"},
		{"resolve outcome", call{"POST", "/v1/commands/c-1/resolve", `{"outcome":"maybe"}`, nil}, 400, "invalid_request", "invalid_value", "outcome"},
	}
	want := map[string]int{}
	for _, c := range cases {
		status, e := b.do(t, c.c)
		require.Equal(t, c.status, status, "%s: %+v", c.name, e)
		require.Equal(t, c.code, e.Code, "%s: %+v", c.name, e)
		require.Contains(t, e.Message, c.msg, c.name)
		require.Less(t, len(e.Message), 2000, c.name)
		want[c.reason]++
		require.Equal(t, want, b.counts(), c.name)
	}
	for _, id := range []string{"op-bad", "t:1:device-1:v1"} {
		_, err := b.st.GetOperation(context.Background(), id)
		require.ErrorIs(t, err, domain.ErrNotFound)
	}
	_, err := b.st.GetTask(context.Background(), "t1")
	require.ErrorIs(t, err, domain.ErrNotFound)

	// A good submit after all that: created, nothing counted.
	status, e := b.do(t, call{"POST", "/v1/operations", `{"operation_id":"op-ok","target":"device-1","action":"restart","params":{"n":9007199254740991,"x":[[1]],"more":"fields are fine in params"}}`, nil})
	require.Equal(t, http.StatusCreated, status, "%+v", e)
	require.Equal(t, want, b.counts())
}

func TestBrowserRules(t *testing.T) {
	t.Parallel()
	b := setupLimits(t, "127.0.0.1:8080", "ctl.example.com", "proxy.example:9443")
	good := `{"operation_id":"op-%d","target":"device-1","action":"restart"}`
	n := 0
	submit := func(h map[string]string) (int, apiwire.Error) {
		n++
		return b.do(t, call{"POST", "/v1/operations", fmt.Sprintf(good, n), h})
	}
	cases := []struct {
		name   string
		header map[string]string
		status int
		code   string
	}{
		{"text/plain", map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, 415, "unsupported_media_type"},
		{"a form", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"multipart", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"},
		{"no type", map[string]string{"Content-Type": ""}, 415, "unsupported_media_type"},
		{"another charset", map[string]string{"Content-Type": "application/json; charset=latin1"}, 415, "unsupported_media_type"},
		{"json-ish", map[string]string{"Content-Type": "application/json-patch+json"}, 415, "unsupported_media_type"},
		{"a foreign origin", map[string]string{"Origin": "http://evil.example"}, 403, "forbidden_origin"},
		{"the null origin", map[string]string{"Origin": "null"}, 403, "forbidden_origin"},
		{"our host on another port", map[string]string{"Origin": "http://127.0.0.1:9999"}, 403, "forbidden_origin"},
		{"another scheme", map[string]string{"Origin": "file://127.0.0.1:8080"}, 403, "forbidden_origin"},
		{"a foreign host", map[string]string{"Host": "evil.example:8080"}, 421, "misdirected_request"},
		{"rebinding to our port", map[string]string{"Host": "rebind.evil.example:8080", "Origin": ""}, 421, "misdirected_request"},
		{"another loopback address", map[string]string{"Host": "127.0.0.2:8080"}, 421, "misdirected_request"},
		{"a named host on another port", map[string]string{"Host": "proxy.example:443"}, 421, "misdirected_request"},
		{"a foreign host and origin", map[string]string{"Host": "evil.example", "Origin": "http://evil.example"}, 421, "misdirected_request"},
		{"no host", map[string]string{"Host": ""}, 421, "misdirected_request"},
	}
	counted := map[string]int{}
	for _, c := range cases {
		status, e := submit(c.header)
		require.Equal(t, c.status, status, "%s: %+v", c.name, e)
		require.Equal(t, c.code, e.Code, c.name)
		counted[map[int]string{415: "unsupported_media_type", 403: "forbidden_origin", 421: "misdirected_host"}[c.status]]++
	}
	require.Equal(t, counted, b.counts())
	for i := 1; i <= n; i++ {
		_, err := b.st.GetOperation(context.Background(), fmt.Sprintf("op-%d", i))
		require.ErrorIs(t, err, domain.ErrNotFound, "a refused request created op-%d", i)
	}

	for _, h := range []map[string]string{
		nil, // curl-like: no Origin
		{"Content-Type": "application/json; charset=utf-8"},
		{"Content-Type": "Application/JSON"},
		{"Origin": "http://127.0.0.1:8080"},
		{"Host": "localhost:8080", "Origin": "http://localhost:8080"},
		{"Host": "[::1]:8080"},
		{"Host": "ctl.example.com"},                                            // a --http-host name, any port
		{"Host": "CTL.example.com.:8443", "Origin": "https://ctl.example.com"}, // case and a trailing dot
		{"Host": "proxy.example:9443", "Origin": "https://proxy.example:9443"},
	} {
		status, e := submit(h)
		require.Equal(t, http.StatusCreated, status, "%v: %+v", h, e)
	}
	require.Equal(t, counted, b.counts(), "nothing more counted")

	// Reads: no body, so no type needed; a foreign Host is still refused,
	// but for /healthz and /metrics; a foreign Origin everywhere.
	for _, c := range []struct {
		path   string
		header map[string]string
		status int
	}{
		{"/v1/operations/op-17", nil, 200},
		{"/v1/operations/op-17", map[string]string{"Content-Type": "text/plain"}, 200},
		{"/v1/devices", map[string]string{"Host": "evil.example:8080"}, 421},
		{"/v1/nothing", map[string]string{"Host": "evil.example:8080"}, 421},
		{"/healthz", map[string]string{"Host": "scraper-target.internal:8080"}, 200},
		{"/healthz", map[string]string{"Origin": "http://evil.example"}, 403},
	} {
		status, _ := b.do(t, call{"GET", c.path, "", c.header})
		require.Equal(t, c.status, status, "%s %v", c.path, c.header)
	}
	// A bodyless POST that names a form type is refused too (an empty form).
	status, e := b.do(t, call{"POST", "/v1/commands/c-1/cancel", "", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	require.Equal(t, 415, status, "%+v", e)
}

func TestHostPolicyOfListeners(t *testing.T) {
	t.Parallel()
	cases := []struct {
		listen string
		ok, no []string
	}{
		{"127.0.0.1:8080", []string{"127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST:8080"}, []string{"127.0.0.1:8081", "10.0.0.1:8080", "evil:8080", "127.0.0.1"}},
		{"localhost:80", []string{"localhost", "127.0.0.1", "localhost:80"}, []string{"evil", "localhost:8080"}},
		{"0.0.0.0:8080", []string{"10.1.2.3:8080", "[fe80::1]:8080", "localhost:8080"}, []string{"myhost:8080", "10.1.2.3:9090"}},
		{":8080", []string{"192.168.1.4:8080"}, []string{"rebind.example:8080"}},
		{"10.0.0.5:8080", []string{"10.0.0.5:8080"}, []string{"10.0.0.6:8080", "localhost:8080"}},
	}
	for _, c := range cases {
		p, err := NewHostPolicy(c.listen, nil)
		require.NoError(t, err)
		for _, h := range c.ok {
			require.True(t, p.allows(h, "80"), "%s should answer to %s", c.listen, h)
		}
		for _, h := range c.no {
			require.False(t, p.allows(h, "80"), "%s should not answer to %s", c.listen, h)
		}
	}
	for _, bad := range []string{"a/b", "user@host", ":8080", "host:"} {
		_, err := NewHostPolicy("127.0.0.1:8080", []string{bad})
		require.Error(t, err, bad)
	}
}
