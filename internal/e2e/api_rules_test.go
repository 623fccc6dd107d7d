package e2e

// Low-severity defects a black-box probe found (issue 24, items 8 and 9),
// reproduced against the real binaries.

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/rollout"
)

// raw sends one request to the controller (a JSON body when body is not
// "", header set as given) and returns its status, headers and error body.
func (b *bundle) raw(method, path, body string, header map[string]string) (int, http.Header, apiwire.Error) {
	b.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequestWithContext(b.ctx(), method, b.ctl.URL+path, rd)
	require.NoError(b.t, err)
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		r.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	var e apiwire.Error
	if resp.StatusCode >= 300 && method != http.MethodHead {
		require.NoError(b.t, json.Unmarshal(got, &e), "%s %s: %d %q", method, path, resp.StatusCode, got)
	}
	return resp.StatusCode, resp.Header, e
}

// Item 8: a wrong method on a route is 405 with Allow, not 404; every
// route refuses a query parameter it does not take or one given twice (and
// keeps ?wait=); a rollout's max_per_minute or max_in_flight given as 0,
// and a grant for a principal with a space or a glob character, are 400
// invalid_request. None of them changes anything.
func TestAPIRulesOnTheBinary(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1})
	op, _, err := b.client.Submit(b.ctx(), apiwire.SubmitRequest{OperationID: "rules-1", Target: "device-1", Action: "restart"}, "")
	require.NoError(t, err)

	// (a) 405 with Allow.
	for _, tc := range []struct{ method, path, allow string }{
		{"PATCH", "/v1/operations/rules-1", "GET, HEAD"},
		{"DELETE", "/v1/operations", "GET, HEAD, POST"},
		{"GET", "/v1/operations/rules-1/compensations", "POST"},
		{"POST", "/v1/devices/device-1", "GET, HEAD"},
		{"GET", "/v1/grants/g-1", "DELETE"},
		{"PUT", "/v1/rollouts", "GET, HEAD, POST"},
		{"POST", "/v1/tasks/t-1/plan", "PUT"},
		{"POST", "/healthz", "GET, HEAD"},
	} {
		status, h, e := b.raw(tc.method, tc.path, "", nil)
		require.Equal(t, http.StatusMethodNotAllowed, status, "%s %s: %+v", tc.method, tc.path, e)
		require.Equal(t, tc.allow, h.Get("Allow"), "%s %s", tc.method, tc.path)
		require.Equal(t, "method_not_allowed", e.Code)
	}
	status, h, e := b.raw("GET", "/v1/nothing", "", nil)
	require.Equal(t, http.StatusNotFound, status, "%+v", e)
	require.Empty(t, h.Get("Allow"))

	// (b) One rule for every route's query string.
	for _, tc := range []struct{ method, path, body, param string }{
		{"GET", "/v1/operations/rules-1?wiat=30s", "", "wiat"},
		{"GET", "/v1/operations/rules-1?wait=1s&wait=2s", "", "wait"},
		{"GET", "/v1/commands/" + op.CommandID + "?verbose=1", "", "verbose"},
		{"GET", "/v1/devices/device-1?online=true", "", "online"},
		{"GET", "/v1/tasks/t-1?x=1", "", "x"},
		{"GET", "/v1/rollouts/r-1?x=1", "", "x"},
		{"POST", "/v1/operations?dry_run=1", `{"operation_id":"rules-2","target":"device-1","action":"restart"}`, "dry_run"},
	} {
		status, _, e := b.raw(tc.method, tc.path, tc.body, nil)
		require.Equal(t, http.StatusBadRequest, status, "%s %s: %+v", tc.method, tc.path, e)
		require.Equal(t, "invalid_request", e.Code, tc.path)
		require.Contains(t, e.Message, "query parameter "+tc.param+":", tc.path)
	}
	_, err = b.client.Operation(b.ctx(), "rules-2", 0)
	require.Equal(t, "not_found", client.Code(err), "the refused submit stored nothing")
	status, _, e = b.raw("GET", "/v1/operations/rules-1?wait=30s", "", nil)
	require.Equal(t, http.StatusOK, status, "?wait= still works: %+v", e)

	// (c) A limit of 0 is refused; left out, it is the default.
	for _, extra := range []string{`"max_per_minute":0`, `"max_in_flight":0`} {
		status, _, e := b.raw("POST", "/v1/rollouts", `{"rollout_id":"zero","action":"set-config","devices":["device-1"],`+extra+`}`, nil)
		require.Equal(t, http.StatusBadRequest, status, "%s: %+v", extra, e)
		require.Equal(t, "invalid_request", e.Code)
		field, _, _ := strings.Cut(strings.Trim(extra, `"`), `"`)
		require.Contains(t, e.Message, field+" 0")
	}
	require.Equal(t, []string{"0"}, b.rows(`SELECT COUNT(*) FROM rollouts`), "nothing created")
	r, status, err := b.client.CreateRollout(b.ctx(), apiwire.RolloutRequest{RolloutID: "dflt", Action: "set-config",
		Devices: json.RawMessage(`["device-1"]`)})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, rollout.DefaultMaxPerMinute, r.MaxPerMinute, "absent is the default")
	require.Equal(t, rollout.DefaultMaxInFlight, r.MaxInFlight)

	// (d) A principal is a name.
	for _, p := range []string{"ali ce", "agent*", "agent?", "[ab]gent"} {
		_, status, err := b.client.CreateGrant(b.ctx(), apiwire.GrantRequest{Principal: p, Action: "restart", Devices: "device-*"})
		require.Equal(t, http.StatusBadRequest, status, "%q: %v", p, err)
		require.Equal(t, "invalid_request", client.Code(err))
	}
	require.Equal(t, []string{"0"}, b.rows(`SELECT COUNT(*) FROM grants`), "no grant stored")
	_, status, err = b.client.CreateGrant(b.ctx(), apiwire.GrantRequest{Principal: "alice@example.com", Action: "restart", Devices: "device-*"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
}

// Item 9: an operator cannot take a rollout device's operation id before
// the rollout does (whole, derived from its parts, as the Idempotency-Key,
// or made by a compensation): 403 reserved_operation_id, nothing stored.
// The rollout created afterwards starts each of its devices itself, and
// they succeed, each executed once.
func TestRolloutOperationIdCannotBeTakenFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 2})
	const id = "claim:rollout:device-1:v1"
	for _, tc := range []struct {
		name string
		req  apiwire.SubmitRequest
		key  string
	}{
		{"whole", apiwire.SubmitRequest{OperationID: id, Target: "device-1", Action: "set-config"}, ""},
		{"derived", apiwire.SubmitRequest{TaskID: "claim", Step: "rollout", Target: "device-1", BusinessVersion: "v1", Action: "set-config"}, ""},
		{"Idempotency-Key", apiwire.SubmitRequest{Target: "device-1", Action: "set-config"}, id},
	} {
		_, status, err := b.client.Submit(b.ctx(), tc.req, tc.key)
		require.Equal(t, http.StatusForbidden, status, "%s: %v", tc.name, err)
		require.Equal(t, "reserved_operation_id", client.Code(err), tc.name)
	}
	_, err := b.client.Operation(b.ctx(), id, 0)
	require.Equal(t, "not_found", client.Code(err), "nothing stored")

	// "claim:rollout" compensated with business_version v1 would be device
	// "compensate" of rollout claim.
	orig, _, err := b.client.Submit(b.ctx(), apiwire.SubmitRequest{OperationID: "claim:rollout", Target: "device-2", Action: "set-config"}, "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(orig.OperationID).Status)
	var comp apiwire.Operation
	status, err := b.client.Do(b.ctx(), http.MethodPost, "/v1/operations/claim:rollout/compensations", nil,
		apiwire.CompensationRequest{Action: "set-config", BusinessVersion: "v1"}, &comp)
	require.Equal(t, http.StatusForbidden, status, "%v", err)
	require.Equal(t, "reserved_operation_id", client.Code(err))

	// The rollout's own scheduler is not refused.
	_, status, err = b.client.CreateRollout(b.ctx(), rolloutJSON("claim", "set-config", `["device-1","device-2"]`, rollout.Spec{MaxPerMinute: 600}))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	final := b.waitRollout(b.client, "claim", "the end", time.Minute, over)
	require.Equal(t, "succeeded", final.Status, "%+v", final.Counts)
	op, err := b.client.Operation(b.ctx(), id, 0)
	require.NoError(t, err)
	require.Equal(t, "succeeded", op.Status)
	ex := b.executions()
	require.Equal(t, 1, ex[id])
	require.Equal(t, 1, ex["claim:rollout:device-2:v1"])
	require.Zero(t, ex["claim:rollout:compensate:v1"])
}
