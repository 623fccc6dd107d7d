package demo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// The demo's binary, its output into a pipe as in `make demo | tee
// demo.log`, ended once the broker, the fleet and the controller are up: by
// a Ctrl-C at the terminal (SIGINT to its process group, tee gone with it)
// while it lingers after the walkthrough and during its batch's progress
// bar, by its reader going away alone, by SIGTERM, and by kill -9. Each
// time no process it started is left (checked by pid: its children from
// /proc, and Mosquitto's from its pid file), and its directory under
// $TMPDIR is gone.
func TestDemoBinaryLeavesNothingBehind(t *testing.T) {
	bin := buildBinaries(t)
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "demo"), "./cmd/demo")
	build.Dir = repoRoot(t)
	b, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/demo\n%s", b)

	// ctrlC is a Ctrl-C at the terminal of `demo | tee demo.log`: SIGINT to
	// the foreground job's group, where tee dies of it too.
	ctrlC := func(t *testing.T, d *demoProcess) {
		d.closeReader()
		require.NoError(t, syscall.Kill(-d.cmd.Process.Pid, syscall.SIGINT))
	}
	for _, tc := range []struct {
		name string
		// linger: without DEMO_EXIT=1, so that it stays up after the walkthrough.
		linger     bool
		operations int
		// until is the output to wait for before the end.
		until string
		end   func(t *testing.T, d *demoProcess)
		// exit is the demo's exit status, or -signal.
		exit int
	}{
		{"Ctrl-C while lingering, tee gone", true, 20, "press Ctrl-C to stop", ctrlC, 0},
		{"Ctrl-C during the batch, tee gone", false, 400, "/400 final", ctrlC, 130},
		{"reader gone", false, 400, "==> submitting", func(t *testing.T, d *demoProcess) { d.closeReader() }, 141},
		{"SIGTERM", false, 400, "==> submitting", func(t *testing.T, d *demoProcess) {
			require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
		}, 130},
		{"kill -9", false, 400, "==> submitting", func(t *testing.T, d *demoProcess) { require.NoError(t, d.cmd.Process.Kill()) }, -int(syscall.SIGKILL)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := isolate(t)
			d := startDemo(t, bin, tc.operations, tc.linger)
			// Once the broker, the fleet and the controller are up.
			d.waitOutput(t, tc.until, 3*time.Minute)
			procs := d.processes(t)
			t.Logf("its processes: %v", procs)

			tc.end(t, d)
			began := time.Now()
			status := d.wait(t, 60*time.Second)
			t.Logf("the demo ended (%d) %s after; stderr: %s", status, time.Since(began).Round(time.Millisecond), d.stderr.String())
			assert.Equal(t, tc.exit, status, "its exit status; stdout:\n%s\nstderr:\n%s", d.out.String(), d.stderr.String())
			if tc.exit >= 0 {
				// An orderly end: everything is gone by the time it exits.
				requireGone(t, procs, 0)
				requireEmpty(t, tmp)
				return
			}
			// After kill -9 the watchdog stops the broker and removes the files.
			requireGone(t, procs, 30*time.Second)
			deadline := time.Now().Add(30 * time.Second)
			for {
				entries, err := os.ReadDir(tmp)
				require.NoError(t, err)
				if len(entries) == 0 {
					break
				}
				require.True(t, time.Now().Before(deadline), "%s still holds %v 30 s after the demo was killed", tmp, entries)
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("everything gone %s after the kill", time.Since(began).Round(time.Millisecond))
		})
	}
}

// demoProcess is the demo's binary, its stdout into a pipe the test reads.
type demoProcess struct {
	cmd    *exec.Cmd
	r      *os.File
	out    testenv.SyncBuffer
	stderr testenv.SyncBuffer
	read   chan struct{} // closed when the reader has stopped reading
	done   chan struct{}
	err    error
}

func startDemo(t *testing.T, bin string, operations int, linger bool) *demoProcess {
	t.Helper()
	d := &demoProcess{read: make(chan struct{}), done: make(chan struct{})}
	r, w, err := os.Pipe()
	require.NoError(t, err)
	d.r = r
	d.cmd = exec.Command(filepath.Join(bin, "demo"), "--bin", bin, "--devices", "3", "--operations", strconv.Itoa(operations))
	d.cmd.Dir = repoRoot(t)
	d.cmd.Env = os.Environ()
	if !linger {
		d.cmd.Env = append(d.cmd.Env, "DEMO_EXIT=1")
	}
	d.cmd.Stdout, d.cmd.Stderr = w, &d.stderr
	d.cmd.WaitDelay = 5 * time.Second
	// A process group of its own, as a terminal's foreground job, and it
	// dies with the test process.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, d.cmd.Start())
	w.Close()
	go func() {
		defer close(d.read)
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			d.out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
		d.closeReader()
	})
	return d
}

// closeReader closes the reading end of the demo's stdout: a write to it
// then fails with EPIPE.
func (d *demoProcess) closeReader() {
	d.r.Close()
}

func (d *demoProcess) waitOutput(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(d.out.String(), s) {
		select {
		case <-d.done:
			t.Fatalf("the demo ended (%v) before printing %q:\n%s\n%s", d.err, s, d.out.String(), d.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no %q after %s:\n%s", s, timeout, d.out.String())
	}
}

// wait waits for the demo to end and returns its exit status, or -signal.
func (d *demoProcess) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(timeout):
		t.Fatalf("the demo still runs %s after it was told to stop:\n%s\n%s", timeout, d.out.String(), d.stderr.String())
	}
	var ee *exec.ExitError
	if d.err == nil {
		return 0
	}
	require.True(t, errors.As(d.err, &ee), "%v", d.err)
	if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
		return -int(ws.Signal())
	}
	return ee.ExitCode()
}

// process is one process by pid and start time (so that a pid used again
// is not taken for it).
type process struct {
	pid   int
	start string
	name  string
}

func (p process) String() string { return fmt.Sprintf("%d (%s)", p.pid, p.name) }

// stat reads a process's state and start time from /proc/pid/stat.
func stat(pid int) (state, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", "", false
	}
	// After the command's name in parentheses: state is field 3, start time 22.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 {
		return "", "", false
	}
	return f[0], f[19], true
}

// processes are the demo's children (its watchdog, the fleet, the
// controller) and the broker (not its child: mosquitto/broker.sh starts it
// in the background), with the run's directory under $TMPDIR.
func (d *demoProcess) processes(t *testing.T) []process {
	t.Helper()
	var pids []int
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", d.cmd.Process.Pid))
	require.NoError(t, err)
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		require.NoError(t, err)
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			require.NoError(t, err)
			pids = append(pids, pid)
		}
	}
	dirs, err := filepath.Glob(filepath.Join(os.Getenv("TMPDIR"), "fleetctl-demo-*", "broker", "mosquitto.pid"))
	require.NoError(t, err)
	require.Len(t, dirs, 1, "the broker's pid file in the run's directory")
	b, err := os.ReadFile(dirs[0])
	require.NoError(t, err)
	broker, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	pids = append(pids, broker)

	var procs []process
	names := map[string]int{}
	for _, pid := range pids {
		_, start, ok := stat(pid)
		require.True(t, ok, "process %d", pid)
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		name := filepath.Base(args[0])
		if name == "sh" && len(args) > 3 {
			name = args[3] // demo-watchdog
		}
		names[name]++
		procs = append(procs, process{pid: pid, start: start, name: name})
	}
	require.Equal(t, map[string]int{"demo-watchdog": 1, "devicesim": 2, "controller": 1, "mosquitto": 1}, names,
		"the demo's processes: %v", procs)
	return procs
}

// requireGone checks, within timeout, that none of procs runs any more (a
// zombie has ended: it waits only to be reaped by its parent).
func requireGone(t *testing.T, procs []process, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []process
		for _, p := range procs {
			if state, start, ok := stat(p.pid); ok && start == p.start && state != "Z" {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
			t.Fatalf("still running %s after the demo ended: %v (now killed)", timeout, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
