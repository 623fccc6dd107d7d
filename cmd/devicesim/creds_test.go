package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// devicesim creds writes the accounts; devicesim run --credentials
// --mqtt-ca logs every device in with its own over TLS, against the real
// broker's secure profile; without the CA it cannot connect.
func TestCredsAndRunOnTheSecureProfile(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "creds")
	var out strings.Builder
	var stderr strings.Builder
	code := runMain(t.Context(), []string{"creds", "--devices", "2", "--controllers", "c1", "--out", dir}, &out, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, out.String(), dir+" holds 3 accounts (2 devices, 1 controllers), 3 new")
	require.Contains(t, out.String(), "--mqtt-password-file "+filepath.Join(dir, "controller-c1.password"))
	st, err := os.Stat(filepath.Join(dir, creds.CredentialsFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	before, err := creds.Load(filepath.Join(dir, creds.CredentialsFile))
	require.NoError(t, err)

	// Again with one more device: the first two keep their passwords.
	out.Reset()
	code = runMain(t.Context(), []string{"creds", "--devices", "3", "--out", dir}, &out, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, out.String(), "holds 4 accounts (3 devices, 1 controllers), 1 new")
	after, err := creds.Load(filepath.Join(dir, creds.CredentialsFile))
	require.NoError(t, err)
	kept := creds.Passwords(after)
	for _, a := range before {
		require.Equal(t, a.Password, kept[a.Username], a.Username)
	}

	for name, args := range map[string][]string{
		"no --out":        {"creds", "--devices", "2"},
		"no accounts":     {"creds", "--out", t.TempDir()},
		"controller- ids": {"creds", "--devices", "1", "--id-prefix", "controller-", "--out", t.TempDir()},
	} {
		var e strings.Builder
		require.Equal(t, 2, runMain(t.Context(), args, &out, &e), "%s: %s", name, e.String())
	}

	broker := testenv.StartSecureBroker(t, dir)
	bin := buildDevicesim(t)
	run := func(extra ...string) (*exec.Cmd, *stderrLines, chan error) {
		cmd := exec.Command(bin, append([]string{"run", "--mqtt", broker.URL(), "--devices", "3",
			"--state-dir", filepath.Join(t.TempDir(), "state"), "--credentials", filepath.Join(dir, creds.CredentialsFile)}, extra...)...)
		pipe, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines := &stderrLines{more: make(chan struct{}), done: make(chan struct{})}
		exited := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(pipe)
			for sc.Scan() {
				lines.mu.Lock()
				lines.lines = append(lines.lines, sc.Text())
				close(lines.more)
				lines.more = make(chan struct{})
				lines.mu.Unlock()
			}
			close(lines.done)
			exited <- cmd.Wait()
		}()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		return cmd, lines, exited
	}
	cmd, lines, exited := run("--mqtt-ca", broker.TLS.CA)
	lines.wait(t, "devicesim: 3 devices online")
	log := broker.Log()
	for i := 1; i <= 3; i++ {
		require.Contains(t, log, fmt.Sprintf("u'device-%d'", i))
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err)
		exited <- err
	case <-time.After(15 * time.Second):
		t.Fatal("devicesim did not exit after SIGTERM")
	}

	// Without the CA (the system's roots) no device comes online.
	_, lines, _ = run("--log-level", "debug")
	lines.wait(t, "devicesim: starting")
	require.Eventually(t, func() bool {
		lines.mu.Lock()
		defer lines.mu.Unlock()
		return strings.Contains(strings.Join(lines.lines, "\n"), "certificate signed by unknown authority")
	}, 10*time.Second, 20*time.Millisecond)
	lines.mu.Lock()
	defer lines.mu.Unlock()
	require.NotContains(t, strings.Join(lines.lines, "\n"), "devices online")
}
