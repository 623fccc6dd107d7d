package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// TestAuditSerialCommands: the serial commands with their devices and
// queue numbers, by device and number; parallel commands are not among them.
func TestAuditSerialCommands(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		ctx := context.Background()
		path := testDSN(t, be)
		clk := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
		s, err := testOpen(ctx, Config{Path: path, Instance: "i1", Now: clk.Now})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })

		submit := func(op, cmd, device string, serial bool) {
			n := newOp(op, cmd)
			n.Target, n.Serial = device, serial
			_, err := s.Submit(ctx, n, nil)
			require.NoError(t, err)
		}
		submit("op-1", "c-1", "device-2", true)
		submit("op-2", "c-2", "device-1", true)
		submit("op-3", "c-3", "device-1", false)
		submit("op-4", "c-4", "device-1", true)
		_, err = s.ClaimSend(ctx, "c-2", fsm.CmdPending, 0, 1, fence, clk.Now())
		require.NoError(t, err)

		a := openAudit(t, path)
		got, err := a.SerialCommands(ctx)
		require.NoError(t, err)
		require.Equal(t, []AuditSerialCommand{
			{CommandID: "c-2", DeviceID: "device-1", SerialSeq: 1, Status: fsm.CmdSent},
			{CommandID: "c-4", DeviceID: "device-1", SerialSeq: 2, Status: fsm.CmdPending},
			{CommandID: "c-1", DeviceID: "device-2", SerialSeq: 1, Status: fsm.CmdPending},
		}, got)
	})
}
