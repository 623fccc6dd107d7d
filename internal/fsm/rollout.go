package fsm

// RolloutState is the status of a rollout: one action across a fleet.
type RolloutState string

const (
	// RolloutWaitingApproval: the action's policy needs approval; an
	// approver's POST .../approvals of the current version moves it to
	// scheduled, a cancel or a missed execute_before ends it.
	RolloutWaitingApproval RolloutState = "waiting_approval"
	// RolloutScheduled: the device set is stored; the scheduler (the
	// rollout's lease holder) moves it to running once execute_after has
	// passed.
	RolloutScheduled RolloutState = "scheduled"
	// RolloutRunning: the scheduler starts devices within the limits and
	// windows, settles their outcomes, and ends the rollout (succeeded,
	// completed_with_failures, aborted) or a person pauses or cancels it.
	RolloutRunning RolloutState = "running"
	// RolloutPaused: no new device starts; those started run to their end.
	// A person resumes (running) or cancels it; the scheduler may still end
	// it (an abort threshold reached by the devices in flight, or every
	// device finished).
	RolloutPaused RolloutState = "paused"
	// RolloutSucceeded: terminal; every device succeeded.
	RolloutSucceeded RolloutState = "succeeded"
	// RolloutCompletedWithFailures: terminal; every device finished, not
	// all succeeded, no abort threshold was reached (or execute_before
	// passed with devices not started, which were cancelled).
	RolloutCompletedWithFailures RolloutState = "completed_with_failures"
	// RolloutAborted: terminal; an abort threshold was reached (or a
	// re-check before a start failed): no device starts again, those not
	// yet published were cancelled, those published run to their end.
	RolloutAborted RolloutState = "aborted"
	// RolloutCancelled: terminal; a person cancelled it (an abort by a
	// person), or execute_before passed before it started.
	RolloutCancelled RolloutState = "cancelled"
)

// Terminal reports whether no transition leaves s.
func (s RolloutState) Terminal() bool { return Rollout.Valid(s) && Rollout.final(s) }

// Rollout is the rollout state machine of the contract.
var Rollout = newMachine("rollout",
	[]RolloutState{RolloutWaitingApproval, RolloutScheduled, RolloutRunning, RolloutPaused,
		RolloutSucceeded, RolloutCompletedWithFailures, RolloutAborted, RolloutCancelled},
	map[RolloutState][]RolloutState{
		RolloutWaitingApproval: {RolloutScheduled, RolloutCancelled},
		RolloutScheduled:       {RolloutRunning, RolloutPaused, RolloutCancelled},
		RolloutRunning:         {RolloutPaused, RolloutSucceeded, RolloutCompletedWithFailures, RolloutAborted, RolloutCancelled},
		RolloutPaused:          {RolloutRunning, RolloutSucceeded, RolloutCompletedWithFailures, RolloutAborted, RolloutCancelled},
	})

// ActiveRolloutStates are the states in which the scheduler has work: it
// may start devices, or end the rollout.
func ActiveRolloutStates() []RolloutState {
	return []RolloutState{RolloutWaitingApproval, RolloutScheduled, RolloutRunning, RolloutPaused}
}

// RolloutDeviceState is the status of one device within a rollout.
type RolloutDeviceState string

const (
	// DevPending: not started yet. The scheduler starts it (started) or
	// the rollout's end cancels it.
	DevPending RolloutDeviceState = "pending"
	// DevStarted: its start is committed together with its operation
	// {rollout_id}:rollout:{device}:v{version}; the scheduler settles it
	// from the operation's outcome.
	DevStarted RolloutDeviceState = "started"
	// DevRetry: its operation ended failed_retryable (timeout, offline,
	// expired) with retries left; the scheduler starts it again, as that
	// operation's own retry, unless a late final receipt decided the
	// operation first (the device takes that outcome).
	DevRetry RolloutDeviceState = "retry"
	// DevSucceeded: terminal; its operation succeeded.
	DevSucceeded RolloutDeviceState = "succeeded"
	// DevFailed: the device failed the action (or the start was refused,
	// e.g. the operation_id exists with other params); final once its
	// operation is failed_final.
	DevFailed RolloutDeviceState = "failed"
	// DevTimeout: no final answer before the command expired, retries used
	// up. Like DevRejected and DevFailed settled from a failed_retryable
	// operation, it follows a late final receipt that decides the operation
	// (the scheduler's pass moves it to that outcome).
	DevTimeout RolloutDeviceState = "timeout"
	// DevRejected: the device rejected the command (expired included),
	// retries used up; final once its operation is failed_final.
	DevRejected RolloutDeviceState = "rejected"
	// DevNeedsAttention: its command waits for a person (a device that
	// cannot deduplicate); finished for the abort rules, settled again once
	// resolved.
	DevNeedsAttention RolloutDeviceState = "needs_attention"
	// DevCancelled: terminal; never published: the rollout was aborted,
	// cancelled or its execute_before passed.
	DevCancelled RolloutDeviceState = "cancelled"
)

// Terminal reports whether no transition leaves s.
func (s RolloutDeviceState) Terminal() bool { return RolloutDevice.Valid(s) && RolloutDevice.final(s) }

// Finished reports whether a device counts as finished for the abort
// rules: it has an outcome of its own (cancelled devices have none).
func (s RolloutDeviceState) Finished() bool {
	switch s {
	case DevSucceeded, DevFailed, DevTimeout, DevRejected, DevNeedsAttention:
		return true
	}
	return false
}

// RolloutDevice is the state machine of one device within a rollout.
var RolloutDevice = newMachine("rollout_device",
	[]RolloutDeviceState{DevPending, DevStarted, DevRetry, DevSucceeded, DevFailed, DevTimeout, DevRejected,
		DevNeedsAttention, DevCancelled},
	map[RolloutDeviceState][]RolloutDeviceState{
		DevPending: {DevStarted, DevFailed, DevCancelled},
		DevStarted: {DevSucceeded, DevFailed, DevTimeout, DevRejected, DevNeedsAttention, DevCancelled, DevRetry},
		DevRetry:   {DevStarted, DevFailed, DevCancelled, DevSucceeded, DevRejected},
		// A person's resolve of the command (or a final receipt) settles it.
		DevNeedsAttention: {DevSucceeded, DevFailed},
		// An outcome settled from a failed_retryable operation follows it
		// when a late final receipt decides it (succeeded, or failed_final).
		DevTimeout:  {DevSucceeded, DevFailed, DevRejected},
		DevRejected: {DevSucceeded, DevFailed},
		DevFailed:   {DevSucceeded, DevRejected},
	})

// DeviceOutcome maps what a rollout device's operation says now to the
// device's state: its operation's status, its current command's status and
// reason, whether the device rejected that command, and whether a retry is
// left. ok is false while the operation is under way (the device stays
// started).
func DeviceOutcome(op OperationState, cmd CommandState, reason string, rejected, retryLeft bool) (RolloutDeviceState, bool) {
	switch op {
	case OpSucceeded:
		return DevSucceeded, true
	case OpFailedFinal:
		switch {
		case cmd == CmdCancelled:
			return DevCancelled, true
		case rejected:
			return DevRejected, true
		}
		return DevFailed, true
	case OpFailedRetryable:
		switch {
		case retryLeft:
			return DevRetry, true
		case cmd == CmdTimeout:
			return DevTimeout, true
		case rejected || reason == ReasonExpired:
			return DevRejected, true
		}
		return DevFailed, true
	case OpStarted:
		if cmd == CmdNeedsAttention {
			return DevNeedsAttention, true
		}
	}
	return "", false
}
