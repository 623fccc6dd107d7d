package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// TestListAuditPagesNewestFirst: GET /v1/audit lists people's changes
// newest first, one principal's with ?principal=, in pages linked by an
// opaque cursor, with the total.
func TestListAuditPagesNewestFirst(t *testing.T) {
	t.Parallel()
	b := setupList(t, 0)
	for i := range 5 {
		who := "alice"
		if i%2 == 1 {
			who = "bob"
		}
		_, _, err := b.st.CreateGrant(b.ctx, fmt.Sprintf("g-%02d", i), "agent", "restart", fmt.Sprintf("device-%d", i), who)
		require.NoError(t, err)
	}
	_, err := b.st.RevokeGrant(b.ctx, "g-00", "bob")
	require.NoError(t, err)

	walk := func(target string) (got []string, totals []string) {
		for i := 0; target != ""; i++ {
			require.Less(t, i, 20, "the next links never end")
			rec := b.get(t, target)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			var es []apiwire.AuditEntry
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &es))
			for _, e := range es {
				require.Equal(t, "grant", e.Kind)
				var d map[string]string
				require.NoError(t, json.Unmarshal(e.Detail, &d))
				require.Equal(t, "agent", d["grantee"])
				got = append(got, e.Principal+":"+e.Action+":"+e.ID)
			}
			totals = append(totals, rec.Header().Get("X-Total-Count"))
			target = ""
			if l := rec.Header().Get("Link"); l != "" {
				m := nextLink.FindStringSubmatch(l)
				require.NotNil(t, m, "Link %q", l)
				target = m[1]
			}
		}
		return got, totals
	}
	got, totals := walk("/v1/audit?limit=2")
	require.Equal(t, []string{"bob:revoke:g-00", "alice:grant:g-04", "bob:grant:g-03", "alice:grant:g-02",
		"bob:grant:g-01", "alice:grant:g-00"}, got)
	require.Equal(t, []string{"6", "6", "6"}, totals)
	got, totals = walk("/v1/audit?principal=bob&limit=2")
	require.Equal(t, []string{"bob:revoke:g-00", "bob:grant:g-03", "bob:grant:g-01"}, got)
	require.Equal(t, []string{"3", "3"}, totals)

	rec := b.get(t, "/v1/audit?principal=bob&limit=1")
	require.Regexp(t, `^</v1/audit\?limit=1&after=[A-Za-z0-9_-]+&principal=bob>; rel="next"$`, rec.Header().Get("Link"))
	rec = b.get(t, "/v1/audit?principal=nobody")
	require.Equal(t, "[]", strings.TrimSpace(rec.Body.String()))
	require.Equal(t, "0", rec.Header().Get("X-Total-Count"))
	rec = b.get(t, "/v1/audit?since=2999-01-01T00:00:00Z")
	require.Equal(t, "0", rec.Header().Get("X-Total-Count"))
	rec = b.get(t, "/v1/audit?until=2999-01-01T00:00:00Z")
	require.Equal(t, "6", rec.Header().Get("X-Total-Count"))
}

func TestListAuditRefusesBadParameters(t *testing.T) {
	t.Parallel()
	b := setupList(t, 0)
	for _, tc := range []struct{ target, names string }{
		{"/v1/audit?limit=0", "limit"},
		{"/v1/audit?limit=1001", "limit"},
		{"/v1/audit?limit=x", "limit"},
		{"/v1/audit?after=g-01", "after"}, // an id is not a cursor
		{"/v1/audit?after=" + base64.RawURLEncoding.EncodeToString([]byte("12,x")), "after"},
		{"/v1/audit?after=" + base64.RawURLEncoding.EncodeToString([]byte("12,0")), "after"},
		{"/v1/audit?after=" + base64.RawURLEncoding.EncodeToString([]byte("12")), "after"},
		{"/v1/audit?after=" + base64.RawURLEncoding.EncodeToString([]byte("12.3")), "after"}, // not this list's form
		{"/v1/audit?after=" + strings.Repeat("A", 100), "after"},
		{"/v1/audit?since=yesterday", "since"},
		{"/v1/audit?until=2026-13-01T00:00:00Z", "until"},
		{"/v1/audit?principal=a&principal=b", "principal"},
		{"/v1/audit?who=bob", "who"},
	} {
		rec := b.get(t, tc.target)
		require.Equal(t, http.StatusBadRequest, rec.Code, tc.target)
		var e apiwire.Error
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), rec.Body.String())
		require.Equal(t, "invalid_request", e.Code, tc.target)
		require.Contains(t, e.Message, "query parameter "+tc.names, tc.target)
		require.Empty(t, rec.Header().Get("X-Total-Count"))
	}
	rec := b.get(t, "/v1/audit?after="+base64.RawURLEncoding.EncodeToString([]byte("12,3")))
	require.Equal(t, http.StatusOK, rec.Code, "a well-formed cursor past the end: an empty page")
}
