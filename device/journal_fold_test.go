package device

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// foldEntry is record n of a device: every fifth a whole record, the others
// deltas; each sets the session, the app state and the claim "op" to n.
func foldEntry(dev string, n int) journalEntry {
	app := json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":%q}`, n, strings.Repeat("x", 100)))
	ops := map[string]string{"op": strconv.Itoa(n)}
	if n%5 == 0 {
		st := newState(dev)
		st.Session, st.App, st.Operations = int64(n), app, ops
		return journalEntry{Device: dev, Full: st}
	}
	return journalEntry{Device: dev, Delta: &delta{Session: int64(n), App: app, Operations: ops}}
}

// requireLatest checks that every device loads as its last record.
func requireLatest(t *testing.T, j *Journal, last map[string]int) {
	t.Helper()
	require.NotEmpty(t, last)
	for dev, n := range last {
		st, err := j.load(dev)
		require.NoError(t, err)
		var app json.RawMessage // a Full record's or a delta's: the same
		if want := foldEntry(dev, n); want.Full != nil {
			app = want.Full.App
		} else {
			app = want.Delta.App
		}
		require.Equal(t, int64(n), st.Session, dev)
		require.JSONEq(t, string(app), string(st.App), dev)
		require.Equal(t, map[string]string{"op": strconv.Itoa(n)}, st.Operations, dev)
	}
}

func journalFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"+journalExt))
	require.NoError(t, err)
	return names
}

// Two generations of one process are folded in the order they were
// written, by their nanos as numbers, not by their names as strings.
func TestOpenJournalRecoversGenerationsInWriteOrder(t *testing.T) {
	dir := t.TempDir()
	pid := os.Getpid() + 1 // a process that is gone: nobody holds the locks
	older := fmt.Sprintf("%d-999%s", pid, journalExt)
	newer := fmt.Sprintf("%d-1000%s", pid, journalExt)
	require.Less(t, newer, older, "the names sort the wrong way as strings")
	write := func(name string, es ...journalEntry) {
		var b []byte
		for _, e := range es {
			line, err := json.Marshal(e)
			require.NoError(t, err)
			b = append(append(b, line...), '\n')
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	write(older, foldEntry("dev-1", 1), foldEntry("dev-2", 2))
	write(newer, foldEntry("dev-1", 3))

	j, err := OpenJournal(dir, nil)
	require.NoError(t, err)
	defer j.Close()
	requireLatest(t, j, map[string]int{"dev-1": 3, "dev-2": 2})
	left := journalFiles(t, dir)
	require.Len(t, left, 1, "both folded and removed; the new one is open")
	pidOf, _ := parseJournalName(left[0])
	require.Equal(t, os.Getpid(), pidOf)
}
