package sim

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

// witness appends to the two witness files. One write per line, under a
// mutex, on files opened with O_APPEND, each followed by fsync: lines of
// devices (and processes) sharing the files never interleave.
type witness struct {
	dir  string
	mu   sync.Mutex
	exec *os.File
	rcpt *os.File
}

func openWitness(dir string) (*witness, error) {
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
	return &witness{dir: dir, exec: e, rcpt: r}, nil
}

func (w *witness) execution(e Execution) error { return w.append(w.exec, e) }

func (w *witness) receipt(r PublishedReceipt) error { return w.append(w.rcpt, r) }

func (w *witness) append(f *os.File, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("append %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	return nil
}

func (w *witness) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(w.exec.Close(), w.rcpt.Close())
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
