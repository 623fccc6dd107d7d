package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"
)

// The tests of this file share the VFS's process-wide counters and its
// injected failures: none of them runs in parallel.

func openGathered(t *testing.T, path string) (w, r *sql.DB) {
	t.Helper()
	w, r, err := New().Open(context.Background(), path, 2)
	require.NoError(t, err)
	t.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}

// newGathered opens a new file through the VFS, with the table t.
func newGathered(t *testing.T) (path string, w, r *sql.DB) {
	t.Helper()
	require.Zero(t, gatherErr, "the VFS is registered")
	path = filepath.Join(t.TempDir(), "db.sqlite")
	w, r = openGathered(t, path)
	// The VFS relies on it (gather.go): SQLite syncs, and so writes out
	// what is gathered, at every commit before other connections read it.
	var sync int
	require.NoError(t, w.QueryRow(`PRAGMA synchronous`).Scan(&sync))
	require.Equal(t, 2, sync, "the writer runs with synchronous=FULL")
	_, err := w.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`)
	require.NoError(t, err)
	return path, w, r
}

func integrityOK(t *testing.T, db *sql.DB) {
	t.Helper()
	var res string
	require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&res))
	require.Equal(t, "ok", res)
}

// insertRows commits one transaction of n rows of 1 KiB on the writer.
func insertRows(w *sql.DB, from, n int) error {
	tx, err := w.Begin()
	if err != nil {
		return err
	}
	for i := from; i < from+n; i++ {
		if _, err := tx.Exec(`INSERT INTO t (id, v) VALUES (?, ?)`, i, strings.Repeat("x", 1024)); err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

// A commit's frames reach the WAL in one write, not two a frame, and what
// they hold is what SQLite wrote: the readers and a new connection read
// every row, and the file is intact.
func TestWALWritesAreGathered(t *testing.T) {
	path, w, r := newGathered(t)

	wal0, file0 := gatherCounts()
	const commits, rows = 40, 30 // 30 KiB a commit: about 10 frames
	for c := range commits {
		require.NoError(t, insertRows(w, c*rows, rows))
	}
	wal, file := gatherCounts()
	wal, file = wal-wal0, file-file0
	t.Logf("%d commits: SQLite's writes to the WAL %d, writes that reached it %d", commits, wal, file)
	require.GreaterOrEqual(t, wal, int64(commits*2*5), "SQLite wrote each frame in two writes, at least five frames a commit")
	require.LessOrEqual(t, file, int64(commits), "at most one write a commit reached the file")

	// A commit larger than the buffer, and than the default VFS writes in
	// one call (128 KiB): about 500 frames.
	wal0, file0 = gatherCounts()
	const big = 2000
	require.NoError(t, insertRows(w, commits*rows, big))
	wal, file = gatherCounts()
	wal, file = wal-wal0, file-file0
	t.Logf("one commit of %d rows: SQLite's writes to the WAL %d, writes that reached it %d", big, wal, file)
	require.GreaterOrEqual(t, wal, int64(2*400))
	require.LessOrEqual(t, file, wal/2/25, "at least 25 frames a write")

	var n int
	require.NoError(t, r.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, commits*rows+big, n, "a reader reads every committed row")
	integrityOK(t, w)

	// The WAL as it is on disk, read by a connection of the default VFS.
	other, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, commits*rows+big, n, "a connection without the VFS reads every row")
	integrityOK(t, other)
}

// A write of the gathered frames that fails fails the commit (at its sync):
// nothing of the transaction is read afterwards, the writer goes on, and
// the file is intact.
func TestAFailedGatheredWriteFailsTheCommit(t *testing.T) {
	path, w, r := newGathered(t)
	require.NoError(t, insertRows(w, 0, 10))

	gatherFailWrites(1)
	t.Cleanup(func() { gatherFailWrites(0) })
	err := insertRows(w, 10, 10)
	require.Error(t, err, "the commit whose frames could not be written fails")
	var se sqlite3.Error
	require.True(t, errors.As(err, &se), "%v", err)
	require.Equal(t, sqlite3.ErrIoErr, se.Code, "%v", err)

	var n int
	require.NoError(t, w.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 10, n, "the writer reads nothing of the failed commit")
	require.NoError(t, r.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 10, n, "a reader reads nothing of the failed commit")

	require.NoError(t, insertRows(w, 10, 10), "the same rows go in at the next try")
	require.NoError(t, r.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 20, n)
	integrityOK(t, w)

	// And they are in the file: after the writer closes, a new one reads them.
	require.NoError(t, w.Close())
	require.NoError(t, r.Close())
	w2, _ := openGathered(t, path)
	require.NoError(t, w2.QueryRow(`SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 20, n)
	integrityOK(t, w2)
}
