package client

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
)

// TestListDevicesFollowsEveryPage: 10,001 devices behind the real API and
// store, read at the default page (1,000) and at the largest (10,000):
// every device once, in id order, whatever the page size.
func TestListDevicesFollowsEveryPage(t *testing.T) {
	t.Parallel()
	const n = 10001
	path := filepath.Join(t.TempDir(), "c.db")
	st, err := backend.Open(context.Background(), store.Config{Path: path, Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	// 10,001 births through the store would be 10,001 commits; one
	// transaction of rows is the same table for the lists.
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	for i := 1; i <= n; i++ {
		_, err := tx.Exec(`INSERT INTO devices (device_id, online, seen, updated_at) VALUES (?, ?, 1, 0)`,
			fmt.Sprintf("device-%05d", i), i%4 != 0)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	require.NoError(t, db.Close())

	var requests atomic.Int64
	h := api.New(api.Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c := New(srv.URL, "")

	devs, err := c.Devices(t.Context())
	require.NoError(t, err)
	require.Len(t, devs, n)
	for i, d := range devs {
		require.Equal(t, fmt.Sprintf("device-%05d", i+1), d.DeviceID)
	}
	require.EqualValues(t, 11, requests.Swap(0), "ten pages of 1,000 and one of 1")

	devs, err = c.ListDevices(t.Context(), DeviceQuery{Limit: 10000})
	require.NoError(t, err)
	require.Len(t, devs, n)
	require.EqualValues(t, 2, requests.Load())

	off := false
	devs, err = c.ListDevices(t.Context(), DeviceQuery{Online: &off, Limit: 999})
	require.NoError(t, err)
	require.Len(t, devs, n/4)
	for _, d := range devs {
		require.False(t, d.Online)
	}

	page, p, err := c.DevicesPage(t.Context(), "/v1/devices?limit=3&online=true")
	require.NoError(t, err)
	require.Len(t, page, 3)
	require.EqualValues(t, n-n/4, p.Total)
	require.Equal(t, "/v1/devices?limit=3&after=device-00003&online=true", p.Next)
}

func TestNextPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		links []string
		want  string
		err   bool
	}{
		{nil, "", false},
		{[]string{`</v1/devices?limit=2&after=d-2>; rel="next"`}, "/v1/devices?limit=2&after=d-2", false},
		{[]string{`</v1/devices?after=d-0>; rel="prev", </v1/devices?after=d-2>; rel=next`}, "/v1/devices?after=d-2", false},
		{[]string{`</v1/devices?after=d-0>; rel="prev"`, `</v1/x?after=a,b>; title="a, b"; rel="last next"`}, "/v1/x?after=a,b", false},
		{[]string{`<?limit=2&after=d-2>; rel="next"`}, "/v1/devices?limit=2&after=d-2", false},
		{[]string{`<https://elsewhere.example/v1/devices>; rel="next"`}, "", true},
		{[]string{`<//elsewhere.example/v1/devices>; rel="next"`}, "", true},
	} {
		got, err := nextPath("/v1/devices?limit=2", tc.links)
		if tc.err {
			require.Error(t, err, tc.links)
			continue
		}
		require.NoError(t, err, tc.links)
		require.Equal(t, tc.want, got, tc.links)
	}
}

func TestListStopsOnALinkThatDoesNotAdvance(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", `</v1/devices?after=d-1>; rel="next"`)
		_, _ = w.Write([]byte(`[{"device_id":"d-1"}]`))
	}))
	t.Cleanup(srv.Close)
	devs, err := New(srv.URL, "").Devices(t.Context())
	require.ErrorContains(t, err, "do not advance")
	require.Len(t, devs, 2, "the pages read before the loop was seen")
}
