package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// buildDevicesim builds the binary into a temporary directory.
func buildDevicesim(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "devicesim")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/devicesim")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// stderrLines collects a process's stderr and signals lines as they come.
type stderrLines struct {
	mu    sync.Mutex
	lines []string
	more  chan struct{}
	done  chan struct{}
}

func (s *stderrLines) wait(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		s.mu.Lock()
		for _, l := range s.lines {
			if strings.HasPrefix(l, prefix) {
				s.mu.Unlock()
				return l
			}
		}
		more := s.more
		s.mu.Unlock()
		select {
		case <-more:
		case <-s.done:
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, l := range s.lines {
				if strings.HasPrefix(l, prefix) {
					return l
				}
			}
			t.Fatalf("devicesim exited without %q; stderr:\n%s", prefix, strings.Join(s.lines, "\n"))
		case <-deadline:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("no %q within 15s; stderr:\n%s", prefix, strings.Join(s.lines, "\n"))
		}
	}
}

func TestDevicesimBinary(t *testing.T) {
	t.Parallel()
	bin := buildDevicesim(t)
	broker := testenv.StartBroker(t)
	probe := testenv.NewProbe(t, broker.URL(), "fleet")
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	profile := filepath.Join(dir, "faults.json")
	require.NoError(t, os.WriteFile(profile, []byte(`{"devices":[{"match":"device-3","faults":{"legacy":true}}]}`), 0o644))

	cmd := exec.Command(bin, "run", "--state-dir", stateDir, "--faults", profile, "--fail", "count=1,error=boom", "--keepalive", "2s")
	cmd.Env = append(os.Environ(), "DEVICESIM_MQTT="+broker.URL(), "DEVICESIM_DEVICES=3", "DEVICESIM_SEED=5")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	lines := &stderrLines{more: make(chan struct{}), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
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

	require.Contains(t, lines.wait(t, "devicesim: starting"), "seed 5")
	lines.wait(t, "devicesim: 3 devices online")
	births := map[string]int64{}
	for _, id := range []string{"device-1", "device-2", "device-3"} {
		b := probe.WaitPresence(id, func(pr testenv.ProbePresence) bool { return pr.Online })
		births[id] = b.Session
		require.Equal(t, id != "device-3", b.Capabilities.Dedupe, "device-3 is legacy by the profile")
	}

	// The --fail flag: the first action of a device fails, the next runs.
	now := time.Now().UTC()
	cmdFor := func(id string) wire.Command {
		return wire.Command{CommandID: id, OperationID: "op-" + id, Action: "restart", IssuedAt: now, ExpiresAt: now.Add(time.Minute), Attempt: 1}
	}
	isFinal := func(id string) func(testenv.ProbeReceipt) bool {
		return func(r testenv.ProbeReceipt) bool { return r.CommandID == id && r.Status.Final() }
	}
	probe.Command("device-2", cmdFor("c-1"))
	r := probe.WaitReceipt(isFinal("c-1"))
	require.Equal(t, []any{wire.ReceiptFailed, "boom"}, []any{r.Status, r.Error})
	probe.Command("device-2", cmdFor("c-2"))
	r = probe.WaitReceipt(isFinal("c-2"))
	require.Equal(t, wire.ReceiptSucceeded, r.Status)
	require.Equal(t, "device-2", r.Device)

	ex, err := witness.ReadExecutions(stateDir)
	require.NoError(t, err)
	require.Len(t, ex, 2)
	require.Equal(t, []string{"c-1", "c-2"}, []string{ex[0].CommandID, ex[1].CommandID})
	require.Equal(t, "device-2", ex[1].DeviceID)
	require.Eventually(t, func() bool {
		rs, err := witness.ReadReceipts(stateDir)
		return err == nil && len(rs) == 2 && rs[1].CommandID == "c-2" && rs[1].Seq == 3
	}, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status")
		exited <- err
	case <-time.After(15 * time.Second):
		t.Fatal("devicesim did not exit after SIGTERM")
	}
	summary := lines.wait(t, "devicesim: stopped:")
	require.Contains(t, summary, "commands seen 2, executions 2")

	ret := testenv.RetainedPresence(t, broker.URL(), "fleet", "device-1", "device-2", "device-3")
	for id, s := range births {
		require.Equal(t, wire.Presence{Online: false, Session: s, At: ret[id].At}, ret[id], id)
		require.NotNil(t, ret[id].At, "%s: its own offline presence, not the LWT", id)
	}
	for _, id := range []string{"device-1", "device-2", "device-3"} {
		_, err := os.Stat(filepath.Join(stateDir, "devices", id+".json"))
		require.NoError(t, err)
	}
}

// A wrong command line exits 2 with a hint, before any device starts; a run
// that fails exits 1. Both print "devicesim: <message>".
func TestDevicesimRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		code int
	}{
		"bad spec":      {[]string{"run", "--drop-command", "often"}, 2},
		"status alone":  {[]string{"run", "--drop-receipt-status", "final"}, 2},
		"bad status":    {[]string{"run", "--drop-receipt", "1", "--drop-receipt-status", "done"}, 2},
		"unknown key":   {[]string{"run", "--drop-command", "statuses=final"}, 2},
		"no devices":    {[]string{"run", "--devices", "0"}, 2},
		"no journal":    {[]string{"run", "--journal-compact-mib", "0"}, 2},
		"bad log level": {[]string{"run", "--log-level", "loud"}, 2},
		"bad duration":  {[]string{"run", "--keepalive", "soon"}, 2},
		"unknown flag":  {[]string{"run", "--bogus"}, 2},
		"extra arg":     {[]string{"run", "x"}, 2},
		"unknown cmd":   {[]string{"rn"}, 2},
		"bad profile":   {[]string{"run", "--faults", "/nonexistent/profile.json"}, 1},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		var stderr strings.Builder
		code := runMain(ctx, append(tc.args, "--state-dir", t.TempDir()), nopWriter{}, &stderr)
		cancel()
		require.Equal(t, tc.code, code, "%s: %s", name, stderr.String())
		require.True(t, strings.HasPrefix(stderr.String(), "devicesim: "), "%s: %s", name, stderr.String())
		if tc.code == 2 {
			hint := "Run 'devicesim run --help' for usage."
			if tc.args[0] == "rn" {
				hint = "Run 'devicesim --help' for usage."
			}
			require.Contains(t, stderr.String(), hint, name)
		}
	}
}

func TestDevicesimHelpNamesEveryVariable(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	require.Equal(t, 0, runMain(t.Context(), []string{"run", "--help"}, &out, nopWriter{}))
	help := out.String()
	run, _ := newRunCmd(nopWriter{})
	n := 0
	run.Flags().VisitAll(func(f *pflag.Flag) {
		n++
		require.Contains(t, help, "(env DEVICESIM_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))+")", f.Name)
	})
	require.Greater(t, n, 20)
	require.Contains(t, help, "(env DEVICESIM_MQTT)")
	require.Contains(t, help, "Examples:\n  devicesim run --mqtt tcp://127.0.0.1:1883 --devices 5")
	require.Contains(t, help, "--log-level debug|info|warn|error")
}

// The examples in run --help parse: every flag exists and takes its value.
func TestDevicesimExamplesParse(t *testing.T) {
	t.Parallel()
	n, err := cmdline.CheckExamples(func() *cobra.Command { return newRootCmd(nopWriter{}, nopWriter{}) }, envPrefix)
	require.NoError(t, err)
	require.Equal(t, 11, n)
}

func TestParseSpec(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]string{
		"0.25":                                 `{"p":0.25}`,
		"p=1,statuses=received+final,delay=2s": `{"delay":"2s","p":1,"statuses":["received","final"]}`,
		"count=1,at=executed,for=500ms":        `{"at":"executed","count":1,"for":"500ms"}`,
		"count=2,skip=1,error=disk_full,actions=restart": `{"actions":["restart"],"count":2,"error":"disk_full","skip":1}`,
	} {
		obj, err := parseSpec(spec)
		require.NoError(t, err, spec)
		got, _ := json.Marshal(obj)
		require.JSONEq(t, want, string(got), spec)
	}
	for _, bad := range []string{"sometimes", "p=x", "count=1.5"} {
		_, err := parseSpec(bad)
		require.Error(t, err, bad)
	}
}

// Fault flags replace their fault for every device, overrides included.
func TestFaultFlagsOverTheProfile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"seed":3,"defaults":{"drop_command":{"p":0.5},"ignore_queries":{"count":1}},
	  "devices":[{"match":"device-2","faults":{"drop_command":{"count":9}}}]}`), 0o644))
	cmd, o := newRunCmd(nopWriter{})
	require.NoError(t, cmd.Flags().Parse([]string{"--faults", file, "--drop-command", "count=2", "--legacy", "--clock-skew", "-3s",
		"--drop-receipt", "0.15", "--drop-receipt-status", "succeeded,executing"}))
	p, err := o.profile(cmd.Flags())
	require.NoError(t, err)
	require.Equal(t, sim.ReceiptFault{Trigger: sim.Trigger{P: 0.15}, Statuses: []string{"succeeded", "executing"}}, p.For("device-2").DropReceipt)
	require.Equal(t, int64(3), p.Seed)
	for _, id := range []string{"device-1", "device-2"} {
		f := p.For(id)
		require.Equal(t, sim.Trigger{Count: 2}, f.DropCommand, id)
		require.Equal(t, sim.Trigger{Count: 1}, f.IgnoreQueries, id)
		require.Equal(t, sim.Legacy{Enabled: true}, f.Legacy, id)
		require.Equal(t, sim.Duration(-3*time.Second), f.ClockSkew, id)
	}
}

func TestFlagsFromEnv(t *testing.T) {
	t.Setenv("DEVICESIM_ID_PREFIX", "pump-")
	t.Setenv("DEVICESIM_LEGACY", "true")
	t.Setenv("DEVICESIM_DEVICES", "7")
	cmd, _ := newRunCmd(nopWriter{})
	require.NoError(t, cmd.Flags().Parse([]string{"--devices", "2"}))
	require.NoError(t, cmdline.FromEnv(cmd.Flags(), envPrefix))
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	require.Equal(t, "pump-", get("id-prefix"))
	require.Equal(t, "true", get("legacy"))
	require.Equal(t, "2", get("devices"), "a flag on the command line wins")

	t.Setenv("DEVICESIM_KEEPALIVE", "soon")
	cmd, _ = newRunCmd(nopWriter{})
	require.NoError(t, cmd.Flags().Parse(nil))
	err := cmdline.FromEnv(cmd.Flags(), envPrefix)
	require.ErrorContains(t, err, "DEVICESIM_KEEPALIVE")
	require.Equal(t, 2, cmdline.ExitCode(err), "a bad value in a variable is a usage error")
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
