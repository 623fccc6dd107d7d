package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetctl/fleetctl/internal/witness"
)

// JournalExt ends the name of a fleet's journal file in the devices dir.
const JournalExt = ".journal"

// defaultCompactAt is the journal size past which the writer folds it into
// the devices' snapshot files and starts it again.
const defaultCompactAt = 64 << 20

// snapshotParallelism bounds the snapshot files written (and fsynced) at
// once when a journal is folded.
const snapshotParallelism = 32

// journal is the fleet's group commit: every device's state changes and
// every witness line go through it, and one writer goroutine makes many of
// them durable together.
//
// A change is enqueued (under its device's lock, so a device's changes keep
// their order) into the batch being gathered, and the caller gets that
// batch as its ticket. The writer takes the gathered batch, appends its
// witness lines (one write per witness file) and fsyncs them, then appends
// its state records to the journal file (one write) and fsyncs it, then
// closes the batch's done channel: every waiter is released at once. State
// records reach the journal only after the witness lines of the same and
// earlier batches are durable, so a final state never outlives the
// execution line it counts. Batches are committed in order: once a ticket
// is done, everything enqueued before it is done too.
//
// The journal file (<StateDir>/devices/<pid>-<nanos>.journal, flocked while
// the fleet runs) holds one JSON line per record, {"d":id,"delta":...} or
// {"d":id,"full":...}. A device's durable state is its snapshot file
// (devices/<id>.json) with its journal records applied in order; the
// writer keeps the offsets of each device's records so a boot reads only
// its own. The journal is folded into the snapshots (each written
// atomically: tmp file, fsync, rename; then one fsync of the directory) and
// emptied when it grows past compactAt, at a clean stop, and at the next
// start for a journal a dead process left.
type journal struct {
	stateDir  string
	log       *slog.Logger
	wit       *witness.Appender
	syncHook  func(file string) error
	compactAt int64

	file *os.File // written by the writer only
	size int64

	mu     sync.Mutex
	cur    *batch
	closed bool
	kick   chan struct{}
	exited chan struct{}

	// idx guards index and the snapshot files: loads read under it,
	// the writer updates the index and folds the journal under it.
	idx   sync.RWMutex
	index map[string][]span
}

type span struct {
	off int64
	n   int
}

// batch is what the writer commits at once; a caller's ticket.
type batch struct {
	journal []byte
	spans   []batchSpan // records in journal, by device
	exec    []byte
	rcpt    []byte
	done    chan struct{}
	err     error
}

type batchSpan struct {
	device string
	off, n int // within batch.journal
}

func newBatch() *batch { return &batch{done: make(chan struct{})} }

func (b *batch) empty() bool { return len(b.journal) == 0 && len(b.exec) == 0 && len(b.rcpt) == 0 }

// wait blocks until the batch is committed; nil if it is durable.
func (b *batch) wait() error {
	if b == nil {
		return nil
	}
	<-b.done
	return b.err
}

// journalEntry is one line of the journal: a device's whole state or a
// change to it.
type journalEntry struct {
	Device string        `json:"d"`
	Full   *durableState `json:"full,omitempty"`
	Delta  *delta        `json:"delta,omitempty"`
}

// delta is a change to a device's state: the device's counters and config
// as they now are, and the command records and operation claims that
// changed (a null record, an empty claim: deleted).
type delta struct {
	Session    int64                      `json:"session"`
	Boots      int                        `json:"boots"`
	Config     map[string]json.RawMessage `json:"config"`
	Commands   map[string]*record         `json:"commands,omitempty"`
	Operations map[string]string          `json:"operations,omitempty"`
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
	st.Session, st.Boots = d.Session, d.Boots
	st.Config = copyConfig(d.Config)
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

// openJournal folds what journals of dead processes left in the state dir
// into the snapshots, then opens (and locks) this fleet's own journal.
func openJournal(stateDir string, wit *witness.Appender, log *slog.Logger, syncHook func(string) error) (*journal, error) {
	j := &journal{
		stateDir: stateDir, log: log, wit: wit, syncHook: syncHook, compactAt: defaultCompactAt,
		cur: newBatch(), kick: make(chan struct{}, 1), exited: make(chan struct{}),
		index: map[string][]span{},
	}
	dir := filepath.Join(stateDir, DevicesDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), JournalExt) {
			continue
		}
		if err := j.recoverFile(filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
	}
	name := filepath.Join(dir, fmt.Sprintf("%d-%d%s", os.Getpid(), time.Now().UnixNano(), JournalExt))
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: lock %s: %w", name, err)
	}
	// The new file's name must be durable before records in it count.
	if err := j.syncDir(dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: %w", err)
	}
	j.file = f
	go j.run()
	return j, nil
}

// recoverFile folds a journal left by another fleet into the snapshots and
// removes it, unless a running fleet holds its lock.
func (j *journal) recoverFile(name string) error {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil // a live fleet's; its devices are its own
		}
		return fmt.Errorf("journal: lock %s: %w", name, err)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := j.fold(b); err != nil {
		return err
	}
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return j.syncDir(filepath.Dir(name))
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
// changed snapshot durably. The caller holds idx (or runs before the
// devices start).
func (j *journal) fold(b []byte) error {
	states := map[string]*durableState{}
	var ferr error
	parseJournal(b, func(e journalEntry) {
		st := states[e.Device]
		if st == nil {
			var err error
			if st, err = loadState(j.stateDir, e.Device); err != nil {
				ferr = errors.Join(ferr, err)
				return
			}
			states[e.Device] = st
		}
		e.apply(st)
	})
	if ferr != nil {
		return fmt.Errorf("journal: %w", ferr)
	}
	if len(states) == 0 {
		return nil
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, snapshotParallelism)
	)
	for _, st := range states {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := st.save(j.stateDir, j.syncFile); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return j.syncDir(filepath.Join(j.stateDir, DevicesDir))
}

func (j *journal) syncFile(f *os.File) error {
	if j.syncHook != nil {
		if err := j.syncHook(f.Name()); err != nil {
			return err
		}
	}
	return f.Sync()
}

func (j *journal) syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return j.syncFile(d)
}

// enqueue adds to the batch being gathered and returns it.
func (j *journal) enqueue(device string, rec, exec, rcpt []byte) (*batch, error) {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil, errJournalClosed
	}
	b := j.cur
	if rec != nil {
		b.spans = append(b.spans, batchSpan{device: device, off: len(b.journal), n: len(rec)})
		b.journal = append(b.journal, rec...)
	}
	b.exec = append(b.exec, exec...)
	b.rcpt = append(b.rcpt, rcpt...)
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
	return b, nil
}

var errJournalClosed = errors.New("sim: journal closed")

// state enqueues a state record of a device.
func (j *journal) state(e journalEntry) (*batch, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("save state of %s: %w", e.Device, err)
	}
	return j.enqueue(e.Device, append(b, '\n'), nil, nil)
}

// execution enqueues an executions.jsonl line.
func (j *journal) execution(e witness.Execution) (*batch, error) {
	line, err := witness.Line(e)
	if err != nil {
		return nil, err
	}
	return j.enqueue(e.DeviceID, nil, line, nil)
}

// receipt enqueues a receipts.jsonl line.
func (j *journal) receipt(r witness.PublishedReceipt) (*batch, error) {
	line, err := witness.Line(r)
	if err != nil {
		return nil, err
	}
	return j.enqueue(r.DeviceID, nil, nil, line)
}

// run is the writer: it commits the gathered batch, one after another, until
// the journal is closed and nothing is left.
func (j *journal) run() {
	defer close(j.exited)
	for {
		j.mu.Lock()
		b, closed, empty := j.cur, j.closed, j.cur.empty()
		if !empty || closed {
			j.cur = newBatch()
		}
		j.mu.Unlock()
		if !empty {
			j.commit(b)
			continue
		}
		if closed {
			return // closed: nothing can be added any more
		}
		<-j.kick
	}
}

// commit makes one batch durable: witness lines first, then the state
// records; the waiters are released with the outcome.
func (j *journal) commit(b *batch) {
	defer close(b.done)
	if err := j.wit.WriteBatch(b.exec, b.rcpt, j.syncFile); err != nil {
		// The state records are not written: one of them may count an
		// execution whose line is not durable.
		b.err = err
		j.log.Error("witness batch failed; its state records are dropped", "err", err)
		return
	}
	if len(b.journal) == 0 {
		return
	}
	off := j.size
	if _, err := j.file.Write(b.journal); err != nil {
		// Take back a partial write, so the next batch starts a line.
		b.err = errors.Join(fmt.Errorf("append journal: %w", err), j.file.Truncate(off))
		j.log.Error("journal batch failed", "err", b.err)
		return
	}
	j.size += int64(len(b.journal))
	j.idx.Lock()
	for _, s := range b.spans {
		j.index[s.device] = append(j.index[s.device], span{off: off + int64(s.off), n: s.n})
	}
	j.idx.Unlock()
	if err := j.syncFile(j.file); err != nil {
		// Written but not known durable: a device that reboots reads it
		// (it may be on disk), but nobody waiting may act on it.
		b.err = fmt.Errorf("fsync journal: %w", err)
		j.log.Error("journal batch failed", "err", b.err)
		return
	}
	if j.size >= j.compactAt {
		if err := j.compact(); err != nil {
			j.log.Error("journal compaction failed; the journal goes on growing", "err", err)
		}
	}
}

// compact folds the journal into the snapshots and empties it. Only the
// writer calls it (or close, once the writer is gone).
func (j *journal) compact() error {
	j.idx.Lock()
	defer j.idx.Unlock()
	if j.size == 0 {
		return nil
	}
	b := make([]byte, j.size)
	if _, err := j.file.ReadAt(b, 0); err != nil {
		return fmt.Errorf("journal: read: %w", err)
	}
	if err := j.fold(b); err != nil {
		return err
	}
	if err := j.file.Truncate(0); err != nil {
		return fmt.Errorf("journal: truncate: %w", err)
	}
	if err := j.syncFile(j.file); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.size = 0
	j.index = map[string][]span{}
	return nil
}

// load is a device's durable state: its snapshot with its journal records
// applied. The caller first waits for the device's last ticket.
func (j *journal) load(id string) (*durableState, error) {
	j.idx.RLock()
	defer j.idx.RUnlock()
	st, err := loadState(j.stateDir, id)
	if err != nil {
		return nil, err
	}
	for _, s := range j.index[id] {
		b := make([]byte, s.n)
		if _, err := j.file.ReadAt(b, s.off); err != nil {
			return nil, fmt.Errorf("load state of %s: journal: %w", id, err)
		}
		var e journalEntry
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, fmt.Errorf("load state of %s: journal: %w", id, err)
		}
		e.apply(st)
	}
	return st, nil
}

// close commits what is gathered, stops the writer, folds the journal into
// the snapshots and removes it.
func (j *journal) close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		<-j.exited
		return nil
	}
	j.closed = true
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
	<-j.exited
	err := j.compact()
	if err == nil {
		j.idx.Lock()
		name := j.file.Name()
		err = errors.Join(j.file.Close(), os.Remove(name), j.syncDir(filepath.Dir(name)))
		j.file = nil
		j.idx.Unlock()
		return err
	}
	// Left for the next start to fold.
	return errors.Join(err, j.file.Close())
}
