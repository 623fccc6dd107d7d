package device

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// journalExt ends the name of a journal file in a journal's directory.
const journalExt = ".journal"

// DefaultCompactAt is JournalOptions.CompactAt's default: the journal size
// past which the writer moves on to a new journal file and folds the old one
// into the devices' snapshot files in the background.
const DefaultCompactAt = 64 << 20

// foldRetryWait is how long the writer waits after a failed fold (or a new
// journal file it could not create) before it tries again.
const foldRetryWait = time.Second

// snapshotParallelism bounds the snapshot files written (and fsynced) at
// once when a journal is folded while nothing else is written (at open and
// at Close).
const snapshotParallelism = 32

// backgroundFoldParallelism is snapshotParallelism for a fold behind the
// writer: 32 snapshot fsyncs at once queue ahead of the journal's own on
// the disk. With 100 devices committing meanwhile, the worst commit wait
// was 351 to 718 ms with 32 and 132 to 158 ms with 1 or 2 (p99.9: 195 to
// 370 ms against 88 to 109 ms).
const backgroundFoldParallelism = 2

// ErrJournalClosed is returned for work handed to a closed Journal.
var ErrJournalClosed = errors.New("device: journal closed")

// ErrDeviceRunning is returned by Run when a device of the same id already
// runs on the same Journal.
var ErrDeviceRunning = errors.New("device: a device of this id already runs on this journal")

// JournalOptions tune a Journal. The zero value is right for firmware.
type JournalOptions struct {
	// Logger gets the writer's errors; nil logs nothing.
	Logger *slog.Logger
	// SyncHook, for tests and simulators, runs before every fsync with the
	// file's name; an error fails the fsync (and the batch).
	SyncHook func(file string) error
	// CompactAt is the journal size past which the writer moves on to a
	// new journal file and folds the old one into the snapshot files in the
	// background (DefaultCompactAt when 0).
	CompactAt int64
	// LockWait is how long OpenJournal waits for the lock of a journal
	// another process left in the directory (default 5s): a process killed
	// a moment ago may still hold it while it exits.
	LockWait time.Duration
}

// defaultLockWait is JournalOptions.LockWait's default.
const defaultLockWait = 5 * time.Second

// Journal is the durable record of the devices of one process: a group
// commit that makes the state changes of many devices durable with one
// write and one fsync. Several Devices share one Journal through
// Options.Journal; a Device without one opens its own in Options.StateDir.
// A Journal is safe for concurrent use.
//
// Its directory holds one snapshot file per device, <id>.json, and the
// journal itself, <pid>-<nanos>.journal, flocked while it is open: one JSON
// line per change of a device's record. A device's durable record is its
// snapshot with its journal lines applied in order. When the journal passes
// 64 MiB the writer moves on to a new file and folds the old one into the
// snapshots in the background (each written atomically: tmp file, fsync,
// rename; then an fsync of the directory), then removes it: batches go on
// committing meanwhile. Close folds the last file and removes it.
// OpenJournal first folds what journals left by a dead process hold (their
// lock is free), oldest first, each up to its first torn or malformed line:
// what follows belongs to a batch whose fsync never returned, so nothing of
// it was ever announced.
type Journal struct {
	dir       string
	log       *slog.Logger
	syncHook  func(file string) error
	compactAt int64
	lockWait  time.Duration

	gen     *generation         // the file the writer appends to; swapped by the writer under idx
	side    map[string]*os.File // side files (AppendLine, Hooks.SaveLine), by name; the writer's
	folding *foldRun            // the last background fold started; the writer's (Close's once it exited)
	retryAt time.Time           // no rotation or fold before it, after a failure; the writer's

	mu      sync.Mutex
	cur     *batch
	closed  bool
	kick    chan struct{}
	exited  chan struct{}
	running map[string]bool // device ids running on this journal

	// idx guards the generations' indexes, old, foldStop and the snapshot
	// files' names: loads read under it, the writer indexes its batches and
	// rotates under it, a fold renames its snapshots and drops its
	// generation under it.
	idx      sync.RWMutex
	old      *generation // a rotated file until its fold removed it
	foldStop bool        // set by abandon: a fold stops before its renames
}

// generation is one journal file and where its records are.
type generation struct {
	file   *os.File
	nanos  int64             // from its name: a later generation has a larger one
	size   int64             // bytes written; fixed once rotated
	index  map[string][]span // records by device; nil once folded into the snapshots
	closed bool
}

func (g *generation) close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	return g.file.Close()
}

type span struct {
	off int64
	n   int
}

// foldRun is a background fold; err is set before done is closed.
type foldRun struct {
	done chan struct{}
	err  error
	end  time.Time
}

// batch is what the writer commits at once; a caller's ticket.
type batch struct {
	journal []byte
	spans   []batchSpan // records in journal, by device
	side    map[string][]byte
	order   []string // side files in first-use order
	done    chan struct{}
	err     error
}

type batchSpan struct {
	device string
	off, n int // within batch.journal
}

func newBatch() *batch { return &batch{done: make(chan struct{})} }

func (b *batch) empty() bool { return len(b.journal) == 0 && len(b.side) == 0 }

// wait blocks until the batch is committed; nil if it is durable.
func (b *batch) wait() error {
	if b == nil {
		return nil
	}
	<-b.done
	return b.err
}

// journalEntry is one line of the journal: a device's whole record or a
// change to it.
type journalEntry struct {
	Device string        `json:"d"`
	Full   *durableState `json:"full,omitempty"`
	Delta  *delta        `json:"delta,omitempty"`
}

// delta is a change to a device's record: its session and application
// state as they now are, and the command records and operation claims that
// changed (a null record, an empty claim: deleted).
type delta struct {
	Session    int64              `json:"session"`
	App        json.RawMessage    `json:"app,omitempty"`
	Commands   map[string]*record `json:"commands,omitempty"`
	Operations map[string]string  `json:"operations,omitempty"`
}

func (e *journalEntry) apply(st *durableState) {
	if e.Full != nil {
		*st = *e.Full
		st.fill()
		return
	}
	d := e.Delta
	if d == nil {
		return
	}
	st.Session, st.App = d.Session, d.App
	for id, r := range d.Commands {
		if r == nil {
			delete(st.Commands, id)
		} else {
			st.Commands[id] = r
		}
	}
	for op, c := range d.Operations {
		if c == "" {
			delete(st.Operations, op)
		} else {
			st.Operations[op] = c
		}
	}
}

// OpenJournal opens the journal in dir (created if missing), after folding
// what journals of dead processes left there. o may be nil.
func OpenJournal(dir string, o *JournalOptions) (*Journal, error) {
	if o == nil {
		o = &JournalOptions{}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	j := &Journal{
		dir: dir, log: log, syncHook: o.SyncHook, compactAt: o.CompactAt, lockWait: o.LockWait,
		cur: newBatch(), kick: make(chan struct{}, 1), exited: make(chan struct{}),
		running: map[string]bool{}, side: map[string]*os.File{},
	}
	if j.compactAt <= 0 {
		j.compactAt = DefaultCompactAt
	}
	if j.lockWait <= 0 {
		j.lockWait = defaultLockWait
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("device: journal: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("device: journal: %w", err)
	}
	var left []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), journalExt) {
			left = append(left, e.Name())
		}
	}
	// Oldest first: a process's generations must be replayed in the order
	// they were written (see foldGen), and their names do not sort that
	// way as strings (nanos of different lengths).
	slices.SortFunc(left, func(a, b string) int {
		pa, na := parseJournalName(a)
		pb, nb := parseJournalName(b)
		return cmp.Or(cmp.Compare(na, nb), cmp.Compare(pa, pb), strings.Compare(a, b))
	})
	for _, name := range left {
		if err := j.recoverFile(filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	g, err := j.newGeneration(0)
	if err != nil {
		return nil, err
	}
	j.gen = g
	go j.run()
	return j, nil
}

// newGeneration creates, locks and makes durable a new journal file, named
// <pid>-<nanos>.journal with nanos after the one given: the order of a
// process's generations does not depend on the clock going forward.
func (j *Journal) newGeneration(after int64) (*generation, error) {
	nanos := max(time.Now().UnixNano(), after+1)
	var (
		name string
		f    *os.File
		err  error
	)
	for range 100 { // another Journal of this process may have taken the name
		name = filepath.Join(j.dir, fmt.Sprintf("%d-%d%s", os.Getpid(), nanos, journalExt))
		f, err = os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_RDWR|os.O_APPEND, 0o644)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
		nanos++
	}
	if err != nil {
		return nil, fmt.Errorf("device: journal: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(name)
		return nil, fmt.Errorf("device: journal: lock %s: %w", name, err)
	}
	// The new file's name must be durable before records in it count.
	if err := j.syncDir(j.dir); err != nil {
		f.Close()
		os.Remove(name)
		return nil, fmt.Errorf("device: journal: %w", err)
	}
	return &generation{file: f, nanos: nanos, index: map[string][]span{}}, nil
}

// Dir is the journal's directory.
func (j *Journal) Dir() string { return j.dir }

// recoverFile folds a journal left by another process into the snapshots
// and removes it. A journal of this process (another Journal open on the
// directory) is left alone: its devices are its own. The lock of another
// process's journal is waited for, up to lockWait: a process killed a
// moment ago may still hold it while it exits. If it stays held, OpenJournal
// fails: skipping it would lose its records for the devices that boot now.
func (j *Journal) recoverFile(name string) error {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("device: journal: %w", err)
	}
	defer f.Close()
	pid, _ := parseJournalName(name)
	deadline := time.Now().Add(j.lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("device: journal: lock %s: %w", name, err)
		}
		if pid == os.Getpid() {
			return nil // a live journal of this process
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("device: journal: %s is still locked by process %d after %v: "+
				"another live process uses this directory, or a killed one has not exited; "+
				"its records are not skipped, start again once it is gone", name, pid, j.lockWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(name); errors.Is(err, fs.ErrNotExist) {
		return nil // folded and removed by whoever held it
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("device: journal: %w", err)
	}
	if err := j.fold(b); err != nil {
		return err
	}
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("device: journal: %w", err)
	}
	return j.syncDir(filepath.Dir(name))
}

// parseJournalName is the process id and the nanos in a journal's name,
// <pid>-<nanos>.journal (0 for what is missing or not a number).
func parseJournalName(name string) (pid int, nanos int64) {
	base := strings.TrimSuffix(filepath.Base(name), journalExt)
	p, n, _ := strings.Cut(base, "-")
	pid, _ = strconv.Atoi(p)
	nanos, _ = strconv.ParseInt(n, 10, 64)
	return pid, nanos
}

// parseJournal splits journal bytes into entries. It stops at a torn or
// malformed line: what follows it belongs to the same batch, which never
// became durable (a batch is written only once the one before is fsynced).
func parseJournal(b []byte, each func(journalEntry)) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return
		}
		var e journalEntry
		if err := json.Unmarshal(b[:i], &e); err != nil || e.Device == "" {
			return
		}
		each(e)
		b = b[i+1:]
	}
}

// fold applies journal bytes to the snapshots they name and writes every
// changed snapshot durably. It runs before the writer starts (recoverFile).
func (j *Journal) fold(b []byte) error {
	staged, err := j.stage(b, snapshotParallelism)
	if err != nil {
		return err
	}
	if len(staged) == 0 {
		return nil
	}
	if err := renameAll(staged); err != nil {
		return err
	}
	return j.syncDir(j.dir)
}

// stage applies journal bytes to the snapshots they name and writes every
// changed snapshot under its tmp name, fsynced (parallelism at once): the
// slow part of a fold, which holds no lock. Only one fold of a directory
// runs at a time (the snapshots it reads are written by folds alone).
func (j *Journal) stage(b []byte, parallelism int) ([]staged, error) {
	states := map[string]*durableState{}
	var ferr error
	parseJournal(b, func(e journalEntry) {
		st := states[e.Device]
		if st == nil {
			var err error
			if st, err = loadState(j.dir, e.Device); err != nil {
				ferr = errors.Join(ferr, err)
				return
			}
			states[e.Device] = st
		}
		e.apply(st)
	})
	if ferr != nil {
		return nil, fmt.Errorf("device: journal: %w", ferr)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		staged []staged
		sem    = make(chan struct{}, parallelism)
	)
	for _, st := range states {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, err := st.stage(j.dir, j.syncFile)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else {
				staged = append(staged, s)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("device: journal: %w", err)
	}
	return staged, nil
}

// renameAll makes staged snapshots visible. It stops at the first failure:
// the generation they came from then stays in the index and on disk, and
// replaying it on a snapshot that already holds it changes nothing.
func renameAll(staged []staged) error {
	for _, s := range staged {
		if err := s.rename(); err != nil {
			return fmt.Errorf("device: journal: %w", err)
		}
	}
	return nil
}

func (j *Journal) syncFile(f *os.File) error {
	if j.syncHook != nil {
		if err := j.syncHook(f.Name()); err != nil {
			return err
		}
	}
	return f.Sync()
}

func (j *Journal) syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return j.syncFile(d)
}

// register marks a device id as running on the journal.
func (j *Journal) register(id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrJournalClosed
	}
	if j.running[id] {
		return ErrDeviceRunning
	}
	j.running[id] = true
	return nil
}

func (j *Journal) unregister(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.running, id)
}

// enqueue adds to the batch being gathered and returns it.
func (j *Journal) enqueue(device string, rec []byte, sideFile string, line []byte) (*batch, error) {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil, ErrJournalClosed
	}
	b := j.cur
	if rec != nil {
		b.spans = append(b.spans, batchSpan{device: device, off: len(b.journal), n: len(rec)})
		b.journal = append(b.journal, rec...)
	}
	if sideFile != "" {
		if b.side == nil {
			b.side = map[string][]byte{}
		}
		if _, ok := b.side[sideFile]; !ok {
			b.order = append(b.order, sideFile)
		}
		b.side[sideFile] = append(b.side[sideFile], line...)
	}
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
	return b, nil
}

// state enqueues a record of a device.
func (j *Journal) state(e journalEntry) (*batch, error) {
	return j.stateWithLine(e, "", nil)
}

// stateWithLine enqueues a record of a device and, in the same batch, a
// line of a side file (if file is set): the writer makes the line durable
// before the record.
func (j *Journal) stateWithLine(e journalEntry, file string, line []byte) (*batch, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("device: save state of %s: %w", e.Device, err)
	}
	if file != "" && (len(line) == 0 || line[len(line)-1] != '\n') {
		line = append(line[:len(line):len(line)], '\n')
	}
	return j.enqueue(e.Device, append(b, '\n'), file, line)
}

// AppendLine is a seam for simulators and tests: it appends line (a newline
// is added if it lacks one) to the file named (opened O_APPEND, created if
// missing) in the batch being gathered and returns without waiting. The
// writer appends each batch's lines with one write per file and fsyncs each
// file before it writes the batch's device records: a device record made
// after AppendLine returns is durable only after the line, and a batch
// whose lines cannot be made durable writes none of its records. A record
// made later may still land in a later batch than a line that failed: a
// line that a record must never outlive (an execution's witness) is given
// to the record itself, by Hooks.SaveLine. A simulator writes its witness
// of a published receipt with AppendLine.
func (j *Journal) AppendLine(file string, line []byte) error {
	if file == "" {
		return errors.New("device: AppendLine: no file")
	}
	if len(line) == 0 || line[len(line)-1] != '\n' {
		line = append(line[:len(line):len(line)], '\n')
	}
	_, err := j.enqueue("", nil, file, line)
	return err
}

// Sync waits until everything handed to the journal so far is durable.
func (j *Journal) Sync() error {
	b, err := j.enqueue("", nil, "", nil)
	if err != nil {
		return err
	}
	return b.wait()
}

// run is the writer: it commits the gathered batch, one after another, until
// the journal is closed and nothing is left.
func (j *Journal) run() {
	defer close(j.exited)
	for {
		j.mu.Lock()
		b, closed := j.cur, j.closed
		j.cur = newBatch()
		j.mu.Unlock()
		if !b.empty() {
			b.err = j.commit(b)
			close(b.done)
			if b.err == nil && j.gen.size >= j.compactAt {
				j.startFold()
			}
			continue
		}
		close(b.done) // nothing in it: Sync's waiters are done
		if closed {
			return // closed: nothing can be added any more
		}
		<-j.kick
	}
}

// commit makes one batch durable: side lines first, then the device
// records; the caller releases the waiters with the outcome.
func (j *Journal) commit(b *batch) error {
	if err := j.writeSide(b); err != nil {
		// The records are not written: one of them may count on a line
		// that is not durable.
		j.log.Error("device journal: side file batch failed; its records are dropped", "err", err)
		return err
	}
	if len(b.journal) == 0 {
		return nil
	}
	g := j.gen
	off := g.size
	if _, err := g.file.Write(b.journal); err != nil {
		// Take back a partial write, so the next batch starts a line.
		err = errors.Join(fmt.Errorf("append journal: %w", err), g.file.Truncate(off))
		j.log.Error("device journal: batch failed", "err", err)
		return err
	}
	g.size += int64(len(b.journal))
	j.idx.Lock()
	for _, s := range b.spans {
		g.index[s.device] = append(g.index[s.device], span{off: off + int64(s.off), n: s.n})
	}
	j.idx.Unlock()
	if err := j.syncFile(g.file); err != nil {
		// Written but not known durable: a device that boots reads it (it
		// may be on disk), but nobody waiting may act on it.
		err = fmt.Errorf("fsync journal: %w", err)
		j.log.Error("device journal: batch failed", "err", err)
		return err
	}
	return nil
}

// startFold is called by the writer once the current file passed
// compactAt: it moves on to a new file (the rotation: a create, a flock and
// a directory fsync) and folds the old one on a goroutine of its own, so
// no batch waits for a fold. One fold runs at a time: while it runs the
// current file grows on. A fold that failed leaves its generation in the
// index and on disk, and is tried again (after foldRetryWait) before the
// next rotation, so at most two generations are ever open.
func (j *Journal) startFold() {
	if f := j.folding; f != nil {
		select {
		case <-f.done:
		default:
			return
		}
		if f.err != nil {
			j.retryAt = f.end.Add(foldRetryWait)
		}
		j.folding = nil
	}
	if time.Now().Before(j.retryAt) {
		return
	}
	j.idx.RLock()
	g := j.old // a generation whose fold failed: again
	j.idx.RUnlock()
	if g == nil {
		next, err := j.newGeneration(j.gen.nanos)
		if err != nil {
			j.retryAt = time.Now().Add(foldRetryWait)
			j.log.Error("device journal: cannot start a new journal file; this one goes on growing", "err", err)
			return
		}
		j.idx.Lock()
		g, j.old, j.gen = j.gen, j.gen, next
		j.idx.Unlock()
	}
	f := &foldRun{done: make(chan struct{})}
	j.folding = f
	go func() {
		defer close(f.done)
		if f.err = j.foldGen(g, backgroundFoldParallelism); f.err != nil {
			f.end = time.Now()
			if errors.Is(f.err, errFoldStopped) {
				return
			}
			j.log.Error("device journal: fold failed; it is tried again, the journal goes on growing", "err", f.err)
		}
	}()
}

// waitFold waits for the background fold, if one runs. Only the writer, or
// Close and abandon once the writer exited, call it.
func (j *Journal) waitFold() {
	if j.folding != nil {
		<-j.folding.done
		j.folding = nil
	}
}

// errFoldStopped ends a fold that abandon stopped before its renames.
var errFoldStopped = errors.New("device: journal: fold stopped")

// foldGen folds a generation that is no longer written into the snapshots
// and removes its file: the fold of a rotated file (in the background) and
// of the last one at Close, with parallelism snapshot files written at
// once. The slow part, reading, parsing and writing each changed snapshot
// under a tmp name with its fsync, holds no lock; under idx the snapshots
// are renamed and the generation leaves the index at once, so a load reads
// either the old snapshots with this generation's records or the new
// snapshots without them; then the directory is fsynced, the file removed,
// the directory fsynced again.
//
// Why a crash at any point is safe: a journal line sets values (a Full
// record, or a delta whose fields overwrite or delete), so replaying
// generations k..n in write order on a snapshot that already holds
// generations up to some m ≥ k-1 gives the state after n: every value ends
// as the last line that sets it, and the lines already in the snapshot are
// set again to the same. A generation's file is removed only once the
// renames that hold it are durable (the first directory fsync), and the
// files on disk are always the newest generations, with no gap: a rotation
// happens only once the previous fold removed its file durably (the second
// fsync), and Close removes the last file only after the one before. So the
// next OpenJournal, folding the files it finds oldest first (by nanos, as
// numbers), replays a suffix of the generations in order: a crash before
// the renames, between them and the removal, or after it leaves the state
// the journals say.
func (j *Journal) foldGen(g *generation, parallelism int) error {
	j.idx.RLock()
	indexed := g.index != nil
	j.idx.RUnlock()
	renamed := !indexed // by an attempt that failed after its renames
	if indexed {
		b := make([]byte, g.size)
		if _, err := g.file.ReadAt(b, 0); err != nil {
			return fmt.Errorf("device: journal: read %s: %w", g.file.Name(), err)
		}
		staged, err := j.stage(b, parallelism)
		if err != nil {
			return err
		}
		j.idx.Lock()
		if j.foldStop {
			j.idx.Unlock()
			return errFoldStopped
		}
		err = renameAll(staged)
		if err == nil {
			g.index = nil
		}
		j.idx.Unlock()
		if err != nil {
			return err
		}
		renamed = len(staged) > 0
	}
	name := g.file.Name()
	if renamed {
		if err := j.syncDir(j.dir); err != nil {
			return fmt.Errorf("device: journal: %w", err)
		}
	}
	// Removed while still open and locked: another Journal of this process
	// leaves a locked file of this process alone (recoverFile).
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("device: journal: %w", err)
	}
	if err := j.syncDir(j.dir); err != nil {
		return fmt.Errorf("device: journal: %w", err)
	}
	j.idx.Lock()
	if j.old == g {
		j.old = nil
	}
	j.idx.Unlock()
	return g.close()
}

func (j *Journal) writeSide(b *batch) error {
	var (
		errs  []error
		files []*os.File
	)
	for _, name := range b.order {
		f := j.side[name]
		if f == nil {
			var err error
			if f, err = os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
				errs = append(errs, err)
				continue
			}
			j.side[name] = f
		}
		if _, err := f.Write(b.side[name]); err != nil {
			errs = append(errs, fmt.Errorf("append %s: %w", name, err))
			continue
		}
		files = append(files, f)
	}
	// One fsync per file written, at the same time: a batch waits for the
	// slowest, not for their sum.
	if len(files) == 1 {
		if err := j.syncFile(files[0]); err != nil {
			errs = append(errs, fmt.Errorf("fsync %s: %w", files[0].Name(), err))
		}
		return errors.Join(errs...)
	}
	synced := make([]error, len(files))
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := j.syncFile(f); err != nil {
				synced[i] = fmt.Errorf("fsync %s: %w", f.Name(), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(append(errs, synced...)...)
}

// load is a device's durable record: its snapshot with its journal records
// applied. The caller first waits for the device's last ticket.
func (j *Journal) load(id string) (*durableState, error) {
	j.idx.RLock()
	defer j.idx.RUnlock()
	st, err := loadState(j.dir, id)
	if err != nil {
		return nil, err
	}
	// The generation being folded, if any, then the current one.
	for _, g := range [...]*generation{j.old, j.gen} {
		if g == nil {
			continue
		}
		for _, s := range g.index[id] {
			b := make([]byte, s.n)
			if _, err := g.file.ReadAt(b, s.off); err != nil {
				return nil, fmt.Errorf("device: load state of %s: journal: %w", id, err)
			}
			var e journalEntry
			if err := json.Unmarshal(b, &e); err != nil {
				return nil, fmt.Errorf("device: load state of %s: journal: %w", id, err)
			}
			e.apply(st)
		}
	}
	return st, nil
}

// stopWriter refuses new work and waits until everything gathered is
// committed; false if it was stopped before.
func (j *Journal) stopWriter() bool {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		<-j.exited
		return false
	}
	j.closed = true
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
	<-j.exited
	for _, f := range j.side {
		f.Close()
	}
	return true
}

// Close commits what is gathered, stops the writer, waits for a background
// fold, folds the journal into the snapshots and removes it. Close it after
// every Device using it has returned from Run.
func (j *Journal) Close() error {
	if !j.stopWriter() {
		return nil
	}
	j.waitFold()
	j.idx.RLock()
	old := j.old // its fold failed: again, and before the last file goes
	j.idx.RUnlock()
	var err error
	if old != nil {
		err = j.foldGen(old, snapshotParallelism)
	}
	if err == nil {
		err = j.foldGen(j.gen, snapshotParallelism)
	}
	if err != nil {
		// Left for the next OpenJournal to fold, in order.
		if old != nil {
			err = errors.Join(err, old.close())
		}
		return errors.Join(err, j.gen.close())
	}
	return nil
}

// abandon is a crash of the journal's process as seen from its files: what
// is gathered is committed, and the files are left unfolded with their
// locks released (the next OpenJournal folds them). A background fold is
// stopped before its renames; one already past them is waited for: no
// goroutine of the journal writes once abandon returns.
func (j *Journal) abandon() {
	if !j.stopWriter() {
		return
	}
	j.idx.Lock()
	j.foldStop = true
	j.idx.Unlock()
	j.waitFold()
	j.idx.RLock()
	old := j.old
	j.idx.RUnlock()
	if old != nil {
		old.close()
	}
	j.gen.close()
}
