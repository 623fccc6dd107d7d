package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// SQLite's allocation statistics are off before the first connection: with
// them on, sqlite3_memory_used counts the pages and statements of an open
// database (hundreds of KB).
func TestAllocationStatisticsAreOff(t *testing.T) {
	require.Zero(t, memStatusErr, "sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0)")
	w, r, err := New().Open(context.Background(), filepath.Join(t.TempDir(), "db.sqlite"), 2)
	require.NoError(t, err)
	t.Cleanup(func() { w.Close(); r.Close() })
	_, err = w.Exec(`CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('a'), ('b')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, r.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 2, n)
	require.Zero(t, memoryUsed(), "bytes counted by SQLite")
}
