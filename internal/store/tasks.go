package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/approval"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// NewTask is a task's creation.
type NewTask struct {
	TaskID        string
	Steps         json.RawMessage // canonical JSON array
	PlanHash      string
	CreateHash    string
	ExecuteAfter  *time.Time
	ExecuteBefore *time.Time
	Author        string
}

func nullTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return ms(*t)
}

func (t *tx) history(taskID, principal, action string, from, to fsm.TaskState, version int, reason string) error {
	_, err := t.Exec(t.s.q.TaskHistoryInsert, taskID, ms(t.now), principal, action, from, to, version, reason)
	if err != nil {
		return fmt.Errorf("task history: %w", err)
	}
	if from != to && from != "" {
		t.notes = append(t.notes, func(o Observer) { o.Transition("task", string(from), string(to)) })
	}
	t.changed("task", taskID, string(from), string(to))
	return nil
}

// CreateTask inserts a task with plan version 1 by its author, or returns
// the task when the same create is replayed (created false); another create
// with the same task_id is domain.ErrKeyReused.
func (s *DB) CreateTask(ctx context.Context, n NewTask) (domain.Task, bool, error) {
	created := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(n.Author)
		var hash string
		err := t.QueryRowContext(ctx, s.q.TaskCreateHash, n.TaskID).Scan(&hash)
		switch {
		case err == nil:
			if hash != n.CreateHash {
				return domain.ErrKeyReused
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		now := ms(t.now)
		if _, err := t.Exec(s.q.TaskInsert,
			n.TaskID, n.CreateHash, nullTime(n.ExecuteAfter), nullTime(n.ExecuteBefore), n.Author, now, now); err != nil {
			return fmt.Errorf("insert task %s: %w", n.TaskID, err)
		}
		if _, err := t.Exec(s.q.TaskVersionInsert, n.TaskID, 1, string(n.Steps), n.PlanHash, n.Author, now); err != nil {
			return fmt.Errorf("insert plan of %s: %w", n.TaskID, err)
		}
		created = true
		if err := t.history(n.TaskID, n.Author, "create", "", fsm.TaskWaitingApproval, 1, ""); err != nil {
			return err
		}
		return t.audit(ActCreate, EntityTask, n.TaskID, map[string]any{"version": 1, "plan_hash": n.PlanHash})
	})
	if err != nil {
		return domain.Task{}, false, err
	}
	task, err := s.GetTask(ctx, n.TaskID)
	return task, created, err
}

// UpdatePlan records a new plan version by author, superseding the current
// one. An unchanged plan (same hash) returns the current version (changed
// false); a base version that is not the current one is domain.ErrStaleVersion; a
// task that left waiting_approval is domain.ErrIllegalState.
func (s *DB) UpdatePlan(ctx context.Context, taskID string, steps json.RawMessage, planHash, author string, baseVersion *int) (domain.Task, bool, error) {
	changed := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(author)
		var status fsm.TaskState
		var version int
		var rowVersion int64
		err := t.QueryRowContext(ctx, s.q.TaskState, taskID).Scan(&status, &version, &rowVersion)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", taskID, domain.ErrNotFound)
		}
		if err != nil {
			return err
		}
		var current string
		if err := t.QueryRowContext(ctx, s.q.TaskVersionHash, taskID, version).Scan(&current); err != nil {
			return err
		}
		switch {
		case status != fsm.TaskWaitingApproval:
			return fmt.Errorf("task %s is %s: %w", taskID, status, domain.ErrIllegalState)
		case current == planHash:
			return nil // a replay of the current plan
		case baseVersion != nil && *baseVersion != version:
			return fmt.Errorf("base_version %d, current %d: %w", *baseVersion, version, domain.ErrStaleVersion)
		}
		now := ms(t.now)
		ch := change{machine: "task", id: taskID, from: string(status), to: string(status)}
		if err := t.cas(ctx, ch, nil, s.q.TaskNewVersion, now, taskID, fsm.TaskWaitingApproval, rowVersion); err != nil {
			return err
		}
		if _, err := t.Exec(s.q.TaskVersionInsert, taskID, version+1, string(steps), planHash, author, now); err != nil {
			return fmt.Errorf("insert plan of %s: %w", taskID, err)
		}
		changed = true
		if err := t.history(taskID, author, "plan", status, status, version+1, fmt.Sprintf("supersedes v%d", version)); err != nil {
			return err
		}
		return t.audit(ActPlan, EntityTask, taskID, map[string]any{"version": version + 1, "supersedes": version, "plan_hash": planHash})
	})
	if err != nil {
		return domain.Task{}, false, err
	}
	task, err := s.GetTask(ctx, taskID)
	return task, changed, err
}

// Approve approves one plan version, checked in the contract's order after
// the caller's 401/403: 404, an exact replay (returned, created false),
// 409 illegal_state, 409 stale_version (another version, or a plan_hash
// that differs), 403 four_eyes (the approver wrote the version).
func (s *DB) Approve(ctx context.Context, taskID string, version int, planHash, approver string, fourEyes bool) (domain.Approval, bool, error) {
	created := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(approver)
		var status fsm.TaskState
		var current int
		var rowVersion int64
		err := t.QueryRowContext(ctx, s.q.TaskState, taskID).Scan(&status, &current, &rowVersion)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", taskID, domain.ErrNotFound)
		}
		if err != nil {
			return err
		}
		var prior *approval.Approved
		var prev approval.Approved
		err = t.QueryRowContext(ctx, s.q.TaskApprovalGet, taskID).Scan(&prev.Version, &prev.Approver)
		switch {
		case err == nil:
			prior = &prev
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		var hash, author string
		if err := t.QueryRowContext(ctx, s.q.TaskVersionAuthor,
			taskID, current).Scan(&hash, &author); err != nil {
			return err
		}
		switch approval.Check(approval.Request{Version: version, PlanHash: planHash, Approver: approver, Prior: prior,
			Waiting: status == fsm.TaskWaitingApproval, Current: current, CurrentHash: hash, Author: author, FourEyes: fourEyes}) {
		case approval.Replay:
			return nil // an exact replay
		case approval.IllegalState:
			return fmt.Errorf("task %s is %s: %w", taskID, status, domain.ErrIllegalState)
		case approval.StaleVersion:
			return fmt.Errorf("approving v%d (plan %.12s), current v%d (plan %.12s): %w", version, planHash, current, hash, domain.ErrStaleVersion)
		case approval.FourEyes:
			return fmt.Errorf("%s wrote v%d: %w", approver, version, domain.ErrFourEyes)
		}
		now := ms(t.now)
		ch := change{machine: "task", id: taskID, from: string(status), to: string(fsm.TaskApproved)}
		if err := t.cas(ctx, ch, nil, s.q.TaskApprove,
			fsm.TaskApproved, version, now, taskID, fsm.TaskWaitingApproval, version, rowVersion); err != nil {
			return err
		}
		if _, err := t.Exec(s.q.TaskApprovalInsert,
			taskID, version, approver, hash, now); err != nil {
			return fmt.Errorf("insert approval of %s: %w", taskID, err)
		}
		created = true
		if err := t.history(taskID, approver, "approve", status, fsm.TaskApproved, version, ""); err != nil {
			return err
		}
		return t.audit(ActApprove, EntityTask, taskID, map[string]any{"version": version, "plan_hash": hash})
	})
	if err != nil {
		return domain.Approval{}, false, err
	}
	task, err := s.GetTask(ctx, taskID)
	if err != nil {
		return domain.Approval{}, false, err
	}
	if task.Approval == nil {
		return domain.Approval{}, false, fmt.Errorf("task %s: approval missing", taskID)
	}
	return *task.Approval, created, nil
}

// Reject rejects a task that is waiting for approval or approved (not yet
// running). A rejection of a rejected task is a replay.
func (s *DB) Reject(ctx context.Context, taskID, reason, who string) (domain.Task, error) {
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(who)
		var status fsm.TaskState
		var rowVersion int64
		var version int
		err := t.QueryRowContext(ctx, s.q.TaskRejectState, taskID).Scan(&status, &rowVersion, &version)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", taskID, domain.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if status == fsm.TaskRejected {
			return nil
		}
		if status != fsm.TaskWaitingApproval && status != fsm.TaskApproved {
			return fmt.Errorf("task %s is %s: %w", taskID, status, domain.ErrIllegalState)
		}
		if err := t.moveTask(ctx, taskID, status, rowVersion, fsm.TaskRejected, -1, "rejected: "+reason, who, version, nil); err != nil {
			return err
		}
		return t.audit(ActReject, EntityTask, taskID, map[string]any{"from": status, "version": version, "reason": reason})
	})
	if err != nil {
		return domain.Task{}, err
	}
	return s.GetTask(ctx, taskID)
}

// moveTask is the task's conditional transition; stepIndex < 0 keeps it.
// A runner's move names its fence f (nil: a person's), checked in the
// same conditional write.
func (t *tx) moveTask(ctx context.Context, taskID string, from fsm.TaskState, rowVersion int64, to fsm.TaskState, stepIndex int, reason, who string, version int, f *domain.Fence) error {
	if err := fsm.Task.Transition(from, to); err != nil {
		return t.refuse("task", taskID, string(from), string(to), ReasonIllegal, 0)
	}
	ch := change{machine: "task", id: taskID, from: string(from), to: string(to)}
	q := t.s.q.TaskMove
	args := []any{to, reason, stepIndex, stepIndex, ms(t.now), taskID, from, rowVersion}
	if f != nil {
		q = t.s.q.TaskMoveFenced
		args = append(args, fenceArgs(*f, t.now)...)
		ch.token = f.Token
		ch.explain = t.fenceExplainer(ctx, t.s.q.TaskFenceHeld, taskID, *f)
	}
	if err := t.cas(ctx, ch, nil, q, args...); err != nil {
		return err
	}
	return t.history(taskID, who, "run", from, to, version, reason)
}

// The task runner (internal/task) drives each approved or running task
// under a lease of its own, as the rollout scheduler drives a rollout:
// ActiveTasks lists them with their holders, AcquireTask takes a lease
// that ran out (or this instance's own after a restart), and each of the
// holder's decisions is one TaskPass: a transaction that checks the fence
// and extends the lease, reads the task's snapshot, asks the domain's
// decide function (task.Decide) what to do and applies it with
// conditional writes that name the fence.

// TaskLease is an active task and who holds its runner's lease.
type TaskLease struct {
	TaskID         string
	Status         fsm.TaskState
	Owner          string
	FencingToken   int64
	LeaseExpiresAt time.Time
}

// ActiveTasks lists the approved and running tasks with their leases.
func (s *DB) ActiveTasks(ctx context.Context) ([]TaskLease, error) {
	rows, err := s.rq.QueryContext(ctx, s.q.TaskListActive)
	if err != nil {
		return nil, fmt.Errorf("active tasks: %w", err)
	}
	defer rows.Close()
	var out []TaskLease
	for rows.Next() {
		var l TaskLease
		var lease int64
		if err := rows.Scan(&l.TaskID, &l.Status, &l.Owner, &l.FencingToken, &lease); err != nil {
			return nil, err
		}
		l.LeaseExpiresAt = fromMS(lease)
		out = append(out, l)
	}
	return out, rows.Err()
}

// AcquireTask takes the runner's lease on a task for owner, with a new
// fencing token (see takeLease). A takeover from another holder, or a
// reclaim after a restart, is recorded in the events log; the task's
// history is the contract's and does not change.
func (s *DB) AcquireTask(ctx context.Context, id, owner string, ttl time.Duration, reclaim bool) (domain.Fence, error) {
	var f domain.Fence
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		l := leased{machine: "task", acquire: t.s.q.TaskAcquire, id: id}
		var lease int64
		err := t.QueryRowContext(ctx, s.q.TaskLeaseGetForUpdate, id).
			Scan(&l.owner, &l.token, &lease)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", id, domain.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("read lease of task %s: %w", id, err)
		}
		l.expires = fromMS(lease)
		var why string
		if f, why, err = t.takeLease(ctx, l, owner, ttl, reclaim); err != nil {
			return err
		}
		if l.owner == "" {
			return nil // the task's first runner
		}
		return t.event("lease", id, l.owner, owner, "task runner: "+why, f.Token)
	})
	return f, err
}

// TaskCandidate is the step the runner prepared for a start: its index in
// the approved plan of Version and the operation record a start inserts
// (built by the ops service), or why no record can be built (Invalid).
type TaskCandidate struct {
	Step      int
	Version   int
	Operation NewOperation
	Invalid   string
}

// TaskSnapshot is what a task pass read, all of it committed: the basis
// of the runner's decision.
type TaskSnapshot struct {
	Task domain.Task // with its approval; not its history
	Now  time.Time
	// PlanHash is the plan_hash of the approved version as stored now.
	PlanHash string
	// StepOp is the state of the operation of the checkpoint's step, when
	// the task is running ("": none was inserted).
	StepOp fsm.OperationState
	// Seen says which of the approved plan's targets have been seen.
	Seen map[string]bool
	// Grants are the requester's live grants.
	Grants []approval.Grant
	// Candidate is the step the runner prepared, if any.
	Candidate *TaskCandidate
}

// TaskDecision is what the domain's decide function asks a task pass to do.
type TaskDecision struct {
	// To moves the task ("" stays) with Reason in its history; StepIndex
	// is its checkpoint then (-1 keeps it).
	To        fsm.TaskState
	StepIndex int
	Reason    string
	// Start inserts the candidate's operation (step Step) in the same
	// transaction as the move to running at that step.
	Start bool
	// Prepare asks the runner for the operation record of step Step: the
	// pass writes nothing but the lease, and the runner passes again with
	// the candidate.
	Prepare bool
	Step    int
	// Waiting names what the task waits for ("window", "step",
	// "approval", "done"), when it neither moves nor starts.
	Waiting string
}

// TaskRules are the domain's part of a task pass.
type TaskRules struct {
	// StepOperationID is the operation_id of step i of k's approved plan.
	StepOperationID func(k domain.Task, i int) string
	Decide          func(TaskSnapshot) TaskDecision
}

// TaskPassResult is what a task pass did.
type TaskPassResult struct {
	Snapshot TaskSnapshot
	Decision TaskDecision
	Moved    bool
	// Started is the submit of the step's operation, when one started.
	Started *SubmitResult
}

// TaskPass is one decision of a task's runner, in one transaction under
// its lease: the fence is checked and the lease extended (a fenced write:
// a lost lease refuses the whole pass, recorded as fenced); the task, its
// approval, its approved plan's hash, its step's operation, its targets'
// presence and its requester's grants are read; rules.Decide says what to
// do; a start inserts the step's operation (UNIQUE: a re-run returns it)
// and moves the checkpoint in the same transaction as the re-checks it
// passed (the walkthrough's steps 5 and 6); every move is a conditional
// write that names the fence.
func (s *DB) TaskPass(ctx context.Context, id string, f domain.Fence, ttl time.Duration, cand *TaskCandidate, rules TaskRules) (TaskPassResult, error) {
	var res TaskPassResult
	var locks rowLocks
	if cand != nil {
		locks = cand.Operation.locks()
	}
	err := s.writeLocking(ctx, locks, func(ctx context.Context, t *tx) error {
		res = TaskPassResult{}
		held := change{machine: "task", id: id, token: f.Token, explain: func() (string, error) { return ReasonFenced, nil }}
		if err := t.cas(ctx, held, nil, s.q.TaskRenew,
			append([]any{ms(t.now.Add(ttl)), id}, fenceArgs(f, t.now)...)...); err != nil {
			return err
		}
		snap, err := t.taskSnapshot(ctx, id, rules)
		if err != nil {
			return err
		}
		snap.Candidate = cand
		d := rules.Decide(snap)
		res.Snapshot, res.Decision = snap, d
		if d.To == "" {
			return nil
		}
		k := snap.Task
		if d.Start {
			sub, err := t.submit(ctx, cand.Operation)
			if err != nil {
				return err
			}
			t.submitted(&sub) // the step's command is due: the dispatcher hears of it through the feed
			res.Started = &sub
		}
		if err := t.moveTask(ctx, id, k.Status, k.RowVersion, d.To, d.StepIndex, d.Reason, "runner:"+f.Owner,
			k.ApprovedVersion, &f); err != nil {
			return err
		}
		res.Moved = true
		return nil
	})
	return res, err
}

// taskSnapshot reads what a task pass decides on.
func (t *tx) taskSnapshot(ctx context.Context, id string, rules TaskRules) (TaskSnapshot, error) {
	snap := TaskSnapshot{Now: t.now}
	k, err := scanTask(t.QueryRowContext(ctx, t.s.q.TaskGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return snap, fmt.Errorf("task %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return snap, fmt.Errorf("get task %s: %w", id, err)
	}
	if k.Approval, err = readApproval(ctx, t, k); err != nil {
		return snap, err
	}
	snap.Task = k
	a := k.Approval
	if a == nil || (k.Status != fsm.TaskApproved && k.Status != fsm.TaskRunning) {
		return snap, nil
	}
	if err := t.QueryRowContext(ctx, t.s.q.TaskVersionHash, id, k.ApprovedVersion).Scan(&snap.PlanHash); err != nil {
		return snap, fmt.Errorf("read approved plan of %s: %w", id, err)
	}
	if k.Status == fsm.TaskRunning && k.StepIndex >= 0 && k.StepIndex < len(a.Steps) {
		err := t.QueryRowContext(ctx, t.s.q.TaskStepOperationStatus,
			rules.StepOperationID(k, k.StepIndex)).Scan(&snap.StepOp)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return snap, fmt.Errorf("read step operation of %s: %w", id, err)
		}
	}
	snap.Seen = map[string]bool{}
	for _, st := range a.Steps {
		if _, ok := snap.Seen[st.Target]; ok {
			continue
		}
		var seen bool
		err := t.QueryRowContext(ctx, t.s.q.TaskDeviceSeen, st.Target).Scan(&seen)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return snap, err
		}
		snap.Seen[st.Target] = seen
	}
	if snap.Grants, err = grantsOf(ctx, t, a.Author); err != nil {
		return snap, err
	}
	return snap, nil
}

// taskColumns are a task's row with its current plan version, as taskFrom
// joins them; scanTask reads them.
const (
	taskFrom    = `tasks k JOIN task_versions v ON v.task_id = k.task_id AND v.version = k.version`
	taskColumns = `k.task_id, k.status, k.reason, k.version, v.plan_hash, v.steps, v.author,
			k.execute_after, k.execute_before, k.created_by, k.approved_version, k.step_index, k.row_version,
			k.owner, k.fencing_token, k.lease_expires_at, k.created_at, k.updated_at`
)

func scanTask(row interface{ Scan(...any) error }) (domain.Task, error) {
	var (
		k                domain.Task
		after, before    sql.NullInt64
		approved         sql.NullInt64
		created, updated int64
		lease            int64
		steps            string
	)
	if err := row.Scan(&k.TaskID, &k.Status, &k.Reason, &k.Version, &k.PlanHash, &steps, &k.Author, &after, &before,
		&k.CreatedBy, &approved, &k.StepIndex, &k.RowVersion, &k.Owner, &k.FencingToken, &lease, &created, &updated); err != nil {
		return domain.Task{}, err
	}
	if err := json.Unmarshal([]byte(steps), &k.Steps); err != nil {
		return domain.Task{}, fmt.Errorf("steps of task %s: %w", k.TaskID, err)
	}
	k.ExecuteAfter, k.ExecuteBefore = fromNullMS(after), fromNullMS(before)
	k.CreatedAt, k.UpdatedAt, k.LeaseExpiresAt = fromMS(created), fromMS(updated), fromMS(lease)
	if approved.Valid {
		k.ApprovedVersion = int(approved.Int64)
	}
	return k, nil
}

// TaskFilter narrows ListTasks; a nil Status lists every task.
type TaskFilter struct {
	Status *fsm.TaskState
}

// ListTasks lists one page of tasks by task_id, each with its current plan
// (not its approval or history: GetTask reads those), with the number that
// match the filter. The dashboard lists the tasks waiting for approval with
// it. Tasks are a person's work, a few hundred at most, so the status filter
// is applied row by row along the primary key.
func (s *DB) ListTasks(ctx context.Context, f TaskFilter, p Page) (Listed[domain.Task], error) {
	k := keyset[domain.Task]{table: taskFrom, key: "k.task_id", columns: taskColumns, scan: scanTask,
		id: func(t domain.Task) string { return t.TaskID }}
	if f.Status != nil {
		k.where, k.args = append(k.where, "k.status = ?"), append(k.args, string(*f.Status))
	}
	return readPage(ctx, s, k, p)
}

// GetTask reads a task with its current plan, its approval and its history.
func (s *DB) GetTask(ctx context.Context, id string) (domain.Task, error) {
	k, err := scanTask(s.rq.QueryRowContext(ctx, s.q.TaskGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Task{}, fmt.Errorf("task %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	if k.Approval, err = readApproval(ctx, s.rq, k); err != nil {
		return domain.Task{}, err
	}
	rows, err := s.rq.QueryContext(ctx, s.q.TaskHistoryList, id)
	if err != nil {
		return domain.Task{}, err
	}
	defer rows.Close()
	k.History = []domain.TaskEvent{}
	for rows.Next() {
		var e domain.TaskEvent
		var at int64
		if err := rows.Scan(&at, &e.Principal, &e.Action, &e.From, &e.To, &e.Version, &e.Reason); err != nil {
			return domain.Task{}, err
		}
		e.At = fromMS(at)
		k.History = append(k.History, e)
	}
	return k, rows.Err()
}

// readApproval reads the approval of an approved task (nil before), with
// the author and steps of the version it approved.
func readApproval(ctx context.Context, q queryer, k domain.Task) (*domain.Approval, error) {
	if k.ApprovedVersion <= 0 {
		return nil, nil
	}
	var (
		a     domain.Approval
		at    int64
		steps string
	)
	err := q.QueryRowContext(ctx, stmts(q).TaskApprovalRead, k.TaskID).Scan(
		&a.Version, &a.Approver, &a.PlanHash, &at, &a.Author, &steps)
	if err != nil {
		return nil, fmt.Errorf("read approval of %s: %w", k.TaskID, err)
	}
	a.TaskID, a.ApprovedAt = k.TaskID, fromMS(at)
	if err := json.Unmarshal([]byte(steps), &a.Steps); err != nil {
		return nil, err
	}
	return &a, nil
}
