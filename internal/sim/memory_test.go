package sim_test

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
)

// memoryBudget is what one idle online device may cost (Go heap and
// goroutine stacks, after a GC). Measured at 10,000 devices: about 44 KB,
// most of it the ten goroutines (stacks and g structs) of each paho client;
// at 1,000, 44–47 KB over four runs. The issue measured 52 KB before.
const memoryBudget = 52 << 10

// TestMemoryPerDevice measures the memory of 1,000 idle online devices, or
// SIM_MEMORY_DEVICES of them (10,000 needs an fd limit above 10,000 for the
// process and the broker), and fails above memoryBudget bytes per device
// (-race doubles stacks: measure without it). SIM_MEMORY_PROFILES=DIR also
// writes heap and goroutine profiles there.
//
//	SIM_MEMORY_DEVICES=10000 go test ./internal/sim/ -run MemoryPerDevice -v
func TestMemoryPerDevice(t *testing.T) {
	s := os.Getenv("SIM_MEMORY_DEVICES")
	if s == "" {
		s = "1000"
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	base := memInUse()
	start := time.Now()
	b := setup(t, func(c *sim.Config) {
		c.Devices = n
		c.KeepAlive = 30 * time.Second // idle devices: no pings in the way
	})
	t.Logf("%d devices online in %v", n, time.Since(start))
	// Every device's first journal batch is done: nothing transient left.
	for _, d := range b.fleet.Devices() {
		require.NotZero(t, d.Session())
	}
	used := memInUse() - base
	per := used / uint64(n)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	t.Logf("heap in use %d KiB, stacks %d KiB", m.HeapInuse>>10, m.StackInuse>>10)
	if dir := os.Getenv("SIM_MEMORY_PROFILES"); dir != "" {
		for _, name := range []string{"heap", "goroutine"} {
			f, err := os.Create(filepath.Join(dir, name+".pprof"))
			require.NoError(t, err)
			require.NoError(t, pprof.Lookup(name).WriteTo(f, 0))
			require.NoError(t, f.Close())
		}
	}
	status, _ := os.ReadFile("/proc/self/status")
	var rss string
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			rss = strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	t.Logf("%d devices: %d KiB in use (heap and stacks), %d bytes per device; %d goroutines; process RSS %s", n, used>>10, per, runtime.NumGoroutine(), rss)
	require.Less(t, per, uint64(memoryBudget))
}

func memInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}
