// Package task runs approved tasks as resumable nodes, each idempotent by a
// natural unique key or its own operation_id, so that re-running any node
// from its start after a crash is harmless:
//
//	(A) save the approval request: the task and its plan versions (the API);
//	(B) wait: for the approval (the API) and for the maintenance window;
//	(C) the side effect, one step at a time: in one transaction, re-check
//	    that the requester (the author of the approved version) still holds a
//	    grant for the step, that the device has been seen, and that the plan
//	    hash is the approved one, then insert the step's operation
//	    {task_id}:{step}:{target}:approval-v{version} (UNIQUE) and move the
//	    task's checkpoint. A failed check rejects the task (before its first
//	    step) or fails it (later); nothing is sent.
//
// The checkpoint is the task row (status, step_index); the operation record
// says how far each step got. A step's operation that ends failed fails the
// task (step_failed:<step>); a task step is never retried automatically.
package task

import (
	"context"
	"log/slog"
	"time"

	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Config configures a Runner.
type Config struct {
	Store    store.Store
	Ops      *ops.Service // builds each step's operation record
	Instance string
	// EnforceGrants re-checks grants at each step (on when auth is on).
	EnforceGrants bool
	Failpoints    *failpoint.Set
	Kick          func(commandID string)
	Interval      time.Duration
	Logger        *slog.Logger
	Now           func() time.Time
}

// Runner drives approved and running tasks.
type Runner struct{ cfg Config }

// New builds a Runner.
func New(cfg Config) *Runner {
	if cfg.Interval <= 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Runner{cfg: cfg}
}

// Run looks at the active tasks every interval until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		ids, err := r.cfg.Store.ActiveTasks(ctx)
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("list active tasks", "err", err)
		}
		for _, id := range ids {
			if ctx.Err() != nil {
				return nil
			}
			r.step(ctx, id)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (r *Runner) step(ctx context.Context, id string) {
	k, err := r.cfg.Store.GetTask(ctx, id)
	if err != nil || k.Approval == nil {
		return
	}
	now := r.cfg.Now()
	switch k.Status {
	case fsm.TaskApproved:
		if k.ExecuteBefore != nil && now.After(*k.ExecuteBefore) {
			r.move(ctx, k, fsm.TaskRejected, -1, "window_missed")
			return
		}
		if k.ExecuteAfter != nil && now.Before(*k.ExecuteAfter) {
			return // (B) waiting for the window
		}
		r.start(ctx, k, 0)
	case fsm.TaskRunning:
		st := k.Approval.Steps[k.StepIndex]
		op, err := r.cfg.Store.GetOperation(ctx, ops.StepOperationID(k.TaskID, st, k.Approval.Version))
		if err != nil {
			r.start(ctx, k, k.StepIndex) // the checkpoint moved but no operation: re-run node C
			return
		}
		switch op.Status {
		case fsm.OpStarted:
		case fsm.OpSucceeded:
			if k.StepIndex+1 == len(k.Approval.Steps) {
				r.move(ctx, k, fsm.TaskCompleted, -1, "")
				return
			}
			r.start(ctx, k, k.StepIndex+1)
		default:
			r.move(ctx, k, fsm.TaskFailed, -1, "step_failed:"+st.Step)
		}
	}
}

// start is node C for one step.
func (r *Runner) start(ctx context.Context, k store.Task, i int) {
	if err := r.cfg.Failpoints.HitContext(ctx, failpoint.BeforeStepInsert); err != nil {
		r.cfg.Logger.Warn("step insert skipped", "task_id", k.TaskID, "err", err)
		return
	}
	st := k.Approval.Steps[i]
	n, err := r.cfg.Ops.PrepareStep(ctx, k, i)
	if err != nil {
		r.move(ctx, k, terminalFor(k), i, "invalid_step: "+err.Error())
		return
	}
	out, err := r.cfg.Store.StartStep(ctx, k, i, r.cfg.EnforceGrants, n, "runner:"+r.cfg.Instance)
	if err != nil {
		r.cfg.Logger.Debug("start step", "task_id", k.TaskID, "step", st.Step, "err", err)
		return
	}
	if out.Refused {
		r.cfg.Logger.Info("task step refused", "task_id", k.TaskID, "step", st.Step, "reason", out.Reason)
		return
	}
	if out.Result.Created || out.Result.Retried {
		r.cfg.Kick(out.Result.Operation.CommandID)
	}
}

func terminalFor(k store.Task) fsm.TaskState {
	if k.Status == fsm.TaskApproved {
		return fsm.TaskRejected
	}
	return fsm.TaskFailed
}

func (r *Runner) move(ctx context.Context, k store.Task, to fsm.TaskState, i int, reason string) {
	if err := r.cfg.Store.MoveTask(ctx, k, to, i, reason, "runner:"+r.cfg.Instance); err != nil {
		r.cfg.Logger.Debug("move task", "task_id", k.TaskID, "to", to, "err", err)
	}
}
