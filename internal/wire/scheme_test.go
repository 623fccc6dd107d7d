package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// CheckScheme takes exactly the schemes PlainScheme and TLSScheme name,
// and its refusal lists every one of them.
func TestCheckSchemeNamesEveryScheme(t *testing.T) {
	all := []string{"tcp", "mqtt", "ssl", "tls", "mqtts", "tcps"}
	for _, s := range all {
		require.NoError(t, CheckScheme(s), s)
		require.NotEqual(t, PlainScheme(s), TLSScheme(s), "%s is one or the other", s)
	}
	for _, s := range []string{"ws", "wss", "http", "", "TCP"} {
		require.False(t, PlainScheme(s) || TLSScheme(s), s)
		err := CheckScheme(s)
		require.Error(t, err, s)
		for _, ok := range all {
			require.Contains(t, err.Error(), ok+"://")
		}
	}
}
