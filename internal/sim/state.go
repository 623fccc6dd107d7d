package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// DevicesDir is the directory under the state dir that holds one snapshot
// file per device, <id>.json, and the fleet's journal (see journal).
const DevicesDir = "devices"

const stateVersion = 1

// durableState is everything a device keeps across crashes and restarts:
// its snapshot file with its journal records applied. Every change is made
// durable through the fleet's journal before the device acts on it.
type durableState struct {
	Version  int    `json:"version"`
	DeviceID string `json:"device_id"`
	// Session is the last session number used for a connection; it is
	// raised and saved before every connection attempt.
	Session int64 `json:"session"`
	// Boots counts the device's starts and its restart actions.
	Boots  int                        `json:"boots"`
	Config map[string]json.RawMessage `json:"config"`
	// Commands holds every command seen, by command_id.
	Commands map[string]*record `json:"commands"`
	// Operations maps an operation_id to the command that took it: the one
	// accepted for execution. At most one command of an operation runs.
	Operations map[string]string `json:"operations"`

	// nextPrune is when prune next looks at the records (in memory only:
	// a new incarnation prunes at its first save).
	nextPrune time.Time
}

// record is what the device knows of one command_id.
type record struct {
	Command wire.Command `json:"command"`
	SeenAt  time.Time    `json:"seen_at"`
	// Latest is the last receipt the device sent (or is about to send) for
	// the command; repeats and queries are answered with it.
	Latest wire.Receipt `json:"latest"`
	// Executions counts the real executions committed to this state; it is
	// compared with executions.jsonl when an interrupted one is resolved.
	Executions int `json:"executions"`
	// Plan is the outcome decided when the command went to "executing",
	// applied once the execution is witnessed.
	Plan *plan `json:"plan,omitempty"`
}

// plan is the decided outcome of one execution.
type plan struct {
	Status    wire.ReceiptStatus         `json:"status"`
	Result    json.RawMessage            `json:"result,omitempty"`
	Error     string                     `json:"error,omitempty"`
	SetConfig bool                       `json:"set_config,omitempty"`
	Config    map[string]json.RawMessage `json:"config,omitempty"`
	Boot      bool                       `json:"boot,omitempty"`
}

func newState(id string) *durableState {
	return &durableState{
		Version:    stateVersion,
		DeviceID:   id,
		Config:     map[string]json.RawMessage{},
		Commands:   map[string]*record{},
		Operations: map[string]string{},
	}
}

func statePath(stateDir, id string) string {
	return filepath.Join(stateDir, DevicesDir, id+".json")
}

// loadState reads a device's durable state; a missing file is a new device.
func loadState(stateDir, id string) (*durableState, error) {
	b, err := os.ReadFile(statePath(stateDir, id))
	if errors.Is(err, fs.ErrNotExist) {
		return newState(id), nil
	}
	if err != nil {
		return nil, fmt.Errorf("load state of %s: %w", id, err)
	}
	st := newState(id)
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("load state of %s: %w", id, err)
	}
	if st.Version != stateVersion || st.DeviceID != id {
		return nil, fmt.Errorf("load state of %s: version %d for device %q", id, st.Version, st.DeviceID)
	}
	st.fill()
	return st, nil
}

// fill makes the maps of a decoded state usable.
func (st *durableState) fill() {
	if st.Config == nil {
		st.Config = map[string]json.RawMessage{}
	}
	if st.Commands == nil {
		st.Commands = map[string]*record{}
	}
	if st.Operations == nil {
		st.Operations = map[string]string{}
	}
}

// save writes the snapshot file atomically: a crash leaves the old file or
// the new one, never a mix. syncFile makes a file durable. The caller
// fsyncs the directory afterwards.
func (st *durableState) save(stateDir string, syncFile func(*os.File) error) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("save state of %s: %w", st.DeviceID, err)
	}
	file := statePath(stateDir, st.DeviceID)
	if err := writeFileAtomic(file, b, syncFile); err != nil {
		return fmt.Errorf("save state of %s: %w", st.DeviceID, err)
	}
	return nil
}

func writeFileAtomic(file string, b []byte, syncFile func(*os.File) error) error {
	tmp := file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := syncFile(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// prune forgets commands whose expiry (or, without one, whose arrival) lies
// more than retention in the past, with their operation claims, and
// returns what it forgot. It scans the records at most once per
// pruneInterval(retention), so a record may outlive its retention by that.
func (st *durableState) prune(now time.Time, retention time.Duration) (cmds, ops []string) {
	if now.Before(st.nextPrune) {
		return nil, nil
	}
	st.nextPrune = now.Add(pruneInterval(retention))
	for id, rec := range st.Commands {
		until := rec.SeenAt
		if rec.Command.ExpiresAt.After(until) {
			until = rec.Command.ExpiresAt
		}
		if rec.Plan == nil && !rec.Latest.Status.Final() {
			continue // still in progress
		}
		if now.Sub(until) > retention {
			delete(st.Commands, id)
			cmds = append(cmds, id)
			if op := rec.Command.OperationID; op != "" && st.Operations[op] == id {
				delete(st.Operations, op)
				ops = append(ops, op)
			}
		}
	}
	return cmds, ops
}

// pruneInterval is a tenth of the retention, at most a minute.
func pruneInterval(retention time.Duration) time.Duration {
	return min(retention/10, time.Minute)
}

func copyConfig(c map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}
