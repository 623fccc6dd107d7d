package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
)

// TestSoak runs a steady load (20 operations a second over 30 devices)
// through mixed device faults for SOAK_DURATION (15 s by default here;
// `make scenarios` runs 2 minutes, `make soak` 30), then waits for every
// operation to be final and checks the invariants. restart is serial (its
// commands queue per device), set-config (every fourth round over the fleet) parallel,
// so both run side by side on each device; invariant 10 checks the queues.
func TestSoak(t *testing.T) {
	t.Parallel()
	dur := 15 * time.Second
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "SOAK_DURATION")
		dur = d
	}
	const devices = 30
	profile := sim.Profile{Seed: 11, Defaults: sim.Faults{
		DropCommand:      sim.Trigger{P: 0.03},
		DropReceipt:      sim.ReceiptFault{Trigger: sim.Trigger{P: 0.05}},
		DuplicateReceipt: sim.ReceiptFault{Trigger: sim.Trigger{P: 0.05}},
		DelayReceipt:     sim.ReceiptFault{Trigger: sim.Trigger{P: 0.05}, Delay: sim.Duration(500 * time.Millisecond)},
		ReorderReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{P: 0.05}},
		Crash:            sim.OutageFault{Trigger: sim.Trigger{P: 0.01}, At: sim.PointExecuted, For: sim.Duration(time.Second)},
		DropConnection:   sim.OutageFault{Trigger: sim.Trigger{P: 0.01}, At: sim.PointReceived, For: sim.Duration(2 * time.Second)},
		SlowExecution:    sim.ActionFault{Trigger: sim.Trigger{P: 0.05}, Delay: sim.Duration(700 * time.Millisecond)},
		Fail:             sim.ActionFault{Trigger: sim.Trigger{P: 0.02}, Error: "disk_full"},
	}}
	b := setup(t, setupOpts{devices: devices, faults: profile,
		args: policyArgs(t, `{"actions":{"restart":{"concurrency":"serial"},"set-config":{"concurrency":"parallel"}}}`)})
	ctx, cancel := context.WithTimeout(context.Background(), dur+3*time.Minute)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	ids := make(chan string, 1<<16)
	tick := time.NewTicker(50 * time.Millisecond)
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		<-tick.C
		i := n.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := req(fmt.Sprintf("soak-%05d", i), fmt.Sprintf("device-%d", i%devices+1))
			if (i/devices)%4 == 3 { // every fourth round over the fleet
				r.Action, r.Params = sim.ActionSetConfig, []byte(fmt.Sprintf(`{"soak":%d}`, i))
			}
			for ctx.Err() == nil {
				op, status, err := b.client.Submit(ctx, r, "")
				if err == nil && (status == http.StatusCreated || status == http.StatusOK) {
					ids <- op.OperationID
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	tick.Stop()
	wg.Wait()
	close(ids)
	final := map[string]int{}
	count := 0
	for id := range ids {
		final[b.waitFinal(id).Status]++
		count++
	}
	stats := b.fleet.Stats()
	t.Logf("soak %s: %d operations over %d devices: %v; device faults: %d commands dropped, %d receipts dropped, %d duplicated, %d delayed, %d re-ordered, %d crashes, %d connection drops",
		dur, count, devices, final, stats.CommandsDropped, stats.ReceiptsDropped, stats.ReceiptsDuplicated, stats.ReceiptsDelayed,
		stats.ReceiptsReordered, stats.Crashes, stats.ConnectionDrops)
	require.Equal(t, int(n.Load()), count)
	require.Zero(t, final["started"])
	require.Equal(t, count, final["succeeded"]+final["failed_final"], "a device failure (disk_full) is failed_final; nothing else")
	out := b.verify()
	require.Regexp(t, `invariant 10 PASS: [^\n]*: [1-9][0-9]* serial commands on [0-9]+ devices \([1-9][0-9]* submitted behind another\), [1-9][0-9]* published, 0 overlaps, 0 out of order`, out,
		"serial restarts queued behind others, published and checked")
}
