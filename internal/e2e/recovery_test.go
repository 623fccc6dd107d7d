package e2e

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
)

// TestRecoveryTimeFor1000InDoubtCommands: 1,000 commands are published to
// devices that lose them all; the controller is killed -9, the devices
// heal, and the restarted controller must reconcile every in-doubt command
// (ask, hear unknown, re-send the same command_id) with no help from its
// ack-timeout sweeper (60 s). Measures restart → every operation succeeded.
// RECOVERY_COMMANDS sets the count (1,000 in make test), over one device
// per ten commands (at least 100).
func TestRecoveryTimeFor1000InDoubtCommands(t *testing.T) {
	t.Parallel()
	n, devices := 1000, 100
	if v := os.Getenv("RECOVERY_COMMANDS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, "RECOVERY_COMMANDS")
		require.Positive(t, n, "RECOVERY_COMMANDS")
		devices = max(100, n/10)
	}
	b := setup(t, setupOpts{devices: devices, args: []string{"--ack-timeout", "60s"},
		faults: sim.Profile{Defaults: sim.Faults{DropCommand: sim.Trigger{P: 1}}}})
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, _, err := b.client.Submit(b.ctx(), req(fmt.Sprintf("rec-%04d", i), fmt.Sprintf("device-%d", i%devices+1)), "")
				require.NoError(t, err)
			}
		}()
	}
	submitStart := time.Now()
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("submitted %d in %s", n, time.Since(submitStart).Round(time.Millisecond))
	eventually(t, "all published", 60*time.Second, func() bool {
		return b.rows(`SELECT COUNT(*) FROM commands WHERE status = 'sent'`)[0] == fmt.Sprint(n)
	})
	b.ctl.Kill()
	for _, d := range b.fleet.Devices() {
		require.NoError(t, d.SetFaults(sim.Faults{}))
	}
	start := time.Now()
	b.ctl.Restart()
	healthy := time.Since(start)
	eventually(t, "every in-doubt command reconciled", 120*time.Second, func() bool {
		return b.rows(`SELECT COUNT(*) FROM operations WHERE status = 'succeeded'`)[0] == fmt.Sprint(n)
	})
	took := time.Since(start)
	ex := b.executions()
	require.Len(t, ex, n)
	for id, k := range ex {
		require.Equal(t, 1, k, id)
	}
	// Asked first (the reconnect's asks are not counted in queries, so the
	// queries table is the record), heard unknown, then re-sent.
	asked := b.rows(`SELECT COUNT(*) FROM commands WHERE attempt >= 2 AND EXISTS (
		SELECT 1 FROM queries WHERE queries.command_id = commands.command_id AND answer = 'unknown')`)[0]
	t.Logf("recovery of %d in-doubt commands over %d devices: restart to healthy %s, to every operation succeeded %s (%s asked first, then re-sent with the same command_id), 0 executed twice",
		n, devices, healthy.Round(time.Millisecond), took.Round(time.Millisecond), asked)
	require.Equal(t, fmt.Sprint(n), asked, "each was asked about, and heard unknown, before its re-send")
	require.Equal(t, []string{fmt.Sprint(n)}, b.rows(`SELECT COUNT(DISTINCT command_id) FROM commands`), "no new command_id")
	b.verify()
}
