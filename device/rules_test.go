package device_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// A legacy device (dedupe:false, query:false) announces so, runs every
// delivery (its receipts continuing the seq) and ignores queries.
func TestLegacyDevice(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	o := e.options("dev-1", &runs)
	o.Capabilities = &device.Capabilities{}
	start(t, o)
	birth := e.probe.WaitPresence("dev-1", func(p testenv.ProbePresence) bool { return p.Online })
	assert.Equal(t, wire.Capabilities{}, *birth.Capabilities)

	cmd := command("")
	e.probe.Command("dev-1", cmd)
	e.final(cmd.CommandID)
	e.probe.Query("dev-1", wire.Query{QueryID: "q-1", CommandID: cmd.CommandID, OperationID: cmd.OperationID})
	again := cmd
	again.Attempt = 2
	e.probe.Command("dev-1", again)
	rs := e.probe.WaitReceipts(6, testenv.ForCommand(cmd.CommandID))
	assert.Equal(t, "received/1 executing/2 succeeded/3 received/4 executing/5 succeeded/6", statuses(rs))
	assert.EqualValues(t, 2, runs.Load())
	assert.Empty(t, e.probe.Receipts(testenv.ForQuery("q-1")), "queries are ignored")
}

// Refusals before acceptance get one receipt, rejected seq 1, and leave the
// operation free: an action without a handler, params that are no object,
// and Options.Accept's error.
func TestRejectedBeforeAcceptance(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	o := e.options("dev-1", &runs)
	o.Accept = func(c device.Command) error {
		if strings.Contains(string(c.Params), "nope") {
			return errors.New("not_now")
		}
		return nil
	}
	start(t, o)
	unsupported := command("")
	unsupported.Action = "reflash"
	badParams := command("")
	badParams.Params = json.RawMessage(`[1]`)
	refused := command("")
	refused.Params = json.RawMessage(`{"nope":true}`)
	for _, c := range []struct {
		cmd wire.Command
		err string
	}{{unsupported, device.ErrorUnsupportedAction}, {badParams, device.ErrorInvalidParams}, {refused, "not_now"}} {
		e.probe.Command("dev-1", c.cmd)
		f := e.final(c.cmd.CommandID)
		assert.Equal(t, wire.ReceiptRejected, f.Status)
		assert.Equal(t, 1, f.Seq)
		assert.Equal(t, c.err, f.Error)
	}
	assert.Zero(t, runs.Load())
	// The operation of a refused command is still free.
	ok := command(refused.OperationID)
	e.probe.Command("dev-1", ok)
	assert.Equal(t, wire.ReceiptSucceeded, e.final(ok.CommandID).Status)
}

// Results: a handler's error fails the command with its text; a result over
// the protocol's 32 KiB is replaced by the result_too_large marker (the
// protocol page's rule), one that is no JSON object fails the command; a
// panic fails it; progress is an executing receipt with a partial result.
func TestResultsErrorsAndProgress(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	o := e.options("dev-1", &runs)
	o.Actions = map[string]device.Handler{
		"fail": func(context.Context, *device.Command) (any, error) { return nil, errBoom },
		"big": func(context.Context, *device.Command) (any, error) {
			return map[string]string{"x": strings.Repeat("a", 40<<10)}, nil
		},
		"array": func(context.Context, *device.Command) (any, error) { return []int{1}, nil },
		"panic": func(context.Context, *device.Command) (any, error) { panic("oops") },
		"progress": func(_ context.Context, c *device.Command) (any, error) {
			if err := c.Progress(map[string]int{"percent": 50}); err != nil {
				return nil, err
			}
			return json.RawMessage(`{"done":true}`), nil
		},
	}
	start(t, o)
	run := func(action string) testenv.ProbeReceipt {
		c := command("")
		c.Action = action
		e.probe.Command("dev-1", c)
		return e.final(c.CommandID)
	}
	f := run("fail")
	assert.Equal(t, wire.ReceiptFailed, f.Status)
	assert.Equal(t, "boom", f.Error)

	f = run("big")
	assert.Equal(t, wire.ReceiptSucceeded, f.Status)
	assert.Equal(t, string(wire.TooLargeResult(40<<10+8)), string(f.Result))

	f = run("array")
	assert.Equal(t, wire.ReceiptFailed, f.Status)
	assert.Contains(t, f.Error, device.ErrorInvalidResult)

	f = run("panic")
	assert.Equal(t, wire.ReceiptFailed, f.Status)
	assert.Equal(t, "panic: oops", f.Error)

	f = run("progress")
	assert.Equal(t, 4, f.Seq)
	assert.JSONEq(t, `{"done":true}`, string(f.Result))
	rs := e.receipts(f.CommandID)
	assert.Equal(t, "received/1 executing/2 executing/3 succeeded/4", statuses(rs))
	assert.JSONEq(t, `{"percent":50}`, string(rs[2].Result))
}

// One id runs once per journal at a time.
func TestOneIDPerJournal(t *testing.T) {
	e := newEnv(t)
	j, err := device.OpenJournal(e.dir, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, j.Close()) }()
	var runs atomic.Int64
	o := e.options("dev-1", &runs)
	o.StateDir, o.Journal = "", j
	start(t, o)
	d, err := device.New(o)
	require.NoError(t, err)
	require.ErrorIs(t, d.Run(context.Background()), device.ErrDeviceRunning)
}

// The library links no controller code and no database driver.
func TestLinksNoControllerCode(t *testing.T) {
	deps := testenv.Deps(t, "github.com/fleetctl/fleetctl/device")
	for _, forbidden := range []string{
		"github.com/fleetctl/fleetctl/internal/store", "github.com/fleetctl/fleetctl/internal/controller",
		"github.com/fleetctl/fleetctl/internal/api", "github.com/fleetctl/fleetctl/internal/domain",
		"github.com/fleetctl/fleetctl/internal/sim", "github.com/jackc/pgx", "github.com/mattn/go-sqlite3", "database/sql",
	} {
		assert.Empty(t, testenv.Linked(deps, forbidden), forbidden)
	}
	for _, dep := range deps {
		if strings.HasPrefix(dep, "github.com/fleetctl/fleetctl/") && dep != "github.com/fleetctl/fleetctl/device" {
			assert.Equal(t, "github.com/fleetctl/fleetctl/internal/wire", dep, "only the wire leaf")
		}
	}
}
