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
//
// The runner has the rollout scheduler's shape. Each active task is driven
// by one instance at a time, under a lease on the task row (owner, fencing
// token, expiry; store.AcquireTask): a peer's task whose lease ran out is
// taken over with a new token, and this instance's own tasks are reclaimed
// at once after a restart (the instance lock proves the old process dead).
// Each decision is one pass (store.TaskPass): a transaction that checks
// the fence and extends the lease, reads the task's snapshot and applies
// what Decide, a pure function of it, says, with conditional writes that
// name the fence. A start takes two passes: the first says which step
// (Prepare), the runner builds its operation record (after the
// before-step-insert failpoint), the second re-checks and inserts it.
//
// The runner looks at a task when told to (Wake: an approval, a step
// operation's change) and, as the safety net, at every task every Interval
// (at most a third of the lease ttl, so that each pass keeps its lease).
package task

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/lease"
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
	// Interval is the safety net: how often the active tasks are listed
	// (a peer's whose lease ran out is taken over then) and each task this
	// instance drives gets a pass without a wake-up. At most LeaseTTL/3;
	// that by default.
	Interval time.Duration
	// LeaseTTL is the runner's lease on each task it drives (10 s when 0).
	LeaseTTL time.Duration
	Logger   *slog.Logger
	Now      func() time.Time
}

// Runner drives approved and running tasks.
type Runner struct {
	cfg   Config
	rules store.TaskRules
	mu    sync.Mutex
	held  map[string]domain.Fence // tasks this runner drives, with its fence
	known map[string]bool         // tasks this process has looked at
	woken map[string]bool         // tasks woken since the last look
	wake  chan struct{}
}

// New builds a Runner.
func New(cfg Config) *Runner {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.Interval <= 0 || cfg.Interval > cfg.LeaseTTL/3 {
		cfg.Interval = cfg.LeaseTTL / 3
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Runner{cfg: cfg, rules: Rules(Checks{EnforceGrants: cfg.EnforceGrants}), held: map[string]domain.Fence{},
		known: map[string]bool{}, woken: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Wake makes the runner look at a task now (its approval, a change of its
// step's operation). It never blocks.
func (r *Runner) Wake(taskID string) {
	r.mu.Lock()
	r.woken[taskID] = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run looks at every active task every Interval, and at the woken ones
// when woken, until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	all := true
	for {
		woken := r.takeWoken()
		if all {
			woken = nil
		}
		r.look(ctx, woken)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			all = true
		case <-r.wake:
			all = false
		}
	}
}

func (r *Runner) takeWoken() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.woken
	r.woken = map[string]bool{}
	return w
}

// look lists the active tasks, takes the leases it can and makes a pass
// over each task it drives: all of them, or those in only when it is
// not nil.
func (r *Runner) look(ctx context.Context, only map[string]bool) {
	active, err := r.cfg.Store.ActiveTasks(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Error("list active tasks", "err", err)
		}
		return
	}
	now := r.cfg.Now()
	live := map[string]bool{}
	for _, l := range active {
		live[l.TaskID] = true
		if (only != nil && !only[l.TaskID]) || ctx.Err() != nil {
			continue
		}
		r.mu.Lock()
		f, held := r.held[l.TaskID]
		first := !r.known[l.TaskID]
		r.known[l.TaskID] = true
		r.mu.Unlock()
		if !held {
			claim := lease.ClaimFor(l.Owner, l.LeaseExpiresAt, r.cfg.Instance, first, now)
			if claim == lease.Leave {
				continue
			}
			if f, err = r.cfg.Store.AcquireTask(ctx, l.TaskID, r.cfg.Instance, r.cfg.LeaseTTL, claim == lease.Reclaim); err != nil {
				if !errors.Is(err, store.ErrRefused) && ctx.Err() == nil {
					r.cfg.Logger.Error("take task lease", "task_id", l.TaskID, "err", err)
				}
				continue
			}
			if l.Owner != "" && l.Owner != r.cfg.Instance {
				r.cfg.Logger.Info("took over a task whose runner lease ran out", "task_id", l.TaskID,
					"from", l.Owner, "fencing_token", f.Token)
			}
			r.mu.Lock()
			r.held[l.TaskID] = f
			r.mu.Unlock()
		}
		r.drive(ctx, l.TaskID, f)
	}
	if only == nil { // forget the tasks that ended
		r.mu.Lock()
		for id := range r.known {
			if !live[id] {
				delete(r.known, id)
				delete(r.held, id)
			}
		}
		r.mu.Unlock()
	}
}

// drive makes the passes of one decision about a task under fence f: a
// start takes a second pass, with the step's operation record.
func (r *Runner) drive(ctx context.Context, id string, f domain.Fence) {
	log := r.cfg.Logger.With("task_id", id)
	var cand *store.TaskCandidate
	for attempt := 0; attempt < 3 && ctx.Err() == nil; attempt++ {
		res, err := r.cfg.Store.TaskPass(ctx, id, f, r.cfg.LeaseTTL, cand, r.rules)
		switch {
		case errors.Is(err, store.ErrFenced):
			log.Warn("task runner lease lost; another instance drives it", "fencing_token", f.Token)
			r.mu.Lock()
			delete(r.held, id)
			r.mu.Unlock()
			return
		case err != nil:
			log.Debug("task pass", "err", err)
			return
		}
		d := res.Decision
		if d.Prepare {
			if cand = r.prepare(ctx, res.Snapshot.Task, d.Step); cand == nil {
				return
			}
			continue
		}
		if res.Moved {
			log.Info("task moved", "to", d.To, "step_index", d.StepIndex, "reason", d.Reason)
		}
		return
	}
}

// prepare builds step i's operation record (node C's first half), after
// the before-step-insert failpoint; nil when the failpoint refused.
func (r *Runner) prepare(ctx context.Context, k domain.Task, i int) *store.TaskCandidate {
	if err := r.cfg.Failpoints.HitContext(ctx, failpoint.BeforeStepInsert); err != nil {
		r.cfg.Logger.Warn("step insert skipped", "task_id", k.TaskID, "err", err)
		return nil
	}
	n, err := r.cfg.Ops.PrepareStep(ctx, k, i)
	c := &store.TaskCandidate{Step: i, Version: k.Approval.Version, Operation: n}
	if err != nil {
		c.Invalid = err.Error()
	}
	return c
}
