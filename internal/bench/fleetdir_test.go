package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// By default the fleet's files go to /dev/shm when it is a tmpfs, and to
// the run's directory when it is not; a FleetDir given is used as is.
func TestTheFleetsFilesStayOffTheDiskWhereTheyCan(t *testing.T) {
	fallback := t.TempDir()
	byDefault, err := makeFleetDir("", fallback)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(byDefault)) })
	if Storage(shm) == "tmpfs" {
		require.Equal(t, shm, filepath.Dir(byDefault))
		require.Equal(t, "tmpfs", Storage(byDefault))
	} else {
		require.Equal(t, fallback, filepath.Dir(byDefault))
	}

	given := t.TempDir()
	d, err := makeFleetDir(given, fallback)
	require.NoError(t, err)
	require.Equal(t, given, filepath.Dir(d))
	require.Equal(t, Storage(given), Storage(d))
}
