package fsm

// TaskState is the status of a task with a versioned, approved plan.
type TaskState string

const (
	// TaskWaitingApproval: a plan version waits for an approver; a new plan
	// version supersedes the old one.
	TaskWaitingApproval TaskState = "waiting_approval"
	// TaskApproved: one version is approved; the runner re-checks permissions,
	// devices and the plan hash when the maintenance window opens.
	TaskApproved TaskState = "approved"
	// TaskRunning: the runner inserts each step's operation in turn.
	TaskRunning TaskState = "running"
	// TaskCompleted: terminal; every step's operation succeeded.
	TaskCompleted TaskState = "completed"
	// TaskRejected: terminal; an approver rejected it, or a re-check before
	// the first step failed, or the window was missed.
	TaskRejected TaskState = "rejected"
	// TaskFailed: terminal; a step's operation failed, or a re-check before a
	// later step failed.
	TaskFailed TaskState = "failed"
)

// Terminal reports whether no transition leaves s.
func (s TaskState) Terminal() bool { return Task.Valid(s) && Task.final(s) }

// Task is the task state machine of the contract.
var Task = newMachine("task",
	[]TaskState{TaskWaitingApproval, TaskApproved, TaskRunning, TaskCompleted, TaskRejected, TaskFailed},
	map[TaskState][]TaskState{
		TaskWaitingApproval: {TaskWaitingApproval, TaskApproved, TaskRejected},
		TaskApproved:        {TaskRunning, TaskRejected},
		TaskRunning:         {TaskCompleted, TaskFailed, TaskRunning},
	})
