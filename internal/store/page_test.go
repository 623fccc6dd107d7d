package store

import (
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// addDevices applies a birth for each id, then an offline for those in offline.
func addDevices(t *testing.T, b *testBundle, ids []string, offline map[string]bool) {
	t.Helper()
	caps := &wire.Capabilities{Dedupe: true, Query: true}
	for _, id := range ids {
		_, err := b.s.ApplyPresence(b.ctx, id, wire.Presence{Online: true, Session: 1, Capabilities: caps})
		require.NoError(t, err)
		if offline[id] {
			_, err = b.s.ApplyPresence(b.ctx, id, wire.Presence{Online: false, Session: 1})
			require.NoError(t, err)
		}
	}
}

func numbered(n int) []string {
	ids := make([]string, 0, n)
	for i := 1; i <= n; i++ {
		ids = append(ids, fmt.Sprintf("device-%d", i))
	}
	return ids
}

// walkDevices follows Next from the start and returns every page's ids and
// the totals each page reported.
func walkDevices(t *testing.T, b *testBundle, f DeviceFilter, limit int) (pages [][]string, totals []int64) {
	t.Helper()
	p := Page{Limit: limit}
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "Next never ends")
		got, err := b.s.ListDevices(b.ctx, f, p)
		require.NoError(t, err)
		ids := []string{}
		for _, d := range got.Items {
			ids = append(ids, d.DeviceID)
		}
		pages, totals = append(pages, ids), append(totals, got.Total)
		if got.Next == "" {
			return pages, totals
		}
		require.Equal(t, ids[len(ids)-1], got.Next, "Next is the page's last id")
		p.After = got.Next
	}
}

func TestListDevicesEmpty(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		got, err := b.s.ListDevices(b.ctx, DeviceFilter{}, Page{})
		require.NoError(t, err)
		require.NotNil(t, got.Items, "an empty page is an empty slice, not nil")
		require.Empty(t, got.Items)
		require.Zero(t, got.Total)
		require.Empty(t, got.Next)
	})
}

func TestListDevicesPages(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		ids := numbered(25)
		addDevices(t, b, ids, nil)
		sorted := append([]string(nil), ids...)
		sort.Strings(sorted) // bytewise: device-1, device-10, ..., device-19, device-2, ...

		for _, tc := range []struct {
			limit int
			sizes []int
		}{
			{10, []int{10, 10, 5}},
			{5, []int{5, 5, 5, 5, 5}}, // an exact multiple: no empty last page
			{25, []int{25}},
			{1, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
			{0, []int{25}}, // the default limit
			{MaxPageLimit + 1, []int{25}},
		} {
			t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
				pages, totals := walkDevices(t, b, DeviceFilter{}, tc.limit)
				var all []string
				var sizes []int
				for i, p := range pages {
					sizes = append(sizes, len(p))
					all = append(all, p...)
					require.EqualValues(t, 25, totals[i], "the total on every page")
				}
				require.Equal(t, tc.sizes, sizes)
				require.Equal(t, sorted, all, "every device once, in id order")
			})
		}
	})
}

func TestListDevicesFilterAndPaging(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		ids := numbered(15)
		offline := map[string]bool{}
		var wantOff, wantOn []string
		for i, id := range ids {
			if i%3 == 0 {
				offline[id] = true
			}
		}
		addDevices(t, b, ids, offline)
		sort.Strings(ids)
		for _, id := range ids {
			if offline[id] {
				wantOff = append(wantOff, id)
			} else {
				wantOn = append(wantOn, id)
			}
		}
		on, off := true, false
		for _, tc := range []struct {
			online *bool
			want   []string
		}{{&off, wantOff}, {&on, wantOn}} {
			pages, totals := walkDevices(t, b, DeviceFilter{Online: tc.online}, 2)
			var all []string
			for i, p := range pages {
				require.LessOrEqual(t, len(p), 2)
				require.EqualValues(t, len(tc.want), totals[i], "the total counts the filter, not the table")
				all = append(all, p...)
			}
			require.Equal(t, tc.want, all)
			require.Len(t, pages, (len(tc.want)+1)/2)
		}
		got, err := b.s.ListDevices(b.ctx, DeviceFilter{Online: &off}, Page{Limit: 100})
		require.NoError(t, err)
		for _, d := range got.Items {
			require.False(t, d.Online)
		}
	})
}

func TestListDevicesAfterUnknownID(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		addDevices(t, b, []string{"a-1", "a-3", "a-5"}, nil)
		for _, tc := range []struct {
			after string
			want  []string
		}{
			{"a-2", []string{"a-3", "a-5"}}, // between two ids: starts at the next
			{"a-3", []string{"a-5"}},        // a known id: strictly after it
			{"0", []string{"a-1", "a-3", "a-5"}},
			{"a-5", []string{}},
			{"z", []string{}}, // past the end: an empty page, the total still counts
		} {
			got, err := b.s.ListDevices(b.ctx, DeviceFilter{}, Page{After: tc.after, Limit: 10})
			require.NoError(t, err)
			ids := []string{}
			for _, d := range got.Items {
				ids = append(ids, d.DeviceID)
			}
			require.Equal(t, tc.want, ids, "after %q", tc.after)
			require.EqualValues(t, 3, got.Total)
			require.Empty(t, got.Next)
		}
	})
}

func TestListGrantsPages(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		var ids []string
		for i := 0; i < 5; i++ {
			g, created, err := b.s.CreateGrant(b.ctx, fmt.Sprintf("g-%02d", i), "agent", "restart", fmt.Sprintf("device-%d", i), "admin")
			require.NoError(t, err)
			require.True(t, created)
			ids = append(ids, g.GrantID)
		}
		for _, id := range []string{"g-01", "g-03"} {
			_, err := b.s.RevokeGrant(b.ctx, id, "admin")
			require.NoError(t, err)
		}
		walk := func(f GrantFilter) (all []string, pages int) {
			p := Page{Limit: 2}
			for {
				got, err := b.s.ListGrants(b.ctx, f, p)
				require.NoError(t, err)
				pages++
				for _, g := range got.Items {
					all = append(all, g.GrantID)
					require.True(t, f.Revoked || g.RevokedAt == nil)
				}
				if f.Revoked {
					require.EqualValues(t, 5, got.Total)
				} else {
					require.EqualValues(t, 3, got.Total)
				}
				if got.Next == "" {
					return all, pages
				}
				p.After = got.Next
			}
		}
		live, pages := walk(GrantFilter{})
		require.Equal(t, []string{"g-00", "g-02", "g-04"}, live)
		require.Equal(t, 2, pages)
		all, pages := walk(GrantFilter{Revoked: true})
		require.Equal(t, ids, all)
		require.Equal(t, 3, pages)
	})
}

// TestListQueriesUseAnIndex: each page is a range of an index in its order
// (no table scan, no sort of the whole table), and a filtered count reads the
// index alone.
func TestListQueriesUseAnIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite")
	plan := func(q string, args ...any) string { return queryPlan(t, b, q, args...) }
	on := true
	count, page := deviceKeyset(DeviceFilter{Online: &on}).queries()
	p := plan(page, true, "", 11)
	require.Contains(t, p, "USING INDEX devices_online (online=? AND device_id>?)")
	require.NotContains(t, p, "TEMP B-TREE")
	require.Contains(t, plan(count, true), "USING COVERING INDEX devices_online (online=?)")

	_, page = deviceKeyset(DeviceFilter{}).queries()
	p = plan(page, "", 11)
	require.Contains(t, p, "(device_id>?)")
	require.NotContains(t, p, "TEMP B-TREE")

	_, page = grantKeyset(GrantFilter{}).queries()
	p = plan(page, "", 11)
	require.Contains(t, p, "(grant_id>?)")
	require.NotContains(t, p, "TEMP B-TREE")
}
