package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// A test process that starts brokers, controllers and simulators keeps
// everything it writes in one scratch directory, and when it is interrupted
// (Ctrl-C, SIGTERM) it kills what it started and removes that directory:
// the tests' own cleanups cannot run then.

// errInterrupted refuses a start once the test process is being interrupted.
var errInterrupted = errors.New("testenv: the test process is interrupted")

var (
	procMu      sync.Mutex
	procs       = map[*exec.Cmd]struct{}{}
	interrupted bool
)

// startTracked starts cmd and keeps it until forget, so that an interrupt
// can kill it. Once an interrupt is being handled it starts nothing.
func startTracked(cmd *exec.Cmd) error {
	procMu.Lock()
	defer procMu.Unlock()
	if interrupted {
		return errInterrupted
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	procs[cmd] = struct{}{}
	return nil
}

// forget drops cmd once it has been waited for.
func forget(cmd *exec.Cmd) {
	procMu.Lock()
	defer procMu.Unlock()
	delete(procs, cmd)
}

// killTrackedLocked sends SIGCONT (a stopped process cannot die) and
// SIGKILL to every tracked process.
func killTrackedLocked() int {
	for cmd := range procs {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
	}
	return len(procs)
}

// StartProcess starts a test's own long-lived child (one that is not a
// Broker or a Controller), kills it when the test ends, and also when the
// test process is interrupted.
func StartProcess(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if err := startTracked(cmd); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); forget(cmd); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
	})
}

// Scratch is a test process's scratch directory; see Setup.
type Scratch struct {
	Dir     string
	tmpdir  string // TMPDIR before Setup
	sigs    chan os.Signal
	stopped chan struct{}
	handled chan struct{}
}

// Setup is for the TestMain of a package whose tests start processes. It
// makes a scratch directory under $TMPDIR (a short name: programs such as
// Chromium put Unix sockets in TMPDIR, and a socket path has at most 107
// bytes) and points TMPDIR at it, so that
// t.TempDir, the binaries Binary builds and the children's own temporary
// files all land inside. On SIGINT or SIGTERM it kills every process
// started through this package (SIGCONT, then SIGKILL), removes the
// directory and exits with status 128+signal. Call Close after m.Run.
func Setup() (*Scratch, error) {
	dir, err := os.MkdirTemp("", "e2e")
	if err != nil {
		return nil, fmt.Errorf("testenv: scratch directory: %w", err)
	}
	old := os.Getenv("TMPDIR")
	root := os.TempDir()
	if err := os.Setenv("TMPDIR", dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	scratchMu.Lock()
	scratchOn, userTempRoot = true, root
	scratchMu.Unlock()
	s := &Scratch{Dir: dir, tmpdir: old, sigs: make(chan os.Signal, 1), stopped: make(chan struct{}), handled: make(chan struct{})}
	signal.Notify(s.sigs, os.Interrupt, syscall.SIGTERM)
	go s.handle()
	return s, nil
}

func (s *Scratch) handle() {
	defer close(s.handled)
	select {
	case <-s.stopped:
		return
	case sig := <-s.sigs:
		// The PostgreSQL clusters first (pg_ctl stop -m immediate): their
		// directories are inside s.Dir, and pg_ctl cannot stop a server
		// whose directory is gone. Like procMu, pgMu is held to the end.
		npg := interruptPostgres()
		// Hold the lock to the end: nothing starts after the kill.
		procMu.Lock()
		interrupted = true
		n := killTrackedLocked()
		err := os.RemoveAll(s.Dir)
		fmt.Fprintf(os.Stderr, "testenv: %v: killed %d child processes, stopped %d PostgreSQL servers, removed %s (%v)\n", sig, n, npg, s.Dir, err)
		code := 1
		if ss, ok := sig.(syscall.Signal); ok {
			code = 128 + int(ss)
		}
		os.Exit(code)
	}
}

// Close stops the signal handling, stops and removes the shared PostgreSQL
// cluster (SharedPostgres), kills any tracked process and stops any other
// cluster still running (a test that did not clean up) and removes the
// scratch directory. It returns what the tests left behind, besides the
// binaries Binary built and the shared cluster.
func (s *Scratch) Close() (left []string, err error) {
	signal.Stop(s.sigs)
	close(s.stopped)
	<-s.handled
	left, pgErr := closePostgres()
	defer func() { err = errors.Join(pgErr, err) }()
	procMu.Lock()
	for cmd := range procs {
		left = append(left, "process "+cmd.String())
	}
	killTrackedLocked()
	procMu.Unlock()
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return left, err
	}
	buildMu.Lock()
	bin := binDir
	binDir, binBuilt = "", map[string]bool{}
	buildMu.Unlock()
	for _, e := range entries {
		if p := filepath.Join(s.Dir, e.Name()); p != bin {
			left = append(left, p)
		}
	}
	if s.tmpdir == "" {
		os.Unsetenv("TMPDIR")
	} else {
		os.Setenv("TMPDIR", s.tmpdir)
	}
	return left, os.RemoveAll(s.Dir)
}

// Main is a TestMain for packages that start the real parts: it runs the
// tests inside a scratch directory (Setup), stops and removes the shared
// PostgreSQL cluster once they are over (Close), and fails the run when a
// test left a file, a process or a cluster behind (all removed), or, after
// a passing run, a goroutine.
func Main(m *testing.M) {
	scratch, err := Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	left, err := scratch.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: clean up %s: %v\n", scratch.Dir, err)
		code = 1
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "testenv: the tests left behind (now removed):\n  %s\n", strings.Join(left, "\n  "))
		code = 1
	}
	if code == 0 {
		// paho leaves a goroutine behind for up to its reconnect back-off when a
		// client is disconnected while reconnecting; it ends by itself.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).reconnect"),
			goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*connectionStatus).Disconnecting")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
