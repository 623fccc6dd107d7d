package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Task errors, mapped to HTTP codes by the API.
var (
	ErrStaleVersion = errors.New("stale version")
	ErrFourEyes     = errors.New("four eyes: the approver wrote this plan version")
)

// Step is one step of a plan.
type Step struct {
	Step   string          `json:"step"`
	Action string          `json:"action"`
	Target string          `json:"target"`
	Params json.RawMessage `json:"params"`
}

// Task is a task with its current plan.
type Task struct {
	TaskID          string
	Status          fsm.TaskState
	Reason          string
	Version         int
	PlanHash        string
	Steps           []Step
	Author          string // of the current version
	ExecuteAfter    *time.Time
	ExecuteBefore   *time.Time
	CreatedBy       string
	ApprovedVersion int
	Approval        *Approval
	StepIndex       int
	RowVersion      int64
	CreatedAt       time.Time
	UpdatedAt       time.Time
	History         []TaskEvent
}

// Requester is the author of the approved version ("" before approval).
func (t Task) Requester() string {
	if t.Approval == nil {
		return ""
	}
	return t.Approval.Author
}

// Approval is the approval of one plan version.
type Approval struct {
	TaskID     string
	Version    int
	Approver   string
	PlanHash   string
	ApprovedAt time.Time
	Author     string // of the approved version: the task's requester
	Steps      []Step // of the approved version
}

// TaskEvent is one line of a task's history.
type TaskEvent struct {
	At        time.Time
	Principal string
	Action    string
	From, To  string
	Version   int
	Reason    string
}

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
	_, err := t.Exec(`INSERT INTO task_history (task_id, at, principal, action, from_state, to_state, version, reason)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, taskID, ms(t.now), principal, action, from, to, version, reason)
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
// with the same task_id is ErrKeyReused.
func (s *DB) CreateTask(ctx context.Context, n NewTask) (Task, bool, error) {
	created := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		var hash string
		err := t.QueryRowContext(ctx, `SELECT create_hash FROM tasks WHERE task_id = ?`, n.TaskID).Scan(&hash)
		switch {
		case err == nil:
			if hash != n.CreateHash {
				return ErrKeyReused
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		now := ms(t.now)
		if _, err := t.Exec(`INSERT INTO tasks (task_id, status, version, create_hash, execute_after, execute_before,
				created_by, created_at, updated_at) VALUES (?, 'waiting_approval', 1, ?, ?, ?, ?, ?, ?)`,
			n.TaskID, n.CreateHash, nullTime(n.ExecuteAfter), nullTime(n.ExecuteBefore), n.Author, now, now); err != nil {
			return fmt.Errorf("insert task %s: %w", n.TaskID, err)
		}
		if _, err := t.Exec(`INSERT INTO task_versions (task_id, version, steps, plan_hash, author, created_at)
			VALUES (?, 1, ?, ?, ?, ?)`, n.TaskID, string(n.Steps), n.PlanHash, n.Author, now); err != nil {
			return fmt.Errorf("insert plan of %s: %w", n.TaskID, err)
		}
		created = true
		return t.history(n.TaskID, n.Author, "create", "", fsm.TaskWaitingApproval, 1, "")
	})
	if err != nil {
		return Task{}, false, err
	}
	task, err := s.GetTask(ctx, n.TaskID)
	return task, created, err
}

// UpdatePlan records a new plan version by author, superseding the current
// one. An unchanged plan (same hash) returns the current version (changed
// false); a base version that is not the current one is ErrStaleVersion; a
// task that left waiting_approval is ErrIllegalState.
func (s *DB) UpdatePlan(ctx context.Context, taskID string, steps json.RawMessage, planHash, author string, baseVersion *int) (Task, bool, error) {
	changed := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		var status fsm.TaskState
		var version int
		var rowVersion int64
		err := t.QueryRowContext(ctx, `SELECT status, version, row_version FROM tasks WHERE task_id = ?`, taskID).Scan(&status, &version, &rowVersion)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", taskID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		var current string
		if err := t.QueryRowContext(ctx, `SELECT plan_hash FROM task_versions WHERE task_id = ? AND version = ?`, taskID, version).Scan(&current); err != nil {
			return err
		}
		switch {
		case status != fsm.TaskWaitingApproval:
			return fmt.Errorf("task %s is %s: %w", taskID, status, ErrIllegalState)
		case current == planHash:
			return nil // a replay of the current plan
		case baseVersion != nil && *baseVersion != version:
			return fmt.Errorf("base_version %d, current %d: %w", *baseVersion, version, ErrStaleVersion)
		}
		now := ms(t.now)
		ch := change{machine: "task", id: taskID, from: string(status), to: string(status)}
		if err := t.cas(ctx, ch, nil, `UPDATE tasks SET version = version + 1, row_version = row_version + 1, updated_at = ?
			WHERE task_id = ? AND status = ? AND row_version = ?`, now, taskID, fsm.TaskWaitingApproval, rowVersion); err != nil {
			return err
		}
		if _, err := t.Exec(`INSERT INTO task_versions (task_id, version, steps, plan_hash, author, created_at)
			VALUES (?, ?, ?, ?, ?, ?)`, taskID, version+1, string(steps), planHash, author, now); err != nil {
			return fmt.Errorf("insert plan of %s: %w", taskID, err)
		}
		changed = true
		return t.history(taskID, author, "plan", status, status, version+1, fmt.Sprintf("supersedes v%d", version))
	})
	if err != nil {
		return Task{}, false, err
	}
	task, err := s.GetTask(ctx, taskID)
	return task, changed, err
}

// Approve approves one plan version, checked in the contract's order after
// the caller's 401/403: 404, an exact replay (returned, created false),
// 409 illegal_state, 409 stale_version (another version, or a plan_hash
// that differs), 403 four_eyes (the approver wrote the version).
func (s *DB) Approve(ctx context.Context, taskID string, version int, planHash, approver string, fourEyes bool) (Approval, bool, error) {
	created := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		var status fsm.TaskState
		var current int
		var rowVersion int64
		err := t.QueryRowContext(ctx, `SELECT status, version, row_version FROM tasks WHERE task_id = ?`, taskID).Scan(&status, &current, &rowVersion)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", taskID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		var prevVersion int
		var prevApprover string
		err = t.QueryRowContext(ctx, `SELECT version, approver FROM approvals WHERE task_id = ?`, taskID).Scan(&prevVersion, &prevApprover)
		if err == nil && prevVersion == version && prevApprover == approver {
			return nil // an exact replay
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if status != fsm.TaskWaitingApproval {
			return fmt.Errorf("task %s is %s: %w", taskID, status, ErrIllegalState)
		}
		var hash, author string
		if err := t.QueryRowContext(ctx, `SELECT plan_hash, author FROM task_versions WHERE task_id = ? AND version = ?`,
			taskID, current).Scan(&hash, &author); err != nil {
			return err
		}
		if version != current || (planHash != "" && planHash != hash) {
			return fmt.Errorf("approving v%d (plan %.12s), current v%d (plan %.12s): %w", version, planHash, current, hash, ErrStaleVersion)
		}
		if fourEyes && author == approver {
			return fmt.Errorf("%s wrote v%d: %w", approver, version, ErrFourEyes)
		}
		now := ms(t.now)
		ch := change{machine: "task", id: taskID, from: string(status), to: string(fsm.TaskApproved)}
		if err := t.cas(ctx, ch, nil, `UPDATE tasks SET status = ?, approved_version = ?, row_version = row_version + 1, updated_at = ?
			WHERE task_id = ? AND status = ? AND version = ? AND row_version = ?`,
			fsm.TaskApproved, version, now, taskID, fsm.TaskWaitingApproval, version, rowVersion); err != nil {
			return err
		}
		if _, err := t.Exec(`INSERT INTO approvals (task_id, version, approver, plan_hash, approved_at) VALUES (?, ?, ?, ?, ?)`,
			taskID, version, approver, hash, now); err != nil {
			return fmt.Errorf("insert approval of %s: %w", taskID, err)
		}
		created = true
		return t.history(taskID, approver, "approve", status, fsm.TaskApproved, version, "")
	})
	if err != nil {
		return Approval{}, false, err
	}
	task, err := s.GetTask(ctx, taskID)
	if err != nil {
		return Approval{}, false, err
	}
	if task.Approval == nil {
		return Approval{}, false, fmt.Errorf("task %s: approval missing", taskID)
	}
	return *task.Approval, created, nil
}

// Reject rejects a task that is waiting for approval or approved (not yet
// running). A rejection of a rejected task is a replay.
func (s *DB) Reject(ctx context.Context, taskID, reason, who string) (Task, error) {
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		var status fsm.TaskState
		var rowVersion int64
		var version int
		err := t.QueryRowContext(ctx, `SELECT status, row_version, version FROM tasks WHERE task_id = ?`, taskID).Scan(&status, &rowVersion, &version)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %s: %w", taskID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if status == fsm.TaskRejected {
			return nil
		}
		if status != fsm.TaskWaitingApproval && status != fsm.TaskApproved {
			return fmt.Errorf("task %s is %s: %w", taskID, status, ErrIllegalState)
		}
		return t.moveTask(ctx, taskID, status, rowVersion, fsm.TaskRejected, -1, "rejected: "+reason, who, version)
	})
	if err != nil {
		return Task{}, err
	}
	return s.GetTask(ctx, taskID)
}

// moveTask is the task's conditional transition; stepIndex < 0 keeps it.
func (t *tx) moveTask(ctx context.Context, taskID string, from fsm.TaskState, rowVersion int64, to fsm.TaskState, stepIndex int, reason, who string, version int) error {
	if err := fsm.Task.Transition(from, to); err != nil {
		return t.refuse("task", taskID, string(from), string(to), ReasonIllegal, 0)
	}
	ch := change{machine: "task", id: taskID, from: string(from), to: string(to)}
	if err := t.cas(ctx, ch, nil, `UPDATE tasks SET status = ?, reason = ?,
			step_index = CASE WHEN ? >= 0 THEN ? ELSE step_index END, row_version = row_version + 1, updated_at = ?
		WHERE task_id = ? AND status = ? AND row_version = ?`,
		to, reason, stepIndex, stepIndex, ms(t.now), taskID, from, rowVersion); err != nil {
		return err
	}
	return t.history(taskID, who, "run", from, to, version, reason)
}

// MoveTask is a runner's conditional task transition (completed, failed,
// rejected window_missed, or running → running to the next step).
func (s *DB) MoveTask(ctx context.Context, task Task, to fsm.TaskState, stepIndex int, reason, who string) error {
	return s.write(ctx, func(ctx context.Context, t *tx) error {
		return t.moveTask(ctx, task.TaskID, task.Status, task.RowVersion, to, stepIndex, reason, who, task.ApprovedVersion)
	})
}

// StepCheck is the outcome of step 5's checks.
type StepCheck struct {
	Refused bool   // the task was rejected or failed instead
	Reason  string // permission_revoked, device_unknown, plan_changed
	Result  SubmitResult
}

// StartStep runs step 5 and step 6 of the walkthrough in one transaction:
// the requester still holds a grant for the step (when grants are
// enforced), the device has been seen, the plan hash is the approved one;
// then the step's operation is inserted (UNIQUE: a re-run returns it) and
// the task is running at that step. A failed check rejects the task (before
// the first step) or fails it (later), and nothing is inserted.
func (s *DB) StartStep(ctx context.Context, task Task, stepIndex int, enforceGrants bool, n NewOperation, who string) (StepCheck, error) {
	var out StepCheck
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		a := task.Approval
		step := a.Steps[stepIndex]
		var current string
		if err := t.QueryRowContext(ctx, `SELECT v.plan_hash FROM tasks k JOIN task_versions v
			ON v.task_id = k.task_id AND v.version = k.approved_version WHERE k.task_id = ?`, task.TaskID).Scan(&current); err != nil {
			return fmt.Errorf("read approved plan of %s: %w", task.TaskID, err)
		}
		reason := ""
		var seen bool
		err := t.QueryRowContext(ctx, `SELECT seen FROM devices WHERE device_id = ?`, step.Target).Scan(&seen)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		switch {
		case current != a.PlanHash:
			reason = "plan_changed"
		case enforceGrants:
			ok, err := allowed(ctx, t, a.Author, step.Action, step.Target)
			if err != nil {
				return err
			}
			if !ok {
				reason = "permission_revoked"
			}
		}
		if reason == "" && !seen {
			reason = "device_unknown"
		}
		if reason != "" {
			to := fsm.TaskFailed
			if task.Status == fsm.TaskApproved {
				to = fsm.TaskRejected
			}
			out = StepCheck{Refused: true, Reason: reason}
			return t.moveTask(ctx, task.TaskID, task.Status, task.RowVersion, to, stepIndex, reason, who, a.Version)
		}
		if out.Result, err = t.submit(ctx, n); err != nil {
			return err
		}
		return t.moveTask(ctx, task.TaskID, task.Status, task.RowVersion, fsm.TaskRunning, stepIndex,
			"step "+step.Step+": "+n.OperationID, who, a.Version)
	})
	return out, err
}

// ActiveTasks lists the ids of approved and running tasks.
func (s *DB) ActiveTasks(ctx context.Context) ([]string, error) {
	return queryStrings(ctx, s.rq, `SELECT task_id FROM tasks WHERE status IN `+activeTasks+` ORDER BY updated_at`)
}

// taskColumns are a task's row with its current plan version, as taskFrom
// joins them; scanTask reads them.
const (
	taskFrom    = `tasks k JOIN task_versions v ON v.task_id = k.task_id AND v.version = k.version`
	taskColumns = `k.task_id, k.status, k.reason, k.version, v.plan_hash, v.steps, v.author,
			k.execute_after, k.execute_before, k.created_by, k.approved_version, k.step_index, k.row_version,
			k.created_at, k.updated_at`
)

func scanTask(row interface{ Scan(...any) error }) (Task, error) {
	var (
		k                Task
		after, before    sql.NullInt64
		approved         sql.NullInt64
		created, updated int64
		steps            string
	)
	if err := row.Scan(&k.TaskID, &k.Status, &k.Reason, &k.Version, &k.PlanHash, &steps, &k.Author, &after, &before,
		&k.CreatedBy, &approved, &k.StepIndex, &k.RowVersion, &created, &updated); err != nil {
		return Task{}, err
	}
	if err := json.Unmarshal([]byte(steps), &k.Steps); err != nil {
		return Task{}, fmt.Errorf("steps of task %s: %w", k.TaskID, err)
	}
	k.ExecuteAfter, k.ExecuteBefore = fromNullMS(after), fromNullMS(before)
	k.CreatedAt, k.UpdatedAt = fromMS(created), fromMS(updated)
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
func (s *DB) ListTasks(ctx context.Context, f TaskFilter, p Page) (Listed[Task], error) {
	k := keyset[Task]{table: taskFrom, key: "k.task_id", columns: taskColumns, scan: scanTask,
		id: func(t Task) string { return t.TaskID }}
	if f.Status != nil {
		k.where, k.args = append(k.where, "k.status = ?"), append(k.args, string(*f.Status))
	}
	return readPage(ctx, s, k, p)
}

// GetTask reads a task with its current plan, its approval and its history.
func (s *DB) GetTask(ctx context.Context, id string) (Task, error) {
	k, err := scanTask(s.rq.QueryRowContext(ctx, `SELECT `+taskColumns+` FROM `+taskFrom+` WHERE k.task_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Task{}, fmt.Errorf("task %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	if k.ApprovedVersion > 0 {
		var (
			a     Approval
			at    int64
			steps string
		)
		err := s.rq.QueryRowContext(ctx, `SELECT a.version, a.approver, a.plan_hash, a.approved_at, v.author, v.steps
			FROM approvals a JOIN task_versions v ON v.task_id = a.task_id AND v.version = a.version WHERE a.task_id = ?`, id).Scan(
			&a.Version, &a.Approver, &a.PlanHash, &at, &a.Author, &steps)
		if err != nil {
			return Task{}, fmt.Errorf("read approval of %s: %w", id, err)
		}
		a.TaskID, a.ApprovedAt = id, fromMS(at)
		if err := json.Unmarshal([]byte(steps), &a.Steps); err != nil {
			return Task{}, err
		}
		k.Approval = &a
	}
	rows, err := s.rq.QueryContext(ctx, `SELECT at, principal, action, from_state, to_state, version, reason
		FROM task_history WHERE task_id = ? ORDER BY id`, id)
	if err != nil {
		return Task{}, err
	}
	defer rows.Close()
	k.History = []TaskEvent{}
	for rows.Next() {
		var e TaskEvent
		var at int64
		if err := rows.Scan(&at, &e.Principal, &e.Action, &e.From, &e.To, &e.Version, &e.Reason); err != nil {
			return Task{}, err
		}
		e.At = fromMS(at)
		k.History = append(k.History, e)
	}
	return k, rows.Err()
}
