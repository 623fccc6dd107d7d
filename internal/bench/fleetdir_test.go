package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// By default the fleet's files go to the memory directory when it is a
// tmpfs, and to the run's directory when it is not; a FleetDir given is
// used as is.
func TestTheFleetsFilesStayOffTheDiskWhereTheyCan(t *testing.T) {
	require.Equal(t, "tmpfs", Storage(shm), "this test needs %s mounted as a tmpfs, as Debian does", shm)
	fallback := t.TempDir()

	inMemory, err := makeFleetDir("", shm, fallback)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(inMemory)) })
	require.Equal(t, shm, filepath.Dir(inMemory))
	require.Equal(t, "tmpfs", Storage(inMemory))

	// A memory directory that is not a tmpfs (the package's own, in the
	// checkout; only read here): the run's directory.
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.Equal(t, "disk", Storage(wd), "this test needs its checkout on a disk")
	onDisk, err := makeFleetDir("", wd, fallback)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(onDisk)) })
	require.Equal(t, fallback, filepath.Dir(onDisk))

	given := t.TempDir()
	d, err := makeFleetDir(given, shm, fallback)
	require.NoError(t, err)
	require.Equal(t, given, filepath.Dir(d))
}
