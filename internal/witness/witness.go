// Package witness holds the simulator's witness files, the independent
// record that invariants 1 and 4 of the contract are checked against: under
// a state dir, executions.jsonl gets one JSON line per real execution of an
// action on a device, and receipts.jsonl one per final receipt a device
// published and the broker acknowledged.
//
// The simulator (package sim) writes them with an Appender; the checker
// (verify), the report and the demo read them with ReadExecutions and
// ReadReceipts, without linking the simulator. Other tools read the files
// too: the names and the line formats are part of the contract and must not
// change.
//
// Durability: lines are appended, under a mutex, to files opened with
// O_APPEND, and fsynced before the append returns. Execution and Receipt
// write one line each (one write, one fsync); the simulator group-commits
// its lines (Line) through the device library's journal (side lines
// written with the records they belong to). Lines of devices (and
// processes) sharing a state dir never interleave; a process killed mid-write leaves at most a torn last
// line, which the readers ignore.
package witness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Witness file names under the state dir.
const (
	ExecutionsFile = "executions.jsonl"
	ReceiptsFile   = "receipts.jsonl"
)

// Execution is one line of executions.jsonl: one real execution of an
// action on a device. At is by the device's (possibly skewed) clock.
type Execution struct {
	DeviceID    string    `json:"device_id"`
	CommandID   string    `json:"command_id"`
	OperationID string    `json:"operation_id"`
	Action      string    `json:"action"`
	At          time.Time `json:"at"`
}

// PublishedReceipt is one line of receipts.jsonl: a final receipt
// (succeeded, failed or rejected) that the broker acknowledged (PUBACK). One
// line per publish: a duplicated receipt, a repeat's answer or a query's
// answer each add one. At is the receipt's own at.
type PublishedReceipt struct {
	DeviceID    string             `json:"device_id"`
	CommandID   string             `json:"command_id"`
	OperationID string             `json:"operation_id"`
	Status      wire.ReceiptStatus `json:"status"`
	Seq         int                `json:"seq"`
	At          time.Time          `json:"at"`
	Error       string             `json:"error,omitempty"`
	QueryID     string             `json:"query_id,omitempty"`
}

// Appender appends to the two witness files of one state dir. It is safe
// for concurrent use; each append returns once its line is fsynced.
type Appender struct {
	mu   sync.Mutex
	exec *os.File
	rcpt *os.File
}

// Open opens (creating if needed) the witness files in dir for appending.
// The directory must exist.
func Open(dir string) (*Appender, error) {
	open := func(name string) (*os.File, error) {
		return os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	}
	e, err := open(ExecutionsFile)
	if err != nil {
		return nil, fmt.Errorf("open witness: %w", err)
	}
	r, err := open(ReceiptsFile)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("open witness: %w", err)
	}
	return &Appender{exec: e, rcpt: r}, nil
}

// Execution appends one line to executions.jsonl.
func (a *Appender) Execution(e Execution) error { return a.append(a.exec, e) }

// Receipt appends one line to receipts.jsonl.
func (a *Appender) Receipt(r PublishedReceipt) error { return a.append(a.rcpt, r) }

func (a *Appender) append(f *os.File, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("append %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	return nil
}

// Line encodes one witness line (an Execution or a PublishedReceipt) with
// its newline, for a journal's side line (device.Hooks.SaveLine).
func Line(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Close closes both files.
func (a *Appender) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return errors.Join(a.exec.Close(), a.rcpt.Close())
}

// ReadExecutions parses <stateDir>/executions.jsonl. A missing file is no
// executions. A last line without its newline (a process killed mid-write)
// is ignored; any other malformed line is an error.
func ReadExecutions(stateDir string) ([]Execution, error) {
	return readLines[Execution](filepath.Join(stateDir, ExecutionsFile))
}

// ReadReceipts parses <stateDir>/receipts.jsonl, as ReadExecutions does.
func ReadReceipts(stateDir string) ([]PublishedReceipt, error) {
	return readLines[PublishedReceipt](filepath.Join(stateDir, ReceiptsFile))
}

func readLines[T any](file string) ([]T, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(b, '\n'); i != len(b)-1 {
		b = b[:i+1] // drop a torn last line
	}
	var out []T
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), wire.MaxPayload*2)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", file, n, err)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}
