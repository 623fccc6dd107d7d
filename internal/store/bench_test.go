package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// benchStore is a store on a new SQLite file, closed when b ends.
func benchStore(b *testing.B) *DB {
	s, err := testOpen(context.Background(), Config{Path: filepath.Join(b.TempDir(), "c.db"), Instance: "i1"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkSubmit measures one submit transaction (operation, command,
// event) on a real SQLite file with synchronous=FULL.
func BenchmarkSubmit(b *testing.B) {
	s := benchStore(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i))
		if _, err := s.Submit(context.Background(), n, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimSend measures one fenced pending → sent decision.
func BenchmarkClaimSend(b *testing.B) {
	s := benchStore(b)
	for i := 0; i < b.N; i++ {
		if _, err := s.Submit(context.Background(), newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.ClaimSend(context.Background(), fmt.Sprintf("c-%d", i), fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyReceiptsBatched measures the writer's group commit on the
// receipt path: 256 callers apply each command's three receipts (received,
// executing, succeeded) at once, so that batches form as they do at
// saturation. It reports the CPU time of the whole process per receipt.
func BenchmarkApplyReceiptsBatched(b *testing.B) {
	ctx, s := context.Background(), benchStore(b)
	const callers = 256
	cmds := (b.N + 2) / 3
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		for i := 0; i < cmds; i++ {
			next <- i
		}
		close(next)
	}()
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := fmt.Sprintf("c-%d", i)
				if _, err := s.Submit(ctx, newOp(fmt.Sprintf("op-%d", i), id), nil); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.ClaimSend(ctx, id, fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	statuses := []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting, wire.ReceiptSucceeded}
	receipts := make(chan wire.Receipt, callers)
	go func() {
		for n := 0; n < b.N; n++ {
			i, k := n%cmds, n/cmds // every command's received first, then executing, then succeeded
			receipts <- wire.Receipt{CommandID: fmt.Sprintf("c-%d", i), OperationID: fmt.Sprintf("op-%d", i),
				Status: statuses[k], Seq: k + 1, At: time.Now(), Result: []byte(`{"ok":true}`)}
		}
		close(receipts)
	}()
	before := cpuTime()
	b.ResetTimer()
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range receipts {
				if _, err := s.ApplyReceipt(ctx, "device-1", r, nil); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/receipt")
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOperationBatched is one operation's writes as the controller
// makes them at saturation, 256 callers at once so that batches form: the
// submit, the fenced pending → sent decision, then the device's three
// receipts applied together (ApplyReceipts). It reports the CPU time of the
// whole process and the database statements per operation.
func BenchmarkOperationBatched(b *testing.B) {
	ctx, s := context.Background(), benchStore(b)
	const callers = 256
	next := make(chan int)
	go func() {
		for i := 0; i < b.N; i++ {
			next <- i
		}
		close(next)
	}()
	statuses := []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting, wire.ReceiptSucceeded}
	before, trips := cpuTime(), s.RoundTrips()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				op, id, dev := fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i), fmt.Sprintf("device-%d", i%100)
				n := newOp(op, id)
				n.Target = dev
				if _, err := s.Submit(ctx, n, nil); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.ClaimSend(ctx, id, fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
					b.Error(err)
					return
				}
				rs := make([]wire.Receipt, len(statuses))
				for k, st := range statuses {
					rs[k] = wire.Receipt{CommandID: id, OperationID: op, Status: st, Seq: k + 1, At: time.Now(), Result: []byte(`{"ok":true}`)}
				}
				res, err := s.ApplyReceipts(ctx, dev, rs, nil)
				if err == nil && (len(res) != len(rs) || res[len(res)-1].Err != nil) {
					err = fmt.Errorf("receipts of %s: %+v", id, res)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(s.RoundTrips()-trips)/float64(b.N), "statements/op")
}

// BenchmarkGetOperation measures one read of an operation with its lists
// (what every ?wait= answer costs), from the read pool.
func BenchmarkGetOperation(b *testing.B) {
	ctx, s := context.Background(), benchStore(b)
	const ops = 1000
	for i := 0; i < ops; i++ {
		if _, err := s.Submit(ctx, newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.GetOperation(ctx, fmt.Sprintf("op-%d", i%ops)); err != nil {
			b.Fatal(err)
		}
	}
}
