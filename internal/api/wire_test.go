package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
)

// TestPageLimitsAreTheStores: the limits callers see in apiwire are the
// ones the store pages by (a ?limit= the API accepts is never clamped).
func TestPageLimitsAreTheStores(t *testing.T) {
	require.Equal(t, store.MaxPageLimit, apiwire.MaxPageLimit)
	require.Equal(t, store.DefaultPageLimit, apiwire.DefaultPageLimit)
	require.Equal(t, rollout.DefaultMaxPerMinute, apiwire.DefaultMaxPerMinute)
	require.Equal(t, rollout.DefaultMaxInFlight, apiwire.DefaultMaxInFlight)
}

// TestStepsConvertAtTheEdge: a plan crosses between the API's and the
// store's form unchanged, and an absent plan stays absent (null), an
// empty one empty ([]), as when the store's type was sent as it is.
func TestStepsConvertAtTheEdge(t *testing.T) {
	steps := []domain.Step{{Step: "s1", Action: "restart", Target: "device-1", Params: json.RawMessage(`{"a":1}`)},
		{Step: "s2", Action: "set-config", Target: "device-2"}}
	require.Equal(t, steps, storeSteps(wireSteps(steps)))
	for _, in := range [][]domain.Step{nil, {}, steps} {
		want, err := json.Marshal(in)
		require.NoError(t, err)
		got, err := json.Marshal(wireSteps(in))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	}
	require.Nil(t, storeSteps(nil))
	require.NotNil(t, storeSteps([]apiwire.Step{}))
}
