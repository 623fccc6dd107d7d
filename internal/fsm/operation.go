package fsm

// OperationState is the status of an operation, the idempotency record of one
// business intent.
type OperationState string

const (
	// OpStarted: the operation was accepted and its command is under way.
	// Its lease holder moves it on when the command ends; a receipt applied
	// by any instance may end it too.
	OpStarted OperationState = "started"
	// OpSucceeded: terminal; the device's result is stored.
	OpSucceeded OperationState = "succeeded"
	// OpFailedRetryable: nothing ran, or nothing is known (expired, device
	// offline, timeout). A POST of the same operation is its retry; a late
	// final receipt of one of its commands decides it.
	OpFailedRetryable OperationState = "failed_retryable"
	// OpFailedFinal: terminal; the device failed it, or it was cancelled.
	OpFailedFinal OperationState = "failed_final"
)

// Terminal reports whether no transition leaves s.
func (s OperationState) Terminal() bool { return Operation.Valid(s) && Operation.final(s) }

// Operation is the operation state machine of the contract.
var Operation = newMachine("operation",
	[]OperationState{OpStarted, OpSucceeded, OpFailedRetryable, OpFailedFinal},
	map[OperationState][]OperationState{
		OpStarted:         {OpSucceeded, OpFailedRetryable, OpFailedFinal},
		OpFailedRetryable: {OpStarted, OpSucceeded, OpFailedFinal},
	})
