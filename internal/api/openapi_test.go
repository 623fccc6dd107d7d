package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/ui"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// oaBundle serves every route (rollouts, events, metrics, the dashboard,
// MCP) on a real SQLite store over a loopback listener, with tokens: alice
// (operator), bob (approver), root (admin); grants and four-eyes on.
type oaBundle struct {
	srv  *Server
	http *httptest.Server
	st   *store.DB
	v    validator.Validator
}

func setupOpenAPI(t *testing.T) *oaBundle {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	caps := wire.Capabilities{Dedupe: true, Query: true}
	for _, d := range []string{"device-1", "device-2"} {
		_, err = st.ApplyPresence(ctx, d, wire.Presence{Online: true, Session: 1, Capabilities: &caps})
		require.NoError(t, err)
	}
	policy := func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }
	svc := ops.New(ops.Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second, Policy: policy, EnforceGrants: true, FourEyes: true})
	ro := rollout.NewService(rollout.Config{Store: st, Ops: svc, Policy: policy, Instance: "i1", LeaseTTL: 10 * time.Second})
	bus := events.New(events.Config{})
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte(`[{"token":"t-alice","principal":"alice","roles":["operator"]},
		{"token":"t-bob","principal":"bob","roles":["approver"]},{"token":"t-root","principal":"root","roles":["admin"]}]`), 0o600))
	auth, err := LoadTokens(tokens)
	require.NoError(t, err)
	srv := New(Config{Service: svc, Store: st, Instance: "i1", Rollouts: ro, Events: bus, Auth: auth,
		Metrics: promhttp.HandlerFor(prometheus.NewRegistry(), promhttp.HandlerOpts{}), UI: ui.Handler(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	hs := httptest.NewServer(srv)
	srv.MountMCP(mcpserver.HTTPHandler(mcpserver.HTTPConfig{API: srv, Addr: func() string { return hs.Listener.Addr().String() },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(func() {
		bus.Close()
		hs.Close()
	})
	b := &oaBundle{srv: srv, http: hs, st: st}
	b.v = b.validator(t)
	return b
}

// document reads GET /v1/openapi.json, without a token.
func (b *oaBundle) document(t *testing.T) []byte {
	t.Helper()
	resp, err := http.Get(b.http.URL + "/v1/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	return body
}

// validator parses the document and validates it against the OpenAPI 3.1
// specification's schema.
func (b *oaBundle) validator(t *testing.T) validator.Validator {
	t.Helper()
	doc, err := libopenapi.NewDocument(b.document(t))
	require.NoError(t, err)
	require.Equal(t, "3.1.0", doc.GetVersion())
	model, err := doc.BuildV3Model()
	require.NoError(t, err, "the document's model (every $ref resolved)")
	require.NotNil(t, model)
	v, errs := validator.NewValidator(doc)
	require.Empty(t, errs)
	ok, verrs := v.ValidateDocument()
	for _, e := range verrs {
		t.Errorf("document: %s: %s (%v)", e.Message, e.Reason, e.SchemaValidationErrors)
	}
	require.True(t, ok, "the document is valid OpenAPI 3.1")
	return v
}

// The document is OpenAPI 3.1, valid against the specification's schema,
// served without a token, and refuses a query parameter like every route.
func TestOpenAPIDocumentIsValid31(t *testing.T) {
	t.Parallel()
	b := setupOpenAPI(t)
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b.document(t), &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)
	require.NotEmpty(t, doc.Paths)

	resp, err := http.Get(b.http.URL + "/v1/openapi.json?x=1")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// A broken document fails the same check: the check can fail.
	broken, err := libopenapi.NewDocument([]byte(`{"openapi":"3.1.0","info":{"title":"x"},"paths":{"/a":{"get":{"responses":{"200":{"content":{}}}}}}}`))
	require.NoError(t, err)
	v, errs := validator.NewValidator(broken)
	require.Empty(t, errs)
	ok, _ := v.ValidateDocument()
	require.False(t, ok, "info without version, a response without description")
}

// documented lists the document's operations as "METHOD /path".
func documented(t *testing.T, raw []byte) []string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	var out []string
	for path, item := range doc.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// The routes the mux serves and the document's operations are the same,
// both ways, but for documentedAhead; and a request to each documented
// operation is routed (not 404 no route, not 405).
func TestOpenAPIMatchesTheRoutesServed(t *testing.T) {
	t.Parallel()
	b := setupOpenAPI(t)
	doc := documented(t, b.document(t))
	var served []string
	for _, p := range b.srv.Routes() {
		method, path, ok := strings.Cut(p, " ")
		switch {
		case p == "/": // the catch-all: 404 no route, 405 with Allow
			continue
		case !ok: // a mount that takes any method (/mcp): the methods documented for it
			var n int
			for _, d := range doc {
				if strings.HasSuffix(d, " "+p) {
					served = append(served, d)
					n++
				}
			}
			require.NotZero(t, n, "%s is served but no method of it is documented", p)
			continue
		}
		served = append(served, method+" "+strings.TrimSuffix(path, "{$}"))
	}
	sort.Strings(served)
	var missing, unserved []string
	for _, s := range served {
		if !slices.Contains(doc, s) {
			missing = append(missing, s)
		}
	}
	for _, d := range doc {
		if !slices.Contains(served, d) {
			unserved = append(unserved, d)
		}
	}
	require.Empty(t, missing, "served but not in the document")
	require.Empty(t, unserved, "documented but not served")

	for _, d := range doc {
		method, path, _ := strings.Cut(d, " ")
		req, err := http.NewRequest(method, b.http.URL+strings.ReplaceAll(path, "{id}", "x-1"), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer t-root")
		if method == http.MethodPost || method == http.MethodPut {
			req.Body = io.NopCloser(strings.NewReader("{}"))
			req.ContentLength = 2
			req.Header.Set("Content-Type", "application/json")
		}
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := noRedirect.Do(req.WithContext(ctx))
		require.NoError(t, err, d)
		var body []byte
		if resp.Header.Get("Content-Type") != "text/event-stream" { // the stream would go on
			body, err = io.ReadAll(resp.Body)
			require.NoError(t, err, d)
		}
		cancel()
		resp.Body.Close()
		routed := !(resp.StatusCode == http.StatusNotFound && strings.Contains(string(body), `"no route`) ||
			resp.StatusCode == http.StatusMethodNotAllowed)
		require.True(t, routed, "%s: %d %s", d, resp.StatusCode, body)
	}
}

// noRedirect answers a redirect as it is.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// oaCall is one request of a run: the request must be valid per the document
// unless invalid says it breaks it on purpose; the answer must have status
// want and validate.
type oaCall struct {
	method, path, token, body string
	header                    map[string]string
	want                      int
	invalid                   bool
}

// do sends c, checking the request and the answer against the document.
func (b *oaBundle) do(t *testing.T, c oaCall) []byte {
	t.Helper()
	build := func() *http.Request {
		var rd io.Reader
		if c.body != "" {
			rd = strings.NewReader(c.body)
		}
		req, err := http.NewRequest(c.method, b.http.URL+c.path, rd)
		require.NoError(t, err)
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		return req
	}
	name := c.method + " " + c.path
	if !c.invalid {
		if ok, errs := b.v.ValidateHttpRequestSync(build()); !ok {
			for _, e := range errs {
				t.Errorf("request %s: %s: %s %v", name, e.Message, e.Reason, e.SchemaValidationErrors)
			}
		}
	}
	req := build()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := noRedirect.Do(req.WithContext(ctx))
	require.NoError(t, err, name)
	defer resp.Body.Close()
	var body []byte
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		// The stream goes on: its first frame (retry:) is enough.
		var buf bytes.Buffer
		for !strings.Contains(buf.String(), "\n\n") {
			chunk := make([]byte, 256)
			n, err := resp.Body.Read(chunk)
			buf.Write(chunk[:n])
			require.NoError(t, err, name)
		}
		body = buf.Bytes()
		cancel()
	} else {
		body, err = io.ReadAll(resp.Body)
		require.NoError(t, err, name)
	}
	if resp.StatusCode != c.want {
		t.Errorf("%s: want %d, got %d %s", name, c.want, resp.StatusCode, body)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if ok, errs := b.v.ValidateHttpResponse(build(), resp); !ok {
		for _, e := range errs {
			t.Errorf("answer %d to %s: %s: %s %v\n%s", resp.StatusCode, name, e.Message, e.Reason, e.SchemaValidationErrors, body)
		}
	}
	return body
}

// mustRefuse checks that the validator refuses an answer to GET path
// altered (old replaced by new): the check of answers can fail.
func (b *oaBundle) mustRefuse(t *testing.T, path string, body []byte, old, new string, header http.Header) {
	t.Helper()
	altered := strings.Replace(string(body), old, new, 1)
	require.NotEqual(t, string(body), altered, "%s is in the answer", old)
	req, err := http.NewRequest("GET", b.http.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer t-alice")
	if header == nil {
		header = http.Header{}
	}
	header.Set("Content-Type", "application/json")
	resp := &http.Response{StatusCode: 200, Header: header, Body: io.NopCloser(strings.NewReader(altered)), Request: req}
	ok, _ := b.v.ValidateHttpResponse(req, resp)
	require.False(t, ok, "an answer with %s instead of %s validates", new, old)
}

// A real run's requests and answers (successes and refusals) validate
// against the document, as a generated client would see them.
func TestOpenAPILiveAnswersValidate(t *testing.T) {
	t.Parallel()
	b := setupOpenAPI(t)
	do := func(c oaCall) []byte { return b.do(t, c) }
	const alice, bob, root = "t-alice", "t-bob", "t-root"

	do(oaCall{method: "GET", path: "/healthz", want: 200})
	do(oaCall{method: "GET", path: "/metrics", want: 200})
	do(oaCall{method: "GET", path: "/ui/", want: 200})
	do(oaCall{method: "GET", path: "/", want: 302})
	do(oaCall{method: "GET", path: "/v1/whoami", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/devices", want: 401, invalid: true})
	do(oaCall{method: "GET", path: "/v1/devices", token: "t-nobody", want: 401})

	// Grants: alice may run everything.
	var g apiwire.GrantView
	require.NoError(t, json.Unmarshal(do(oaCall{method: "POST", path: "/v1/grants", token: root,
		body: `{"principal":"alice","action":"*","devices":"*"}`, want: 201}), &g))
	do(oaCall{method: "POST", path: "/v1/grants", token: root, body: `{"principal":"alice","action":"*","devices":"*"}`, want: 200})
	do(oaCall{method: "POST", path: "/v1/grants", token: alice, body: `{"principal":"alice","action":"*","devices":"*"}`, want: 403})
	grant2 := do(oaCall{method: "POST", path: "/v1/grants", token: root, body: `{"principal":"carol","action":"reboot","devices":"device-?"}`, want: 201})
	var g2 apiwire.GrantView
	require.NoError(t, json.Unmarshal(grant2, &g2))
	do(oaCall{method: "DELETE", path: "/v1/grants/" + g2.GrantID, token: root, want: 200})
	do(oaCall{method: "DELETE", path: "/v1/grants/g-none", token: root, want: 404})
	do(oaCall{method: "GET", path: "/v1/grants?limit=1&all=1", token: alice, want: 200})

	// Operations and their commands.
	var op apiwire.Operation
	require.NoError(t, json.Unmarshal(do(oaCall{method: "POST", path: "/v1/operations", token: alice,
		body: `{"operation_id":"op-1","target":"device-1","action":"restart","params":{"reason":"stuck"}}`, want: 201}), &op))
	do(oaCall{method: "POST", path: "/v1/operations", token: alice, header: map[string]string{"Idempotency-Key": "op-1"},
		body: `{"target":"device-1","action":"restart","params":{"reason":"stuck"}}`, want: 200})
	do(oaCall{method: "POST", path: "/v1/operations", token: alice,
		body: `{"operation_id":"op-1","target":"device-1","action":"restart","params":{"reason":"other"}}`, want: 422})
	do(oaCall{method: "POST", path: "/v1/operations", token: alice, body: `{"target":"device-1","action":"restart","colour":1}`, want: 400, invalid: true})
	do(oaCall{method: "POST", path: "/v1/operations", token: alice, body: `{"target":`, want: 400, invalid: true})
	do(oaCall{method: "POST", path: "/v1/operations", token: bob, body: `{"operation_id":"op-2","target":"device-1","action":"restart"}`, want: 403})
	do(oaCall{method: "POST", path: "/v1/operations", token: alice, body: `{"operation_id":"op-2","target":"device-1","action":"restart","params":{"pad":"` +
		strings.Repeat("x", MaxBody) + `"}}`, want: 413, invalid: true})
	do(oaCall{method: "POST", path: "/v1/operations", token: alice, header: map[string]string{"Content-Type": "text/plain"},
		body: `{"target":"device-1","action":"restart"}`, want: 415, invalid: true})
	got := do(oaCall{method: "GET", path: "/v1/operations/op-1", token: alice, want: 200})
	b.mustRefuse(t, "/v1/operations/op-1", got, `"status":"started"`, `"status":"bogus"`, nil)
	b.mustRefuse(t, "/v1/operations/op-1", got, `"request_hash"`, `"request_hash_x"`, nil)
	do(oaCall{method: "GET", path: "/v1/operations/op-1?wait=1ms", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/operations/op-1?wait=forever", token: alice, want: 400})
	do(oaCall{method: "GET", path: "/v1/operations/op-none", token: alice, want: 404})
	do(oaCall{method: "POST", path: "/v1/operations/op-1/compensations", token: alice,
		body: `{"action":"restart","reason":"undo","business_version":"v1"}`, want: 409})
	do(oaCall{method: "GET", path: "/v1/commands/" + op.CommandID, token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/commands/c-none", token: alice, want: 404})
	do(oaCall{method: "POST", path: "/v1/commands/" + op.CommandID + "/resolve", token: alice,
		body: `{"outcome":"succeeded","note":"checked"}`, want: 409})
	// op-1's device is online: its submit committed the publish decision.
	do(oaCall{method: "POST", path: "/v1/commands/" + op.CommandID + "/cancel", token: alice, want: 409})
	var offline apiwire.Operation // a device never seen: its command waits, cancellable
	require.NoError(t, json.Unmarshal(do(oaCall{method: "POST", path: "/v1/operations", token: alice,
		body: `{"operation_id":"op-3","target":"device-9","action":"restart"}`, want: 201}), &offline))
	do(oaCall{method: "POST", path: "/v1/commands/" + offline.CommandID + "/cancel", token: alice, want: 200})
	do(oaCall{method: "POST", path: "/v1/commands/" + offline.CommandID + "/cancel", token: alice, body: `{}`, want: 200}) // again: the same

	// Devices.
	got = do(oaCall{method: "GET", path: "/v1/devices?limit=1", token: alice, want: 200})
	b.mustRefuse(t, "/v1/devices?limit=1", got, `"device_id"`, `"device_id"`+"\t", nil) // unchanged body, no X-Total-Count
	b.mustRefuse(t, "/v1/devices?limit=1", got, `"online":true`, `"online":"yes"`, http.Header{"X-Total-Count": {"2"}})
	do(oaCall{method: "GET", path: "/v1/devices?online=true&after=device-1", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/devices?online=maybe", token: alice, want: 400, invalid: true})
	do(oaCall{method: "GET", path: "/v1/devices?limit=0", token: alice, want: 400, invalid: true})
	do(oaCall{method: "GET", path: "/v1/devices/device-1", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/devices/device-9", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/devices/bad%20id", token: alice, want: 400})
	do(oaCall{method: "POST", path: "/v1/devices/device-2/presence/reset", token: root, want: 200})
	do(oaCall{method: "POST", path: "/v1/devices/device-2/presence/reset", token: alice, want: 403})

	// Tasks: created by alice, approved by bob (four-eyes), replayed, stale.
	step := `{"step":"restart-device","action":"restart","target":"device-1","params":{}}`
	do(oaCall{method: "POST", path: "/v1/tasks", token: alice, body: `{"task_id":"t1","steps":[` + step + `]}`, want: 201})
	do(oaCall{method: "POST", path: "/v1/tasks", token: alice, body: `{"task_id":"t1","steps":[` + step + `]}`, want: 200})
	do(oaCall{method: "POST", path: "/v1/tasks", token: alice, body: `{"task_id":"t1","steps":[` + strings.Replace(step, "device-1", "device-2", 1) + `]}`, want: 422})
	do(oaCall{method: "POST", path: "/v1/tasks", token: alice, body: `{"task_id":"t1","steps":[]}`, want: 400})
	do(oaCall{method: "PUT", path: "/v1/tasks/t1/plan", token: alice, body: `{"steps":[` + step + `,` +
		strings.Replace(step, "device-1", "device-2", 1) + `],"base_version":1}`, want: 200})
	do(oaCall{method: "PUT", path: "/v1/tasks/t1/plan", token: alice, body: `{"steps":[` + step + `],"base_version":1}`, want: 409})
	do(oaCall{method: "POST", path: "/v1/tasks/t1/approvals", token: bob, body: `{"version":1}`, want: 409})
	do(oaCall{method: "POST", path: "/v1/tasks/t1/approvals", token: alice, body: `{"version":2}`, want: 403})
	do(oaCall{method: "POST", path: "/v1/tasks/t1/approvals", token: bob, body: `{"version":2}`, want: 201})
	do(oaCall{method: "POST", path: "/v1/tasks/t1/approvals", token: bob, body: `{"version":2}`, want: 200})
	do(oaCall{method: "GET", path: "/v1/tasks/t1", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/tasks/t-none", token: alice, want: 404})
	do(oaCall{method: "POST", path: "/v1/tasks", token: alice, body: `{"task_id":"t2","execute_after":"2030-01-01T00:00:00Z","steps":[` + step + `]}`, want: 201})
	do(oaCall{method: "POST", path: "/v1/tasks/t2/rejections", token: bob, body: `{"reason":"not now"}`, want: 200})
	do(oaCall{method: "POST", path: "/v1/tasks/t2/rejections", token: bob, body: `{"reason":"not now"}`, want: 200}) // again
	do(oaCall{method: "PUT", path: "/v1/tasks/t2/plan", token: alice, body: `{"steps":[` + step + `]}`, want: 409})
	do(oaCall{method: "GET", path: "/v1/tasks?status=rejected", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/tasks?limit=1", token: alice, want: 200})

	// Rollouts.
	do(oaCall{method: "POST", path: "/v1/rollouts", token: alice, body: `{"rollout_id":"fw-1","action":"restart","params":{"fw":"4.2"},
		"devices":["device-1","device-2"],"max_per_minute":60,"ramp":{"base_per_minute":6,"factor":2,"every_succeeded":1},
		"max_in_flight":1,"abort":[{"when":"failed","percent":50,"min_finished":2}],"windows":[{"cron":"0 2 * * *","duration":"2h"}],"retries":1}`, want: 201})
	do(oaCall{method: "POST", path: "/v1/rollouts", token: alice, body: `{"rollout_id":"fw-2","action":"restart","devices":"device-*",
		"execute_after":"2030-01-01T00:00:00Z"}`, want: 201})
	do(oaCall{method: "POST", path: "/v1/rollouts", token: alice, body: `{"rollout_id":"fw-2","action":"reboot","devices":"device-*"}`, want: 422})
	do(oaCall{method: "POST", path: "/v1/rollouts", token: alice, body: `{"rollout_id":"fw-3","action":"restart","devices":["device-77"]}`, want: 400})
	do(oaCall{method: "GET", path: "/v1/rollouts", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/rollouts?status=scheduled&limit=1", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/rollouts/fw-1", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/rollouts/fw-none", token: alice, want: 404})
	do(oaCall{method: "GET", path: "/v1/rollouts/fw-1/devices?limit=1", token: alice, want: 200})
	do(oaCall{method: "POST", path: "/v1/rollouts/fw-2/pause", token: alice, want: 200})
	do(oaCall{method: "POST", path: "/v1/rollouts/fw-2/resume", token: alice, body: `{}`, want: 200})
	do(oaCall{method: "POST", path: "/v1/rollouts/fw-2/cancel", token: alice, want: 200})
	do(oaCall{method: "POST", path: "/v1/rollouts/fw-2/pause", token: alice, want: 409})
	do(oaCall{method: "POST", path: "/v1/rollouts/fw-2/approvals", token: bob, body: `{"version":1}`, want: 409})

	// The rest: instances, the event stream, MCP.
	do(oaCall{method: "GET", path: "/v1/instances?all=true", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/events?last_event_id=0", token: alice, want: 200})
	do(oaCall{method: "GET", path: "/v1/events?access_token=" + alice, want: 200})
	do(oaCall{method: "POST", path: "/mcp", token: alice, header: map[string]string{"Accept": "application/json, text/event-stream"},
		body: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		want: 200})

	// The operators' view.
	for _, path := range []string{"/v1/operations?status=started&device=device-1&limit=10", "/v1/commands?status=open&status=cancelled&limit=10",
		"/v1/operations?limit=2", "/v1/commands?status=needs_attention", "/v1/audit?principal=alice&since=2020-01-01T00:00:00Z", "/v1/audit?limit=1"} {
		do(oaCall{method: "GET", path: path, token: alice, want: 200})
	}
	do(oaCall{method: "GET", path: "/v1/commands?status=stuck", token: alice, want: 400, invalid: true})
}

// Every error code the API answers is in the document's table: the
// domain's (codeStatus) and each literal code this package writes.
func TestOpenAPIListsEveryErrorCode(t *testing.T) {
	codes := errorCodes()
	has := func(code string, status int) bool { return slices.Contains(codes[status], code) }
	for code, status := range codeStatus {
		require.True(t, has(string(code), status), "%s %d", code, status)
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	lit := regexp.MustCompile(`(?:apiErr|refusal)\(http\.Status(\w+), "([a-z_]+)"`)
	statusOf := map[string]int{}
	for st := 100; st < 600; st++ {
		if txt := http.StatusText(st); txt != "" {
			statusOf[strings.NewReplacer(" ", "", "-", "", "'", "").Replace(txt)] = st
		}
	}
	statusOf["RequestEntityTooLarge"] = http.StatusRequestEntityTooLarge
	var n int
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range lit.FindAllStringSubmatch(string(src), -1) {
			st, ok := statusOf[m[1]]
			require.True(t, ok, "status %s", m[1])
			require.True(t, has(m[2], st), "%s: %d %s is not in the document's error codes (transportCodes)", f, st, m[2])
			n++
		}
	}
	require.Greater(t, n, 10, "the literal codes were found")
}

// A field the document says a request body requires is refused when
// absent (400; a version, 409 stale_version): the document's required
// lists are the server's.
func TestOpenAPIRequiredFieldsAreRequired(t *testing.T) {
	t.Parallel()
	b := setupOpenAPI(t)
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Required []string `json:"required"`
			} `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(b.document(t), &doc))
	b.do(t, oaCall{method: "POST", path: "/v1/grants", token: "t-root", body: `{"principal":"alice","action":"*","devices":"*"}`, want: 201})
	b.do(t, oaCall{method: "POST", path: "/v1/tasks", token: "t-alice", want: 201,
		body: `{"task_id":"t1","steps":[{"step":"s","action":"restart","target":"device-1"}]}`})
	b.do(t, oaCall{method: "POST", path: "/v1/rollouts", token: "t-alice", want: 201,
		body: `{"rollout_id":"fw-1","action":"restart","devices":"device-*"}`})
	rollout := `{"rollout_id":"fw-8","action":"restart","devices":"device-*","ramp":{"base_per_minute":6,"factor":2,"every_succeeded":1},
		"abort":[{"when":"failed","percent":50,"min_finished":2}],"windows":[{"cron":"0 2 * * *","duration":"2h"}]}`
	for _, c := range []struct {
		schema, method, path, token, body string
		in                                []any // where the schema's object is in the body: member names, indexes
	}{
		{"SubmitRequest", "POST", "/v1/operations", "t-alice", `{"operation_id":"op-9","target":"device-1","action":"restart"}`, nil},
		{"CompensationRequest", "POST", "/v1/operations/op-9/compensations", "t-alice", `{"action":"restart","reason":"r","business_version":"v1"}`, nil},
		{"TaskRequest", "POST", "/v1/tasks", "t-alice", `{"task_id":"t9","steps":[{"step":"s","action":"restart","target":"device-1"}]}`, nil},
		{"PlanRequest", "PUT", "/v1/tasks/t1/plan", "t-alice", `{"steps":[{"step":"s","action":"restart","target":"device-2"}]}`, nil},
		{"ApprovalRequest", "POST", "/v1/tasks/t1/approvals", "t-bob", `{"version":1}`, nil},
		{"GrantRequest", "POST", "/v1/grants", "t-root", `{"principal":"carol","action":"a","devices":"d"}`, nil},
		{"ResolveRequest", "POST", "/v1/commands/c-1/resolve", "t-alice", `{"outcome":"failed","note":"n"}`, nil},
		{"RolloutRequest", "POST", "/v1/rollouts", "t-alice", `{"rollout_id":"fw-9","action":"restart","devices":"device-*"}`, nil},
		{"RolloutApprovalRequest", "POST", "/v1/rollouts/fw-1/approvals", "t-bob", `{"version":1}`, nil},
		{"StepInput", "POST", "/v1/tasks", "t-alice", `{"task_id":"t8","steps":[{"step":"s","action":"restart","target":"device-1"}]}`, []any{"steps", 0}},
		{"RampInput", "POST", "/v1/rollouts", "t-alice", rollout, []any{"ramp"}},
		{"AbortRuleInput", "POST", "/v1/rollouts", "t-alice", rollout, []any{"abort", 0}},
		{"MaintenanceWindowInput", "POST", "/v1/rollouts", "t-alice", rollout, []any{"windows", 0}},
	} {
		require.NotEmpty(t, doc.Components.Schemas[c.schema].Required, c.schema)
		for _, field := range doc.Components.Schemas[c.schema].Required {
			var whole any
			require.NoError(t, json.Unmarshal([]byte(c.body), &whole))
			obj := whole
			for _, step := range c.in {
				if i, ok := step.(int); ok {
					obj = obj.([]any)[i]
				} else {
					obj = obj.(map[string]any)[step.(string)]
				}
			}
			delete(obj.(map[string]any), field)
			body, err := json.Marshal(whole)
			require.NoError(t, err)
			want := http.StatusBadRequest
			if field == "version" {
				want = http.StatusConflict // absent is version 0, never the current one: stale_version
			}
			b.do(t, oaCall{method: c.method, path: c.path, token: c.token, body: string(body), want: want, invalid: true})
		}
	}
}
