package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// The binary serves GET /v1/openapi.json, a valid OpenAPI 3.1 document,
// and the answers of a real run (devices that execute and report, a
// command with its receipts and events, the instance with its leases)
// validate against it, as do the requests sent.
func TestOpenAPIOnTheBinary(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 2})
	resp, err := http.Get(b.ctl.URL + "/v1/openapi.json")
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	doc, err := libopenapi.NewDocument(raw)
	require.NoError(t, err)
	v, errs := validator.NewValidator(doc)
	require.Empty(t, errs)
	ok, verrs := v.ValidateDocument()
	for _, e := range verrs {
		t.Errorf("document: %s: %s", e.Message, e.Reason)
	}
	require.True(t, ok)

	do := func(method, path, body string, want int) []byte {
		t.Helper()
		build := func() *http.Request {
			var rd io.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			r, err := http.NewRequestWithContext(b.ctx(), method, b.ctl.URL+path, rd)
			require.NoError(t, err)
			if body != "" {
				r.Header.Set("Content-Type", "application/json")
			}
			return r
		}
		if ok, errs := v.ValidateHttpRequestSync(build()); !ok {
			for _, e := range errs {
				t.Errorf("request %s %s: %s: %s", method, path, e.Message, e.Reason)
			}
		}
		resp, err := http.DefaultClient.Do(build())
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, want, resp.StatusCode, "%s %s: %s", method, path, got)
		resp.Body = io.NopCloser(bytes.NewReader(got))
		if ok, errs := v.ValidateHttpResponse(build(), resp); !ok {
			for _, e := range errs {
				t.Errorf("answer %d to %s %s: %s: %s %v\n%s", resp.StatusCode, method, path, e.Message, e.Reason, e.SchemaValidationErrors, got)
			}
		}
		return got
	}

	var op apiwire.Operation
	require.NoError(t, json.Unmarshal(do("POST", "/v1/operations",
		`{"operation_id":"oa-1","target":"device-1","action":"restart","params":{"reason":"stuck"}}`, http.StatusCreated), &op))
	final := b.waitFinal("oa-1")
	require.Equal(t, "succeeded", final.Status)
	do("GET", "/v1/operations/oa-1?wait=1s", "", http.StatusOK)
	var cmd apiwire.Command
	require.NoError(t, json.Unmarshal(do("GET", "/v1/commands/"+op.CommandID, "", http.StatusOK), &cmd))
	require.NotEmpty(t, cmd.Receipts, "a real command's receipts are validated")
	do("POST", "/v1/commands/"+op.CommandID+"/cancel", "", http.StatusConflict)
	do("POST", "/v1/operations/oa-1/compensations", `{"action":"restart","reason":"undo","business_version":"v1"}`, http.StatusCreated)
	do("GET", "/v1/devices?limit=1", "", http.StatusOK)
	do("GET", "/v1/devices/device-2", "", http.StatusOK)
	do("GET", "/v1/instances", "", http.StatusOK)
	do("GET", "/v1/whoami", "", http.StatusOK)
	do("GET", "/v1/tasks", "", http.StatusOK)
	do("GET", "/healthz", "", http.StatusOK)
	do("GET", "/metrics", "", http.StatusOK)
	do("GET", "/v1/operations/oa-none", "", http.StatusNotFound)
}
