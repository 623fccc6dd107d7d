package store

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// The files of an SQLite store stay where they were opened, or the store
// stops.
//
// A process holds its SQLite files open by descriptor, not by name: when
// the directory that holds them is removed (or a file renamed away or
// replaced), every commit still succeeds, into a file nobody will open
// again, and is lost with the process; and the instance lock beside the
// database goes with the directory, so a second process with the same
// instance id starts at once, on a fresh database. So the store checks
// that each path still names the file it has open (same device and
// inode; a path that no longer resolves fails the same way):
//
//   - the database file, its -wal and its -shm (the WAL holds the commits
//     not yet checkpointed; a second process that made a fresh -shm would
//     read the WAL without this one's index), and the instance lock;
//   - right before every COMMIT, so that a batch is not committed into a
//     file that left (it is rolled back), and right after it, before any
//     caller of the batch is answered: a change is acknowledged only when
//     its files were still at their paths after it committed (one that
//     left during the COMMIT itself may hold the change, in a file renamed
//     away; its callers are told to retry, which is idempotent). A check
//     is a stat a file, four with the lock: 5 to 20 µs in all on the
//     shared test machine (BenchmarkFileGuardCheck), twice per batch,
//     against a batch's commit with its fsync of 0.6 ms or more
//     (BenchmarkSubmit), where the difference does not show;
//   - every guardInterval on a ticker, so an idle store notices too;
//   - on every Err (GET /healthz).
//
// The first failed check is final: the writer refuses every later batch
// without running it (*BatchError wrapping ErrDatabaseLost), Err returns
// it, and the Instance's Lost fires, so the instance stops. PostgreSQL has
// no files here and nothing is checked.

// ErrDatabaseLost: a file of the SQLite store (the database, its WAL or
// shared-memory index, or the instance lock beside it) is no longer at its
// path. Nothing is committed after it; the instance must stop.
var ErrDatabaseLost = errors.New("store: a database file is no longer at its path")

// guardInterval is how often an idle store checks its files.
const guardInterval = time.Second

// fileID is a file's identity: device and inode. An inode is not reused
// while this process holds its file open, so an equal ID is the same file.
type fileID struct{ dev, ino uint64 }

// guardedFile is one path the store checks, and what it is (for the error).
type guardedFile struct {
	what, path string
	id         fileID
}

// fileGuard holds the store's guarded files and the outcome of their
// checks. A nil *fileGuard (PostgreSQL) checks nothing.
type fileGuard struct {
	mu    sync.Mutex
	files []guardedFile
	err   error         // the first failed check; final
	lost  chan struct{} // closed when err is set
	stop  chan struct{} // ends the ticker
	done  chan struct{} // closed when the ticker ended
	once  sync.Once
}

// newFileGuard records the identity of each file that exists now (the
// first must: the database; its WAL and shared-memory index exist while a
// connection is open in WAL mode), and checks them every interval until
// close. No file: nil.
func newFileGuard(files []guardedFile, interval time.Duration) (*fileGuard, error) {
	if len(files) == 0 {
		return nil, nil
	}
	g := &fileGuard{lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	for i, f := range files {
		id, err := statID(f.path)
		if i > 0 && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("store: stat the %s %s: %w", f.what, f.path, err)
		}
		f.id = id
		g.files = append(g.files, f)
	}
	go g.run(interval)
	return g, nil
}

func (g *fileGuard) run(interval time.Duration) {
	defer close(g.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-g.lost:
			return
		case <-t.C:
			_ = g.check()
		}
	}
}

// close ends the ticker; it is safe to call more than once.
func (g *fileGuard) close() {
	if g == nil {
		return
	}
	g.once.Do(func() { close(g.stop) })
	<-g.done
}

// add guards one more file, open as f (the instance lock).
func (g *fileGuard) add(what, path string, f *os.File) error {
	if g == nil {
		return nil
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("store: %s %s: %w", what, path, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.files = append(g.files, guardedFile{what: what, path: path, id: fileID{uint64(st.Dev), uint64(st.Ino)}})
	return nil
}

// remove stops guarding path (the instance lock, released).
func (g *fileGuard) remove(path string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, f := range g.files {
		if f.path == path {
			g.files = append(g.files[:i], g.files[i+1:]...)
			return
		}
	}
}

// failed is the outcome of an earlier failed check, without checking.
func (g *fileGuard) failed() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// check stats every guarded path; the first that no longer names its file
// makes the guard fail, for good.
func (g *fileGuard) check() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	for _, f := range g.files {
		id, err := statID(f.path)
		switch {
		case err != nil:
			g.err = fmt.Errorf("%w: the %s %s: %v (its directory was removed, or it was moved away)",
				ErrDatabaseLost, f.what, f.path, err)
		case id != f.id:
			g.err = fmt.Errorf("%w: the %s %s now names another file (inode %d, not the open %d): it was replaced",
				ErrDatabaseLost, f.what, f.path, id.ino, f.id.ino)
		default:
			continue
		}
		close(g.lost)
		return g.err
	}
	return nil
}

// lostC is closed once a check failed; nil (never) without a guard.
func (g *fileGuard) lostC() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.lost
}

// statID is the identity of the file path names (a symbolic link
// followed, as SQLite follows it), or stat's errno.
func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{uint64(st.Dev), uint64(st.Ino)}, nil
}

// Err is nil while the store's files are where it opened them; then the
// error that says which is not (ErrDatabaseLost), after which the store
// commits nothing. It checks them now. Always nil with PostgreSQL.
func (s *DB) Err() error { return s.files.check() }
