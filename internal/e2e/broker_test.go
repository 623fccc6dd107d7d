package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/witness"
)

// runLoad submits n operations at a steady pace from 4 callers that retry
// with the same operation_id until answered; after each third of them it
// calls between(k).
func runLoad(t *testing.T, b *bundle, prefix string, n, devices int, between func(k int)) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids := make([]string, n)
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r := req(fmt.Sprintf("%s-%03d", prefix, i), fmt.Sprintf("device-%d", i%devices+1))
				for ctx.Err() == nil {
					op, status, err := b.client.Submit(ctx, r, "")
					if err == nil && (status == http.StatusCreated || status == http.StatusOK) {
						ids[i] = op.OperationID
						break
					}
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		}()
	}
	tick := time.NewTicker(15 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < n; i++ {
		<-tick.C
		work <- i
		if between != nil && (i+1)%(n/3) == 0 && i+1 < n {
			between((i + 1) / (n / 3))
		}
	}
	close(work)
	wg.Wait()
	require.NoError(t, ctx.Err())
	return ids
}

func TestBrokerRestartCleanAndKill9DuringARun(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		const n, devices = 240, 20
		b := setup(t, setupOpts{backend: be, devices: devices})
		ids := runLoad(t, b, "brk", n, devices, func(k int) {
			if k == 1 {
				b.broker.Restart(false) // clean: the broker saves its state
			} else {
				b.broker.Restart(true) // kill -9: whatever it had not autosaved (1 s) is lost
			}
		})
		for _, id := range ids {
			require.Equal(t, "succeeded", b.waitFinal(id).Status, id)
		}
		ex := b.executions()
		for id, k := range ex {
			require.Equal(t, 1, k, "%s executed %d times", id, k)
		}
		require.Len(t, ex, n)

		// What the broker lost and the controller recovered: final receipts a
		// device published (not answers to queries) that never reached the
		// controller, whose outcome was then learned by asking.
		pub, err := witness.ReadReceipts(b.stateDir)
		require.NoError(t, err)
		published := map[string]bool{}
		for _, r := range pub {
			if r.QueryID == "" && r.Status.Final() {
				published[r.CommandID] = true
			}
		}
		got := map[string]bool{}
		for _, row := range b.rows(`SELECT DISTINCT command_id FROM receipts WHERE query_id = '' AND status IN ('succeeded','failed','rejected')`) {
			got[row] = true
		}
		lost := 0
		for c := range published {
			if !got[c] {
				lost++
			}
		}
		byQuery := b.rows(`SELECT COUNT(DISTINCT command_id) FROM receipts WHERE query_id != '' AND status = 'succeeded' AND effect = 'applied'`)
		resent := b.rows(`SELECT COUNT(*) FROM commands WHERE attempt > 1`)
		t.Logf("broker restarted cleanly once and killed -9 once during %d operations: %d final receipts the devices published never reached the controller; %s commands were settled by a query's answer, %s re-sent with the same command_id; 0 executed twice",
			n, lost, byQuery[0], resent[0])
		b.verify()
	})
}
