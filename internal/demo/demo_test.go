package demo

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// These tests change the process's TMPDIR and working directory, so none of
// them runs in parallel.

// repoRoot is where mosquitto/broker.sh is found.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// isolate points TMPDIR at an empty directory of the test's, and the working
// directory at the repository's root, and returns that TMPDIR.
func isolate(t *testing.T) string {
	t.Helper()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Chdir(repoRoot(t))
	return tmp
}

func requireEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Empty(t, names, "left behind in %s", dir)
}

var portRE = regexp.MustCompile(`127\.0\.0\.1:(\d+)`)

// requirePortsClosed checks that nothing listens any more on the loopback
// ports the output names (the broker's, the API's): their processes are gone.
func requirePortsClosed(t *testing.T, out string) {
	t.Helper()
	ms := portRE.FindAllStringSubmatch(out, -1)
	require.NotEmpty(t, ms, "the output names the broker's port: %s", out)
	for _, m := range ms {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+m[1], time.Second)
		if err == nil {
			c.Close()
			t.Errorf("something still listens on 127.0.0.1:%s", m[1])
		}
	}
}

// A failing run removes the directory it made under $TMPDIR and stops the
// broker it started; its output does not point at files it removed.
func TestFailedRunRemovesItsFiles(t *testing.T) {
	tmp := isolate(t)
	var out testenv.SyncBuffer
	err := Run(context.Background(), Config{Bin: t.TempDir(), Devices: 1, Operations: 1, Out: &out}) // no binaries there
	require.ErrorContains(t, err, "start devicesim")
	requireEmpty(t, tmp)
	requirePortsClosed(t, out.String())
	require.NotContains(t, out.String(), tmp, "no path to files that are gone")
}

// A named Dir is kept, and the output says where it is.
func TestNamedDirIsKept(t *testing.T) {
	tmp := isolate(t)
	dir := filepath.Join(t.TempDir(), "run")
	var out testenv.SyncBuffer
	err := Run(context.Background(), Config{Bin: t.TempDir(), Dir: dir, Devices: 1, Operations: 1, Out: &out})
	require.ErrorContains(t, err, "start devicesim")
	require.DirExists(t, filepath.Join(dir, "broker"))
	require.FileExists(t, filepath.Join(dir, "broker", "mosquitto.log"))
	require.Contains(t, out.String(), "(files in "+dir+")")
	requireEmpty(t, tmp)
	requirePortsClosed(t, out.String())
}

// buildBinaries builds the controller and devicesim in a directory outside
// the TMPDIR under test: the test's binaries, not the demo's files.
func buildBinaries(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/mosquitto"); err != nil {
		t.Fatalf("needs Mosquitto at /usr/sbin/mosquitto: run make deps (apt-get install mosquitto)")
	}
	bin := t.TempDir()
	for _, name := range []string{"controller", "devicesim"} {
		build := exec.Command("go", "build", "-o", filepath.Join(bin, name), "./cmd/"+name)
		build.Dir = repoRoot(t)
		b, err := build.CombinedOutput()
		require.NoError(t, err, "go build ./cmd/%s\n%s", name, b)
	}
	return bin
}

// waitOutput waits until the demo's output contains s, failing if the demo
// ends first or the deadline passes.
func waitOutput(t *testing.T, out *testenv.SyncBuffer, done <-chan error, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(out.String(), s) {
		select {
		case err := <-done:
			t.Fatalf("the demo ended (%v) before printing %q:\n%s", err, s, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no %q after %s:\n%s", s, timeout, out.String())
	}
}

// A whole run as `make demo` does it: the dashboard's URL first, the batch
// and its verdict, the walkthrough with its agent on MCP, then everything
// stays up, the dashboard served, until Ctrl-C, which ends the run without
// an error, its processes stopped and its files removed.
func TestWholeRunLingersUntilInterrupted(t *testing.T) {
	bin := buildBinaries(t)
	tmp := isolate(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Bin: bin, Devices: 4, Operations: 40, Out: &out, Linger: true}) }()
	waitOutput(t, &out, done, "press Ctrl-C to stop", 3*time.Minute)

	text := out.String()
	m := regexp.MustCompile(`==> dashboard: (http://127\.0\.0\.1:\d+/ui/)`).FindStringSubmatch(text)
	require.NotNil(t, m, "the dashboard's URL, printed before the batch:\n%s", text)
	require.Less(t, strings.Index(text, "==> dashboard:"), strings.Index(text, "==> submitting"))
	for _, want := range []string{
		"verdict: every operation final, none executed twice",
		"agent proposes a plan with create_task: task-88 v1",
		"the same revision sent again: still v3",
		"tools have none that approves",
		"alice approves the superseded v2: refused (stale_version)",
		"the operation is succeeded",
		"with submit_operation: refused (reserved_operation_id)",
	} {
		require.Contains(t, text, want)
	}
	require.Regexp(t, `the agent made \d+ tool calls, each sent twice \(\d+ sends\), and lost \d+ first answers; the command was published 1 time\(s\)`, text)
	resp, err := http.Get(m[1])
	require.NoError(t, err, "the dashboard is served while the demo lingers")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Ctrl-C while lingering is the normal end")
	case <-time.After(45 * time.Second):
		t.Fatalf("the demo did not return 45s after its context was cancelled\n%s", out.String())
	}
	requireEmpty(t, tmp)
	requirePortsClosed(t, out.String())
}

// Cancelling the context (what SIGINT does in cmd/demo) in the middle of the
// batch stops every process and removes every file, promptly.
func TestInterruptedRunCleansUp(t *testing.T) {
	bin := buildBinaries(t)
	tmp := isolate(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Bin: bin, Devices: 3, Operations: 400, Out: &out}) }()

	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "==> submitting") {
		select {
		case err := <-done:
			t.Fatalf("the demo ended before its batch: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no batch after 60s:\n%s", out.String())
	}
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Len(t, entries, 1, "the run's one directory, under TMPDIR")
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		require.True(t, errors.Is(err, context.Canceled), "%v", err)
	case <-time.After(45 * time.Second):
		t.Fatalf("the demo did not return 45s after its context was cancelled\n%s", out.String())
	}
	t.Logf("returned %s after the cancel", time.Since(cancelled).Round(time.Millisecond))
	requireEmpty(t, tmp)
	requirePortsClosed(t, out.String())
	require.NotContains(t, out.String(), tmp)
}
