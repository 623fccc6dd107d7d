package task

import (
	"github.com/fleetctl/fleetctl/internal/approval"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Checks are the runner's settings for step 5's re-checks.
type Checks struct {
	// EnforceGrants re-checks the requester's grant for each step (on
	// when auth is on).
	EnforceGrants bool
}

// Rules are the domain's part of a task pass (store.TaskPass).
func Rules(c Checks) store.TaskRules {
	return store.TaskRules{
		StepOperationID: func(k domain.Task, i int) string {
			return domain.TaskStepOperationID(k.TaskID, k.Approval.Steps[i].Step, k.Approval.Steps[i].Target, k.Approval.Version)
		},
		Decide: func(snap store.TaskSnapshot) store.TaskDecision { return Decide(snap, c) },
	}
}

// Decide is the runner's rules, a pure function of the committed snapshot
// a pass read (the task and its approval, the approved version's plan
// hash as stored now, the state of the checkpoint step's operation, the
// presence of the plan's targets, the requester's grants, the time) and
// of the step the runner prepared (the candidate):
//
//   - approved: rejected window_missed once execute_before has passed;
//     waits while execute_after has not come; else step 0 starts.
//   - running: waits while the checkpoint step's operation is started;
//     when it succeeded, the next step starts, or the task is completed
//     after the last; when it ended otherwise (failed_final,
//     failed_retryable: a task step is never retried automatically) the
//     task fails step_failed:<step>; with no operation (the checkpoint
//     moved but its insert was lost) the step starts again (node C).
//   - a start needs the step's operation record (Prepare asks the runner
//     for it, nothing is written); a record that cannot be built ends the
//     task invalid_step; then step 5's re-checks (approval.CheckStep:
//     plan_changed, permission_revoked, device_unknown) end it with their
//     reason; otherwise the operation is inserted and the task is running
//     at that step. A failed check before the first step rejects the task
//     (approved → rejected), later it fails it (running → failed).
//   - any other state, or no approval: nothing to do.
func Decide(snap store.TaskSnapshot, c Checks) store.TaskDecision {
	k := snap.Task
	a := k.Approval
	wait := func(what string) store.TaskDecision { return store.TaskDecision{StepIndex: -1, Waiting: what} }
	if a == nil {
		return wait("approval")
	}
	switch k.Status {
	case fsm.TaskApproved:
		w := approval.Window{After: k.ExecuteAfter, Before: k.ExecuteBefore}
		if w.Missed(snap.Now) {
			return store.TaskDecision{To: fsm.TaskRejected, StepIndex: -1, Reason: "window_missed"}
		}
		if w.Waiting(snap.Now) {
			return wait("window") // (B) waiting for the window
		}
		return start(snap, 0, c)
	case fsm.TaskRunning:
		i := k.StepIndex
		switch snap.StepOp {
		case "":
			return start(snap, i, c) // the checkpoint moved but no operation: node C again
		case fsm.OpStarted:
			return wait("step")
		case fsm.OpSucceeded:
			if i+1 == len(a.Steps) {
				return store.TaskDecision{To: fsm.TaskCompleted, StepIndex: -1}
			}
			return start(snap, i+1, c)
		default:
			return store.TaskDecision{To: fsm.TaskFailed, StepIndex: -1, Reason: "step_failed:" + a.Steps[i].Step}
		}
	}
	return wait("done")
}

// start is node C for step i: its operation record, step 5's re-checks,
// then the insert with the checkpoint's move.
func start(snap store.TaskSnapshot, i int, c Checks) store.TaskDecision {
	k, a := snap.Task, snap.Task.Approval
	cand := snap.Candidate
	if cand == nil || cand.Step != i || cand.Version != a.Version {
		return store.TaskDecision{StepIndex: -1, Prepare: true, Step: i}
	}
	end := terminalFor(k)
	if cand.Invalid != "" {
		return store.TaskDecision{To: end, StepIndex: i, Step: i, Reason: "invalid_step: " + cand.Invalid}
	}
	st := a.Steps[i]
	if reason := approval.CheckStep(approval.Step{ApprovedHash: a.PlanHash, CurrentHash: snap.PlanHash,
		EnforceGrants: c.EnforceGrants, Grants: snap.Grants, Action: st.Action, Device: st.Target,
		Seen: snap.Seen[st.Target]}); reason != "" {
		return store.TaskDecision{To: end, StepIndex: i, Step: i, Reason: reason}
	}
	return store.TaskDecision{To: fsm.TaskRunning, StepIndex: i, Step: i, Start: true,
		Reason: "step " + st.Step + ": " + cand.Operation.OperationID}
}

// terminalFor is where a failed check or an invalid step leaves a task:
// rejected before its first step, failed after it.
func terminalFor(k domain.Task) fsm.TaskState {
	if k.Status == fsm.TaskApproved {
		return fsm.TaskRejected
	}
	return fsm.TaskFailed
}
