package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/store/sqlite"
)

// walFile reads the SQLite WAL beside the store's file: its size, and the
// checkpoint sequence number of its header (bytes 12 to 15), which grows by
// one each time the WAL begins again from its start.
func walFile(t *testing.T, b *testBundle) (size int64, seq uint32) {
	t.Helper()
	f, err := os.Open(b.s.dsn + "-wal")
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	var h [16]byte
	_, err = f.ReadAt(h[:], 0)
	require.NoError(t, err)
	return st.Size(), binary.BigEndian.Uint32(h[12:])
}

// checkpointed says every page of the database is in its file: what a
// reader sees (pages of the WAL included) is the file's size.
func checkpointed(t *testing.T, b *testBundle) bool {
	t.Helper()
	var size int64
	require.NoError(t, b.s.r.QueryRowContext(b.ctx, `SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`).Scan(&size))
	st, err := os.Stat(b.s.dsn)
	require.NoError(t, err)
	return st.Size() == size
}

// The WAL is copied into the database beside the writer: a few operations
// (far fewer frames than the writer's own threshold) are in the file
// within the checkpoints' interval, with the writer idle.
func TestWALIsCheckpointedBesideTheWriter(t *testing.T) {
	t.Parallel()
	b := setupConfig(t, "sqlite", func(c *Config) { c.CheckpointEvery = 20 * time.Millisecond })
	for i := range 30 {
		_, err := b.s.Submit(b.ctx, newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil)
		require.NoError(t, err)
	}
	size, _ := walFile(t, b)
	require.Less(t, size, int64(sqlite.WriterCheckpointFrames)*4096, "the writer's own threshold is far off")
	require.Eventually(t, func() bool { return checkpointed(t, b) }, 10*time.Second, 10*time.Millisecond,
		"no checkpoint beside the writer copied the WAL into the file")
}

// Without the checkpoints beside it (or while they fall behind), the
// writer's own checkpoints bound the WAL: it begins again from its start,
// twice, and its file never grows much past WriterCheckpointFrames.
func TestWriterBoundsTheWALWithoutCheckpointsBeside(t *testing.T) {
	t.Parallel()
	b := setupConfig(t, "sqlite", func(c *Config) { c.CheckpointEvery = -1 })
	limit := int64(sqlite.WriterCheckpointFrames+2000) * (4096 + 24)
	_, seq0 := walFile(t, b)
	for i := 0; ; i++ {
		require.Less(t, i, 20000, "the WAL never began again")
		_, err := b.s.Submit(b.ctx, newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil)
		require.NoError(t, err)
		size, seq := walFile(t, b)
		require.LessOrEqual(t, size, limit, "after %d operations", i+1)
		if seq >= seq0+2 {
			break
		}
	}
}
