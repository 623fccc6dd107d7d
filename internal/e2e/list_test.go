package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
)

// TestDevicesListPaged: 25 devices, five of them offline, listed by the real
// controller ten at a time: the Link headers lead through every device
// exactly once, X-Total-Count counts the filter, and online=true|false
// splits the fleet; the CLI binary follows the same pages.
func TestDevicesListPaged(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 25})
	var all, offline, online []string
	for i := 1; i <= 25; i++ {
		id := fmt.Sprintf("device-%d", i)
		all = append(all, id)
		if i%5 == 0 {
			offline = append(offline, id)
		} else {
			online = append(online, id)
		}
	}
	for _, id := range offline {
		b.fleet.Device(id).DropConnection(0)
	}
	for _, id := range offline {
		b.waitDevice(id, false)
	}
	sort.Strings(all)

	// walk follows the Link headers from path; it returns the ids in the
	// order read, the number of pages and each page's X-Total-Count.
	walk := func(path string) (ids []string, pages int, totals []int64) {
		for path != "" {
			devs, p, err := b.client.DevicesPage(b.ctx(), path)
			require.NoError(t, err)
			require.LessOrEqual(t, len(devs), 10)
			for _, d := range devs {
				ids = append(ids, d.DeviceID)
			}
			pages++
			totals = append(totals, p.Total)
			path = p.Next
		}
		return ids, pages, totals
	}
	ids, pages, totals := walk("/v1/devices?limit=10")
	require.Equal(t, all, ids, "every device exactly once, in id order")
	require.Equal(t, 3, pages)
	require.Equal(t, []int64{25, 25, 25}, totals)

	ids, pages, totals = walk("/v1/devices?limit=10&online=true")
	require.ElementsMatch(t, online, ids)
	require.Len(t, ids, 20)
	require.Equal(t, 2, pages, "20 online devices: two full pages, no empty third")
	require.Equal(t, []int64{20, 20}, totals)
	ids, _, totals = walk("/v1/devices?limit=10&online=false")
	require.ElementsMatch(t, offline, ids)
	require.Equal(t, []int64{5}, totals)

	// A bad limit is refused with the API's code.
	_, _, err := b.client.DevicesPage(b.ctx(), "/v1/devices?limit=10001")
	require.Equal(t, "invalid_request", client.Code(err), "%v", err)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusBadRequest, e.Status)

	// The CLI binary reads every page.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"device", "list", "--page-size", "10", "--json"}, all},
		{[]string{"device", "list", "--page-size", "10", "--online", "true", "--json"}, online},
	} {
		out, err := b.run(tc.args...)
		require.NoError(t, err, out)
		var devs []apiwire.Device
		require.NoError(t, json.Unmarshal([]byte(out), &devs), out)
		got := []string{}
		for _, d := range devs {
			got = append(got, d.DeviceID)
		}
		require.ElementsMatch(t, tc.want, got, tc.args)
		require.Len(t, got, len(tc.want), "no device twice")
	}
}
