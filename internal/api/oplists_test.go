package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// submitN submits n operations on device-1 (op-000, op-001, ...) through
// the route, so each records its attribution, and cancels every third
// one's command.
func (b *routesBundle) submitN(t *testing.T, n int) []apiwire.Operation {
	t.Helper()
	var out []apiwire.Operation
	for i := range n {
		rec := b.send(t, "POST", "/v1/operations", fmt.Sprintf(`{"operation_id":"op-%03d","target":"device-1","action":"restart"}`, i))
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		var op apiwire.Operation
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &op))
		if i%3 == 0 {
			rec := b.send(t, "POST", "/v1/commands/"+op.CommandID+"/cancel", "")
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		}
		out = append(out, op)
	}
	return out
}

// walkList follows the Link headers from target and returns the ids (by
// idOf) and each page's X-Total-Count.
func (b *routesBundle) walkList(t *testing.T, target string, idOf func(json.RawMessage) string) (ids, totals []string) {
	t.Helper()
	for pages := 0; target != ""; pages++ {
		require.Less(t, pages, 100, "the links never end")
		rec := b.send(t, "GET", target, "")
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var items []json.RawMessage
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &items))
		for _, it := range items {
			ids = append(ids, idOf(it))
		}
		totals = append(totals, rec.Header().Get("X-Total-Count"))
		target = ""
		if link := rec.Header().Get("Link"); link != "" {
			require.True(t, strings.HasSuffix(link, `>; rel="next"`), link)
			target = strings.TrimSuffix(strings.TrimPrefix(link, "<"), `>; rel="next"`)
		}
	}
	return ids, totals
}

func field(name string) func(json.RawMessage) string {
	return func(raw json.RawMessage) string {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return "!" + err.Error()
		}
		return fmt.Sprint(m[name])
	}
}

func TestListOperationsAndCommandsRoutes(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	ops := b.submitN(t, 7)

	// Newest first; one millisecond may hold several, then ids descending.
	ids, totals := b.walkList(t, "/v1/operations?limit=3", field("operation_id"))
	require.ElementsMatch(t, []string{"op-000", "op-001", "op-002", "op-003", "op-004", "op-005", "op-006"}, ids)
	require.Equal(t, []string{"7", "7", "7"}, totals)
	rec := b.send(t, "GET", "/v1/operations?limit=1", "")
	var first []apiwire.Operation
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &first))
	require.Equal(t, ids[0], first[0].OperationID)
	one := b.send(t, "GET", "/v1/operations/"+ids[0], "")
	require.JSONEq(t, one.Body.String(), strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(rec.Body.String()), "["), "]"),
		"an item is GET /v1/operations/{id}'s answer")
	require.Equal(t, "anonymous", first[0].SubmittedBy, "without --tokens")
	require.Equal(t, "api", first[0].Via)
	require.NotContains(t, rec.Body.String(), "approved_by", "omitted when empty")

	// Filters: repeated and comma-separated statuses, open, in the link.
	ids, totals = b.walkList(t, "/v1/operations?status=failed_final&limit=2", field("operation_id"))
	require.Equal(t, []string{"op-006", "op-003", "op-000"}, sortDesc(ids))
	require.Equal(t, "3", totals[0])
	ids, _ = b.walkList(t, "/v1/operations?status=open&device=device-1&submitted_by=anonymous&action=restart&limit=2", field("operation_id"))
	require.Len(t, ids, 4)
	ids, _ = b.walkList(t, "/v1/commands?status=cancelled,pending&status=sent&limit=2", field("command_id"))
	require.Len(t, ids, 7)
	ids, totals = b.walkList(t, "/v1/commands?status=cancelled&limit=2", field("status"))
	require.Equal(t, []string{"cancelled", "cancelled", "cancelled"}, ids)
	require.Equal(t, "3", totals[0])
	ids, _ = b.walkList(t, "/v1/commands?operation_id=op-004", field("command_id"))
	require.Equal(t, []string{ops[4].CommandID}, ids)
	ids, _ = b.walkList(t, "/v1/operations?task_id=none&until=2000-01-01T00:00:00Z", field("operation_id"))
	require.Empty(t, ids)
	ids, _ = b.walkList(t, "/v1/operations?since=2000-01-01T00:00:00Z", field("operation_id"))
	require.Len(t, ids, 7)

	rec = b.send(t, "GET", "/v1/commands?operation_id=op-004", "")
	var cmds []apiwire.Command
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &cmds))
	require.NotEmpty(t, cmds[0].Events, "an item is GET /v1/commands/{id}'s answer, with its events")
	one = b.send(t, "GET", "/v1/commands/"+ops[4].CommandID, "")
	require.JSONEq(t, one.Body.String(), strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(rec.Body.String()), "["), "]"))

	// The Link keeps every filter, repeated ones included.
	rec = b.send(t, "GET", "/v1/commands?status=cancelled&status=pending&device=device-1&limit=1", "")
	link := rec.Header().Get("Link")
	require.Contains(t, link, "status=cancelled&status=pending&device=device-1")
	require.Contains(t, link, "limit=1&after=")
}

func sortDesc(ids []string) []string {
	out := append([]string(nil), ids...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] > out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestListOperatorListsRefuseBadParameters(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	b.submitN(t, 1)
	for _, c := range []struct{ target, names string }{
		{"/v1/operations?status=bogus", `status: "bogus" is not a state`},
		{"/v1/operations?status=started,needs_attention", `"needs_attention" is not a state`},
		{"/v1/commands?status=failed_final", `"failed_final" is not a state`},
		{"/v1/operations?after=nope", "after"},
		{"/v1/commands?after=" + "MTIz", "after"},
		{"/v1/operations?limit=0", "limit"},
		{"/v1/operations?limit=1001", "limit"},
		{"/v1/operations?since=yesterday", "since"},
		{"/v1/commands?until=2026-13-01T00:00:00Z", "until"},
		{"/v1/operations?device=a%20b", "device"},
		{"/v1/operations?device=", "device"},
		{"/v1/operations?operation_id=x", "operation_id"},
		{"/v1/commands?submitted_by=x", "submitted_by"},
		{"/v1/commands?task_id=x", "task_id"},
		{"/v1/operations?device=a&device=b", "given more than once"},
	} {
		rec := b.send(t, "GET", c.target, "")
		require.Equal(t, http.StatusBadRequest, rec.Code, c.target)
		e := errorOf(t, rec)
		require.Equal(t, "invalid_request", e.Code, c.target)
		require.Contains(t, e.Message, c.names, c.target)
	}
	rec := b.send(t, "GET", "/v1/operations?limit=1000&status=open&status=started", "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
}
