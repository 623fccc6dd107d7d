package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// submitUntilAnswered submits r until the controller answers 201 or 200,
// backing off while it restarts, as a caller that retries with the same
// operation_id does; it returns the answer and how many tries failed.
func (b *bundle) submitUntilAnswered(ctx context.Context, r apiwire.SubmitRequest) (apiwire.Operation, int) {
	for failed := 0; ctx.Err() == nil; failed++ {
		op, status, err := b.client.Submit(ctx, r, "")
		if err == nil && (status == http.StatusCreated || status == http.StatusOK) {
			return op, failed
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond): // back off while the controller restarts
		}
	}
	return apiwire.Operation{}, 0
}

// TestKill9DuringARun kills the controller with SIGKILL 20 times while 500
// operations over 50 devices are submitted at a steady pace. Callers retry
// with the same operation_id until they get an answer. After the last
// restart every operation must be final, none executed twice (the devices'
// witness), and every operation the API once reported succeeded must still
// be succeeded.
func TestKill9DuringARun(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		const (
			ops     = 500
			devices = 50
			kills   = 20
		)
		seed := time.Now().UnixNano()
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewSource(seed))
		b := setup(t, setupOpts{backend: be, devices: devices, args: []string{"--lease-ttl", "2s"}})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()

		id := func(i int) string { return fmt.Sprintf("chaos-%03d:restart:device-%d:v1", i, i%devices+1) }
		var (
			mu        sync.Mutex
			succeeded = map[string]bool{} // reported succeeded by the API at some point
			retries   int
		)
		work := make(chan int)
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					op, n := b.submitUntilAnswered(ctx, req(fmt.Sprintf("chaos-%03d", i), fmt.Sprintf("device-%d", i%devices+1)))
					mu.Lock()
					retries += n
					if op.Status == "succeeded" {
						succeeded[op.OperationID] = true
					}
					mu.Unlock()
				}
			}()
		}
		// A poller records what the API says is succeeded while the kills go on.
		pollDone := make(chan struct{})
		go func() {
			defer close(pollDone)
			for ctx.Err() == nil {
				for i := 0; i < ops && ctx.Err() == nil; i += 7 {
					op, err := b.client.Operation(ctx, id(i), 0)
					if err == nil && op.Status == "succeeded" {
						mu.Lock()
						succeeded[op.OperationID] = true
						mu.Unlock()
					}
				}
				mu.Lock()
				n := len(succeeded)
				mu.Unlock()
				if n >= ops {
					return
				}
			}
		}()
		// The load: 50 operations a second.
		go func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < ops; i++ {
				select {
				case <-ctx.Done():
					close(work)
					return
				case <-tick.C:
				}
				work <- i
			}
			close(work)
		}()
		// The kills: SIGKILL at random moments, restart at once.
		var downtime time.Duration
		for k := 0; k < kills; k++ {
			select {
			case <-ctx.Done():
				t.Fatal("timed out during the kills")
			case <-time.After(time.Duration(150+rng.Intn(350)) * time.Millisecond):
			}
			start := time.Now()
			b.ctl.Kill()
			b.ctl.Restart()
			downtime += time.Since(start)
		}
		wg.Wait()

		final := map[string]int{}
		for i := 0; i < ops; i++ {
			op := b.waitFinal(id(i))
			final[op.Status]++
			mu.Lock()
			if succeeded[op.OperationID] {
				require.Equal(t, "succeeded", op.Status, "%s was reported succeeded and must stay so", op.OperationID)
			}
			mu.Unlock()
		}
		cancel()
		<-pollDone
		ex := b.executions()
		twice := 0
		for _, n := range ex {
			if n > 1 {
				twice++
			}
		}
		t.Logf("kill -9 x%d (restart to healthy %s on average), %d operations over %d devices: final %v, executions %d, executed twice %d, caller retries %d, reported succeeded during the run %d",
			kills, (downtime / kills).Round(time.Millisecond), ops, devices, final, len(ex), twice, retries, len(succeeded))
		require.Zero(t, twice, "no operation executed twice")
		require.Equal(t, ops, final["succeeded"], "every operation succeeded in the end")
		require.Equal(t, []string{fmt.Sprint(ops)}, b.rows(`SELECT COUNT(*) FROM operations`))
		b.verify()
	})
}
