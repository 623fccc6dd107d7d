package e2e

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSubmitToSucceeded measures one operation from POST to succeeded
// through the real store, broker and a simulated device: submit, then
// GET ?wait= until it is done, one at a time.
func BenchmarkSubmitToSucceeded(b *testing.B) {
	bu := setup(b, setupOpts{devices: 10})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := req(fmt.Sprintf("bench-%d", i), fmt.Sprintf("device-%d", i%10+1))
		op, _, err := bu.client.Submit(bu.ctx(), r, "")
		if err != nil {
			b.Fatal(err)
		}
		done, err := bu.client.Operation(bu.ctx(), op.OperationID, 30*time.Second)
		if err != nil || done.Status != "succeeded" {
			b.Fatalf("operation %s: %v %s", op.OperationID, err, done.Status)
		}
	}
}

// BenchmarkSubmitToSucceededParallel is the same with concurrent callers
// over 10 devices: throughput rather than latency.
func BenchmarkSubmitToSucceededParallel(b *testing.B) {
	bu := setup(b, setupOpts{devices: 10})
	var n atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			r := req(fmt.Sprintf("pbench-%d", i), fmt.Sprintf("device-%d", i%10+1))
			op, _, err := bu.client.Submit(bu.ctx(), r, "")
			if err != nil {
				b.Error(err)
				return
			}
			done, err := bu.client.Operation(bu.ctx(), op.OperationID, 30*time.Second)
			if err != nil || done.Status != "succeeded" {
				b.Errorf("operation %s: %v %s", op.OperationID, err, done.Status)
				return
			}
		}
	})
}
