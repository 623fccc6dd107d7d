package device_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
)

// Start runs a device as Run does, its end reported to end: nil after a
// clean stop, ErrKilled after Kill; and a second boot of the id finds
// what the first made durable.
func TestStart(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int64
	boot := func() (*device.Device, context.CancelFunc, chan error) {
		d, err := device.New(e.options("dev-1", &runs))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan error, 2)
		require.NoError(t, d.Start(ctx, func(err error) { ended <- err }))
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		require.NoError(t, d.WaitOnline(wctx))
		return d, cancel, ended
	}
	ended := func(ch chan error) error {
		select {
		case err := <-ch:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("end not called")
			return nil
		}
	}

	d, cancel, ch := boot()
	cmd := command("")
	e.probe.Command("dev-1", cmd)
	e.final(cmd.CommandID)
	d.Kill()
	require.ErrorIs(t, ended(ch), device.ErrKilled)
	cancel()
	require.Error(t, d.Start(context.Background(), func(error) {}), "once only")

	_, cancel, ch = boot()
	e.probe.Command("dev-1", cmd)
	e.barrier(t, "dev-1")
	require.EqualValues(t, 1, runs.Load(), "the repeat answered from the record")
	cancel()
	require.NoError(t, ended(ch))
	select {
	case err := <-ch:
		t.Fatalf("end called twice: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}
