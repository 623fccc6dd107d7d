package sim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// A thousand devices in one process: all come online, each executes one
// command, and all shut down with a retained offline presence.
func TestThousandDevices(t *testing.T) {
	t.Parallel()
	const n = 1000
	start := time.Now()
	b := setup(t, func(c *sim.Config) { c.Devices = n })
	t.Logf("%d devices online in %v", n, time.Since(start))
	require.Len(t, b.fleet.Devices(), n)

	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("device-%d", i)
		b.probe.Command(id, command("c-"+id, "op-"+id, sim.ActionRestart, nil))
	}
	b.probe.WaitFor(30*time.Second, "all finals", func() bool {
		return len(b.probe.Receipts(func(r testenv.ProbeReceipt) bool { return r.Status == wire.ReceiptSucceeded })) == n
	})
	ex, err := witness.ReadExecutions(b.dir)
	require.NoError(t, err)
	require.Len(t, ex, n)
	t.Logf("%d commands executed after %v", n, time.Since(start))

	b.fleet.Stop()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%d", i+1)
	}
	ret := testenv.RetainedPresence(t, b.broker.URL(), root, ids...)
	for _, id := range ids {
		require.False(t, ret[id].Online, id)
	}
	s := b.fleet.Stats()
	require.Equal(t, int64(n), s.Executions)
	require.Equal(t, int64(n), s.Connects)
	t.Logf("stopped after %v", time.Since(start))
}
