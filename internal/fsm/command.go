package fsm

import "github.com/fleetctl/fleetctl/internal/wire"

// CommandState is the controller's view of one command_id.
type CommandState string

const (
	// CmdPending: committed with its operation (the outbox), not yet
	// published. The lease holder moves it to sent with a fenced update
	// before publishing, or to waiting_device when the device is offline.
	CmdPending CommandState = "pending"
	// CmdWaitingDevice: the device is offline; the lease holder sends (or
	// asks about) the command when it returns, or times it out.
	CmdWaitingDevice CommandState = "waiting_device"
	// CmdSent: at least one publish decision was committed. Receipts move it
	// on; the lease holder's sweeper asks about it after the ack timeout.
	CmdSent CommandState = "sent"
	// CmdReceived: the device said it has the command.
	CmdReceived CommandState = "received"
	// CmdExecuting: the device said it is executing the command.
	CmdExecuting CommandState = "executing"
	// CmdSucceeded: terminal; the device reported success (or a person resolved it so).
	CmdSucceeded CommandState = "succeeded"
	// CmdFailed: terminal; the device failed or rejected it, or it could not be sent by policy.
	CmdFailed CommandState = "failed"
	// CmdTimeout: terminal; expires_at passed with no final receipt.
	CmdTimeout CommandState = "timeout"
	// CmdCancelled: terminal; cancelled before it was ever published.
	CmdCancelled CommandState = "cancelled"
	// CmdNeedsAttention: published to a device that cannot deduplicate, outcome
	// unproven: a person resolves it, or a final receipt settles it.
	CmdNeedsAttention CommandState = "needs_attention"
)

// Terminal reports whether no transition leaves s.
func (s CommandState) Terminal() bool { return Command.Valid(s) && Command.final(s) }

// Command is the command state machine of the contract.
var Command = newMachine("command",
	[]CommandState{CmdPending, CmdWaitingDevice, CmdSent, CmdReceived, CmdExecuting,
		CmdSucceeded, CmdFailed, CmdTimeout, CmdCancelled, CmdNeedsAttention},
	map[CommandState][]CommandState{
		// pending → failed: offline policy fail (reason device_offline).
		CmdPending:        {CmdSent, CmdWaitingDevice, CmdCancelled, CmdTimeout, CmdFailed},
		CmdWaitingDevice:  {CmdSent, CmdReceived, CmdExecuting, CmdSucceeded, CmdFailed, CmdTimeout, CmdCancelled},
		CmdSent:           {CmdReceived, CmdExecuting, CmdSucceeded, CmdFailed, CmdWaitingDevice, CmdTimeout, CmdNeedsAttention},
		CmdReceived:       {CmdExecuting, CmdSucceeded, CmdFailed, CmdWaitingDevice, CmdTimeout, CmdNeedsAttention},
		CmdExecuting:      {CmdSucceeded, CmdFailed, CmdWaitingDevice, CmdTimeout, CmdNeedsAttention},
		CmdNeedsAttention: {CmdSucceeded, CmdFailed},
	})

// TerminalCommandStates lists the states no transition leaves.
func TerminalCommandStates() []CommandState {
	var out []CommandState
	for _, s := range Command.States() {
		if s.Terminal() {
			out = append(out, s)
		}
	}
	return out
}

// Receipt ranks order what a device reported about one command. A receipt
// moves a command forward only when its rank is strictly higher than the
// rank already recorded (the store's `WHERE status_rank < ?`); an equal or
// lower rank is a duplicate or a stale receipt.
const (
	RankNone      = 0
	RankReceived  = 1
	RankExecuting = 2
	RankFinal     = 3
)

// ReceiptRank is the rank of a receipt status; unknown ranks 0 and never
// moves a command.
func ReceiptRank(s wire.ReceiptStatus) int {
	switch s {
	case wire.ReceiptReceived:
		return RankReceived
	case wire.ReceiptExecuting:
		return RankExecuting
	case wire.ReceiptSucceeded, wire.ReceiptFailed, wire.ReceiptRejected:
		return RankFinal
	}
	return RankNone
}

// CommandStateForReceipt is the command state a receipt status moves to
// (rejected is a failure with the device's error as reason).
func CommandStateForReceipt(s wire.ReceiptStatus) (CommandState, bool) {
	switch s {
	case wire.ReceiptReceived:
		return CmdReceived, true
	case wire.ReceiptExecuting:
		return CmdExecuting, true
	case wire.ReceiptSucceeded:
		return CmdSucceeded, true
	case wire.ReceiptFailed, wire.ReceiptRejected:
		return CmdFailed, true
	}
	return "", false
}

// Reasons that, on a failed or timed-out command, leave its operation retryable:
// nothing ran, or nothing is known.
const (
	ReasonExpired       = "expired"
	ReasonDeviceOffline = "device_offline"
	ReasonTimeout       = "timeout"
	ReasonCancelled     = "cancelled"
)

// OperationOutcome maps a command's terminal state (and reason) to its
// operation's next state. needs_attention and non-terminal states leave the
// operation started (ok false).
func OperationOutcome(s CommandState, reason string) (OperationState, bool) {
	switch s {
	case CmdSucceeded:
		return OpSucceeded, true
	case CmdFailed:
		if reason == ReasonExpired || reason == ReasonDeviceOffline {
			return OpFailedRetryable, true
		}
		return OpFailedFinal, true
	case CmdTimeout:
		return OpFailedRetryable, true
	case CmdCancelled:
		return OpFailedFinal, true
	}
	return "", false
}
