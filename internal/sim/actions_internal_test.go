package sim

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// restartResult is byte for byte what json.Marshal made of the result map.
func TestRestartResult(t *testing.T) {
	for _, n := range []int{0, 1, 2, 99, 1 << 40, -3} {
		want, err := json.Marshal(map[string]any{"restarted": true, "boots": n})
		require.NoError(t, err)
		require.Equal(t, string(want), string(restartResult(n)))
	}
}
