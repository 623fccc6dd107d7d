package metrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/store"
)

// changeSeconds is controller_store_change_seconds as gathered from m's
// registry: each change's sample count and sum.
func changeSeconds(t *testing.T, m *Metrics) map[string][2]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	require.NoError(t, err)
	out := map[string][2]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "controller_store_change_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			require.Len(t, s.GetLabel(), 1)
			require.Equal(t, "change", s.GetLabel()[0].GetName())
			h := s.GetHistogram()
			out[s.GetLabel()[0].GetValue()] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
		}
	}
	return out
}

// The change label takes the store's names, and both series are there
// before the first change, so that a reader of /metrics (make bench) finds
// them from the start.
func TestChangeSecondsHasTheStoresChangesFromTheStart(t *testing.T) {
	require.Equal(t, []string{store.ChangeSubmit, store.ChangeReceipts}, storeChanges)
	m := New()
	require.Equal(t, map[string][2]float64{store.ChangeSubmit: {0, 0}, store.ChangeReceipts: {0, 0}}, changeSeconds(t, m))

	m.Answered(store.ChangeSubmit, 3*time.Millisecond)
	m.Answered(store.ChangeReceipts, 5*time.Millisecond)
	m.Answered(store.ChangeReceipts, 7*time.Millisecond)
	got := changeSeconds(t, m)
	require.Equal(t, 1.0, got[store.ChangeSubmit][0])
	require.InDelta(t, 0.003, got[store.ChangeSubmit][1], 1e-9)
	require.Equal(t, 2.0, got[store.ChangeReceipts][0])
	require.InDelta(t, 0.012, got[store.ChangeReceipts][1], 1e-9)
}
