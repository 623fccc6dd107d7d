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
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/wire"
)

type listBundle struct {
	srv *Server
	st  *store.DB
	ctx context.Context
}

// setupList serves the API over a real SQLite store holding n devices
// device-1..device-n, those whose number is a multiple of 3 offline.
func setupList(t *testing.T, n int) *listBundle {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	caps := &wire.Capabilities{Dedupe: true, Query: true}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("device-%d", i)
		_, err := st.ApplyPresence(ctx, id, wire.Presence{Online: true, Session: 1, Capabilities: caps})
		require.NoError(t, err)
		if i%3 == 0 {
			_, err = st.ApplyPresence(ctx, id, wire.Presence{Online: false, Session: 1})
			require.NoError(t, err)
		}
	}
	srv := New(Config{Store: st, Instance: "i1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return &listBundle{srv: srv, st: st, ctx: ctx}
}

func (b *listBundle) get(t *testing.T, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	return rec
}

var nextLink = regexp.MustCompile(`^<([^>]+)>; rel="next"$`)

// walk follows the Link headers from target and returns every page's device
// ids, and each page's X-Total-Count.
func (b *listBundle) walk(t *testing.T, target string) (pages [][]string, totals []string, links []string) {
	t.Helper()
	for i := 0; target != ""; i++ {
		require.Less(t, i, 100, "the next links never end")
		rec := b.get(t, target)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var devs []apiwire.Device
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &devs))
		ids := []string{}
		for _, d := range devs {
			ids = append(ids, d.DeviceID)
		}
		pages, totals = append(pages, ids), append(totals, rec.Header().Get("X-Total-Count"))
		target = ""
		if l := rec.Header().Get("Link"); l != "" {
			m := nextLink.FindStringSubmatch(l)
			require.NotNil(t, m, "Link %q", l)
			target = m[1]
			links = append(links, l)
		}
	}
	return pages, totals, links
}

func sortedIDs(n int, keep func(i int) bool) []string {
	var ids []string
	for i := 1; i <= n; i++ {
		if keep(i) {
			ids = append(ids, fmt.Sprintf("device-%d", i))
		}
	}
	sort.Strings(ids)
	return ids
}

func TestListDevicesPagesWithLinks(t *testing.T) {
	t.Parallel()
	b := setupList(t, 25)
	all := sortedIDs(25, func(int) bool { return true })

	pages, totals, links := b.walk(t, "/v1/devices?limit=10")
	require.Equal(t, []string{"25", "25", "25"}, totals, "the total on every page")
	require.Equal(t, [][]string{all[:10], all[10:20], all[20:]}, pages, "every device once, in id order")
	require.Equal(t, []string{
		`</v1/devices?limit=10&after=` + all[9] + `>; rel="next"`,
		`</v1/devices?limit=10&after=` + all[19] + `>; rel="next"`,
	}, links, "no link on the last page")

	// The default limit holds 25: one page, no link.
	rec := b.get(t, "/v1/devices")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "25", rec.Header().Get("X-Total-Count"))
	require.Empty(t, rec.Header().Get("Link"))

	// An exact multiple of the limit: no link to an empty page.
	pages, _, _ = b.walk(t, "/v1/devices?limit=5")
	require.Len(t, pages, 5)
	// The largest limit, and an empty after (the start).
	pages, _, _ = b.walk(t, "/v1/devices?limit=10000&after=")
	require.Equal(t, [][]string{all}, pages)
}

func TestListDevicesOnlineFilterKeepsItInTheLink(t *testing.T) {
	t.Parallel()
	b := setupList(t, 25)
	for _, tc := range []struct {
		online string
		want   []string
	}{
		{"false", sortedIDs(25, func(i int) bool { return i%3 == 0 })},
		{"true", sortedIDs(25, func(i int) bool { return i%3 != 0 })},
	} {
		pages, totals, links := b.walk(t, "/v1/devices?online="+tc.online+"&limit=3")
		var got []string
		for i, p := range pages {
			got = append(got, p...)
			require.Equal(t, fmt.Sprint(len(tc.want)), totals[i], "the total counts the filter")
		}
		require.Equal(t, tc.want, got)
		for _, l := range links {
			require.Regexp(t, `^</v1/devices\?limit=3&after=device-\d+&online=`+tc.online+`>; rel="next"$`, l)
		}
	}
}

func TestListEmptyIsAnEmptyArray(t *testing.T) {
	t.Parallel()
	b := setupList(t, 0)
	for _, target := range []string{"/v1/devices", "/v1/devices?online=true", "/v1/devices?after=zzz", "/v1/grants"} {
		rec := b.get(t, target)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "[]", strings.TrimSpace(rec.Body.String()), target)
		require.Equal(t, "0", rec.Header().Get("X-Total-Count"))
		require.Empty(t, rec.Header().Get("Link"))
	}
	b2 := setupList(t, 4)
	rec := b2.get(t, "/v1/devices?after=device-9")
	require.Equal(t, "[]", strings.TrimSpace(rec.Body.String()), "past the end: an empty page")
	require.Equal(t, "4", rec.Header().Get("X-Total-Count"), "still the whole total")
}

func TestListRefusesBadParameters(t *testing.T) {
	t.Parallel()
	b := setupList(t, 5)
	before := b.get(t, "/v1/devices").Body.String()
	for _, tc := range []struct{ target, names string }{
		{"/v1/devices?limit=0", "limit"},
		{"/v1/devices?limit=10001", "limit"},
		{"/v1/devices?limit=-1", "limit"},
		{"/v1/devices?limit=ten", "limit"},
		{"/v1/devices?limit=1.5", "limit"},
		{"/v1/devices?limit=", "limit"},
		{"/v1/devices?limit=1&limit=2", "limit"},
		{"/v1/devices?online=yes", "online"},
		{"/v1/devices?online=", "online"},
		{"/v1/devices?online=true&online=false", "online"},
		{"/v1/devices?after=a%20b", "after"},
		{"/v1/devices?after=" + strings.Repeat("a", 201), "after"},
		{"/v1/devices?onlin=true", "onlin"}, // a misspelt filter never lists everything
		{"/v1/devices?offset=10", "offset"},
		{"/v1/grants?all=maybe", "all"},
		{"/v1/grants?online=true", "online"},
		{"/v1/grants?limit=99999", "limit"},
	} {
		rec := b.get(t, tc.target)
		require.Equal(t, http.StatusBadRequest, rec.Code, tc.target)
		var e apiwire.Error
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), rec.Body.String())
		require.Equal(t, "invalid_request", e.Code, tc.target)
		require.Contains(t, e.Message, "query parameter "+tc.names, tc.target)
		require.Empty(t, rec.Header().Get("X-Total-Count"))
		require.Empty(t, rec.Header().Get("Link"))
	}
	require.Equal(t, before, b.get(t, "/v1/devices").Body.String(), "nothing changed")
}

func TestListGrantsPages(t *testing.T) {
	t.Parallel()
	b := setupList(t, 0)
	var ids []string
	for i := 0; i < 5; i++ {
		g, _, err := b.st.CreateGrant(b.ctx, fmt.Sprintf("g-%02d", i), "agent", "restart", fmt.Sprintf("device-%d", i), "admin")
		require.NoError(t, err)
		ids = append(ids, g.GrantID)
	}
	_, err := b.st.RevokeGrant(b.ctx, "g-02", "admin")
	require.NoError(t, err)

	read := func(target string) ([]string, string, string) {
		rec := b.get(t, target)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var gs []apiwire.GrantView
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &gs))
		var got []string
		for _, g := range gs {
			got = append(got, g.GrantID)
		}
		return got, rec.Header().Get("X-Total-Count"), rec.Header().Get("Link")
	}
	got, total, link := read("/v1/grants?limit=2")
	require.Equal(t, []string{"g-00", "g-01"}, got)
	require.Equal(t, "4", total)
	require.Equal(t, `</v1/grants?limit=2&after=g-01>; rel="next"`, link)
	got, _, link = read("/v1/grants?limit=2&after=g-01")
	require.Equal(t, []string{"g-03", "g-04"}, got, "the revoked g-02 is left out")
	require.Empty(t, link)

	got, total, link = read("/v1/grants?all=1&limit=3")
	require.Equal(t, ids[:3], got)
	require.Equal(t, "5", total)
	require.Equal(t, `</v1/grants?limit=3&after=g-02&all=1>; rel="next"`, link, "the filter as given")
	got, _, _ = read("/v1/grants?all=true&limit=3&after=g-02")
	require.Equal(t, ids[3:], got)
}
