package fsm

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Every pair of states, legal or not, is checked against these lists: a move
// missing here or added to the table by mistake fails the test.
var legalOperation = map[string]bool{
	"started→succeeded":             true,
	"started→failed_retryable":      true,
	"started→failed_final":          true,
	"failed_retryable→started":      true,
	"failed_retryable→succeeded":    true,
	"failed_retryable→failed_final": true,
}

var legalCommand = map[string]bool{
	"pending→sent": true, "pending→waiting_device": true, "pending→cancelled": true,
	"pending→timeout": true, "pending→failed": true,
	"waiting_device→sent": true, "waiting_device→received": true, "waiting_device→executing": true,
	"waiting_device→succeeded": true, "waiting_device→failed": true, "waiting_device→timeout": true,
	"waiting_device→cancelled": true,
	"sent→received":            true, "sent→executing": true, "sent→succeeded": true, "sent→failed": true,
	"sent→waiting_device": true, "sent→timeout": true, "sent→needs_attention": true,
	"received→executing": true, "received→succeeded": true, "received→failed": true,
	"received→waiting_device": true, "received→timeout": true, "received→needs_attention": true,
	"executing→succeeded": true, "executing→failed": true, "executing→waiting_device": true,
	"executing→timeout": true, "executing→needs_attention": true,
	"needs_attention→succeeded": true, "needs_attention→failed": true,
}

func checkAllPairs[S ~string](t *testing.T, m *Machine[S], legal map[string]bool) {
	t.Helper()
	seen := 0
	for _, from := range m.States() {
		for _, to := range m.States() {
			key := fmt.Sprintf("%s→%s", from, to)
			t.Run(key, func(t *testing.T) {
				err := m.Transition(from, to)
				if legal[key] {
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				require.True(t, errors.Is(err, ErrIllegalTransition))
				var te *TransitionError
				require.ErrorAs(t, err, &te)
				require.Equal(t, m.Name(), te.Machine)
				require.Equal(t, string(from), te.From)
				require.Equal(t, string(to), te.To)
			})
			if legal[key] {
				seen++
			}
		}
	}
	require.Equal(t, len(legal), seen, "every listed legal move names real states")
}

func TestOperationTransitions(t *testing.T) { checkAllPairs(t, Operation, legalOperation) }

func TestCommandTransitions(t *testing.T) { checkAllPairs(t, Command, legalCommand) }

func TestTerminalStatesHaveNoExit(t *testing.T) {
	for _, s := range Command.States() {
		if s.Terminal() {
			for _, to := range Command.States() {
				require.False(t, Command.Can(s, to), "%s → %s", s, to)
			}
		}
	}
	for _, s := range Operation.States() {
		if s.Terminal() {
			for _, to := range Operation.States() {
				require.False(t, Operation.Can(s, to), "%s → %s", s, to)
			}
		}
	}
}

func TestSources(t *testing.T) {
	require.Equal(t, []CommandState{CmdSent, CmdReceived, CmdExecuting}, Command.Sources(CmdNeedsAttention))
	require.Equal(t, []CommandState{CmdPending, CmdWaitingDevice}, Command.Sources(CmdCancelled))
	require.Equal(t, []OperationState{OpFailedRetryable}, Operation.Sources(OpStarted))
}

func TestValid(t *testing.T) {
	require.True(t, Command.Valid(CmdNeedsAttention))
	require.False(t, Command.Valid("done"))
	require.True(t, Operation.Valid(OpFailedRetryable))
	require.False(t, Operation.Valid(OperationState(CmdSent)))
}

func TestReceiptRanks(t *testing.T) {
	cases := []struct {
		status wire.ReceiptStatus
		rank   int
		state  CommandState
		ok     bool
	}{
		{wire.ReceiptReceived, RankReceived, CmdReceived, true},
		{wire.ReceiptExecuting, RankExecuting, CmdExecuting, true},
		{wire.ReceiptSucceeded, RankFinal, CmdSucceeded, true},
		{wire.ReceiptFailed, RankFinal, CmdFailed, true},
		{wire.ReceiptRejected, RankFinal, CmdFailed, true},
		{wire.ReceiptUnknown, RankNone, "", false},
	}
	for _, c := range cases {
		t.Run(string(c.status), func(t *testing.T) {
			require.Equal(t, c.rank, ReceiptRank(c.status))
			st, ok := CommandStateForReceipt(c.status)
			require.Equal(t, c.ok, ok)
			require.Equal(t, c.state, st)
			if ok {
				// Every state a receipt can lead to is reachable from sent (jumps allowed).
				require.True(t, Command.Can(CmdSent, st), "sent → %s", st)
			}
		})
	}
}

func TestOperationOutcome(t *testing.T) {
	cases := []struct {
		cmd    CommandState
		reason string
		want   OperationState
		ok     bool
	}{
		{CmdSucceeded, "", OpSucceeded, true},
		{CmdFailed, "disk_full", OpFailedFinal, true},
		{CmdFailed, ReasonExpired, OpFailedRetryable, true},
		{CmdFailed, ReasonDeviceOffline, OpFailedRetryable, true},
		{CmdTimeout, ReasonTimeout, OpFailedRetryable, true},
		{CmdCancelled, ReasonCancelled, OpFailedFinal, true},
		{CmdNeedsAttention, "", "", false},
		{CmdSent, "", "", false},
		{CmdPending, "", "", false},
	}
	for _, c := range cases {
		t.Run(string(c.cmd)+"/"+c.reason, func(t *testing.T) {
			got, ok := OperationOutcome(c.cmd, c.reason)
			require.Equal(t, c.ok, ok)
			require.Equal(t, c.want, got)
			if ok {
				require.True(t, Operation.Can(OpStarted, got))
			}
		})
	}
}

var legalTask = map[string]bool{
	"waiting_approval→waiting_approval": true, "waiting_approval→approved": true, "waiting_approval→rejected": true,
	"approved→running": true, "approved→rejected": true,
	"running→completed": true, "running→failed": true, "running→running": true,
}

func TestTaskTransitions(t *testing.T) { checkAllPairs(t, Task, legalTask) }
