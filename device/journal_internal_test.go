package device

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// leftJournal writes a journal as a process (pid) that is gone or going
// would leave it, holding one record of device dev-1 (session 7), and
// takes its lock on a file description of its own, as that process's
// would still be held while it exits. release drops the lock.
func leftJournal(t *testing.T, dir string, pid int) (release func()) {
	t.Helper()
	name := filepath.Join(dir, fmt.Sprintf("%d-1%s", pid, journalExt))
	require.NoError(t, os.WriteFile(name, []byte(`{"d":"dev-1","delta":{"session":7}}`+"\n"), 0o644))
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	t.Cleanup(func() { f.Close() })
	return func() { f.Close() }
}

// A journal still locked for a moment by a process killed with kill -9
// (it is exiting) is waited for and folded: its records are not skipped.
func TestOpenJournalWaitsForAKilledProcesssLock(t *testing.T) {
	dir := t.TempDir()
	release := leftJournal(t, dir, os.Getpid()+1)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(300 * time.Millisecond) // the dying process lets go
		release()
	}()
	j, err := OpenJournal(dir, &JournalOptions{LockWait: 10 * time.Second})
	require.NoError(t, err)
	defer j.Close()
	<-released
	st, err := j.load("dev-1")
	require.NoError(t, err)
	require.Equal(t, int64(7), st.Session, "the left journal's record is folded")
}

// A lock that stays held fails OpenJournal loudly, naming the file.
func TestOpenJournalFailsOnALockThatStaysHeld(t *testing.T) {
	dir := t.TempDir()
	leftJournal(t, dir, os.Getpid()+1)
	start := time.Now()
	_, err := OpenJournal(dir, &JournalOptions{LockWait: 300 * time.Millisecond})
	require.ErrorContains(t, err, "still locked")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited")
	left, _ := filepath.Glob(filepath.Join(dir, "*"+journalExt))
	require.Len(t, left, 1, "the left journal is kept")
}

// A record saved with a side line (Hooks.SaveLine) is never durable
// without it: if the line cannot be made durable, the record is not
// written.
func TestSaveLineFailsItsRecord(t *testing.T) {
	dir := t.TempDir()
	side := filepath.Join(dir, "side.jsonl")
	var failing atomic.Bool
	failing.Store(true)
	j, err := OpenJournal(dir, &JournalOptions{SyncHook: func(file string) error {
		if failing.Load() && file == side {
			return errors.New("injected fsync failure")
		}
		return nil
	}})
	require.NoError(t, err)
	defer j.Close()

	b, err := j.stateWithLine(journalEntry{Device: "dev-1", Delta: &delta{Session: 3}}, side, []byte(`{"n":1}`))
	require.NoError(t, err)
	require.Error(t, b.wait(), "the batch failed with its line")
	st, err := j.load("dev-1")
	require.NoError(t, err)
	require.Zero(t, st.Session, "the record was not written")

	failing.Store(false)
	b, err = j.stateWithLine(journalEntry{Device: "dev-1", Delta: &delta{Session: 4}}, side, []byte(`{"n":2}`))
	require.NoError(t, err)
	require.NoError(t, b.wait())
	st, err = j.load("dev-1")
	require.NoError(t, err)
	require.Equal(t, int64(4), st.Session)
	lines, err := os.ReadFile(side)
	require.NoError(t, err)
	require.Contains(t, string(lines), `{"n":2}`+"\n")
}

// compact agrees with json.Compact on what it would leave as it is.
func TestCompact(t *testing.T) {
	for _, s := range []string{
		`{"a":1}`, `{"a": 1}`, "{\"a\":1}\n", `{"a":"x y"}`, `{"a":"x\" y"}`, `{"a":"x\\"," b":2}`,
		`{"a":"\\\\"}`, `{"a":"\\\\" }`, `{"a":[1,2,{"b":"c d"}]}`, "{\"a\":\t[]}", `{}`,
	} {
		var buf bytes.Buffer
		require.NoError(t, json.Compact(&buf, []byte(s)), s)
		require.Equal(t, buf.String() == s, compact([]byte(s)), s)
	}
}
