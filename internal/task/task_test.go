package task

import (
	"context"
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
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
)

// fakeStore holds one task's snapshot and lease, runs the runner's rules
// on it as a pass would, and records what the runner asks of it.
type fakeStore struct {
	store.Store // any other call panics: the runner makes none
	mu          sync.Mutex
	lease       store.TaskLease
	snap        store.TaskSnapshot
	started     store.SubmitResult // a start's submit
	passErr     error
	acquireErr  error
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

func (s *fakeStore) ActiveTasks(context.Context) ([]store.TaskLease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []store.TaskLease{s.lease}, nil
}

func (s *fakeStore) AcquireTask(_ context.Context, id, owner string, _ time.Duration, reclaim bool) (domain.Fence, error) {
	s.record("acquire %s reclaim=%t", id, reclaim)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acquireErr != nil {
		return domain.Fence{}, s.acquireErr
	}
	s.lease.Owner, s.lease.FencingToken = owner, s.lease.FencingToken+1
	return domain.Fence{Owner: owner, Token: s.lease.FencingToken}, nil
}

func (s *fakeStore) TaskPass(_ context.Context, id string, f domain.Fence, _ time.Duration, cand *store.TaskCandidate, rules store.TaskRules) (store.TaskPassResult, error) {
	c := "none"
	if cand != nil {
		c = fmt.Sprintf("%d %s", cand.Step, cand.Operation.OperationID)
		if cand.Invalid != "" {
			c = fmt.Sprintf("%d invalid", cand.Step)
		}
	}
	s.record("pass %s token %d candidate %s", id, f.Token, c)
	if s.passErr != nil {
		return store.TaskPassResult{}, s.passErr
	}
	snap := s.snap
	snap.Candidate = cand
	d := rules.Decide(snap)
	res := store.TaskPassResult{Snapshot: snap, Decision: d, Moved: d.To != ""}
	if d.Start {
		sub := s.started
		res.Started = &sub
	}
	return res, nil
}

func (s *fakeStore) GetDevice(context.Context, string) (domain.Device, error) {
	return domain.Device{}, domain.ErrNotFound
}

type runnerBundle struct {
	st *fakeStore
	r  *Runner
}

func newRunner(t *testing.T, st *fakeStore, failpoints string) *runnerBundle {
	t.Helper()
	fps, err := failpoint.Parse(failpoints, failpoint.Known)
	require.NoError(t, err)
	clock := func() time.Time { return now }
	b := &runnerBundle{st: st}
	b.r = New(Config{
		Store: st, Instance: "i1", EnforceGrants: true, Failpoints: fps, Now: clock, LeaseTTL: 30 * time.Second,
		Ops: ops.New(ops.Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second, Now: clock,
			Policy: func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return b
}

// TestLook: what one look at a task does, for each state the runner meets
// it in: take its lease (or leave it to a live holder), then one decision,
// a start taking a second pass with the step's operation record.
func TestLook(t *testing.T) {
	t.Parallel()
	created := store.SubmitResult{Created: true, Operation: domain.Operation{CommandID: "c-new"}}
	free := store.TaskLease{TaskID: "t1"}
	const (
		acquire  = "acquire t1 reclaim=false"
		pass     = "pass t1 token 1 candidate none"
		withOp0  = "pass t1 token 1 candidate 0 " + op0
		withOp1  = "pass t1 token 1 candidate 1 " + op1
		ownToken = "pass t1 token 8 candidate none"
	)
	for _, c := range []struct {
		name       string
		lease      store.TaskLease
		snap       store.TaskSnapshot
		started    store.SubmitResult
		passErr    error
		acquireErr error
		failpoints string
		want       []string
	}{
		{name: "approved, no holder: taken, the first step prepared and started", lease: free,
			snap: snapshot(twoSteps(fsm.TaskApproved, 0), ""), started: created,
			want: []string{acquire, pass, withOp0}},
		{name: "approved, window not open yet: one pass, waits", lease: free,
			snap: snapshot(withWindow(twoSteps(fsm.TaskApproved, 0), at(time.Minute), nil), ""), want: []string{acquire, pass}},
		{name: "running, step succeeded: the next step", lease: free,
			snap: snapshot(twoSteps(fsm.TaskRunning, 0), fsm.OpSucceeded), started: created,
			want: []string{acquire, pass, withOp1}},
		{name: "running, last step succeeded: completed in one pass", lease: free,
			snap: snapshot(twoSteps(fsm.TaskRunning, 1), fsm.OpSucceeded), want: []string{acquire, pass}},
		{name: "an existing operation: the same step pass", lease: free, snap: snapshot(twoSteps(fsm.TaskRunning, 1), ""),
			started: store.SubmitResult{Operation: domain.Operation{CommandID: "c-old"}}, want: []string{acquire, pass, withOp1}},
		{name: "a retried step: the same step pass", lease: free, snap: snapshot(twoSteps(fsm.TaskRunning, 1), ""),
			started: store.SubmitResult{Retried: true, Operation: domain.Operation{CommandID: "c-2"}},
			want:    []string{acquire, pass, withOp1}},
		{name: "refused step: the check-and-insert pass refuses it", lease: free, started: created,
			snap: func() store.TaskSnapshot { s := snapshot(twoSteps(fsm.TaskApproved, 0), ""); s.Grants = nil; return s }(),
			want: []string{acquire, pass, withOp0}},
		{name: "failpoint before-step-insert: no check-and-insert pass", lease: free, started: created,
			snap: snapshot(twoSteps(fsm.TaskApproved, 0), ""), failpoints: failpoint.BeforeStepInsert + "=error",
			want: []string{acquire, pass}},
		{name: "invalid step: its candidate says why", lease: free,
			snap: snapshot(withTarget(twoSteps(fsm.TaskApproved, 0), 0, "controller-1"), ""),
			want: []string{acquire, pass, "pass t1 token 1 candidate 0 invalid"}},
		{name: "pass error: nothing more", lease: free, snap: snapshot(twoSteps(fsm.TaskApproved, 0), ""),
			passErr: errors.New("busy"), want: []string{acquire, pass}},
		{name: "a live peer holds it: left alone", lease: store.TaskLease{TaskID: "t1", Owner: "i2", FencingToken: 3,
			LeaseExpiresAt: now.Add(time.Second)}, snap: snapshot(twoSteps(fsm.TaskApproved, 0), "")},
		{name: "a peer's lease ran out: taken over", lease: store.TaskLease{TaskID: "t1", Owner: "i2", FencingToken: 7,
			LeaseExpiresAt: now.Add(-time.Second)}, snap: snapshot(twoSteps(fsm.TaskRunning, 0), fsm.OpStarted),
			want: []string{acquire, "pass t1 token 8 candidate none"}},
		{name: "its own lease from before a restart: reclaimed at once", lease: store.TaskLease{TaskID: "t1", Owner: "i1",
			FencingToken: 7, LeaseExpiresAt: now.Add(time.Minute)}, snap: snapshot(twoSteps(fsm.TaskRunning, 0), fsm.OpStarted),
			want: []string{"acquire t1 reclaim=true", ownToken}},
		{name: "refused lease: no pass", lease: free, acquireErr: &store.RefusedError{Reason: "lease_held"},
			snap: snapshot(twoSteps(fsm.TaskApproved, 0), ""), want: []string{acquire}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st := &fakeStore{lease: c.lease, snap: c.snap, started: c.started, passErr: c.passErr, acquireErr: c.acquireErr}
			b := newRunner(t, st, c.failpoints)
			b.r.look(context.Background(), nil)
			require.Equal(t, c.want, st.Calls())
		})
	}
}

// TestLookKeepsItsLease: a held task gets a pass under the same fence at
// each look, without taking its lease again; a fenced pass drops it, and
// the next look leaves it to its new, live holder.
func TestLookKeepsItsLease(t *testing.T) {
	t.Parallel()
	st := &fakeStore{lease: store.TaskLease{TaskID: "t1"}, snap: snapshot(twoSteps(fsm.TaskRunning, 0), fsm.OpStarted)}
	b := newRunner(t, st, "")
	ctx := context.Background()
	b.r.look(ctx, nil)
	b.r.look(ctx, nil)
	require.Equal(t, []string{"acquire t1 reclaim=false", "pass t1 token 1 candidate none", "pass t1 token 1 candidate none"}, st.Calls())

	st.mu.Lock()
	st.passErr = &store.RefusedError{Reason: store.ReasonFenced, Fenced: true}
	st.lease = store.TaskLease{TaskID: "t1", Owner: "i2", FencingToken: 2, LeaseExpiresAt: now.Add(time.Minute)}
	st.mu.Unlock()
	b.r.look(ctx, nil)
	b.r.look(ctx, nil)
	require.Equal(t, []string{"acquire t1 reclaim=false", "pass t1 token 1 candidate none", "pass t1 token 1 candidate none",
		"pass t1 token 1 candidate none"}, st.Calls(), "after the fenced pass, the live holder keeps it")
}

// TestLookOnlyWoken: a look after a wake-up passes over the woken tasks only.
func TestLookOnlyWoken(t *testing.T) {
	t.Parallel()
	st := &fakeStore{lease: store.TaskLease{TaskID: "t1"}, snap: snapshot(twoSteps(fsm.TaskRunning, 0), fsm.OpStarted)}
	b := newRunner(t, st, "")
	b.r.look(context.Background(), map[string]bool{"t2": true})
	require.Empty(t, st.Calls())
	b.r.look(context.Background(), map[string]bool{"t1": true})
	require.Equal(t, []string{"acquire t1 reclaim=false", "pass t1 token 1 candidate none"}, st.Calls())
}

// TestWake: with a poll far away, Wake makes Run look at the task at once,
// and never blocks; Run returns nil once its context ends.
func TestWake(t *testing.T) {
	t.Parallel()
	st := &fakeStore{lease: store.TaskLease{TaskID: "t1"}, snap: snapshot(twoSteps(fsm.TaskRunning, 0), fsm.OpStarted)}
	b := newRunner(t, st, "")
	b.r.cfg.Interval = time.Hour
	for i := 0; i < 10; i++ {
		b.r.Wake("t1") // nothing runs yet: none of these may block
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.r.Run(ctx) }()
	passes := func() int { return strings.Count(strings.Join(st.Calls(), "\n"), "pass t1") }
	waitFor := func(n int) {
		deadline := time.Now().Add(5 * time.Second)
		for passes() < n {
			require.True(t, time.Now().Before(deadline), "no pass %d in 5 s: %v", n, st.Calls())
			<-time.After(5 * time.Millisecond) // poll interval of a deadline-bounded wait
		}
	}
	waitFor(1) // the first look (it covers the wake-ups sent before)
	b.r.Wake("t1")
	waitFor(2)
	b.r.Wake("t1")
	waitFor(3)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestInterval: the safety net's poll is at most a third of the lease ttl.
func TestInterval(t *testing.T) {
	t.Parallel()
	require.Equal(t, 10*time.Second/3, New(Config{}).cfg.Interval)
	require.Equal(t, 500*time.Millisecond, New(Config{Interval: 500 * time.Millisecond, LeaseTTL: 3 * time.Second}).cfg.Interval)
	require.Equal(t, time.Second, New(Config{Interval: time.Minute, LeaseTTL: 3 * time.Second}).cfg.Interval)
}
