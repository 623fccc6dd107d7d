package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// routesBundle serves every route (rollouts, events, metrics, a dashboard)
// on a real SQLite store where device-1 has been seen and is offline, auth off.
type routesBundle struct {
	srv *Server
	st  *store.DB
}

func setupRoutes(t *testing.T) *routesBundle {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	caps := wire.Capabilities{}
	_, err = st.ApplyPresence(ctx, "device-1", wire.Presence{Online: true, Session: 1, Capabilities: &caps})
	require.NoError(t, err)
	// Then offline (its will): a submit leaves its command pending, so a
	// cancel of it is not already_published.
	_, err = st.ApplyPresence(ctx, "device-1", wire.Presence{Online: false, Session: 1})
	require.NoError(t, err)
	policy := func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }
	svc := ops.New(ops.Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second, Policy: policy})
	ro := rollout.NewService(rollout.Config{Store: st, Ops: svc, Policy: policy, Instance: "i1", LeaseTTL: 10 * time.Second})
	bus := events.New(events.Config{})
	t.Cleanup(bus.Close)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return &routesBundle{st: st, srv: New(Config{Service: svc, Store: st, Instance: "i1", Rollouts: ro, Events: bus,
		Metrics: ok, UI: ok, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})}
}

// send serves one request (a JSON body when body is not "") and returns
// the recorder.
func (b *routesBundle) send(t *testing.T, method, target, body string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, "http://127.0.0.1:8080"+target, rd)
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, r)
	return rec
}

func errorOf(t *testing.T, rec *httptest.ResponseRecorder) apiwire.Error {
	t.Helper()
	var e apiwire.Error
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), rec.Body.String())
	return e
}

// Every route answers a method it does not serve with 405
// method_not_allowed and an Allow header listing those it does (a GET
// route serves HEAD too); a path no route has is still 404, without Allow.
func TestWrongMethodIs405WithAllow(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	for path, allow := range map[string]string{
		"/v1/operations":                           "GET, HEAD, POST",
		"/v1/commands":                             "GET, HEAD",
		"/v1/operations/op-1":                      "GET, HEAD",
		"/v1/operations/op-1/compensations":        "POST",
		"/v1/commands/c-1":                         "GET, HEAD",
		"/v1/commands/c-1/cancel":                  "POST",
		"/v1/commands/c-1/resolve":                 "POST",
		"/v1/devices":                              "GET, HEAD",
		"/v1/devices/device-1":                     "GET, HEAD",
		"/v1/devices/device-1/presence/reset":      "POST",
		"/v1/tasks":                                "GET, HEAD, POST",
		"/v1/tasks/t1":                             "GET, HEAD",
		"/v1/tasks/t1/plan":                        "PUT",
		"/v1/tasks/t1/approvals":                   "POST",
		"/v1/tasks/t1/rejections":                  "POST",
		"/v1/grants":                               "GET, HEAD, POST",
		"/v1/grants/g-1":                           "DELETE",
		"/v1/instances":                            "GET, HEAD",
		"/v1/rollouts":                             "GET, HEAD, POST",
		"/v1/rollouts/fw-1":                        "GET, HEAD",
		"/v1/rollouts/fw-1/devices":                "GET, HEAD",
		"/v1/rollouts/fw-1/pause":                  "POST",
		"/v1/rollouts/fw-1/resume":                 "POST",
		"/v1/rollouts/fw-1/cancel":                 "POST",
		"/v1/rollouts/fw-1/approvals":              "POST",
		"/v1/events":                               "GET, HEAD",
		"/v1/whoami":                               "GET, HEAD",
		"/healthz":                                 "GET, HEAD",
		"/metrics":                                 "GET, HEAD",
		"/ui/index.html":                           "GET, HEAD",
		"/":                                        "GET, HEAD",
		"/v1/operations/a:b:rollout:c:v1/comp%20x": "", // no route: 404
	} {
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
			if strings.Contains(", "+allow+",", ", "+m+",") {
				continue
			}
			rec := b.send(t, m, path, "")
			if allow == "" {
				require.Equal(t, http.StatusNotFound, rec.Code, "%s %s: %s", m, path, rec.Body)
				require.Equal(t, "not_found", errorOf(t, rec).Code)
				require.Empty(t, rec.Header().Get("Allow"))
				continue
			}
			require.Equal(t, http.StatusMethodNotAllowed, rec.Code, "%s %s: %s", m, path, rec.Body)
			require.Equal(t, allow, rec.Header().Get("Allow"), "%s %s", m, path)
			e := errorOf(t, rec)
			require.Equal(t, "method_not_allowed", e.Code)
			require.Contains(t, e.Message, allow)
		}
	}
	_, err := b.st.GetOperation(context.Background(), "op-1")
	require.ErrorIs(t, err, domain.ErrNotFound, "nothing was created")
}

// One rule for the query string of every route: a parameter the route
// does not take, or one given twice, is 400 invalid_request naming it, and
// nothing changes; the ones it takes (?wait=, a list's) still work.
func TestQueryParametersOneRule(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	rec := b.send(t, "POST", "/v1/operations", `{"operation_id":"op-1","target":"device-1","action":"restart"}`)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var op apiwire.Operation
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &op))
	rec = b.send(t, "POST", "/v1/rollouts", `{"rollout_id":"fw-1","action":"set-config","devices":["device-1"]}`)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	for _, tc := range []struct{ method, target, body, param string }{
		{"GET", "/v1/operations/op-1?wiat=30s", "", "wiat"},
		{"GET", "/v1/operations/op-1?wait=1s&wait=2s", "", "wait"},
		{"GET", "/v1/operations/op-1?wait=0s&x", "", "x"},
		{"GET", "/v1/commands/" + op.CommandID + "?verbose=1", "", "verbose"},
		{"GET", "/v1/devices/device-1?online=true", "", "online"},
		{"GET", "/v1/tasks/t1?history=0", "", "history"},
		{"GET", "/v1/rollouts/fw-1?fields=status", "", "fields"},
		{"GET", "/v1/rollouts/fw-1?x=1&x=2", "", "x"},
		{"GET", "/v1/whoami?as=admin", "", "as"},
		{"GET", "/v1/events?last_event_id=1&last_event_id=2", "", "last_event_id"},
		{"GET", "/v1/devices?limit=1&limit=2", "", "limit"},
		{"GET", "/v1/rollouts/fw-1/devices?statuss=started", "", "statuss"},
		{"GET", "/v1/instances?all=1&all=0", "", "all"},
		{"POST", "/v1/operations?dry_run=1", `{"operation_id":"op-2","target":"device-1","action":"restart"}`, "dry_run"},
		{"POST", "/v1/operations/op-1/compensations?force=1", `{"action":"restart","business_version":"v1"}`, "force"},
		{"POST", "/v1/commands/" + op.CommandID + "/cancel?force=1", "", "force"},
		{"POST", "/v1/rollouts/fw-1/cancel?now=1", "", "now"},
		{"POST", "/v1/grants?x=1", `{"principal":"agent","action":"restart","devices":"device-*"}`, "x"},
	} {
		rec := b.send(t, tc.method, tc.target, tc.body)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s %s: %s", tc.method, tc.target, rec.Body)
		e := errorOf(t, rec)
		require.Equal(t, "invalid_request", e.Code, tc.target)
		require.Contains(t, e.Message, "query parameter "+tc.param+":", tc.target)
	}
	// Nothing changed.
	for _, id := range []string{"op-2", "op-1:compensate:v1"} {
		_, err := b.st.GetOperation(context.Background(), id)
		require.ErrorIs(t, err, domain.ErrNotFound, id)
	}
	c, err := b.st.GetCommand(context.Background(), op.CommandID)
	require.NoError(t, err)
	require.NotEqual(t, "cancelled", string(c.Status))
	ro, err := b.st.GetRollout(context.Background(), "fw-1")
	require.NoError(t, err)
	require.NotEqual(t, "cancelled", string(ro.Status))
	gs, err := b.st.ListGrants(context.Background(), store.GrantFilter{Revoked: true}, store.Page{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, gs.Items)

	// The parameters a route takes still work.
	for _, target := range []string{"/v1/operations/op-1?wait=0s", "/v1/operations/op-1", "/v1/devices/device-1",
		"/v1/rollouts/fw-1", "/v1/devices?limit=1&online=true", "/v1/rollouts/fw-1/devices?status=pending&limit=5",
		"/v1/instances?all=1", "/v1/whoami", "/healthz"} {
		rec := b.send(t, "GET", target, "")
		require.Equal(t, http.StatusOK, rec.Code, "%s: %s", target, rec.Body)
	}
}

// max_per_minute and max_in_flight given as 0 are refused (400
// invalid_request naming the field) and create nothing; left out, each is
// its default.
func TestRolloutZeroLimitsAreRefused(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	for _, tc := range []struct{ extra, field string }{
		{`,"max_per_minute":0`, "max_per_minute"},
		{`,"max_in_flight":0`, "max_in_flight"},
		{`,"max_per_minute":0,"max_in_flight":5`, "max_per_minute"},
		{`,"max_per_minute":-0`, "max_per_minute"},
	} {
		rec := b.send(t, "POST", "/v1/rollouts", `{"rollout_id":"fw-0","action":"set-config","devices":["device-1"]`+tc.extra+`}`)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s: %s", tc.extra, rec.Body)
		e := errorOf(t, rec)
		require.Equal(t, "invalid_request", e.Code)
		require.Contains(t, e.Message, tc.field+" 0", tc.extra)
	}
	_, err := b.st.GetRollout(context.Background(), "fw-0")
	require.ErrorIs(t, err, domain.ErrNotFound, "nothing was created")

	for id, extra := range map[string]string{"fw-absent": ``, "fw-null": `,"max_per_minute":null,"max_in_flight":null`} {
		rec := b.send(t, "POST", "/v1/rollouts", `{"rollout_id":"`+id+`","action":"set-config","devices":["device-1"]`+extra+`}`)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		var v apiwire.RolloutView
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v))
		require.Equal(t, rollout.DefaultMaxPerMinute, v.MaxPerMinute, id)
		require.Equal(t, rollout.DefaultMaxInFlight, v.MaxInFlight, id)
	}
	rec := b.send(t, "POST", "/v1/rollouts", `{"rollout_id":"fw-1","action":"set-config","devices":["device-1"],"max_per_minute":1,"max_in_flight":1}`)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}

// A grant's principal with a space or a glob character is 400
// invalid_request and stores nothing.
func TestGrantPrincipalIsAName(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	for _, p := range []string{"ali ce", "agent*", "a?", "[ab]", strings.Repeat("p", 65)} {
		body, _ := json.Marshal(apiwire.GrantRequest{Principal: p, Action: "restart", Devices: "device-*"})
		rec := b.send(t, "POST", "/v1/grants", string(body))
		require.Equal(t, http.StatusBadRequest, rec.Code, "%q: %s", p, rec.Body)
		e := errorOf(t, rec)
		require.Equal(t, "invalid_request", e.Code)
		require.Contains(t, e.Message, "principal")
	}
	gs, err := b.st.ListGrants(context.Background(), store.GrantFilter{Revoked: true}, store.Page{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, gs.Items)
	rec := b.send(t, "POST", "/v1/grants", `{"principal":"alice@example.com","action":"restart","devices":"device-*"}`)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}

// A direct submit of a rollout device's operation id is 403
// reserved_operation_id and stores nothing.
func TestRolloutShapedSubmitIsReserved(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	for _, body := range []string{
		`{"operation_id":"fw-9:rollout:device-1:v1","target":"device-1","action":"set-config"}`,
		`{"task_id":"fw-9","step":"rollout","target":"device-1","business_version":"v1","action":"set-config"}`,
	} {
		rec := b.send(t, "POST", "/v1/operations", body)
		require.Equal(t, http.StatusForbidden, rec.Code, rec.Body.String())
		require.Equal(t, "reserved_operation_id", errorOf(t, rec).Code)
	}
	_, err := b.st.GetOperation(context.Background(), "fw-9:rollout:device-1:v1")
	require.ErrorIs(t, err, domain.ErrNotFound)
}
