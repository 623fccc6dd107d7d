package rollout

import (
	"math"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func counts(kv ...any) map[fsm.RolloutDeviceState]int {
	c := map[fsm.RolloutDeviceState]int{}
	for _, st := range fsm.RolloutDevice.States() {
		c[st] = 0
	}
	for i := 0; i < len(kv); i += 2 {
		c[kv[i].(fsm.RolloutDeviceState)] = kv[i+1].(int)
	}
	return c
}

func TestRampRate(t *testing.T) {
	s := Spec{MaxPerMinute: 1200, Ramp: &Ramp{BasePerMinute: 120, Factor: 2, EverySucceeded: 50}}
	require.NoError(t, s.Validate())
	for _, c := range []struct {
		succeeded int
		rate      float64
	}{{0, 120}, {49, 120}, {50, 240}, {99, 240}, {100, 480}, {150, 960}, {200, 1200}, {5000, 1200}} {
		require.Equal(t, c.rate, s.Rate(c.succeeded), "after %d successes", c.succeeded)
	}
	require.Equal(t, 1200.0, Spec{MaxPerMinute: 1200}.Rate(0), "no ramp: the limit from the start")
	require.Equal(t, 525*time.Millisecond, Interval(120))
	require.Equal(t, 53*time.Millisecond, Interval(1200), "rounded up to the millisecond")
}

// The pacing holds the limit in every window: any 10 s (plus 0.4 s
// of jitter) holds at most rate/6 starts spaced by Interval.
func TestIntervalHoldsTheLimitInEveryWindow(t *testing.T) {
	for _, rate := range []float64{6, 60, 120, 240, 480, 960, 1000, 1200} {
		iv := Interval(rate)
		// Starts spaced by at least iv, seen with up to 0.4 s of jitter in a
		// window of 10 s: they were made within a span of 10.4 s.
		n := int(math.Ceil(float64(10*time.Second+400*time.Millisecond) / float64(iv)))
		require.LessOrEqual(t, float64(n), rate/6, "rate %v: %d starts in 10.4 s", rate, n)
	}
}

func TestSpecValidation(t *testing.T) {
	ok := Spec{MaxPerMinute: 600, Ramp: &Ramp{BasePerMinute: 60, Factor: 2, EverySucceeded: 50}, MaxInFlight: 100,
		Abort:   []AbortRule{{When: "failed", Percent: 5, MinFinished: 20}, {When: "any", Percent: 50}},
		Windows: []Window{{Cron: "0 2 * * *", Duration: "2h"}, {Cron: "*/20 * * * * *", Duration: "8s"}}, Retries: 2}
	require.NoError(t, ok.Validate())
	d := Spec{}
	require.NoError(t, d.Validate())
	require.Equal(t, DefaultMaxPerMinute, d.MaxPerMinute)
	require.Equal(t, DefaultMaxInFlight, d.MaxInFlight)
	for name, bad := range map[string]Spec{
		"negative rate": {MaxPerMinute: -1},
		"base > max":    {MaxPerMinute: 10, Ramp: &Ramp{BasePerMinute: 20, Factor: 2, EverySucceeded: 1}},
		"factor 1":      {MaxPerMinute: 10, Ramp: &Ramp{BasePerMinute: 1, Factor: 1, EverySucceeded: 1}},
		"every 0":       {MaxPerMinute: 10, Ramp: &Ramp{BasePerMinute: 1, Factor: 2}},
		"when":          {MaxPerMinute: 10, Abort: []AbortRule{{When: "slow", Percent: 5}}},
		"percent":       {MaxPerMinute: 10, Abort: []AbortRule{{When: "failed", Percent: 0}}},
		"cron":          {MaxPerMinute: 10, Windows: []Window{{Cron: "every night", Duration: "1h"}}},
		"duration":      {MaxPerMinute: 10, Windows: []Window{{Cron: "0 2 * * *", Duration: "0s"}}},
		"retries":       {MaxPerMinute: 10, Retries: 11},
		"before first":  {MaxPerMinute: 10, ExecuteAfter: &t0, ExecuteBefore: &t0},
	} {
		require.Error(t, bad.Validate(), name)
	}
}

func TestWindows(t *testing.T) {
	s := Spec{MaxPerMinute: 10, Windows: []Window{{Cron: "0 2 * * *", Duration: "2h"}}}
	day := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	w := s.WindowAt(day.Add(time.Hour))
	require.False(t, w.Open)
	require.Equal(t, day.Add(2*time.Hour), w.Opens)
	w = s.WindowAt(day.Add(2 * time.Hour))
	require.True(t, w.Open, "opens at its cron time")
	require.Equal(t, day.Add(4*time.Hour), w.Ends)
	w = s.WindowAt(day.Add(3*time.Hour + 59*time.Minute))
	require.True(t, w.Open)
	w = s.WindowAt(day.Add(4 * time.Hour))
	require.False(t, w.Open, "closed at its end")
	require.Equal(t, day.Add(26*time.Hour), w.Opens)

	// execute_before cuts the window short and ends everything.
	before := day.Add(3 * time.Hour)
	s.ExecuteBefore = &before
	w = s.WindowAt(day.Add(2*time.Hour + 30*time.Minute))
	require.True(t, w.Open)
	require.Equal(t, before, w.Ends)
	require.True(t, s.WindowAt(before).Missed)

	after := day.Add(2*time.Hour + 15*time.Minute)
	s.ExecuteAfter = &after
	w = s.WindowAt(day.Add(2 * time.Hour))
	require.False(t, w.Open)
	require.Equal(t, after, w.Opens)

	// Six fields: seconds first.
	s = Spec{MaxPerMinute: 10, Windows: []Window{{Cron: "*/20 * * * * *", Duration: "8s"}}}
	require.True(t, s.WindowAt(t0.Add(7*time.Second)).Open)
	w = s.WindowAt(t0.Add(8 * time.Second))
	require.False(t, w.Open)
	require.Equal(t, t0.Add(20*time.Second), w.Opens)
}

func TestAbortRules(t *testing.T) {
	s := Spec{MaxPerMinute: 10, Abort: []AbortRule{{When: "failed", Percent: 10, MinFinished: 20}, {When: "any", Percent: 50, MinFinished: 1}}}
	st := s.AbortStates(counts(fsm.DevSucceeded, 10, fsm.DevFailed, 5))
	require.False(t, st[0].Tripped, "15 finished < min_finished 20")
	require.False(t, st[1].Tripped, "5 of 15 not succeeded: 33% < 50%")
	st = s.AbortStates(counts(fsm.DevSucceeded, 18, fsm.DevFailed, 2))
	require.True(t, st[0].Tripped, "2 of 20 = 10%: reached")
	require.Equal(t, "failed 2 of 20 finished (10.0%) reached 10% (min_finished 20)", st[0].String())
	st = s.AbortStates(counts(fsm.DevSucceeded, 19, fsm.DevFailed, 2, fsm.DevCancelled, 100, fsm.DevStarted, 7))
	require.False(t, st[0].Tripped, "2 of 21 < 10%; cancelled and in-flight devices have no outcome")
	st = s.AbortStates(counts(fsm.DevTimeout, 1, fsm.DevNeedsAttention, 1))
	require.True(t, st[1].Tripped)
}

func snapshot(status fsm.RolloutState, c map[fsm.RolloutDeviceState]int, now time.Time, last *time.Time) store.RolloutSnapshot {
	total := 0
	for _, n := range c {
		total += n
	}
	return store.RolloutSnapshot{Now: now, InFlight: c[fsm.DevStarted], Candidate: &domain.RolloutDevice{DeviceID: "device-9"},
		Rollout: domain.Rollout{RolloutID: "fw", Status: status, Counts: c, DevicesTotal: total, MaxInFlight: 5, LastStartAt: last}}
}

func TestDecide(t *testing.T) {
	spec := Spec{MaxPerMinute: 1200, Ramp: &Ramp{BasePerMinute: 120, Factor: 2, EverySucceeded: 50}, MaxInFlight: 5,
		Abort: []AbortRule{{When: "failed", Percent: 10, MinFinished: 20}}}
	require.NoError(t, spec.Validate())
	last := t0.Add(-time.Second)

	d := Decide(spec, snapshot(fsm.RolloutScheduled, counts(fsm.DevPending, 100), t0, nil), time.Second)
	require.Equal(t, fsm.RolloutRunning, d.To)
	require.True(t, d.Start)
	require.Equal(t, Interval(120), d.Interval)

	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 100), t0, &last), time.Second)
	require.True(t, d.Start, "1 s since the last start, interval 525 ms")
	recent := t0.Add(-100 * time.Millisecond)
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 100), t0, &recent), time.Second)
	require.False(t, d.Start)
	require.Equal(t, "rate", d.Waiting)
	require.Equal(t, recent.Add(Interval(120)), d.Next)

	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 100, fsm.DevSucceeded, 150), t0, &recent), time.Second)
	require.True(t, d.Start, "150 successes: 960/min, an interval of 66 ms")
	require.Equal(t, Interval(960), d.Interval)

	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 100, fsm.DevStarted, 5), t0, &last), time.Second)
	require.False(t, d.Start)
	require.Equal(t, "in_flight", d.Waiting)

	d = Decide(spec, snapshot(fsm.RolloutPaused, counts(fsm.DevPending, 100), t0, &last), time.Second)
	require.False(t, d.Start)
	require.Equal(t, "paused", d.Waiting)

	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 70, fsm.DevSucceeded, 27, fsm.DevFailed, 3), t0, &last), time.Second)
	require.Equal(t, fsm.RolloutAborted, d.To)
	require.False(t, d.Start)
	require.Contains(t, d.Reason, "failed 3 of 30 finished")

	d = Decide(spec, snapshot(fsm.RolloutPaused, counts(fsm.DevSucceeded, 10), t0, &last), time.Second)
	require.Equal(t, fsm.RolloutSucceeded, d.To, "nothing left, nothing in flight")
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevSucceeded, 10, fsm.DevTimeout, 1), t0, &last), time.Second)
	require.Equal(t, fsm.RolloutCompletedWithFailures, d.To)

	before := t0
	spec.ExecuteBefore = &before
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3, fsm.DevStarted, 1), t0, &last), time.Second)
	require.Equal(t, fsm.RolloutCompletedWithFailures, d.To)
	require.Contains(t, d.Reason, "3 devices not started")
	d = Decide(spec, snapshot(fsm.RolloutWaitingApproval, counts(fsm.DevPending, 3), t0, nil), time.Second)
	require.Equal(t, fsm.RolloutCancelled, d.To)

	spec.ExecuteBefore = nil
	spec.Windows = []Window{{Cron: "*/20 * * * * *", Duration: "8s"}}
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3), t0.Add(5*time.Second), &last), time.Second)
	require.True(t, d.Start)
	require.Equal(t, 3*time.Second, d.CommandTTL, "the command expires when the window closes")
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3), t0.Add(9*time.Second), &last), time.Second)
	require.False(t, d.Start)
	require.Equal(t, "window", d.Waiting)
	require.Equal(t, t0.Add(20*time.Second), d.Next)
}

func TestNaturalOrder(t *testing.T) {
	ids := []string{"device-10", "device-2", "device-1", "pump-3", "device-02", "device-100", "device-9a", "device-9"}
	sort.SliceStable(ids, func(i, j int) bool { return naturalLess(ids[i], ids[j]) })
	require.Equal(t, []string{"device-1", "device-2", "device-02", "device-9", "device-9a", "device-10", "device-100", "pump-3"}, ids)
}

// A start needs the action's ack_timeout left in its window, and its
// command's ttl (the window's end) is then at least that.
func TestDecideStartsWithAckTimeoutLeft(t *testing.T) {
	spec := Spec{MaxPerMinute: 600, Windows: []Window{{Cron: "*/20 * * * * *", Duration: "8s"}}}
	require.NoError(t, spec.Validate())
	last := t0.Add(-time.Minute)
	const ack = 2 * time.Second
	at := func(d time.Duration) Decision {
		return Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3), t0.Add(d), &last), ack)
	}
	d := at(5 * time.Second)
	require.True(t, d.Start)
	require.Equal(t, 3*time.Second, d.CommandTTL)
	d = at(6 * time.Second)
	require.True(t, d.Start, "exactly the ack timeout left")
	require.Equal(t, ack, d.CommandTTL)
	d = at(7*time.Second + 458*time.Millisecond)
	require.False(t, d.Start, "542 ms left: less than the ack timeout")
	require.Equal(t, "window", d.Waiting)
	require.Equal(t, t0.Add(20*time.Second), d.Next, "the next window")
	require.Empty(t, d.To)

	// execute_before: no start with less than ack left before it; the
	// devices not started are cancelled once it passes.
	before := t0.Add(time.Second)
	spec = Spec{MaxPerMinute: 600, ExecuteBefore: &before}
	require.NoError(t, spec.Validate())
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3, fsm.DevSucceeded, 1), t0, &last), ack)
	require.False(t, d.Start)
	require.Equal(t, "window", d.Waiting)
	require.Equal(t, before, d.Next)
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3, fsm.DevSucceeded, 1), before, &last), ack)
	require.Equal(t, fsm.RolloutCompletedWithFailures, d.To)
	require.Contains(t, d.Reason, "3 devices not started")
	d = Decide(spec, snapshot(fsm.RolloutRunning, counts(fsm.DevPending, 3), t0.Add(-2*time.Second), &last), ack)
	require.True(t, d.Start, "3 s left")
	require.Equal(t, 3*time.Second, d.CommandTTL)
}

// A device follows a late success: the pass moved the timeout to
// succeeded before Decide reads the counts, so the abort rule that the
// timeout tripped does not trip and the rollout succeeds; and the rollout
// does not end while an outcome a late final receipt may still change is
// younger than the ack timeout.
func TestDecideFollowsLateSuccess(t *testing.T) {
	spec := Spec{MaxPerMinute: 600, MaxInFlight: 5, Abort: []AbortRule{{When: "timeout", Percent: 10, MinFinished: 10}}}
	require.NoError(t, spec.Validate())
	last := t0.Add(-time.Minute)
	const ack = time.Second
	late := func(c map[fsm.RolloutDeviceState]int, provisional int, since time.Time) store.RolloutSnapshot {
		s := snapshot(fsm.RolloutRunning, c, t0, &last)
		s.Provisional, s.ProvisionalSince = provisional, since
		if c[fsm.DevPending] == 0 {
			s.Candidate = nil
		}
		return s
	}
	// In the middle: a provisional timeout counts for the abort rules...
	d := Decide(spec, late(counts(fsm.DevSucceeded, 9, fsm.DevTimeout, 1, fsm.DevPending, 5), 1, t0), ack)
	require.Equal(t, fsm.RolloutAborted, d.To, d.Reason)
	// ...one that a late success turned (the pass settled it) does not.
	d = Decide(spec, late(counts(fsm.DevSucceeded, 10, fsm.DevPending, 5), 0, time.Time{}), ack)
	require.Empty(t, d.To)
	require.True(t, d.Start)

	// At the end: a timeout recorded 400 ms ago holds the end.
	spec.Abort = nil
	d = Decide(spec, late(counts(fsm.DevSucceeded, 9, fsm.DevTimeout, 1), 1, t0.Add(-400*time.Millisecond)), ack)
	require.Empty(t, d.To, "a late final receipt may still decide the timeout")
	require.Equal(t, "late_outcome", d.Waiting)
	require.Equal(t, t0.Add(600*time.Millisecond), d.Next)
	// The late success arrived: the device followed, the rollout succeeded.
	d = Decide(spec, late(counts(fsm.DevSucceeded, 10), 0, time.Time{}), ack)
	require.Equal(t, fsm.RolloutSucceeded, d.To)
	// No late receipt within the ack timeout: the timeout stands.
	d = Decide(spec, late(counts(fsm.DevSucceeded, 9, fsm.DevTimeout, 1), 1, t0.Add(-ack)), ack)
	require.Equal(t, fsm.RolloutCompletedWithFailures, d.To)
	// An outcome whose operation is final (failed_final) ends it at once.
	d = Decide(spec, late(counts(fsm.DevSucceeded, 9, fsm.DevFailed, 1), 0, time.Time{}), ack)
	require.Equal(t, fsm.RolloutCompletedWithFailures, d.To)
}
