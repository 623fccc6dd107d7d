package fsm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

var legalRollout = map[string]bool{
	"waiting_approval→scheduled": true, "waiting_approval→cancelled": true,
	"scheduled→running": true, "scheduled→paused": true, "scheduled→cancelled": true,
	"running→paused": true, "running→succeeded": true, "running→completed_with_failures": true,
	"running→aborted": true, "running→cancelled": true,
	"paused→running": true, "paused→succeeded": true, "paused→completed_with_failures": true,
	"paused→aborted": true, "paused→cancelled": true,
}

var legalRolloutDevice = map[string]bool{
	"pending→started": true, "pending→failed": true, "pending→cancelled": true,
	"started→succeeded": true, "started→failed": true, "started→timeout": true, "started→rejected": true,
	"started→needs_attention": true, "started→cancelled": true, "started→retry": true,
	"retry→started": true, "retry→failed": true, "retry→cancelled": true, "retry→succeeded": true, "retry→rejected": true,
	"needs_attention→succeeded": true, "needs_attention→failed": true,
	// A late final receipt of a failed_retryable operation.
	"timeout→succeeded": true, "timeout→failed": true, "timeout→rejected": true,
	"rejected→succeeded": true, "rejected→failed": true, "failed→succeeded": true, "failed→rejected": true,
}

func TestRolloutTransitions(t *testing.T) { checkAllPairs(t, Rollout, legalRollout) }

func TestRolloutDeviceTransitions(t *testing.T) { checkAllPairs(t, RolloutDevice, legalRolloutDevice) }

func TestRolloutTerminalStates(t *testing.T) {
	var terminal []RolloutState
	for _, s := range Rollout.States() {
		if s.Terminal() {
			terminal = append(terminal, s)
		}
	}
	require.Equal(t, []RolloutState{RolloutSucceeded, RolloutCompletedWithFailures, RolloutAborted, RolloutCancelled}, terminal)
	for _, s := range ActiveRolloutStates() {
		require.False(t, s.Terminal(), s)
	}
}

func TestDeviceOutcome(t *testing.T) {
	for _, c := range []struct {
		op       OperationState
		cmd      CommandState
		reason   string
		rejected bool
		retry    bool
		want     RolloutDeviceState
		ok       bool
	}{
		{OpStarted, CmdSent, "", false, false, "", false},
		{OpStarted, CmdNeedsAttention, "", false, false, DevNeedsAttention, true},
		{OpSucceeded, CmdSucceeded, "", false, false, DevSucceeded, true},
		{OpFailedFinal, CmdFailed, "disk_full", false, true, DevFailed, true},
		{OpFailedFinal, CmdFailed, "bad", true, true, DevRejected, true},
		{OpFailedFinal, CmdCancelled, "cancelled", false, true, DevCancelled, true},
		{OpFailedRetryable, CmdTimeout, "timeout", false, true, DevRetry, true},
		{OpFailedRetryable, CmdTimeout, "timeout", false, false, DevTimeout, true},
		{OpFailedRetryable, CmdFailed, ReasonExpired, true, false, DevRejected, true},
		{OpFailedRetryable, CmdFailed, ReasonDeviceOffline, false, false, DevFailed, true},
	} {
		got, ok := DeviceOutcome(c.op, c.cmd, c.reason, c.rejected, c.retry)
		require.Equal(t, c.ok, ok, "%+v", c)
		require.Equal(t, c.want, got, "%+v", c)
		if ok {
			require.True(t, RolloutDevice.Valid(got))
		}
	}
}
