package witness_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

func TestReaders(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ex, err := witness.ReadExecutions(dir)
	require.NoError(t, err)
	require.Empty(t, ex, "no file, no executions")

	lines := `{"device_id":"d-1","command_id":"c-1","operation_id":"o-1","action":"restart","at":"2030-01-02T03:04:05Z"}
{"device_id":"d-1","command_id":"c-2","operation_id":"o-2","action":"set-config","at":"2030-01-02T03:04:06Z"}
{"device_id":"d-1","comm`
	require.NoError(t, os.WriteFile(filepath.Join(dir, witness.ExecutionsFile), []byte(lines), 0o644))
	ex, err = witness.ReadExecutions(dir)
	require.NoError(t, err)
	require.Len(t, ex, 2, "a torn last line is ignored")
	require.Equal(t, witness.Execution{DeviceID: "d-1", CommandID: "c-2", OperationID: "o-2", Action: "set-config", At: time.Date(2030, 1, 2, 3, 4, 6, 0, time.UTC)}, ex[1])

	require.NoError(t, os.WriteFile(filepath.Join(dir, witness.ReceiptsFile), []byte("{\"device_id\":\"d-1\",\"status\":\"succeeded\",\"seq\":3}\nnot json\n"), 0o644))
	_, err = witness.ReadReceipts(dir)
	require.ErrorContains(t, err, ":2:")
}

// The line formats are read by other tools: the bytes must not change.
func TestAppenderWritesTheContractsLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	at := time.Date(2030, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	a, err := witness.Open(dir)
	require.NoError(t, err)
	require.NoError(t, a.Execution(witness.Execution{DeviceID: "d-1", CommandID: "c-1", OperationID: "o-1", Action: "restart", At: at}))
	require.NoError(t, a.Receipt(witness.PublishedReceipt{DeviceID: "d-1", CommandID: "c-1", OperationID: "o-1", Status: wire.ReceiptSucceeded, Seq: 3, At: at}))
	require.NoError(t, a.Receipt(witness.PublishedReceipt{DeviceID: "d-1", CommandID: "c-1", OperationID: "o-1", Status: wire.ReceiptFailed, Seq: 4, At: at,
		Error: "boom", QueryID: "q-1"}))
	require.NoError(t, a.Close())

	b, err := os.ReadFile(filepath.Join(dir, "executions.jsonl"))
	require.NoError(t, err)
	require.Equal(t, `{"device_id":"d-1","command_id":"c-1","operation_id":"o-1","action":"restart","at":"2030-01-02T03:04:05.006Z"}`+"\n", string(b))
	b, err = os.ReadFile(filepath.Join(dir, "receipts.jsonl"))
	require.NoError(t, err)
	require.Equal(t, `{"device_id":"d-1","command_id":"c-1","operation_id":"o-1","status":"succeeded","seq":3,"at":"2030-01-02T03:04:05.006Z"}`+"\n"+
		`{"device_id":"d-1","command_id":"c-1","operation_id":"o-1","status":"failed","seq":4,"at":"2030-01-02T03:04:05.006Z","error":"boom","query_id":"q-1"}`+"\n", string(b))
	st, err := os.Stat(filepath.Join(dir, "receipts.jsonl"))
	require.NoError(t, err)
	require.Zero(t, st.Mode().Perm()&^0o644, "rw-r--r-- at most")

	// Opening again appends: what a previous process wrote stays.
	a, err = witness.Open(dir)
	require.NoError(t, err)
	require.NoError(t, a.Execution(witness.Execution{DeviceID: "d-2", CommandID: "c-2", OperationID: "o-2", Action: "restart", At: at}))
	require.NoError(t, a.Close())
	ex, err := witness.ReadExecutions(dir)
	require.NoError(t, err)
	require.Len(t, ex, 2)
	require.Equal(t, "d-2", ex[1].DeviceID)
}

// Two appenders on one state dir (two fleets, or two processes) and many
// goroutines on each: every line arrives whole.
func TestConcurrentAppendsNeverInterleave(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const writers, each = 8, 50
	long := strings.Repeat("x", 2000) // lines longer than a small write buffer
	var wg sync.WaitGroup
	for _, n := range []int{1, 2} {
		a, err := witness.Open(dir)
		require.NoError(t, err)
		t.Cleanup(func() { a.Close() })
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if err := a.Execution(witness.Execution{DeviceID: long, CommandID: "c", OperationID: string(rune('a'+n)) + string(rune('a'+w)) + strings.Repeat("i", i), Action: "restart"}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	ex, err := witness.ReadExecutions(dir)
	require.NoError(t, err, "every line parses")
	require.Len(t, ex, 2*writers*each)
	seen := map[string]bool{}
	for _, e := range ex {
		require.Equal(t, long, e.DeviceID)
		seen[e.OperationID] = true
	}
	require.Len(t, seen, 2*writers*each)
}

func TestOpenNeedsTheDirectory(t *testing.T) {
	t.Parallel()
	_, err := witness.Open(filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
}
