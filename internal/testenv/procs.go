package testenv

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildMu  sync.Mutex
	binDir   string
	binBuilt = map[string]bool{}
)

// Binary returns the path of one of the project's commands (controller,
// devicesim), built once per test process into a directory under $TMPDIR:
// with Setup in TestMain, inside the scratch directory, which Close removes.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if binDir == "" {
		dir, err := os.MkdirTemp("", "fleetctl-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	path := filepath.Join(binDir, name)
	if !binBuilt[name] {
		build := exec.Command("go", "build", "-o", path, "./cmd/"+name)
		build.Dir = RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
		}
		binBuilt[name] = true
	}
	return path
}

// SyncBuffer is a bytes.Buffer safe to write from several goroutines (a
// child's output, a logger's) while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ControllerOpts configures a controller process.
type ControllerOpts struct {
	DB         string
	MQTT       string
	InstanceID string
	Env        []string // extra environment, e.g. CONTROLLER_FAILPOINTS=...
	Args       []string // extra flags
	Port       int      // 0: a free port
}

// Controller is a `controller serve` child process.
type Controller struct {
	t      testing.TB
	Opts   ControllerOpts
	URL    string
	cmd    *exec.Cmd
	out    *SyncBuffer
	done   chan struct{}
	status error
}

// StartController starts `controller serve` and waits until /healthz answers.
func StartController(t testing.TB, o ControllerOpts) *Controller {
	t.Helper()
	c := StartControllerNoWait(t, o)
	c.WaitHealthy()
	return c
}

// StartControllerNoWait starts `controller serve` without waiting for it.
func StartControllerNoWait(t testing.TB, o ControllerOpts) *Controller {
	t.Helper()
	if o.Port == 0 {
		o.Port = FreePort(t)
	}
	if o.InstanceID == "" {
		o.InstanceID = "i1"
	}
	c := &Controller{t: t, Opts: o, URL: fmt.Sprintf("http://127.0.0.1:%d", o.Port)}
	c.start()
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("controller %s output:\n%s", o.InstanceID, c.Output())
		}
	})
	return c
}

func (c *Controller) start() {
	c.t.Helper()
	args := append([]string{"serve", "--db", c.Opts.DB, "--mqtt", c.Opts.MQTT,
		"--http", fmt.Sprintf("127.0.0.1:%d", c.Opts.Port), "--instance-id", c.Opts.InstanceID}, c.Opts.Args...)
	cmd := exec.Command(Binary(c.t, "controller"), args...)
	cmd.Env = append(os.Environ(), c.Opts.Env...)
	if c.out == nil {
		c.out = &SyncBuffer{}
	}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := startTracked(cmd); err != nil {
		c.t.Fatalf("start controller: %v", err)
	}
	c.cmd, c.done, c.status = cmd, make(chan struct{}), nil
	go func() { c.status = cmd.Wait(); forget(cmd); close(c.done) }()
}

// WaitHealthy waits up to 15 s for /healthz, failing the test if the process exits.
func (c *Controller) WaitHealthy() {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			c.t.Fatalf("controller exited (%v) before it was healthy:\n%s", c.status, c.Output())
		default:
		}
		if resp, err := hc.Get(c.URL + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-c.done:
		case <-time.After(25 * time.Millisecond):
		}
	}
	c.t.Fatalf("controller not healthy within 15s:\n%s", c.Output())
}

// Output is everything the process wrote so far (all its runs).
func (c *Controller) Output() string { return c.out.String() }

// Done is closed when the current process has exited.
func (c *Controller) Done() <-chan struct{} { return c.done }

// ExitCode waits up to 15 s for the process to exit and returns its status.
func (c *Controller) ExitCode() int {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		c.t.Fatalf("controller did not exit within 15s")
	}
	if c.status == nil {
		return 0
	}
	if ee, ok := c.status.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

// Kill sends SIGKILL and waits for the process to go.
func (c *Controller) Kill() { c.signal(syscall.SIGKILL) }

// Stop sends SIGTERM and waits for a clean exit.
func (c *Controller) Stop() { c.signal(syscall.SIGTERM) }

// Signal sends sig without waiting (SIGSTOP, SIGCONT).
func (c *Controller) Signal(sig syscall.Signal) { _ = c.cmd.Process.Signal(sig) }

func (c *Controller) signal(sig syscall.Signal) {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// Restart starts the process again with the same options (after it exited
// or was killed), with env replacing the extra environment, and waits until
// it is healthy.
func (c *Controller) Restart(env ...string) {
	c.t.Helper()
	c.Kill()
	c.Opts.Env = env
	c.start()
	c.WaitHealthy()
}
