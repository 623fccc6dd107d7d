package verify

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/store"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// evenly spaced starts of n devices, each operation ending after took.
func spaced(n int, every, took time.Duration) (store.AuditRollout, []domain.Event) {
	r := store.AuditRollout{RolloutID: "fw", MaxPerMinute: 60, MaxInFlight: 2}
	var evs []domain.Event
	for i := 0; i < n; i++ {
		op := fmt.Sprintf("fw:rollout:device-%d:v1", i)
		at := t0.Add(time.Duration(i) * every)
		r.Starts = append(r.Starts, store.AuditRolloutStart{DeviceID: fmt.Sprintf("device-%d", i), OperationID: op, Attempt: 1, At: at})
		evs = append(evs, domain.Event{Machine: "operation", EntityID: op, From: "started", To: "succeeded", At: at.Add(took)})
	}
	return r, evs
}

func TestInvariant8(t *testing.T) {
	_, ok := (&run{}).rollouts(nil)
	require.False(t, ok, "no rollout: no verdict")

	good, evs := spaced(30, 1050*time.Millisecond, 1500*time.Millisecond)
	v, ok := (&run{events: evs}).rollouts([]store.AuditRollout{good})
	require.True(t, ok)
	require.True(t, v.OK, v.Detail)
	require.Equal(t, 8, v.N)

	fast, evs := spaced(30, 500*time.Millisecond, 100*time.Millisecond)
	v, _ = (&run{events: evs}).rollouts([]store.AuditRollout{fast})
	require.False(t, v.OK, "20 starts in 10 s at 60/min")
	require.Contains(t, v.Detail, "starts within 10s (max 10)")

	slow, evs := spaced(10, 1050*time.Millisecond, 5*time.Second)
	v, _ = (&run{events: evs}).rollouts([]store.AuditRollout{slow})
	require.False(t, v.OK, "5 s actions every 1.05 s: 5 in flight, max 2")
	require.Contains(t, v.Detail, "in flight")

	twice, evs := spaced(3, 2*time.Second, time.Second)
	twice.Starts = append(twice.Starts, store.AuditRolloutStart{DeviceID: "device-0", OperationID: "fw:rollout:device-0:v1", Attempt: 2, At: t0.Add(9 * time.Second)})
	v, _ = (&run{events: evs}).rollouts([]store.AuditRollout{twice})
	require.False(t, v.OK, "a second start without a retryable outcome")
	twice.Retries = 1
	evs = append(evs, domain.Event{Machine: "operation", EntityID: "fw:rollout:device-0:v1", From: "started", To: "failed_retryable", At: t0.Add(5 * time.Second)})
	v, _ = (&run{events: evs}).rollouts([]store.AuditRollout{twice})
	require.True(t, v.OK, "a retry: %s", v.Detail)
}
