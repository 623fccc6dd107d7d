package rollout

import (
	"errors"
	"testing"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/stretchr/testify/require"
)

// A limit given as 0 is refused, naming it; absent or null is the default,
// which Validate fills.
func TestCheckGivenLimits(t *testing.T) {
	for body, field := range map[string]string{
		`{"max_per_minute":0}`:                   "max_per_minute",
		`{"max_in_flight":0}`:                    "max_in_flight",
		`{"max_in_flight":3,"max_per_minute":0}`: "max_per_minute",
	} {
		err := CheckGivenLimits([]byte(body))
		require.True(t, errors.Is(err, domain.ErrInvalid), "%s: %v", body, err)
		require.ErrorContains(t, err, field+" 0", body)
	}
	for _, body := range []string{`{}`, `{"max_per_minute":null,"max_in_flight":null}`, `{"max_per_minute":1,"max_in_flight":1}`} {
		require.NoError(t, CheckGivenLimits([]byte(body)), body)
	}
	var s Spec
	require.NoError(t, s.Validate())
	require.Equal(t, DefaultMaxPerMinute, s.MaxPerMinute)
	require.Equal(t, DefaultMaxInFlight, s.MaxInFlight)
}
