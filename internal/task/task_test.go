package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
)

// fakeStore holds one task and the operations of its steps, and records
// what the runner asks of it.
type fakeStore struct {
	store.Store // any other call panics: the runner makes none
	mu          sync.Mutex
	task        store.Task
	taskErr     error
	ops         map[string]fsm.OperationState
	check       store.StepCheck
	stepErr     error
	calls       []string
}

func (s *fakeStore) record(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, fmt.Sprintf(format, args...))
}

func (s *fakeStore) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *fakeStore) ActiveTasks(context.Context) ([]string, error) {
	return []string{s.task.TaskID}, nil
}

func (s *fakeStore) GetTask(_ context.Context, id string) (store.Task, error) {
	if id != s.task.TaskID {
		return store.Task{}, store.ErrNotFound
	}
	return s.task, s.taskErr
}

func (s *fakeStore) GetOperation(_ context.Context, id string) (store.Operation, error) {
	st, ok := s.ops[id]
	if !ok {
		return store.Operation{}, store.ErrNotFound
	}
	return store.Operation{OperationID: id, Status: st}, nil
}

func (s *fakeStore) GetDevice(context.Context, string) (store.Device, error) {
	return store.Device{}, store.ErrNotFound
}

func (s *fakeStore) StartStep(_ context.Context, k store.Task, i int, enforce bool, n store.NewOperation, who string) (store.StepCheck, error) {
	s.record("start %d %s grants=%t by %s", i, n.OperationID, enforce, who)
	return s.check, s.stepErr
}

func (s *fakeStore) MoveTask(_ context.Context, k store.Task, to fsm.TaskState, i int, reason, who string) error {
	s.record("move %s %d %q by %s", to, i, reason, who)
	return nil
}

var now = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) *time.Time { t := now.Add(d); return &t }

// twoSteps is an approved version 2 of a two-step plan.
func twoSteps(status fsm.TaskState, stepIndex int) store.Task {
	steps := []store.Step{
		{Step: "drain", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`)},
		{Step: "reboot", Action: "restart", Target: "device-2", Params: json.RawMessage(`{}`)},
	}
	return store.Task{TaskID: "t1", Status: status, Version: 2, Steps: steps, StepIndex: stepIndex,
		Approval: &store.Approval{TaskID: "t1", Version: 2, Steps: steps, Author: "alice"}}
}

const (
	op0 = "t1:drain:device-1:approval-v2"
	op1 = "t1:reboot:device-2:approval-v2"
)

type runnerBundle struct {
	st    *fakeStore
	r     *Runner
	mu    sync.Mutex
	kicks []string
}

func (b *runnerBundle) Kicks() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.kicks...)
}

func newRunner(t *testing.T, st *fakeStore, failpoints string) *runnerBundle {
	t.Helper()
	fps, err := failpoint.Parse(failpoints, failpoint.Known)
	require.NoError(t, err)
	clock := func() time.Time { return now }
	b := &runnerBundle{st: st}
	b.r = New(Config{
		Store: st, Instance: "i1", EnforceGrants: true, Failpoints: fps, Now: clock,
		Ops: ops.New(ops.Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second, Now: clock,
			Policy: func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }}),
		Kick: func(id string) {
			b.mu.Lock()
			b.kicks = append(b.kicks, id)
			b.mu.Unlock()
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return b
}

// TestStep: what one look at a task does, for each state the runner meets
// it in: wait, start a step (node C), move the checkpoint on, or end it.
func TestStep(t *testing.T) {
	t.Parallel()
	created := store.StepCheck{Result: store.SubmitResult{Created: true, Operation: store.Operation{CommandID: "c-new"}}}
	for _, c := range []struct {
		name       string
		task       store.Task
		taskErr    error
		ops        map[string]fsm.OperationState
		check      store.StepCheck
		stepErr    error
		failpoints string
		want       []string
		kicks      []string
	}{
		{name: "approved, no window: the first step", task: twoSteps(fsm.TaskApproved, 0), check: created,
			want: []string{"start 0 " + op0 + " grants=true by runner:i1"}, kicks: []string{"c-new"}},
		{name: "approved, window not open yet: waits", task: withWindow(twoSteps(fsm.TaskApproved, 0), at(time.Minute), nil)},
		{name: "approved, window open", task: withWindow(twoSteps(fsm.TaskApproved, 0), at(-time.Minute), at(time.Minute)),
			check: created, want: []string{"start 0 " + op0 + " grants=true by runner:i1"}, kicks: []string{"c-new"}},
		{name: "approved, window missed: rejected", task: withWindow(twoSteps(fsm.TaskApproved, 0), nil, at(-time.Second)),
			want: []string{`move rejected -1 "window_missed" by runner:i1`}},
		{name: "running, step under way: waits", task: twoSteps(fsm.TaskRunning, 0),
			ops: map[string]fsm.OperationState{op0: fsm.OpStarted}},
		{name: "running, step succeeded: the next step", task: twoSteps(fsm.TaskRunning, 0), check: created,
			ops:  map[string]fsm.OperationState{op0: fsm.OpSucceeded},
			want: []string{"start 1 " + op1 + " grants=true by runner:i1"}, kicks: []string{"c-new"}},
		{name: "running, last step succeeded: completed", task: twoSteps(fsm.TaskRunning, 1),
			ops:  map[string]fsm.OperationState{op0: fsm.OpSucceeded, op1: fsm.OpSucceeded},
			want: []string{`move completed -1 "" by runner:i1`}},
		{name: "running, step failed: failed", task: twoSteps(fsm.TaskRunning, 1),
			ops:  map[string]fsm.OperationState{op1: fsm.OpFailedFinal},
			want: []string{`move failed -1 "step_failed:reboot" by runner:i1`}},
		{name: "running, step failed_retryable: failed, never retried", task: twoSteps(fsm.TaskRunning, 0),
			ops:  map[string]fsm.OperationState{op0: fsm.OpFailedRetryable},
			want: []string{`move failed -1 "step_failed:drain" by runner:i1`}},
		{name: "running, checkpoint moved but no operation: node C again", task: twoSteps(fsm.TaskRunning, 1),
			check: store.StepCheck{Result: store.SubmitResult{Operation: store.Operation{CommandID: "c-old"}}},
			want:  []string{"start 1 " + op1 + " grants=true by runner:i1"}},
		{name: "a retried step is kicked", task: twoSteps(fsm.TaskRunning, 1),
			check: store.StepCheck{Result: store.SubmitResult{Retried: true, Operation: store.Operation{CommandID: "c-2"}}},
			want:  []string{"start 1 " + op1 + " grants=true by runner:i1"}, kicks: []string{"c-2"}},
		{name: "refused step: nothing kicked", task: twoSteps(fsm.TaskApproved, 0),
			check: store.StepCheck{Refused: true, Reason: "permission_revoked", Result: created.Result},
			want:  []string{"start 0 " + op0 + " grants=true by runner:i1"}},
		{name: "step error: nothing kicked", task: twoSteps(fsm.TaskApproved, 0), check: created, stepErr: errors.New("busy"),
			want: []string{"start 0 " + op0 + " grants=true by runner:i1"}},
		{name: "failpoint before-step-insert: nothing", task: twoSteps(fsm.TaskApproved, 0), check: created,
			failpoints: failpoint.BeforeStepInsert + "=error"},
		{name: "approved, invalid step: rejected", task: withTarget(twoSteps(fsm.TaskApproved, 0), 0, "controller-1"),
			want: []string{`~^move rejected 0 "invalid_step: .*target \\"controller-1\\" is not a device id.*" by runner:i1$`}},
		{name: "running, invalid next step: failed", task: withTarget(twoSteps(fsm.TaskRunning, 0), 1, "bad target"),
			ops: map[string]fsm.OperationState{op0: fsm.OpSucceeded}, want: []string{`~^move failed 1 "invalid_step: .*target \\"bad target\\" is not a device id.*" by runner:i1$`}},
		{name: "no approval: nothing", task: store.Task{TaskID: "t1", Status: fsm.TaskApproved}},
		{name: "unreadable task: nothing", task: twoSteps(fsm.TaskApproved, 0), taskErr: errors.New("gone")},
		{name: "waiting approval: nothing", task: twoSteps(fsm.TaskWaitingApproval, 0)},
		{name: "completed: nothing", task: twoSteps(fsm.TaskCompleted, 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st := &fakeStore{task: c.task, taskErr: c.taskErr, ops: c.ops, check: c.check, stepErr: c.stepErr}
			b := newRunner(t, st, c.failpoints)
			b.r.step(context.Background(), "t1")
			if len(c.want) == 1 && strings.HasPrefix(c.want[0], "~") { // a pattern: the reason quotes package ops' error
				require.Len(t, st.Calls(), 1)
				require.Regexp(t, c.want[0][1:], st.Calls()[0])
			} else {
				require.Equal(t, c.want, st.Calls())
			}
			require.Equal(t, c.kicks, b.Kicks())
		})
	}
}

func withWindow(k store.Task, after, before *time.Time) store.Task {
	k.ExecuteAfter, k.ExecuteBefore = after, before
	return k
}

func withTarget(k store.Task, i int, target string) store.Task {
	steps := append([]store.Step(nil), k.Approval.Steps...)
	steps[i].Target = target
	a := *k.Approval
	a.Steps = steps
	k.Approval = &a
	return k
}

// TestRunStepsActiveTasksUntilCancelled: Run looks at each active task
// and returns nil once its context ends.
func TestRunStepsActiveTasksUntilCancelled(t *testing.T) {
	t.Parallel()
	st := &fakeStore{task: twoSteps(fsm.TaskRunning, 0), ops: map[string]fsm.OperationState{op0: fsm.OpSucceeded},
		check: store.StepCheck{Result: store.SubmitResult{Created: true, Operation: store.Operation{CommandID: "c-1"}}}}
	b := newRunner(t, st, "")
	b.r.cfg.Interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.r.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(b.Kicks()) < 2 { // two looks, each starting step 1 again (the fake never moves on)
		require.True(t, time.Now().Before(deadline), "Run did not step the task twice in 5 s: %v", st.Calls())
		<-time.After(5 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	for _, c := range st.Calls() {
		require.Equal(t, "start 1 "+op1+" grants=true by runner:i1", c)
	}
}

func TestTerminalFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, fsm.TaskRejected, terminalFor(store.Task{Status: fsm.TaskApproved}), "before the first step")
	require.Equal(t, fsm.TaskFailed, terminalFor(store.Task{Status: fsm.TaskRunning}), "after it")
}
