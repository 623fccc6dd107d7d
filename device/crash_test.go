package device_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// blocking is a restart action that signals when it runs and then waits
// until released (or its context ends).
type blocking struct {
	runs    atomic.Int64
	started chan struct{}
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{started: make(chan struct{}, 10), release: make(chan struct{})}
}

func (b *blocking) handler(ctx context.Context, _ *device.Command) (any, error) {
	b.runs.Add(1)
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return map[string]any{"restarted": true}, nil
}

func (b *blocking) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-b.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the action never started")
	}
}

// A device that dies while its action runs is resolved at the next boot,
// never by running the action again: without a resolver it is failed
// "interrupted" (the operation stays taken: the action may have run); with
// a resolver that says it ran, the resolver's outcome. Devices share one
// Journal, as a process of many devices does.
func TestCrashWhileExecutingIsResolvedAtBoot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		resolve  device.Resolver
		status   wire.ReceiptStatus
		errText  string
		result   string
		opIsFree bool
	}{
		{name: "no resolver", status: wire.ReceiptFailed, errText: device.ErrorInterrupted},
		{name: "resolver: ran", status: wire.ReceiptSucceeded, result: `{"resolved":true}`,
			resolve: func(context.Context, device.Command) (bool, any, error) {
				return true, map[string]bool{"resolved": true}, nil
			}},
		{name: "resolver: never started", status: wire.ReceiptFailed, errText: device.ErrorInterrupted, opIsFree: true,
			resolve: func(context.Context, device.Command) (bool, any, error) { return false, nil, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			j, err := device.OpenJournal(e.dir, nil)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, j.Close()) })
			b := newBlocking()
			defer close(b.release)
			var other atomic.Int64
			o := e.options("dev-1", &other)
			o.StateDir, o.Journal = "", j
			o.Actions["restart"] = b.handler
			o.Resolve = tc.resolve
			// A neighbour on the same journal keeps working throughout.
			neighbour := start(t, func() device.Options { n := e.options("dev-2", &other); n.StateDir, n.Journal = "", j; return n }())

			r := start(t, o)
			cmd := command("")
			e.probe.Command("dev-1", cmd)
			b.waitStarted(t)
			e.probe.WaitReceipts(2, testenv.ForCommand(cmd.CommandID)) // received, executing
			r.kill(t)

			start(t, o)
			f := e.final(cmd.CommandID)
			assert.Equal(t, tc.status, f.Status)
			assert.Equal(t, 3, f.Seq)
			assert.Equal(t, tc.errText, f.Error)
			if tc.result != "" {
				assert.JSONEq(t, tc.result, string(f.Result))
			}
			again := cmd
			again.Attempt = 2
			e.probe.Command("dev-1", again)
			next := command(cmd.OperationID)
			e.probe.Command("dev-1", next)
			e.barrier(t, "dev-1")
			if tc.opIsFree {
				assert.Len(t, e.receipts(cmd.CommandID), 4, "the repeat answered with the resolution")
				e.probe.WaitReceipt(func(r testenv.ProbeReceipt) bool {
					return r.CommandID == next.CommandID && r.Status == wire.ReceiptExecuting
				})
				assert.EqualValues(t, 2, b.runs.Load(), "the operation was given back: its next command runs")
			} else {
				// The repeat and the next command of the operation are both
				// answered with the resolution, carrying the command that ran.
				assert.Len(t, e.receipts(cmd.CommandID), 5, "the repeat answered with the resolution")
				assert.Empty(t, e.receipts(next.CommandID))
				assert.EqualValues(t, 1, b.runs.Load(), "never run twice")
			}

			nc := command("")
			e.probe.Command("dev-2", nc)
			e.final(nc.CommandID)
			_ = neighbour
		})
	}
}

// The child process: a device on the test broker whose restart action
// appends one line per run to a file (durably, through the journal), and
// which, in mode "hang-received" or "hang-executing", stops forever at
// that point (so the parent can kill -9 it there).
func childMain() {
	mode, broker, dir := os.Getenv("DEVICE_CHILD"), os.Getenv("DEVICE_CHILD_BROKER"), os.Getenv("DEVICE_CHILD_DIR")
	j, err := device.OpenJournal(dir, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	runs := filepath.Join(dir, "runs.log")
	o := device.Options{
		ID: "dev-1", Broker: broker, Journal: j, KeepAlive: 2 * time.Second, MaxReconnectInterval: 100 * time.Millisecond,
		Actions: map[string]device.Handler{"restart": func(_ context.Context, c *device.Command) (any, error) {
			if err := j.AppendLine(runs, []byte(c.ID)); err != nil {
				return nil, err
			}
			if mode == "hang-executing" {
				if err := j.Sync(); err != nil { // the line, durable before the kill
					return nil, err
				}
				fmt.Println("EXECUTING")
				select {}
			}
			return map[string]bool{"restarted": true}, nil
		}},
		Hooks: &device.Hooks{Point: func(p device.Point, _ device.Command) {
			if mode == "hang-received" && p == device.PointReceived {
				fmt.Println("RECORDED")
				select {}
			}
		}},
	}
	d, err := device.New(o)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	go func() {
		_ = d.WaitOnline(context.Background())
		fmt.Println("ONLINE")
	}()
	if err := d.Run(context.Background()); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
}

// child runs this test binary as a device process and returns a channel
// of its output lines.
func child(t *testing.T, e *env, mode string) (*exec.Cmd, <-chan string) {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), "DEVICE_CHILD="+mode, "DEVICE_CHILD_BROKER="+e.broker.URL(), "DEVICE_CHILD_DIR="+e.dir)
	out, err := c.StdoutPipe()
	require.NoError(t, err)
	c.Stderr = os.Stderr
	require.NoError(t, c.Start())
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	return c, lines
}

func expectLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the child ended before %q", want)
			require.False(t, strings.HasPrefix(l, "ERROR"), l)
			if l == want {
				return
			}
		case <-deadline:
			t.Fatalf("the child never said %q", want)
		}
	}
}

func killChild(t *testing.T, c *exec.Cmd) {
	t.Helper()
	require.NoError(t, c.Process.Signal(syscall.SIGKILL))
	_ = c.Wait()
}

func runLines(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "runs.log"))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Fields(string(b))
}

// The record is durable before the PUBACK: a process killed (kill -9) after
// the "received" record is written but before the command is acknowledged
// gets the command again from the broker (persistent session), and the next
// process answers that redelivery from the record; the action runs once.
func TestRecordDurableBeforePuback(t *testing.T) {
	e := newEnv(t)
	c, lines := child(t, e, "hang-received")
	expectLine(t, lines, "ONLINE")
	cmd := command("")
	e.probe.Command("dev-1", cmd)
	expectLine(t, lines, "RECORDED")
	killChild(t, c)
	assert.Empty(t, e.receipts(cmd.CommandID), "nothing announced before the kill")

	_, lines = child(t, e, "normal")
	expectLine(t, lines, "ONLINE")
	f := e.final(cmd.CommandID)
	assert.Equal(t, wire.ReceiptSucceeded, f.Status)
	// The broker redelivered the unacknowledged command: it was answered
	// with the record's latest receipt (a receipt sent twice), not run.
	e.probe.WaitFor(0, "the redelivery's answer", func() bool {
		seen := map[int]int{}
		for _, r := range e.receipts(cmd.CommandID) {
			if seen[r.Seq]++; seen[r.Seq] == 2 {
				return true
			}
		}
		return false
	})
	e.barrier(t, "dev-1")
	for _, r := range e.receipts(cmd.CommandID) {
		assert.LessOrEqual(t, r.Seq, 3, "no second run: %+v", r.Receipt)
		assert.NotEqual(t, wire.ReceiptReceived, r.Status, "the received receipt of the first process was never sent, and not again")
	}
	assert.Equal(t, []string{cmd.CommandID}, runLines(t, e.dir), "the action ran once")
}

// kill -9 in the middle of the action: the next process resolves it as
// failed "interrupted" and never runs it again.
func TestKilledWhileExecuting(t *testing.T) {
	e := newEnv(t)
	c, lines := child(t, e, "hang-executing")
	expectLine(t, lines, "ONLINE")
	cmd := command("")
	e.probe.Command("dev-1", cmd)
	expectLine(t, lines, "EXECUTING")
	e.probe.WaitReceipts(2, testenv.ForCommand(cmd.CommandID))
	killChild(t, c)

	_, lines = child(t, e, "normal")
	expectLine(t, lines, "ONLINE")
	f := e.final(cmd.CommandID)
	assert.Equal(t, wire.ReceiptFailed, f.Status)
	assert.Equal(t, device.ErrorInterrupted, f.Error)
	assert.Equal(t, 3, f.Seq)
	again := cmd
	again.Attempt = 2
	e.probe.Command("dev-1", again)
	e.barrier(t, "dev-1")
	assert.Equal(t, []string{cmd.CommandID}, runLines(t, e.dir), "one run, the interrupted one")
	assert.Len(t, e.receipts(cmd.CommandID), 4)
}
