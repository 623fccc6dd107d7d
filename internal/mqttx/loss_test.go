package mqttx

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// A lost connection is classified once its reconnect is known, whichever
// of the two paho reports first.
func TestLossWatch(t *testing.T) {
	t.Parallel()
	refused := errors.New("dial tcp 127.0.0.1:1883: connect: connection refused")
	for _, tc := range []struct {
		err      error
		attempts int
		want     Loss
	}{
		{io.EOF, 1, LossTakenOver},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), 1, LossTakenOver},
		{io.EOF, 4, LossClosed},
		{errors.New("pingresp not received, disconnecting"), 1, LossError},
		{refused, 3, LossError},
	} {
		for _, lossFirst := range []bool{true, false} {
			var w lossWatch
			_, ok := w.connected()
			require.False(t, ok, "the first connection lost nothing")
			var got Loss
			if lossFirst {
				_, ok = w.lost(tc.err)
				require.False(t, ok)
				for range tc.attempts {
					w.attempt()
				}
				got, ok = w.connected()
			} else {
				for range tc.attempts {
					w.attempt()
				}
				_, ok = w.connected()
				require.False(t, ok)
				got, ok = w.lost(tc.err)
			}
			require.True(t, ok)
			require.Equal(t, tc.want, got, "%v after %d attempts (loss first: %v)", tc.err, tc.attempts, lossFirst)
			// Nothing left over for the next pair.
			_, ok = w.connected()
			require.False(t, ok)
		}
	}
	var w lossWatch
	require.True(t, w.failed(refused))
	require.False(t, w.failed(refused), "said once")
	require.True(t, w.failed(errors.New("not Authorized")))
	w.connected()
	require.True(t, w.failed(refused), "again after a connect")
}
