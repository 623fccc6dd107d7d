package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// Actions the simulated devices support.
const (
	// ActionRestart bumps the durable boot counter; result
	// {"restarted":true,"boots":N}. The device does not reconnect.
	ActionRestart = "restart"
	// ActionSetConfig merges its params (an object) into the durable config
	// as a JSON merge patch (a null value removes the key); result
	// SetConfigResult: a summary of the config, never the config itself
	// when that is large, so that the receipt stays within the protocol's
	// result limit whatever was merged before.
	ActionSetConfig = "set-config"
)

// Error strings of the receipts a device makes itself.
const (
	ErrExpired           = device.ErrorExpired
	ErrUnsupportedAction = device.ErrorUnsupportedAction
	ErrInvalidParams     = device.ErrorInvalidParams
	ErrInterrupted       = device.ErrorInterrupted
	ErrSimulatedFailure  = "simulated_failure"
	ErrSimulatedReject   = "simulated_rejection"
)

// appState is a simulated device's own state, kept in the library's
// durable record (Hooks.SaveApp, LoadApp): saved with every change of the
// record, so an action's effect is durable with its final receipt.
type appState struct {
	// Boots counts the device's starts and its restart actions.
	Boots  int                        `json:"boots"`
	Config map[string]json.RawMessage `json:"config"`
	// Fail holds the fail fault's decisions for accepted commands that
	// have not run yet (decided when the command is accepted, so that a
	// crash after the execution cannot lose it).
	Fail map[string]string `json:"fail,omitempty"`
	// Last is the latest execution whose effect is applied: a command
	// found "executing" at boot with this id ran and ended so.
	Last *lastRun `json:"last,omitempty"`
}

type lastRun struct {
	CommandID string          `json:"command_id"`
	Failed    bool            `json:"failed,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     string          `json:"error,omitempty"`
}

func (l *lastRun) outcome() (any, error) {
	if l.Failed {
		return nil, errors.New(l.Error)
	}
	return l.Result, nil
}

func newAppState() appState {
	return appState{Config: map[string]json.RawMessage{}}
}

// handler is the action of a simulated device: the slow_execution fault,
// then the execution. The execution's witness line and its effect on the
// app state are handed to the next save of the device's record
// (saveLine), so that no record holds the effect, or the outcome, without
// the line being durable first.
func (d *Device) handler(inc *incarnation) device.Handler {
	return func(ctx context.Context, cmd *device.Command) (any, error) {
		d.mu.Lock()
		var delay time.Duration
		if sf := d.faults.SlowExecution; sf.matches(cmd.Action) && d.fireLocked("slow_execution", sf.Trigger) {
			delay = sf.Delay.D()
		}
		d.mu.Unlock()
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done(): // a clean stop cut the action short: it did not run
				t.Stop()
				return nil, fmt.Errorf("%w: %w", device.ErrNotStarted, ctx.Err())
			}
		}
		line, _ := witness.Line(witness.Execution{DeviceID: d.id, CommandID: cmd.ID, OperationID: cmd.OperationID, Action: cmd.Action, At: d.now()})
		d.appMu.Lock()
		last := d.planLocked(cmd.ID, cmd.Action, cmd.Params)
		inc.executed = &execution{line: line, last: last, action: cmd.Action, params: cmd.Params}
		d.appMu.Unlock()
		return last.outcome()
	}
}

// execution is an execution whose line and effect wait for the next save.
type execution struct {
	line   []byte
	last   *lastRun
	action string
	params json.RawMessage
}

// saveLine (Hooks.SaveLine) applies a waiting execution's effect to the app
// state (SaveApp saves it next) and returns its witness line.
func (d *Device) saveLine(inc *incarnation) (string, []byte) {
	d.appMu.Lock()
	e := inc.executed
	inc.executed = nil
	if e != nil {
		d.applyLocked(e)
	}
	d.appMu.Unlock()
	if e == nil {
		return "", nil
	}
	d.mu.Lock()
	d.stats.Executions++
	d.mu.Unlock()
	return d.f.execFile, e.line
}

// planLocked decides an execution's outcome from the app state (under
// appMu): the fail fault's decision (no effect), else the action's result.
func (d *Device) planLocked(commandID, action string, params json.RawMessage) *lastRun {
	app := &d.app
	last := &lastRun{CommandID: commandID}
	if e, ok := app.Fail[commandID]; ok {
		last.Failed, last.Error = true, e
		return last
	}
	switch action {
	case ActionRestart:
		last.Result = restartResult(app.Boots + 1)
	case ActionSetConfig:
		next, changed := mergeConfig(app.Config, params)
		last.Result = SetConfigResult(next, changed)
	}
	return last
}

// restartResult is a restart's result, {"boots":N,"restarted":true}: what
// json.Marshal makes of the map {"restarted": true, "boots": N} (its keys
// sorted), without the reflection.
func restartResult(boots int) json.RawMessage {
	b := make([]byte, 0, 40)
	b = append(b, `{"boots":`...)
	b = strconv.AppendInt(b, int64(boots), 10)
	return append(b, `,"restarted":true}`...)
}

// applyLocked applies an execution's effect to the app state (under
// appMu).
func (d *Device) applyLocked(e *execution) {
	app := &d.app
	d.appDirty = true
	delete(app.Fail, e.last.CommandID)
	app.Last = e.last
	if e.last.Failed {
		return
	}
	switch e.action {
	case ActionRestart:
		app.Boots++
	case ActionSetConfig:
		app.Config, _ = mergeConfig(app.Config, e.params)
	}
}

// mergeConfig is config with params merged as a JSON merge patch, and the
// number of keys the patch names.
func mergeConfig(config map[string]json.RawMessage, params json.RawMessage) (map[string]json.RawMessage, int) {
	next := copyConfig(config)
	var patch map[string]json.RawMessage
	_ = json.Unmarshal(params, &patch)
	for k, v := range patch {
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			delete(next, k)
		} else {
			next[k] = v
		}
	}
	return next, len(patch)
}

// resolve is the device's Resolver: a command found "executing" at boot ran
// if the app state holds its outcome (the effect was saved), or if
// executions.jsonl holds a line of it (it ran, its effect was not saved:
// applied now); otherwise it never ran (failed "interrupted", its operation
// given back). A legacy device's recovery is best effort: an earlier
// delivery's line counts.
func (d *Device) resolve(_ context.Context, cmd device.Command) (bool, any, error) {
	d.mu.Lock()
	d.stats.Recovered++
	d.mu.Unlock()
	d.appMu.Lock()
	defer d.appMu.Unlock()
	if l := d.app.Last; l != nil && l.CommandID == cmd.ID {
		res, err := l.outcome()
		return true, res, err
	}
	execs, err := witness.ReadExecutions(d.f.cfg.StateDir)
	if err != nil {
		d.log.Error("cannot read the execution witness; the command is failed interrupted", "err", err)
		return true, nil, device.ErrInterrupted
	}
	for _, e := range execs {
		if e.DeviceID == d.id && e.CommandID == cmd.ID {
			last := d.planLocked(cmd.ID, cmd.Action, cmd.Params)
			d.applyLocked(&execution{last: last, action: cmd.Action, params: cmd.Params})
			res, err := last.outcome()
			return true, res, err
		}
	}
	delete(d.app.Fail, cmd.ID)
	d.appDirty = true
	return false, nil, nil
}

// accept is the reject fault, and where the fail fault decides: both when
// a command is accepted, so the decision is durable with its record.
func (d *Device) accept(cmd device.Command) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rf := d.faults.Reject; rf.matches(cmd.Action) && d.fireLocked("reject", rf.Trigger) {
		return errors.New(or(rf.Error, ErrSimulatedReject))
	}
	if ff := d.faults.Fail; ff.matches(cmd.Action) && d.fireLocked("fail", ff.Trigger) {
		d.appMu.Lock()
		if d.app.Fail == nil {
			d.app.Fail = map[string]string{}
		}
		d.app.Fail[cmd.ID] = or(ff.Error, ErrSimulatedFailure)
		d.appDirty = true
		d.appMu.Unlock()
	}
	return nil
}

func (d *Device) saveApp() json.RawMessage {
	d.appMu.Lock()
	defer d.appMu.Unlock()
	if d.appDirty || d.saved == nil {
		d.saved, _ = json.Marshal(d.app)
		d.appDirty = false
	}
	return d.saved
}

// loadApp takes the app state from the durable record at boot, and counts
// the boot.
func (d *Device) loadApp(raw json.RawMessage) {
	app := decodeApp(raw)
	app.Boots++
	d.appMu.Lock()
	d.app, d.appDirty = app, true
	d.appMu.Unlock()
	d.mu.Lock()
	d.stats.Boots++
	d.mu.Unlock()
}

func decodeApp(raw json.RawMessage) appState {
	app := newAppState()
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &app)
	}
	if app.Config == nil {
		app.Config = map[string]json.RawMessage{}
	}
	return app
}

// SetConfigEchoBytes is the largest config a set-config result carries
// whole.
const SetConfigEchoBytes = 4 << 10

// SetConfigResult is a set-config's result: {"config_keys":N,
// "config_sha256":"<hex of the config's JSON>","changed_keys":M}, with
// "config" itself when it encodes to at most SetConfigEchoBytes. The JSON
// hashed is the config's compact encoding, its keys sorted.
func SetConfigResult(config map[string]json.RawMessage, changed int) json.RawMessage {
	whole, _ := json.Marshal(config)
	sum := sha256.Sum256(whole)
	res := map[string]any{"config_keys": len(config), "config_sha256": hex.EncodeToString(sum[:]), "changed_keys": changed}
	if len(whole) <= SetConfigEchoBytes {
		res["config"] = json.RawMessage(whole)
	}
	out, _ := json.Marshal(res)
	return out
}

func copyConfig(c map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func witnessFiles(stateDir string) (execFile, rcptFile string) {
	return filepath.Join(stateDir, witness.ExecutionsFile), filepath.Join(stateDir, witness.ReceiptsFile)
}
