package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// openGuarded opens an SQLite store in a directory of its own, with the
// instance lock i1 held, and commits one operation.
func openGuarded(t *testing.T) (s *DB, inst *Instance, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "data", "c.db")
	require.NoError(t, os.Mkdir(filepath.Dir(path), 0o755))
	s, err := testOpen(context.Background(), Config{Path: path, Instance: "i1"})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	inst, err = s.LockInstance(context.Background(), "i1")
	require.NoError(t, err)
	t.Cleanup(inst.Close)
	_, err = s.Submit(context.Background(), newOp("op-before", "c-before"), nil)
	require.NoError(t, err)
	require.NoError(t, s.Err())
	return s, inst, path
}

// lostWithin waits for the instance's Lost, failing the test after d.
func lostWithin(t *testing.T, inst *Instance, d time.Duration) error {
	t.Helper()
	select {
	case err := <-inst.Lost():
		return err
	case <-time.After(d):
		t.Fatalf("Lost did not fire within %s", d)
		return nil
	}
}

// A file of the store that leaves its path makes the next commit fail
// (nothing acknowledged), Err report it, naming the path, and Lost fire;
// the store commits nothing more, even once the file is back.
func TestFileGuardRefusesCommitsOnceAFileLeavesItsPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		gone func(t *testing.T, path string) (named string, back func())
	}{
		{"directory removed", func(t *testing.T, path string) (string, func()) {
			require.NoError(t, os.RemoveAll(filepath.Dir(path)))
			return path, nil
		}},
		{"database renamed away", func(t *testing.T, path string) (string, func()) {
			require.NoError(t, os.Rename(path, path+".moved"))
			return path, func() { require.NoError(t, os.Rename(path+".moved", path)) }
		}},
		{"database replaced", func(t *testing.T, path string) (string, func()) {
			require.NoError(t, os.Rename(path, path+".moved"))
			require.NoError(t, os.WriteFile(path, nil, 0o644))
			return path, nil
		}},
		{"WAL removed", func(t *testing.T, path string) (string, func()) {
			require.NoError(t, os.Remove(path+"-wal"))
			return path + "-wal", nil
		}},
		{"instance lock removed", func(t *testing.T, path string) (string, func()) {
			lock := path + ".instance-i1.lock"
			require.NoError(t, os.Remove(lock))
			return lock, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, inst, path := openGuarded(t)
			named, back := tc.gone(t, path)

			_, err := s.Submit(context.Background(), newOp("op-after", "c-after"), nil)
			require.ErrorIs(t, err, ErrDatabaseLost, "a commit after the file left is refused")
			var be *BatchError
			require.True(t, errors.As(err, &be), "%v", err)
			require.ErrorContains(t, err, named)
			require.ErrorIs(t, s.Err(), ErrDatabaseLost)
			require.ErrorContains(t, lostWithin(t, inst, 5*time.Second), named)

			if back != nil {
				back()
			}
			_, err = s.Submit(context.Background(), newOp("op-later", "c-later"), nil)
			require.ErrorIs(t, err, ErrDatabaseLost, "refused for good")
		})
	}
}

// An idle store notices too, within a few of its checks.
func TestFileGuardNoticesWhileIdle(t *testing.T) {
	t.Parallel()
	s, inst, path := openGuarded(t)
	require.NoError(t, os.RemoveAll(filepath.Dir(path)))
	start := time.Now()
	err := lostWithin(t, inst, 3*guardInterval)
	require.ErrorIs(t, err, ErrDatabaseLost)
	require.ErrorContains(t, err, path)
	t.Logf("noticed after %s", time.Since(start).Round(time.Millisecond))
	require.ErrorIs(t, s.Err(), ErrDatabaseLost)
}

// A store whose files stay put is never reported lost, and closes cleanly.
func TestFileGuardQuietWhileFilesStay(t *testing.T) {
	t.Parallel()
	s, inst, _ := openGuarded(t)
	for i := range 20 {
		_, err := s.Submit(context.Background(), newOp("op-"+string(rune('a'+i)), "c-"+string(rune('a'+i))), nil)
		require.NoError(t, err)
	}
	require.NoError(t, s.Err())
	select {
	case err := <-inst.Lost():
		t.Fatalf("lost: %v", err)
	default:
	}
}

// BenchmarkFileGuardCheck is the cost of one check of an SQLite store with
// its instance lock (four stats), made twice per committed batch.
func BenchmarkFileGuardCheck(b *testing.B) {
	path := filepath.Join(b.TempDir(), "c.db")
	s, err := testOpen(context.Background(), Config{Path: path, Instance: "i1"})
	require.NoError(b, err)
	defer s.Close()
	inst, err := s.LockInstance(context.Background(), "i1")
	require.NoError(b, err)
	defer inst.Close()
	require.Len(b, s.files.files, 4)
	for b.Loop() {
		if err := s.files.check(); err != nil {
			b.Fatal(err)
		}
	}
}

// filesOpenUnder counts this process's descriptors open on files whose
// path begins with prefix (the database, its WAL and its shared memory).
func filesOpenUnder(t *testing.T, prefix string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, prefix) {
			n++
		}
	}
	return n
}

// An Open that fails (here at its first migration: the file holds a table
// of that name already) closes what it opened: no connection is left on
// the file.
func TestAFailedOpenLeavesNothingOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE operations (x)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Zero(t, filesOpenUnder(t, path))

	_, err = testOpen(context.Background(), Config{Path: path, Instance: "i1"})
	require.ErrorContains(t, err, "migration 0001")
	require.Zero(t, filesOpenUnder(t, path), "the failed Open's connections are closed")
}
