package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device/conformtest"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// restartScript kills the devicesim whose pid is in the pid file with
// SIGKILL (if any), waits until it is dead (so its journal's lock is gone),
// and starts it again in the background: what `devicesim conform --restart`
// runs, and what starts the device the first time.
const restartScript = `#!/bin/sh
if [ -s %[1]q ]; then
  pid=$(cat %[1]q)
  kill -9 "$pid" 2>/dev/null
  i=0
  while [ $i -lt 200 ] && [ -e /proc/$pid ] && [ "$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)" != Z ]; do
    sleep 0.05; i=$((i+1))
  done
fi
%[2]q run --mqtt %[3]q --devices 1 --state-dir %[4]q --keepalive 2s %[5]s >>%[6]q 2>&1 &
echo $! >%[1]q
`

// startScriptedDevicesim writes the restart script, runs it once, and kills
// the last devicesim it started when the test ends.
func startScriptedDevicesim(t *testing.T, bin, broker, extra string) (script, logFile string) {
	t.Helper()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "devicesim.pid")
	logFile = filepath.Join(dir, "devicesim.log")
	script = filepath.Join(dir, "restart.sh")
	body := fmt.Sprintf(restartScript, pidFile, bin, broker, filepath.Join(dir, "state"), extra, logFile)
	require.NoError(t, os.WriteFile(script, []byte(body), 0o755))
	out, err := exec.Command("/bin/sh", script).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			log, _ := os.ReadFile(logFile)
			t.Logf("devicesim log:\n%s", log)
		}
	})
	return script, logFile
}

// conform runs `devicesim conform` and returns its stdout and exit status.
func conform(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"conform"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	t.Logf("devicesim conform %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return stdout.String(), code
}

// A devicesim device passes every rule, the restart rules included, with
// --restart killing the devicesim process with SIGKILL and starting it again
// from its state directory.
func TestConformPassesAgainstDevicesimWithKill9Restart(t *testing.T) {
	t.Parallel()
	bin := buildDevicesim(t)
	broker := testenv.StartBroker(t)
	script, logFile := startScriptedDevicesim(t, bin, broker.URL(), "")

	out, code := conform(t, bin, "--mqtt", broker.URL(), "--device", "device-1", "--restart", "/bin/sh "+script, "--timeout", "5s")
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, len(conformtest.Rules)+1)
	for i, rule := range conformtest.Rules {
		require.Equal(t, "PASS "+rule, lines[i])
	}
	require.Equal(t, fmt.Sprintf("%d passed, 0 failed, 0 skipped", len(conformtest.Rules)), lines[len(lines)-1])
	// The restart was a kill -9: two starts, no clean shutdown.
	log, err := os.ReadFile(logFile)
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(string(log), "devicesim: starting"), "%s", log)
	require.NotContains(t, string(log), "devicesim: shutting down")
}

// A devicesim device that ignores its queries while declaring query:true
// fails the query rules, and only those: exit 1. Without --restart the
// restart rules are SKIP. --json prints one object per rule.
func TestConformFailsABrokenDevice(t *testing.T) {
	t.Parallel()
	bin := buildDevicesim(t)
	broker := testenv.StartBroker(t)
	_, _ = startScriptedDevicesim(t, bin, broker.URL(), "--ignore-queries 1")

	out, code := conform(t, bin, "--mqtt", broker.URL(), "--device", "device-1", "--timeout", "2s", "--json")
	require.Equal(t, 1, code)
	var got []conformtest.Result
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var r conformtest.Result
		require.NoError(t, dec.Decode(&r))
		got = append(got, r)
	}
	require.Len(t, got, len(conformtest.Rules))
	want := map[string]conformtest.Outcome{
		conformtest.RuleQueryKnown: conformtest.Fail, conformtest.RuleQueryByOperation: conformtest.Fail,
		conformtest.RuleQueryUnknown:             conformtest.Fail,
		conformtest.RulePresenceSessionIncreases: conformtest.Skip, conformtest.RuleDedupeSurvivesRestart: conformtest.Skip,
	}
	for i, r := range got {
		require.Equal(t, conformtest.Rules[i], r.Rule)
		w := want[r.Rule]
		if w == "" {
			w = conformtest.Pass
		}
		require.Equal(t, w, r.Outcome, "%s", r)
	}
	require.Contains(t, got[6].Detail, "no answer carrying query_id")
}

// Usage errors exit 2 before anything connects.
func TestConformRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"no device":      {"conform", "--mqtt", "tcp://127.0.0.1:1"},
		"no broker":      {"conform", "--device", "device-1"},
		"bad device":     {"conform", "--mqtt", "tcp://127.0.0.1:1", "--device", "controller-1"},
		"params":         {"conform", "--mqtt", "tcp://127.0.0.1:1", "--device", "device-1", "--params", "[]"},
		"bad json":       {"conform", "--mqtt", "tcp://127.0.0.1:1", "--device", "device-1", "--params", "{"},
		"timeout":        {"conform", "--mqtt", "tcp://127.0.0.1:1", "--device", "device-1", "--timeout", "0s"},
		"action":         {"conform", "--mqtt", "tcp://127.0.0.1:1", "--device", "device-1", "--action", "a b"},
		"extra argument": {"conform", "--mqtt", "tcp://127.0.0.1:1", "--device", "device-1", "x"},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		var stdout, stderr strings.Builder
		code := runMain(ctx, args, &stdout, &stderr)
		cancel()
		require.Equal(t, 2, code, "%s: %s", name, stderr.String())
		require.Empty(t, stdout.String(), name)
		require.Contains(t, stderr.String(), "Run 'devicesim conform --help' for usage.", name)
	}
}

// On the secure profile the suite logs in with a controller account of its
// own (--mqtt-user, --mqtt-password-file) over TLS (--mqtt-ca), which the
// ACL lets write commands and queries and read receipts and presence.
func TestConformOnTheSecureProfile(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "creds")
	var stderr strings.Builder
	require.Equal(t, 0, runMain(t.Context(), []string{"creds", "--devices", "1", "--controllers", "conform", "--out", dir}, nopWriter{}, &stderr), stderr.String())
	broker := testenv.StartSecureBroker(t, dir)
	bin := buildDevicesim(t)
	_, _ = startScriptedDevicesim(t, bin, broker.URL(),
		fmt.Sprintf("--credentials %q --mqtt-ca %q", filepath.Join(dir, creds.CredentialsFile), broker.TLS.CA))

	out, code := conform(t, bin, "--mqtt", broker.URL(), "--device", "device-1", "--timeout", "3s",
		"--mqtt-user", "controller-conform", "--mqtt-password-file", creds.PasswordFile(dir, "conform"), "--mqtt-ca", broker.TLS.CA)
	require.Equal(t, 0, code)
	require.True(t, strings.HasSuffix(out, fmt.Sprintf("%d passed, 0 failed, 2 skipped\n", len(conformtest.Rules)-2)), out)

	// Without the CA the suite cannot connect: exit 1, nothing on stdout.
	out, code = conform(t, bin, "--mqtt", broker.URL(), "--device", "device-1", "--timeout", "3s",
		"--mqtt-user", "controller-conform", "--mqtt-password-file", creds.PasswordFile(dir, "conform"))
	require.Equal(t, 1, code)
	require.Empty(t, out)
}
