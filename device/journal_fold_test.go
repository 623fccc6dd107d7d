package device

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// foldCompactAt makes a journal rotate and fold every few dozen records.
const foldCompactAt = 4 << 10

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

// foldFleet appends records of a few devices to a journal and remembers
// each device's last one.
type foldFleet struct {
	t    *testing.T
	j    *Journal
	n    int
	last map[string]int
}

func newFoldFleet(t *testing.T, j *Journal) *foldFleet {
	return &foldFleet{t: t, j: j, last: map[string]int{}}
}

const foldDevices = 20

// round appends one record of every device, each in a batch of its own,
// and waits until each is committed.
func (f *foldFleet) round() {
	f.t.Helper()
	for i := range foldDevices {
		dev := fmt.Sprintf("dev-%d", i)
		f.n++
		b, err := f.j.state(foldEntry(dev, f.n))
		require.NoError(f.t, err)
		requireCommitted(f.t, b)
		f.last[dev] = f.n
	}
}

// requireCommitted waits for a batch, up to a deadline: a writer stalled
// behind a fold fails the test instead of hanging it.
func requireCommitted(t *testing.T, b *batch) {
	t.Helper()
	select {
	case <-b.done:
		require.NoError(t, b.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was not committed within 10s: the writer is stalled")
	}
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

// folding reports whether a rotated generation is still open (its fold
// runs, failed or was stopped).
func folding(j *Journal) bool {
	j.idx.RLock()
	defer j.idx.RUnlock()
	return j.old != nil
}

// foldGate blocks (or fails) the fsyncs of snapshot files, which only a
// fold writes, while the journal's own fsyncs go through.
type foldGate struct {
	blocked chan string // a snapshot fsync waits
	release chan struct{}
	once    sync.Once
	failing atomic.Bool
	failed  atomic.Int64
}

func newFoldGate() *foldGate {
	return &foldGate{blocked: make(chan string, 1), release: make(chan struct{})}
}

// openFoldJournal opens a journal that rotates every few dozen records,
// its snapshot fsyncs through the gate.
func openFoldJournal(t *testing.T, dir string, g *foldGate) *Journal {
	t.Helper()
	j, err := OpenJournal(dir, &JournalOptions{CompactAt: foldCompactAt, SyncHook: g.hook})
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() }) // nothing if the test closed or abandoned it
	t.Cleanup(g.open)               // first: a blocked fold ends
	return j
}

func (g *foldGate) hook(file string) error {
	if !strings.HasSuffix(file, ".json.tmp") {
		return nil
	}
	if g.failing.Load() {
		g.failed.Add(1)
		return errors.New("injected snapshot fsync failure")
	}
	select {
	case g.blocked <- file:
	default:
	}
	<-g.release
	return nil
}

func (g *foldGate) open() { g.once.Do(func() { close(g.release) }) }

// heldFold opens a journal in a directory of its own and appends rounds
// until a fold is held in the gate's snapshot fsyncs.
func heldFold(t *testing.T) (dir string, j *Journal, g *foldGate, f *foldFleet) {
	t.Helper()
	dir = t.TempDir()
	g = newFoldGate()
	j = openFoldJournal(t, dir, g)
	f = newFoldFleet(t, j)
	f.appendUntilBlocked(g)
	return dir, j, g, f
}

// appendUntilBlocked appends rounds until a fold is blocked in the gate.
func (f *foldFleet) appendUntilBlocked(g *foldGate) {
	f.t.Helper()
	for range 100 {
		f.round()
		select {
		case file := <-g.blocked:
			require.True(f.t, strings.HasPrefix(filepath.Base(file), "dev-"), file)
			return
		default:
		}
	}
	f.t.Fatal("no fold started")
}

// While a fold writes the snapshots, batches go on committing (the fold
// used to run on the writer and stall every device for seconds), no second
// rotation starts, and loads see every record; once it ends, more folds
// follow, and everything loads back, before and after Close.
func TestJournalFoldsInTheBackground(t *testing.T) {
	dir, j, g, f := heldFold(t)
	require.Len(t, journalFiles(t, dir), 2, "rotated: the old file is folding, the new one written")
	for range 5 { // past the threshold again, several times over
		f.round()
	}
	j.idx.RLock()
	old := j.old.file.Name()
	j.idx.RUnlock()
	files := journalFiles(t, dir)
	require.Len(t, files, 2, "no second rotation while a fold runs")
	for _, name := range files {
		if name != old {
			fi, err := os.Stat(name)
			require.NoError(t, err)
			require.Greater(t, fi.Size(), int64(foldCompactAt), "the current file grew past the threshold")
		}
	}
	requireLatest(t, j, f.last)
	_, err := os.Stat(statePath(dir, "dev-0"))
	require.ErrorIs(t, err, fs.ErrNotExist, "the fold's snapshots are not visible yet")

	g.open()
	require.Eventually(t, func() bool { return !folding(j) }, 10*time.Second, 5*time.Millisecond)
	_, err = os.Stat(statePath(dir, "dev-0"))
	require.NoError(t, err, "the fold's snapshots are visible")
	requireLatest(t, j, f.last)

	for range 20 { // several more thresholds, folds
		f.round()
	}
	require.LessOrEqual(t, len(journalFiles(t, dir)), 2)
	requireLatest(t, j, f.last)

	require.NoError(t, j.Close())
	require.Empty(t, journalFiles(t, dir))
	j, err = OpenJournal(dir, nil)
	require.NoError(t, err)
	defer j.Close()
	requireLatest(t, j, f.last)
}

// A crash while a fold waits for its snapshots' fsyncs: abandon stops it
// before its renames, and the next OpenJournal folds both files, the old
// one first.
func TestJournalCrashDuringFold(t *testing.T) {
	dir, j, g, f := heldFold(t)
	f.round()
	f.round()

	abandoned := make(chan struct{})
	go func() {
		defer close(abandoned)
		j.abandon()
	}()
	require.Eventually(t, func() bool {
		j.idx.RLock()
		defer j.idx.RUnlock()
		return j.foldStop
	}, 10*time.Second, 5*time.Millisecond)
	g.open()
	select {
	case <-abandoned:
	case <-time.After(10 * time.Second):
		t.Fatal("abandon did not return")
	}
	require.Len(t, journalFiles(t, dir), 2, "both files are left")
	_, err := os.Stat(statePath(dir, "dev-0"))
	require.ErrorIs(t, err, fs.ErrNotExist, "the stopped fold renamed nothing")

	j, err = OpenJournal(dir, nil)
	require.NoError(t, err)
	requireLatest(t, j, f.last)
	require.NoError(t, j.Close())
	require.Empty(t, journalFiles(t, dir))
}

// A fold that fails keeps its file and its records in the index: batches
// commit, loads see everything, a crash then loses nothing, and once the
// fault is gone the fold is tried again and succeeds.
func TestJournalFailedFold(t *testing.T) {
	setup := func(t *testing.T) (string, *Journal, *foldGate, *foldFleet) {
		dir := t.TempDir()
		g := newFoldGate()
		g.failing.Store(true)
		j := openFoldJournal(t, dir, g)
		f := newFoldFleet(t, j)
		for i := 0; g.failed.Load() == 0; i++ {
			require.Less(t, i, 100, "no fold started")
			f.round()
		}
		f.round()
		f.round()
		requireLatest(t, j, f.last)
		return dir, j, g, f
	}

	t.Run("crash", func(t *testing.T) {
		dir, j, _, f := setup(t)
		j.abandon()
		require.Len(t, journalFiles(t, dir), 2, "the failed fold's file is kept")
		j, err := OpenJournal(dir, nil)
		require.NoError(t, err)
		requireLatest(t, j, f.last)
		require.NoError(t, j.Close())
		require.Empty(t, journalFiles(t, dir))
	})

	t.Run("retried", func(t *testing.T) {
		dir, j, g, f := setup(t)
		g.failing.Store(false)
		g.open()
		deadline := time.Now().Add(10 * time.Second)
		for folding(j) { // a commit past the threshold, after foldRetryWait, folds it again
			require.True(t, time.Now().Before(deadline), "the failed fold was not tried again")
			f.round()
		}
		requireLatest(t, j, f.last)
		require.LessOrEqual(t, len(journalFiles(t, dir)), 2)
		require.NoError(t, j.Close())
		require.Empty(t, journalFiles(t, dir))
		j, err := OpenJournal(dir, nil)
		require.NoError(t, err)
		requireLatest(t, j, f.last)
		require.NoError(t, j.Close())
	})
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
