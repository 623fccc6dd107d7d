package device

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

const stateVersion = 1

// durableState is everything a device keeps across crashes and restarts:
// its snapshot file with its journal records applied. Every change is made
// durable through the journal before the device acts on it.
type durableState struct {
	Version  int    `json:"version"`
	DeviceID string `json:"device_id"`
	// Session is the last session number used for a connection; it is
	// raised and saved before every connection attempt.
	Session int64 `json:"session"`
	// App is the application's own state (Hooks.SaveApp), saved with
	// every record.
	App json.RawMessage `json:"app,omitempty"`
	// Commands holds every command seen, by command_id.
	Commands map[string]*record `json:"commands"`
	// Operations maps an operation_id to the command that took it: the one
	// accepted for execution. At most one command of an operation runs.
	Operations map[string]string `json:"operations"`

	// nextPrune is when prune next looks at the records (in memory only).
	nextPrune time.Time
}

// record is what the device knows of one command_id.
type record struct {
	Command wire.Command `json:"command"`
	SeenAt  time.Time    `json:"seen_at"`
	// Latest is the last receipt the device sent (or is about to send) for
	// the command; repeats and queries are answered with it.
	Latest wire.Receipt `json:"latest"`
	// Runs counts the handler calls started for the command (more than
	// one only for a dedupe:false device).
	Runs int `json:"runs,omitempty"`
}

func newState(id string) *durableState {
	return &durableState{
		Version:    stateVersion,
		DeviceID:   id,
		Commands:   map[string]*record{},
		Operations: map[string]string{},
	}
}

func statePath(dir, id string) string { return filepath.Join(dir, id+".json") }

// loadState reads a device's snapshot; a missing file is a new device.
func loadState(dir, id string) (*durableState, error) {
	b, err := os.ReadFile(statePath(dir, id))
	if errors.Is(err, fs.ErrNotExist) {
		return newState(id), nil
	}
	if err != nil {
		return nil, fmt.Errorf("device: load state of %s: %w", id, err)
	}
	st := newState(id)
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("device: load state of %s: %w", id, err)
	}
	if st.Version != stateVersion || st.DeviceID != id {
		return nil, fmt.Errorf("device: load state of %s: version %d for device %q", id, st.Version, st.DeviceID)
	}
	st.fill()
	return st, nil
}

// fill makes the maps of a decoded state usable.
func (st *durableState) fill() {
	if st.Commands == nil {
		st.Commands = map[string]*record{}
	}
	if st.Operations == nil {
		st.Operations = map[string]string{}
	}
}

// staged is a snapshot file written and fsynced under its tmp name, not yet
// visible: rename makes it the device's snapshot.
type staged struct{ tmp, file, device string }

// stage writes the snapshot under a tmp name and fsyncs it: the slow half
// of an atomic save, done before the caller takes any lock.
func (st *durableState) stage(dir string, syncFile func(*os.File) error) (staged, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return staged{}, fmt.Errorf("device: save state of %s: %w", st.DeviceID, err)
	}
	s := staged{file: statePath(dir, st.DeviceID), device: st.DeviceID}
	s.tmp = s.file + ".tmp"
	f, err := os.OpenFile(s.tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.Write(b)
		if err == nil {
			err = syncFile(f)
		}
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return staged{}, fmt.Errorf("device: save state of %s: %w", st.DeviceID, err)
	}
	return s, nil
}

// rename makes a staged snapshot the device's: a crash leaves the old file
// or the new one, never a mix. The caller fsyncs the directory afterwards.
func (s staged) rename() error {
	if err := os.Rename(s.tmp, s.file); err != nil {
		return fmt.Errorf("device: save state of %s: %w", s.device, err)
	}
	return nil
}

// prune forgets commands whose expiry (or, without one, whose arrival)
// lies more than retention in the past, with their operation claims, and
// returns what it forgot. It scans at most once per pruneInterval.
func (st *durableState) prune(now time.Time, retention time.Duration) (cmds, ops []string) {
	if now.Before(st.nextPrune) {
		return nil, nil
	}
	st.nextPrune = now.Add(min(retention/10, time.Minute))
	for id, rec := range st.Commands {
		if !rec.Latest.Status.Final() {
			continue // still in progress
		}
		until := rec.SeenAt
		if rec.Command.ExpiresAt.After(until) {
			until = rec.Command.ExpiresAt
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
