package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// devicesimProc is a running devicesim with its stderr.
type devicesimProc struct {
	cmd    *exec.Cmd
	lines  *stderrLines
	exited chan error
}

func startDevicesim(t *testing.T, bin string, args ...string) *devicesimProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"run"}, args...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &devicesimProc{cmd: cmd, lines: &stderrLines{more: make(chan struct{}), done: make(chan struct{})}, exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.lines.mu.Lock()
			p.lines.lines = append(p.lines.lines, sc.Text())
			close(p.lines.more)
			p.lines.more = make(chan struct{})
			p.lines.mu.Unlock()
		}
		close(p.lines.done)
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		err := <-p.exited
		p.exited <- err
	})
	return p
}

// wait waits for the process to exit and returns its error.
func (p *devicesimProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("devicesim did not exit")
		return nil
	}
}

// devicesim killed with SIGKILL in the middle of a stream of commands (so
// in the middle of a journal batch) restarts from what was durable: no
// command or operation runs twice, every receipt published before the kill
// still holds (a repeat gets the same final receipt), and every reported
// execution has its witness line.
func TestKill9MidBatchLosesOnlyWhatWasNotDurable(t *testing.T) {
	t.Parallel()
	const devices, commands = 10, 600
	bin := buildDevicesim(t)
	broker := testenv.StartBroker(t)
	probe := testenv.NewProbe(t, broker.URL(), "fleet")
	stateDir := filepath.Join(t.TempDir(), "state")
	args := []string{"--mqtt", broker.URL(), "--devices", fmt.Sprint(devices), "--state-dir", stateDir, "--keepalive", "2s", "--max-reconnect-interval", "100ms"}

	first := startDevicesim(t, bin, args...)
	first.lines.wait(t, fmt.Sprintf("devicesim: %d devices online", devices))
	now := time.Now().UTC()
	cmds := make([]wire.Command, commands)
	dev := func(i int) string { return fmt.Sprintf("device-%d", i%devices+1) }
	for i := range cmds {
		cmds[i] = wire.Command{CommandID: fmt.Sprintf("c-%d", i), OperationID: fmt.Sprintf("op-%d", i), Action: sim.ActionRestart,
			IssuedAt: now, ExpiresAt: now.Add(5 * time.Minute), Attempt: 1}
		probe.Command(dev(i), cmds[i])
	}
	isFinal := func(r testenv.ProbeReceipt) bool { return r.Status.Final() && r.QueryID == "" }
	probe.WaitFor(30*time.Second, "a sixth of the finals", func() bool { return len(probe.Receipts(isFinal)) >= commands/6 })
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, first.wait(t), "killed")
	killedAt := time.Now()
	before := probe.Receipts(func(testenv.ProbeReceipt) bool { return true })
	t.Logf("killed after %d receipts, %d final", len(before), len(probe.Receipts(isFinal)))

	second := startDevicesim(t, bin, args...)
	second.lines.wait(t, fmt.Sprintf("devicesim: %d devices online", devices))
	for i, c := range cmds {
		c.Attempt = 2
		probe.Command(dev(i), c)
	}
	after := func(id string) func(testenv.ProbeReceipt) bool {
		return func(r testenv.ProbeReceipt) bool {
			return r.CommandID == id && isFinal(r) && r.ReceivedAt.After(killedAt)
		}
	}
	finals := map[string]testenv.ProbeReceipt{}
	probe.WaitFor(60*time.Second, "a final receipt for every command after the restart", func() bool {
		for _, c := range cmds {
			if _, ok := finals[c.CommandID]; ok {
				continue
			}
			rs := probe.Receipts(after(c.CommandID))
			if len(rs) == 0 {
				return false
			}
			finals[c.CommandID] = rs[0]
		}
		return true
	})
	require.NoError(t, second.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.wait(t), "clean exit")

	execs, err := witness.ReadExecutions(stateDir)
	require.NoError(t, err)
	byCmd, byOp := map[string]int{}, map[string]int{}
	for _, e := range execs {
		byCmd[e.CommandID]++
		byOp[e.OperationID]++
		require.LessOrEqual(t, byCmd[e.CommandID], 1, "%s ran twice", e.CommandID)
		require.LessOrEqual(t, byOp[e.OperationID], 1, "%s ran twice", e.OperationID)
	}
	interrupted := 0
	for _, c := range cmds {
		f := finals[c.CommandID]
		switch {
		case f.Status == wire.ReceiptSucceeded:
			require.Equal(t, 1, byCmd[c.CommandID], "%s succeeded: its execution is witnessed", c.CommandID)
		case f.Status == wire.ReceiptFailed && f.Error == sim.ErrInterrupted:
			require.Zero(t, byCmd[c.CommandID], "%s interrupted: it never ran", c.CommandID)
			interrupted++
		default:
			t.Fatalf("%s: final %s %q", c.CommandID, f.Status, f.Error)
		}
	}
	// What was published before the kill was durable: the same seq never
	// carries another status, and an earlier final is the final now.
	for _, r := range before {
		if r.QueryID != "" {
			continue
		}
		f := finals[r.CommandID]
		if r.Status.Final() {
			require.Equal(t, []any{r.Status, r.Seq}, []any{f.Status, f.Seq}, "%s: final before the kill", r.CommandID)
		}
		if r.Status == wire.ReceiptExecuting {
			require.Equal(t, r.Seq+1, f.Seq, "%s: the final follows the published executing", r.CommandID)
		}
	}
	rcpts, err := witness.ReadReceipts(stateDir)
	require.NoError(t, err)
	for _, r := range rcpts {
		f := finals[r.CommandID]
		require.Equal(t, []any{f.Status, f.Seq}, []any{r.Status, r.Seq}, "%s: witnessed receipt", r.CommandID)
	}
	t.Logf("%d executions, %d interrupted, %d receipt lines", len(execs), interrupted, len(rcpts))

	// The journal was folded into the snapshots at the clean stop.
	left, err := filepath.Glob(filepath.Join(stateDir, sim.DevicesDir, "*"+sim.JournalExt))
	require.NoError(t, err)
	require.Empty(t, left)
	for i := range devices {
		_, err := os.Stat(filepath.Join(stateDir, sim.DevicesDir, dev(i)+".json"))
		require.NoError(t, err)
	}
}
