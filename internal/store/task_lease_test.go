package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// startOrFail is a stand-in for the domain's decide (package task imports
// this one): it starts the candidate's step, or fails the task.
func startOrFail(snap TaskSnapshot) TaskDecision {
	if snap.Candidate == nil {
		return TaskDecision{To: fsm.TaskFailed, StepIndex: -1, Reason: "test"}
	}
	return TaskDecision{To: fsm.TaskRunning, StepIndex: 0, Start: true, Reason: "step: " + snap.Candidate.Operation.OperationID}
}

var testRules = TaskRules{
	StepOperationID: func(k domain.Task, i int) string { return fmt.Sprintf("%s:%d", k.TaskID, i) },
	Decide:          startOrFail,
}

// TestTaskLeaseFencesEachPass: a task's runner lease is taken once (a live
// holder's is refused), a pass under it inserts the step's operation and
// moves the task in one transaction, the lease is taken over once it ran
// out (a new token, recorded), and the old holder's pass is then refused as
// fenced with nothing of it written.
func TestTaskLeaseFencesEachPass(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, _, err := b.s.CreateTask(b.ctx, newTask("t-1", "agent"))
		require.NoError(t, err)
		_, _, err = b.s.Approve(b.ctx, "t-1", 1, "", "alice", true)
		require.NoError(t, err)
		active, err := b.s.ActiveTasks(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []TaskLease{{TaskID: "t-1", Status: fsm.TaskApproved, LeaseExpiresAt: time.UnixMilli(0).UTC()}},
			normalize(active))

		f1, err := b.s.AcquireTask(b.ctx, "t-1", "i1", 2*time.Second, false)
		require.NoError(t, err)
		require.Equal(t, domain.Fence{Owner: "i1", Token: 1}, f1)
		_, err = b.s.AcquireTask(b.ctx, "t-1", "i2", 2*time.Second, false)
		require.ErrorIs(t, err, ErrRefused, "a live holder keeps it")

		// A pass under the lease: the step's operation and the move, together.
		res, err := b.s.TaskPass(b.ctx, "t-1", f1, 2*time.Second, &TaskCandidate{Operation: newOp("t-1:0", "c-1")}, testRules)
		require.NoError(t, err)
		require.True(t, res.Moved)
		require.NotNil(t, res.Started)
		require.True(t, res.Started.Created)
		k, err := b.s.GetTask(b.ctx, "t-1")
		require.NoError(t, err)
		require.Equal(t, fsm.TaskRunning, k.Status)
		require.Equal(t, "i1", k.Owner)
		require.Equal(t, b.clk.Now().Add(2*time.Second), k.LeaseExpiresAt, "the pass extended the lease")
		history := len(k.History)

		// The lease runs out; i2 takes it over with a new token.
		b.clk.Advance(3 * time.Second)
		f2, err := b.s.AcquireTask(b.ctx, "t-1", "i2", 2*time.Second, false)
		require.NoError(t, err)
		require.Equal(t, domain.Fence{Owner: "i2", Token: 2}, f2)
		ev, err := b.s.Events(b.ctx, "t-1")
		require.NoError(t, err)
		var leases []string
		for _, e := range ev {
			if e.Machine == "lease" {
				leases = append(leases, e.From+" → "+e.To+": "+e.Reason)
			}
		}
		require.Equal(t, []string{"i1 → i2: task runner: takeover of an expired lease"}, leases)

		// The old holder's pass is fenced: nothing of it is written.
		_, err = b.s.TaskPass(b.ctx, "t-1", f1, 2*time.Second, nil, testRules)
		require.ErrorIs(t, err, ErrFenced)
		k, err = b.s.GetTask(b.ctx, "t-1")
		require.NoError(t, err)
		require.Equal(t, fsm.TaskRunning, k.Status)
		require.Len(t, k.History, history)

		// The new holder's decides; a restart of it reclaims at once.
		f3, err := b.s.AcquireTask(b.ctx, "t-1", "i2", 2*time.Second, true)
		require.NoError(t, err)
		require.Equal(t, domain.Fence{Owner: "i2", Token: 3}, f3)
		_, err = b.s.TaskPass(b.ctx, "t-1", f2, 2*time.Second, nil, testRules)
		require.ErrorIs(t, err, ErrFenced, "the token before the reclaim")
		res, err = b.s.TaskPass(b.ctx, "t-1", f3, 2*time.Second, nil, testRules)
		require.NoError(t, err)
		require.Equal(t, fsm.TaskFailed, res.Decision.To)
		k, err = b.s.GetTask(b.ctx, "t-1")
		require.NoError(t, err)
		require.Equal(t, fsm.TaskFailed, k.Status)
		active, err = b.s.ActiveTasks(b.ctx)
		require.NoError(t, err)
		require.Empty(t, active)
	})
}

// TestTaskPassSnapshot: what a pass reads for the domain's decision.
func TestTaskPassSnapshot(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		_, _, err := b.s.CreateTask(b.ctx, newTask("t-1", "agent"))
		require.NoError(t, err)
		_, _, err = b.s.CreateGrant(b.ctx, "g-1", "agent", "restart", "device-*", "admin")
		require.NoError(t, err)
		_, _, err = b.s.Approve(b.ctx, "t-1", 1, "", "alice", true)
		require.NoError(t, err)
		f, err := b.s.AcquireTask(b.ctx, "t-1", "i1", 2*time.Second, false)
		require.NoError(t, err)
		var snap TaskSnapshot
		_, err = b.s.TaskPass(b.ctx, "t-1", f, 2*time.Second, nil, TaskRules{StepOperationID: testRules.StepOperationID,
			Decide: func(s TaskSnapshot) TaskDecision { snap = s; return TaskDecision{StepIndex: -1} }})
		require.NoError(t, err)
		require.Equal(t, fsm.TaskApproved, snap.Task.Status)
		require.NotNil(t, snap.Task.Approval)
		require.Equal(t, "agent", snap.Task.Approval.Author)
		require.Equal(t, "hash-t-1", snap.PlanHash)
		require.Equal(t, map[string]bool{"device-1": false}, snap.Seen, "never seen")
		require.Len(t, snap.Grants, 1)
		require.Equal(t, "device-*", snap.Grants[0].Devices)
		require.Equal(t, b.clk.Now(), snap.Now)
		require.Equal(t, fsm.OperationState(""), snap.StepOp)
	})
}

func normalize(ls []TaskLease) []TaskLease {
	for i := range ls {
		ls[i].LeaseExpiresAt = ls[i].LeaseExpiresAt.UTC()
	}
	return ls
}
