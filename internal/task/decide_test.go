package task

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/approval"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

var now = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) *time.Time { t := now.Add(d); return &t }

// twoSteps is an approved version 2 of a two-step plan.
func twoSteps(status fsm.TaskState, stepIndex int) domain.Task {
	steps := []domain.Step{
		{Step: "drain", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`)},
		{Step: "reboot", Action: "restart", Target: "device-2", Params: json.RawMessage(`{}`)},
	}
	return domain.Task{TaskID: "t1", Status: status, Version: 2, ApprovedVersion: 2, Steps: steps, StepIndex: stepIndex,
		Approval: &domain.Approval{TaskID: "t1", Version: 2, Steps: steps, Author: "alice", PlanHash: "h2"}}
}

const (
	op0 = "t1:drain:device-1:approval-v2"
	op1 = "t1:reboot:device-2:approval-v2"
)

// snapshot is what a pass reads of k when every check holds.
func snapshot(k domain.Task, stepOp fsm.OperationState) store.TaskSnapshot {
	return store.TaskSnapshot{Task: k, Now: now, PlanHash: "h2", StepOp: stepOp,
		Seen:   map[string]bool{"device-1": true, "device-2": true},
		Grants: []approval.Grant{{Action: "restart", Devices: "device-*"}}}
}

func candidate(step int, opID string) *store.TaskCandidate {
	return &store.TaskCandidate{Step: step, Version: 2, Operation: store.NewOperation{OperationID: opID}}
}

func withWindow(k domain.Task, after, before *time.Time) domain.Task {
	k.ExecuteAfter, k.ExecuteBefore = after, before
	return k
}

func withTarget(k domain.Task, i int, target string) domain.Task {
	steps := append([]domain.Step(nil), k.Approval.Steps...)
	steps[i].Target = target
	a := *k.Approval
	a.Steps = steps
	k.Approval = &a
	return k
}

// TestDecide: every branch of the runner's rules, one snapshot each.
func TestDecide(t *testing.T) {
	t.Parallel()
	wait := func(what string) store.TaskDecision { return store.TaskDecision{StepIndex: -1, Waiting: what} }
	prepare := func(i int) store.TaskDecision { return store.TaskDecision{StepIndex: -1, Prepare: true, Step: i} }
	move := func(to fsm.TaskState, i int, reason string) store.TaskDecision {
		return store.TaskDecision{To: to, StepIndex: i, Step: max(i, 0), Reason: reason}
	}
	start := func(i int, step, opID string) store.TaskDecision {
		return store.TaskDecision{To: fsm.TaskRunning, StepIndex: i, Step: i, Start: true, Reason: "step " + step + ": " + opID}
	}
	approved, running0, running1 := twoSteps(fsm.TaskApproved, 0), twoSteps(fsm.TaskRunning, 0), twoSteps(fsm.TaskRunning, 1)
	edit := func(s store.TaskSnapshot, f func(*store.TaskSnapshot)) store.TaskSnapshot { f(&s); return s }
	for _, c := range []struct {
		name   string
		snap   store.TaskSnapshot
		grants bool // EnforceGrants
		want   store.TaskDecision
	}{
		// (B) the approval and the window.
		{"no approval: waits", snapshot(domain.Task{TaskID: "t1", Status: fsm.TaskApproved}, ""), true, wait("approval")},
		{"waiting approval: nothing", snapshot(twoSteps(fsm.TaskWaitingApproval, 0), ""), true, wait("done")},
		{"approved, window not open yet: waits", snapshot(withWindow(approved, at(time.Minute), nil), ""), true, wait("window")},
		{"approved, window missed: rejected", snapshot(withWindow(approved, nil, at(-time.Second)), ""), true,
			store.TaskDecision{To: fsm.TaskRejected, StepIndex: -1, Reason: "window_missed"}},
		{"approved, window missed before it opened: rejected", snapshot(withWindow(approved, at(-time.Minute), at(-time.Second)), ""), true,
			store.TaskDecision{To: fsm.TaskRejected, StepIndex: -1, Reason: "window_missed"}},
		// (C) a start: its record first, then step 5, then the insert.
		{"approved, no window: prepare the first step", snapshot(approved, ""), true, prepare(0)},
		{"approved, window open: prepare the first step", snapshot(withWindow(approved, at(-time.Minute), at(time.Minute)), ""), true, prepare(0)},
		{"approved, candidate: start step 0", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) { s.Candidate = candidate(0, op0) }),
			true, start(0, "drain", op0)},
		{"a candidate for another step: prepare again", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) { s.Candidate = candidate(1, op1) }),
			true, prepare(0)},
		{"a candidate for another version: prepare again", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) {
			s.Candidate = candidate(0, op0)
			s.Candidate.Version = 1
		}), true, prepare(0)},
		{"approved, invalid step: rejected", edit(snapshot(withTarget(approved, 0, "controller-1"), ""), func(s *store.TaskSnapshot) {
			s.Candidate = &store.TaskCandidate{Step: 0, Version: 2, Invalid: "bad target"}
		}), true, move(fsm.TaskRejected, 0, "invalid_step: bad target")},
		{"invalid step before the re-checks", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) {
			s.Candidate = &store.TaskCandidate{Step: 0, Version: 2, Invalid: "bad target"}
			s.PlanHash = "h3"
		}), true, move(fsm.TaskRejected, 0, "invalid_step: bad target")},
		{"approved, plan changed: rejected", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) {
			s.Candidate, s.PlanHash = candidate(0, op0), "h3"
		}), true, move(fsm.TaskRejected, 0, "plan_changed")},
		{"approved, permission revoked: rejected", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) {
			s.Candidate, s.Grants = candidate(0, op0), []approval.Grant{{Action: "restart", Devices: "device-2"}}
		}), true, move(fsm.TaskRejected, 0, "permission_revoked")},
		{"grants not enforced", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) {
			s.Candidate, s.Grants = candidate(0, op0), nil
		}), false, start(0, "drain", op0)},
		{"approved, device unknown: rejected", edit(snapshot(approved, ""), func(s *store.TaskSnapshot) {
			s.Candidate, s.Seen = candidate(0, op0), map[string]bool{"device-2": true}
		}), true, move(fsm.TaskRejected, 0, "device_unknown")},
		// running: follow the checkpoint step's operation.
		{"running, step under way: waits", snapshot(running0, fsm.OpStarted), true, wait("step")},
		{"running, step succeeded: prepare the next step", snapshot(running0, fsm.OpSucceeded), true, prepare(1)},
		{"running, step succeeded, candidate: start the next step", edit(snapshot(running0, fsm.OpSucceeded), func(s *store.TaskSnapshot) {
			s.Candidate = candidate(1, op1)
		}), true, start(1, "reboot", op1)},
		{"running, last step succeeded: completed", snapshot(running1, fsm.OpSucceeded), true,
			store.TaskDecision{To: fsm.TaskCompleted, StepIndex: -1}},
		{"running, step failed: failed", snapshot(running1, fsm.OpFailedFinal), true,
			store.TaskDecision{To: fsm.TaskFailed, StepIndex: -1, Reason: "step_failed:reboot"}},
		{"running, step failed_retryable: failed, never retried", snapshot(running0, fsm.OpFailedRetryable), true,
			store.TaskDecision{To: fsm.TaskFailed, StepIndex: -1, Reason: "step_failed:drain"}},
		{"running, checkpoint moved but no operation: node C again", snapshot(running1, ""), true, prepare(1)},
		{"running, no operation, candidate: the same step again", edit(snapshot(running1, ""), func(s *store.TaskSnapshot) {
			s.Candidate = candidate(1, op1)
		}), true, start(1, "reboot", op1)},
		{"running, invalid next step: failed", edit(snapshot(running0, fsm.OpSucceeded), func(s *store.TaskSnapshot) {
			s.Candidate = &store.TaskCandidate{Step: 1, Version: 2, Invalid: "bad target"}
		}), true, move(fsm.TaskFailed, 1, "invalid_step: bad target")},
		{"running, permission revoked at the next step: failed", edit(snapshot(running0, fsm.OpSucceeded), func(s *store.TaskSnapshot) {
			s.Candidate, s.Grants = candidate(1, op1), nil
		}), true, move(fsm.TaskFailed, 1, "permission_revoked")},
		{"running, device unknown at the next step: failed", edit(snapshot(running0, fsm.OpSucceeded), func(s *store.TaskSnapshot) {
			s.Candidate, s.Seen = candidate(1, op1), map[string]bool{"device-1": true}
		}), true, move(fsm.TaskFailed, 1, "device_unknown")},
		{"running, plan changed at the next step: failed", edit(snapshot(running0, fsm.OpSucceeded), func(s *store.TaskSnapshot) {
			s.Candidate, s.PlanHash = candidate(1, op1), "h3"
		}), true, move(fsm.TaskFailed, 1, "plan_changed")},
		{"completed: nothing", snapshot(twoSteps(fsm.TaskCompleted, 1), fsm.OpSucceeded), true, wait("done")},
		{"rejected: nothing", snapshot(twoSteps(fsm.TaskRejected, 0), ""), true, wait("done")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, Decide(c.snap, Checks{EnforceGrants: c.grants}))
		})
	}
}

func TestTerminalFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, fsm.TaskRejected, terminalFor(domain.Task{Status: fsm.TaskApproved}), "before the first step")
	require.Equal(t, fsm.TaskFailed, terminalFor(domain.Task{Status: fsm.TaskRunning}), "after it")
}

// TestRulesStepOperationID: the id a pass reads the checkpoint step's
// operation by is the one the step's operation is inserted with.
func TestRulesStepOperationID(t *testing.T) {
	t.Parallel()
	rules := Rules(Checks{})
	require.Equal(t, op0, rules.StepOperationID(twoSteps(fsm.TaskRunning, 0), 0))
	require.Equal(t, op1, rules.StepOperationID(twoSteps(fsm.TaskRunning, 1), 1))
}
