package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// The rollout tests measure the limits from the devices' own execution log
// (executions.jsonl), not from the controller's counters. The simulator
// writes an execution's line when the action ends, so each device's start
// is its line's time minus the slow_execution delay it was given.

// rolloutDevicesEnv sets the fleet of the big rollout tests: 2,000 in
// scenarios/run, fewer in `make test` (see rolloutFleet).
const rolloutDevicesEnv = "ROLLOUT_DEVICES"

// rolloutFleet is the fleet size of the big rollout tests.
func rolloutFleet(t *testing.T, def int) int {
	if v := os.Getenv(rolloutDevicesEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, rolloutDevicesEnv)
		return n
	}
	return def
}

func (b *bundle) rollout(c *client.Client, id string) apiwire.RolloutView {
	b.t.Helper()
	r, err := c.Rollout(b.ctx(), id)
	require.NoError(b.t, err)
	return r
}

// waitRollout waits for cond on the rollout, read through c.
func (b *bundle) waitRollout(c *client.Client, id, what string, timeout time.Duration, cond func(apiwire.RolloutView) bool) apiwire.RolloutView {
	b.t.Helper()
	var r apiwire.RolloutView
	deadline := time.Now().Add(timeout)
	for {
		got, err := c.Rollout(b.ctx(), id)
		if err == nil {
			r = got
			if cond(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("rollout %s: timed out after %s waiting for %s; last: %s %+v counts %v (err %v)\n%s", id, timeout, what,
				r.Status, r.Reason, r.Counts, err, b.ctl.Output())
		}
		<-time.After(100 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
}

// over: ended, and nothing in flight.
func over(r apiwire.RolloutView) bool {
	return r.EndedAt != nil && r.InFlight == 0
}

// span is one device execution as its log shows it.
type span struct {
	device, operation, command string
	start, end                 time.Time
}

// rolloutExecutions reads the executions of one rollout's operations;
// delay gives each device's slow_execution delay.
func (b *bundle) rolloutExecutions(id string, delay func(device string) time.Duration) []span {
	b.t.Helper()
	ex, err := witness.ReadExecutions(b.stateDir)
	require.NoError(b.t, err)
	var out []span
	for _, e := range ex {
		if !strings.HasPrefix(e.OperationID, id+":rollout:") {
			continue
		}
		out = append(out, span{device: e.DeviceID, operation: e.OperationID, command: e.CommandID,
			start: e.At.Add(-delay(e.DeviceID)), end: e.At})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// maxInWindow is the most starts in any window of length w (half-open).
func maxInWindow(spans []span, w time.Duration) (int, time.Time) {
	best, at, j := 0, time.Time{}, 0
	for i := range spans {
		for spans[i].start.Sub(spans[j].start) >= w {
			j++
		}
		if n := i - j + 1; n > best {
			best, at = n, spans[j].start
		}
	}
	return best, at
}

// maxOverlap is the most executions running at once.
func maxOverlap(spans []span) int {
	type edge struct {
		at time.Time
		d  int
	}
	var es []edge
	for _, s := range spans {
		es = append(es, edge{s.start, 1}, edge{s.end, -1})
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].at.Equal(es[j].at) {
			return es[i].d < es[j].d // an end before a start at the same instant
		}
		return es[i].at.Before(es[j].at)
	})
	n, best := 0, 0
	for _, e := range es {
		n += e.d
		best = max(best, n)
	}
	return best
}

// perWindow counts the starts in consecutive 10 s windows from the first.
func perWindow(spans []span, w time.Duration) []int {
	if len(spans) == 0 {
		return nil
	}
	first := spans[0].start
	var out []int
	for _, s := range spans {
		k := int(s.start.Sub(first) / w)
		for len(out) <= k {
			out = append(out, 0)
		}
		out[k]++
	}
	return out
}

// checkOnce requires every operation of the rollout executed at most once
// (and, with all, exactly once for every device).
func checkOnce(t *testing.T, spans []span, devices int, all bool) {
	t.Helper()
	seen := map[string]int{}
	for _, s := range spans {
		seen[s.operation]++
	}
	for op, n := range seen {
		require.Equal(t, 1, n, "%s executed %d times", op, n)
	}
	if all {
		require.Len(t, seen, devices, "every device executed once")
	}
}

func rolloutJSON(id, action, devices string, spec rollout.Spec) apiwire.RolloutRequest {
	return apiwire.RolloutRequest{RolloutID: id, Action: action, Params: json.RawMessage(`{"fw":"4.2"}`),
		Devices: json.RawMessage(devices), RolloutSpec: apiwire.RolloutSpec(spec)}
}

// slowFleet: every device's action takes fast, those whose id ends in 7
// take slow.
func slowFleet(fast, slow time.Duration) (sim.Profile, func(string) time.Duration) {
	p := sim.Profile{Seed: 15,
		Defaults: sim.Faults{SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(fast)}},
		Devices: []sim.Override{{Match: "device-*7",
			Faults: sim.Faults{SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(slow)}}}}}
	return p, func(id string) time.Duration {
		if ok, _ := path.Match("device-*7", id); ok {
			return slow
		}
		return fast
	}
}

// The ramp and the limits, measured at the devices: a fleet of
// ROLLOUT_DEVICES (2,000 in scenarios/run; 400 in make test, with the
// ramp's step scaled to the fleet) at max_per_minute 1,200, a ramp from 120
// (factor 2), at most 25 in flight with one device in ten slow (6 s, the
// others 1 s): the start rate seen in the execution log follows the ramp,
// no 10 s window holds more than 200 starts, no more than 25 devices ever
// execute at once, and every device executes once.
func TestRolloutRampAndLimits(t *testing.T) {
	t.Parallel()
	n := rolloutFleet(t, 400)
	every := 20 // a step every 20 successes, every 50 from 1,000 devices
	if n >= 1000 {
		every = 50
	}
	const inFlightLimit = 30
	profile, delay := slowFleet(time.Second, 6*time.Second)
	b := setup(t, setupOpts{devices: n, faults: profile})
	spec := rollout.Spec{MaxPerMinute: 1200, Ramp: &rollout.Ramp{BasePerMinute: 120, Factor: 2, EverySucceeded: every},
		MaxInFlight: inFlightLimit}
	start := time.Now()
	r, status, err := b.client.CreateRollout(b.ctx(), rolloutJSON("ramp", "set-config", `"device-*"`, spec))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, n, r.DevicesTotal)
	final := b.waitRollout(b.client, "ramp", "the end", 10*time.Minute, over)
	took := time.Since(start)
	require.Equal(t, "succeeded", final.Status, final.Reason)
	require.Equal(t, n, final.Counts["succeeded"])

	spans := b.rolloutExecutions("ramp", delay)
	checkOnce(t, spans, n, true)
	peak, at := maxInWindow(spans, 10*time.Second)
	inFlight := maxOverlap(spans)
	t.Logf("%d devices in %s; starts per 10 s window (from the execution log): %v", n, took.Round(time.Second), perWindow(spans, 10*time.Second))
	t.Logf("busiest 10 s window: %d starts from %s (limit 200); most executing at once: %d (max_in_flight %d)",
		peak, at.Format("15:04:05.000"), inFlight, inFlightLimit)
	for _, ph := range rampPhases(spans, spec) {
		t.Log(ph)
	}
	require.LessOrEqual(t, peak, 200, "max_per_minute 1,200 is at most 200 starts in any 10 s")
	require.LessOrEqual(t, inFlight, inFlightLimit)

	// The ramp: the first every_succeeded devices start at 120/min.
	base, _ := maxInWindow(spans[:every], 10*time.Second)
	require.LessOrEqual(t, base, 20, "120/min at the start: at most 20 in any 10 s")
	if n >= 1000 {
		require.Greater(t, peak, 150, "the rate reached the limit's neighbourhood")
	}
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// rampPhases measures the start rate of each step of the ramp from the
// execution log: step k runs from the time the (k·every)-th device
// finished its action (the devices' successes, as they saw them) to the
// next step's.
func rampPhases(spans []span, spec rollout.Spec) []string {
	ends := make([]time.Time, len(spans))
	for i, s := range spans {
		ends[i] = s.end
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	every := spec.Ramp.EverySucceeded
	var out []string
	from := spans[0].start
	for k := 0; ; k++ {
		rate := spec.Rate(k * every)
		to := spans[len(spans)-1].start.Add(time.Nanosecond)
		last := rate >= float64(spec.MaxPerMinute) || (k+1)*every > len(ends)
		if !last {
			to = ends[(k+1)*every-1]
		}
		n := 0
		for _, s := range spans {
			if !s.start.Before(from) && s.start.Before(to) {
				n++
			}
		}
		if d := to.Sub(from); d > 0 {
			out = append(out, fmt.Sprintf("ramp step %d: allowed %4.0f/min (paced at %4.0f/min): %4d starts in %5.1f s = %4.0f/min",
				k, rate, float64(time.Minute)/float64(rollout.Interval(rate)), n, d.Seconds(), float64(n)/d.Minutes()))
		}
		if last {
			return out
		}
		from = to
	}
}

// 10 % of the devices fail their action: the rollout aborts once the
// failed share reaches its threshold after min_finished; no device starts
// after the abort committed (no start record, and no command published,
// after it); the devices not published are cancelled.
func TestRolloutAbortsOnFailureThreshold(t *testing.T) {
	t.Parallel()
	const n = 300
	const slow = time.Second
	p := sim.Profile{Seed: 15,
		Defaults: sim.Faults{SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(slow)}},
		Devices: []sim.Override{{Match: "device-*0", Faults: sim.Faults{
			SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(slow)},
			Fail:          sim.ActionFault{Trigger: sim.Trigger{P: 1}, Error: "flash_failed"}}}}}
	b := setup(t, setupOpts{devices: n, faults: p})
	spec := rollout.Spec{MaxPerMinute: 600, MaxInFlight: 15,
		Abort: []rollout.AbortRule{{When: "failed", Percent: 8, MinFinished: 50}}}
	_, _, err := b.client.CreateRollout(b.ctx(), rolloutJSON("abort", "set-config", `"device-*"`, spec))
	require.NoError(t, err)
	final := b.waitRollout(b.client, "abort", "the abort", 3*time.Minute, over)
	require.Equal(t, "aborted", final.Status)
	t.Logf("abort: %s", final.Reason)

	var abortAt time.Time
	for _, h := range final.History {
		if h.To == "aborted" {
			abortAt = h.At
		}
	}
	require.False(t, abortAt.IsZero(), "the abort is in the history")
	var finished, failed int
	_, err = fmt.Sscanf(final.Reason, "failed %d of %d finished", &failed, &finished)
	require.NoError(t, err, final.Reason)
	require.GreaterOrEqual(t, finished, 50, "not before min_finished")
	require.GreaterOrEqual(t, float64(failed)*100, 8*float64(finished), "the threshold was reached")

	// No start after the abort: the committed start records, and the
	// commands the devices executed were all published before it.
	starts := b.rows(`SELECT MAX(started_at), COUNT(*) FROM rollout_starts WHERE rollout_id = 'abort'`)
	var lastStart, started int64
	_, err = fmt.Sscanf(strings.ReplaceAll(starts[0], "|", " "), "%d %d", &lastStart, &started)
	require.NoError(t, err)
	require.LessOrEqual(t, lastStart, abortAt.UnixMilli(), "the last start was committed before the abort")
	sent := map[string]int64{}
	for _, row := range b.rows(`SELECT entity_id, MIN(at) FROM events WHERE machine = 'command' AND to_state = 'sent' AND refused = 0 GROUP BY entity_id`) {
		id, at, _ := strings.Cut(row, "|")
		sent[id], _ = strconv.ParseInt(at, 10, 64)
	}
	spans := b.rolloutExecutions("abort", func(string) time.Duration { return slow })
	checkOnce(t, spans, n, false)
	afterAbort := 0
	for _, s := range spans {
		require.Contains(t, sent, s.command)
		require.LessOrEqual(t, sent[s.command], abortAt.UnixMilli(), "%s was published after the abort", s.command)
		if s.end.After(abortAt) {
			afterAbort++ // published before the abort, ran to its end after it
		}
	}
	cancelled := final.Counts["cancelled"]
	require.Equal(t, n-int(started)+cancelledStarted(b), cancelled, "every device never started is cancelled")
	require.Greater(t, cancelled, n/2)
	t.Logf("abort point: %d finished, %d failed; %d devices started (%d executed), %d cancelled; starts committed after the abort: 0, "+
		"commands published after it: 0; executions published before it that ended after it (ran to their end): %d",
		finished, failed, started, len(spans), cancelled, afterAbort)
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// cancelledStarted counts the devices whose start was committed but whose
// command was cancelled unpublished by the abort.
func cancelledStarted(b *bundle) int {
	rows := b.rows(`SELECT COUNT(*) FROM rollout_devices WHERE rollout_id = 'abort' AND status = 'cancelled' AND attempts > 0`)
	n, _ := strconv.Atoi(rows[0])
	return n
}

// kill -9 of the instance that runs the scheduler, three times during a
// rollout, with two instances on PostgreSQL: every device executes at most
// once, the rollout completes, and the limits hold across the restarts
// (measured from the execution log). The first kill is followed by an
// immediate restart (the instance reclaims its rollout with a new token);
// after the next two the peer takes the rollout over once its lease ran out.
func TestRolloutSurvivesSchedulerKills(t *testing.T) {
	t.Parallel()
	n := rolloutFleet(t, 300)
	profile, delay := slowFleet(500*time.Millisecond, 3*time.Second)
	b := setup(t, setupOpts{backend: "postgres", devices: n, faults: profile, args: []string{"--lease-ttl", "2s"}})
	peer, pc := b.peer("i2", nil, "--lease-ttl", "2s")
	ctls := map[string]struct {
		restart func()
		kill    func()
		c       *client.Client
	}{
		"i1": {func() { b.ctl.Restart() }, b.ctl.Kill, b.client},
		"i2": {func() { peer.Restart() }, peer.Kill, pc},
	}
	other := map[string]string{"i1": "i2", "i2": "i1"}
	spec := rollout.Spec{MaxPerMinute: 1200, Ramp: &rollout.Ramp{BasePerMinute: 300, Factor: 2, EverySucceeded: max(n/20, 10)},
		MaxInFlight: 30, Retries: 2}
	_, _, err := b.client.CreateRollout(b.ctx(), rolloutJSON("kills", "set-config", `"device-*"`, spec))
	require.NoError(t, err)
	var kills []string
	for i, at := range []float64{0.2, 0.45, 0.7} {
		cur := b.waitRollout(pc, "kills", fmt.Sprintf("%.0f%% done", at*100), 5*time.Minute, func(r apiwire.RolloutView) bool {
			return float64(r.Finished) >= at*float64(n)
		})
		owner := cur.Scheduler.Owner
		token := cur.Scheduler.FencingToken
		ctls[owner].kill()
		kills = append(kills, fmt.Sprintf("kill -9 of %s (token %d) at %d/%d finished", owner, token, cur.Finished, n))
		if i == 0 {
			ctls[owner].restart()
			got := b.waitRollout(ctls[owner].c, "kills", "reclaimed by the restarted instance", time.Minute, func(r apiwire.RolloutView) bool {
				return r.Scheduler.FencingToken > token
			})
			kills[i] += fmt.Sprintf(", restarted at once: reclaimed by %s with token %d", got.Scheduler.Owner, got.Scheduler.FencingToken)
			continue
		}
		survivor := ctls[other[owner]].c
		got := b.waitRollout(survivor, "kills", "taken over by the peer", time.Minute, func(r apiwire.RolloutView) bool {
			return r.Scheduler.Owner == other[owner] && r.Scheduler.FencingToken > token
		})
		kills[i] += fmt.Sprintf(", taken over by %s with token %d", got.Scheduler.Owner, got.Scheduler.FencingToken)
		ctls[owner].restart()
	}
	final := b.waitRollout(pc, "kills", "the end", 10*time.Minute, over)
	for _, k := range kills {
		t.Log(k)
	}
	require.Equal(t, "succeeded", final.Status, final.Reason)
	spans := b.rolloutExecutions("kills", delay)
	checkOnce(t, spans, n, true)
	peak, _ := maxInWindow(spans, 10*time.Second)
	inFlight := maxOverlap(spans)
	t.Logf("%d devices, 3 kills: each executed once; busiest 10 s window %d starts (limit 200); most executing at once %d (max_in_flight 30); starts per 10 s: %v",
		n, peak, inFlight, perWindow(spans, 10*time.Second))
	require.LessOrEqual(t, peak, 200)
	require.LessOrEqual(t, inFlight, 30)
	instances := b.rows(`SELECT DISTINCT instance || ':' || fencing_token FROM rollout_starts WHERE rollout_id = 'kills' ORDER BY 1`)
	t.Logf("starts were committed under: %v", instances)
	require.GreaterOrEqual(t, len(instances), 4, "four terms of the scheduler's lease")
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// A replay of the creating POST returns the same rollout (200); other
// content with its id is refused (422); a bad rule is 400.
func TestRolloutCreateIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 5})
	req := rolloutJSON("fw-1", "set-config", `"device-*"`, rollout.Spec{MaxPerMinute: 600, MaxInFlight: 2,
		Abort: []rollout.AbortRule{{When: "failed", Percent: 20, MinFinished: 2}}})
	first, status, err := b.client.CreateRollout(b.ctx(), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	again, status, err := b.client.CreateRollout(b.ctx(), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, first.RolloutID, again.RolloutID)
	require.Equal(t, first.CreatedAt, again.CreatedAt)
	require.Equal(t, first.DevicesTotal, again.DevicesTotal)

	other := req
	other.Params = json.RawMessage(`{"fw":"4.3"}`)
	_, _, err = b.client.CreateRollout(b.ctx(), other)
	require.Equal(t, "idempotency_key_reused", client.Code(err), "%v", err)
	other = req
	other.MaxPerMinute = 601
	_, _, err = b.client.CreateRollout(b.ctx(), other)
	require.Equal(t, "idempotency_key_reused", client.Code(err))

	bad := req
	bad.RolloutID = "fw-2"
	bad.Ramp = &rollout.Ramp{BasePerMinute: 6000, Factor: 2, EverySucceeded: 1}
	_, _, err = b.client.CreateRollout(b.ctx(), bad)
	require.Equal(t, "invalid_request", client.Code(err))
	unknown := rolloutJSON("fw-3", "set-config", `["device-1","device-99"]`, rollout.Spec{MaxPerMinute: 10})
	_, _, err = b.client.CreateRollout(b.ctx(), unknown)
	require.Equal(t, "device_unknown", client.Code(err))
	// The body's ids and params meet the same rules as a submit's.
	badID := rolloutJSON("fw/4", "set-config", `"device-*"`, rollout.Spec{MaxPerMinute: 10})
	_, status, err = b.client.CreateRollout(b.ctx(), badID)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "invalid_request", client.Code(err))
	require.ErrorContains(t, err, `rollout_id "fw/4"`)
	huge := rolloutJSON("fw-5", "set-config", `"device-*"`, rollout.Spec{MaxPerMinute: 10})
	huge.Params = json.RawMessage(`{"blob":"` + strings.Repeat("x", 300<<10) + `"}`)
	_, status, err = b.client.CreateRollout(b.ctx(), huge)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Equal(t, "too_large", client.Code(err))
	refused := b.refusedCounts()
	require.Equal(t, 1, refused[[2]string{"http", "bad_id"}])
	require.Equal(t, 1, refused[[2]string{"http", "too_large"}])
	require.Equal(t, []string{"1"}, b.rows(`SELECT COUNT(*) FROM rollouts`), "only fw-1 exists")

	final := b.waitRollout(b.client, "fw-1", "the end", time.Minute, over)
	require.Equal(t, "succeeded", final.Status)
	again, status, err = b.client.CreateRollout(b.ctx(), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "a replay after the end returns it, and runs nothing again")
	require.Equal(t, "succeeded", again.Status)
	ds, err := b.client.RolloutDevices(b.ctx(), "fw-1", "succeeded", 2)
	require.NoError(t, err)
	require.Len(t, ds, 5, "the pages followed to the end")
	require.Equal(t, "fw-1:rollout:device-1:v1", ds[0].OperationID)
	op, err := b.client.Operation(b.ctx(), ds[0].OperationID, 0)
	require.NoError(t, err)
	require.Equal(t, "succeeded", op.Status, "each device's action is an ordinary operation")
	checkOnce(t, b.rolloutExecutions("fw-1", func(string) time.Duration { return 0 }), 5, true)
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// Pause holds across a kill -9 and restart: the paused rollout starts
// nothing while the restarted instance's scheduler drives it again, then a
// resume finishes it, every device executing once.
func TestRolloutPauseAcrossRestart(t *testing.T) {
	t.Parallel()
	const n = 12
	b := setup(t, setupOpts{devices: n, args: []string{"--lease-ttl", "2s"}})
	_, _, err := b.client.CreateRollout(b.ctx(), rolloutJSON("pause", "restart", `"device-*"`, rollout.Spec{MaxPerMinute: 60}))
	require.NoError(t, err)
	b.waitRollout(b.client, "pause", "3 started", time.Minute, func(r apiwire.RolloutView) bool { return r.Rate.Starts >= 3 })
	paused, err := b.client.MoveRollout(b.ctx(), "pause", "pause")
	require.NoError(t, err)
	require.Equal(t, "paused", paused.Status)
	starts := paused.Rate.Starts
	token := paused.Scheduler.FencingToken

	b.ctl.Kill()
	b.ctl.Restart()
	// The restarted instance reclaims the rollout (a new token) and makes
	// passes over it (each extends the lease): two lease extensions after
	// the reclaim, still nothing started.
	r := b.waitRollout(b.client, "pause", "reclaimed after the restart", time.Minute, func(r apiwire.RolloutView) bool {
		return r.Scheduler.FencingToken > token
	})
	lease := r.Scheduler.LeaseExpiresAt
	for i := 0; i < 2; i++ {
		r = b.waitRollout(b.client, "pause", "a pass of the new scheduler", time.Minute, func(r apiwire.RolloutView) bool {
			return r.Scheduler.LeaseExpiresAt.After(lease)
		})
		lease = r.Scheduler.LeaseExpiresAt
	}
	require.Equal(t, "paused", r.Status)
	require.Equal(t, starts, r.Rate.Starts, "nothing started while paused, across the restart")

	out, err := b.run("rollout", "resume", "pause")
	require.NoError(t, err, out)
	require.Contains(t, out, "running")
	final := b.waitRollout(b.client, "pause", "the end", 2*time.Minute, over)
	require.Equal(t, "succeeded", final.Status)
	checkOnce(t, b.rolloutExecutions("pause", func(string) time.Duration { return 0 }), n, true)
	var actions []string
	for _, h := range final.History {
		actions = append(actions, h.Action+":"+h.To)
	}
	require.Contains(t, actions, "pause:paused")
	require.Contains(t, actions, "resume:running")
	t.Logf("paused at %d starts, kill -9 and restart, reclaimed with token %d, resumed: %s", starts, r.Scheduler.FencingToken, final.Reason)
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// Devices offline inside a recurring window: no device starts outside a
// window (windows of 8 s every 20 s); the offline devices' commands expire
// with their window, and their retry, as their operation's own retry, runs
// in the next window once they are back.
func TestRolloutOfflineDevicesInAWindow(t *testing.T) {
	t.Parallel()
	const n = 12
	b := setup(t, setupOpts{devices: n})
	spec := rollout.Spec{MaxPerMinute: 600, Retries: 2, Windows: []rollout.Window{{Cron: "*/20 * * * * *", Duration: "8s"}}}
	// Start a little after a window opened or closed, so that the first
	// window used is a whole one.
	now := time.Now()
	sec := now.Second() % 20
	if sec < 9 {
		<-time.After(time.Duration(9-sec)*time.Second - time.Duration(now.Nanosecond())) // wait for a window to close: the test's time base, not a synchronisation
	}
	_, _, err := b.client.CreateRollout(b.ctx(), rolloutJSON("window", "restart", `"device-*"`, spec))
	require.NoError(t, err)
	r := b.rollout(b.client, "window")
	require.False(t, r.Window.Open)
	require.NotNil(t, r.Window.Opens)
	open1 := *r.Window.Opens
	offline := []string{"device-3", "device-7", "device-11"}
	for _, id := range offline {
		// Away until 2 s after the first window closed, back well before the next.
		b.fleet.Device(id).DropConnection(time.Until(open1.Add(10 * time.Second)))
	}
	for _, id := range offline {
		b.waitDevice(id, false)
	}
	final := b.waitRollout(b.client, "window", "the end", 2*time.Minute, over)
	require.Equal(t, "succeeded", final.Status, final.Reason)
	spans := b.rolloutExecutions("window", func(string) time.Duration { return 0 })
	checkOnce(t, spans, n, true)
	inWindow := func(at time.Time) bool {
		s := at.UTC()
		return s.Second()%20 < 8 || (s.Second()%20 == 8 && s.Nanosecond() < int(500*time.Millisecond))
	}
	for _, s := range spans {
		require.True(t, inWindow(s.end), "%s executed at %s, outside a window", s.device, s.end.Format("15:04:05.000"))
	}
	for _, row := range b.rows(`SELECT device_id, started_at FROM rollout_starts WHERE rollout_id = 'window'`) {
		dev, at, _ := strings.Cut(row, "|")
		ms, _ := strconv.ParseInt(at, 10, 64)
		require.True(t, inWindow(time.UnixMilli(ms)), "%s started at %s", dev, time.UnixMilli(ms).UTC().Format("15:04:05.000"))
	}
	ds, err := b.client.RolloutDevices(b.ctx(), "window", "", 0)
	require.NoError(t, err)
	for _, d := range ds {
		want := 1
		for _, o := range offline {
			if d.DeviceID == o {
				want = 2
			}
		}
		require.Equal(t, want, d.Attempts, "%s", d.DeviceID)
	}
	for _, s := range spans {
		for _, o := range offline {
			if s.device == o {
				require.True(t, s.end.After(open1.Add(8*time.Second)), "%s ran in a later window", o)
			}
		}
	}
	t.Logf("window 1 opened %s: %d devices ran in it; %v were offline, their commands expired with it and their retries ran in the next window",
		open1.Format("15:04:05"), n-len(offline), offline)
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// An action whose policy needs approval: the rollout waits for a versioned
// approval; four-eyes holds (its creator cannot approve it); once approved
// by another, it runs.
func TestRolloutNeedsApproval(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{devices: 3})
	req := rolloutJSON("approve", "restart", `"device-*"`, rollout.Spec{MaxPerMinute: 600})
	r, status, err := tb.agent.CreateRollout(tb.ctx(), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "waiting_approval", r.Status)
	_, _, err = tb.agent.ApproveRollout(tb.ctx(), "approve", 1)
	require.Equal(t, "four_eyes", client.Code(err))
	_, _, err = tb.bob.ApproveRollout(tb.ctx(), "approve", 2)
	require.Equal(t, "stale_version", client.Code(err))
	_, _, err = tb.viewer.ApproveRollout(tb.ctx(), "approve", 1)
	require.Equal(t, "forbidden", client.Code(err))
	a, status, err := tb.bob.ApproveRollout(tb.ctx(), "approve", 1)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "bob", a.Approval.Approver)
	_, status, err = tb.bob.ApproveRollout(tb.ctx(), "approve", 1)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "an exact replay")
	final := tb.waitRollout(tb.viewer, "approve", "the end", time.Minute, over)
	require.Equal(t, "succeeded", final.Status)
	require.Equal(t, 3, final.Counts["succeeded"])
	require.Contains(t, tb.verify(), "invariant 8 PASS")
}

// A device whose action outlasts its command (slow_execution 4.5 s; a
// command ttl of 4 s, ack_timeout 3 s): its command times out, its
// operation goes failed_retryable, and the final receipt the device
// publishes after that decides the operation succeeded. The rollout device
// follows its operation: it was timeout and ends succeeded, and the
// rollout, held while that timeout could still change, ends succeeded
// (it ended completed_with_failures before the fix).
func TestRolloutFollowsLateSuccess(t *testing.T) {
	t.Parallel()
	const ttl, ack, slow = 4 * time.Second, 3 * time.Second, 4500 * time.Millisecond
	p := sim.Profile{Seed: 15, Devices: []sim.Override{{Match: "device-2",
		Faults: sim.Faults{SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(slow)}}}}}
	b := setup(t, setupOpts{devices: 3, faults: p, args: []string{"--ack-timeout", ack.String(), "--command-ttl", ttl.String()}})
	_, _, err := b.client.CreateRollout(b.ctx(), rolloutJSON("late", "set-config", `"device-*"`, rollout.Spec{MaxPerMinute: 600}))
	require.NoError(t, err)
	final := b.waitRollout(b.client, "late", "the end", time.Minute, over)

	// The failure window was entered: device-2's command timed out and its
	// operation went failed_retryable before the late receipt decided it.
	opID := "late:rollout:device-2:v1"
	var ops []string
	for _, row := range b.rows(`SELECT to_state FROM events WHERE machine = 'operation' AND entity_id = ? AND refused = 0 ORDER BY id`, opID) {
		ops = append(ops, row)
	}
	require.Equal(t, []string{"started", "failed_retryable", "succeeded"}, ops, "device-2's operation")
	require.Equal(t, []string{"timeout|succeeded"},
		b.rows(`SELECT c.status, c.late_outcome FROM commands c WHERE c.operation_id = ?`, opID), "its command timed out, its receipt came late")

	require.Equal(t, "succeeded", final.Status, "%s (counts %v)", final.Reason, final.Counts)
	require.Equal(t, 3, final.Counts["succeeded"])
	ds, err := b.client.RolloutDevices(b.ctx(), "late", "", 0)
	require.NoError(t, err)
	for _, d := range ds {
		require.Equal(t, "succeeded", d.Status, d.DeviceID)
		if d.DeviceID == "device-2" {
			require.Equal(t, "late final receipt, was timeout", d.Reason)
		}
	}
	// The rollout did not end while the timeout could still change: the
	// device followed its operation first.
	var followed, ended time.Time
	for _, h := range final.History {
		switch {
		case h.Action == "late_outcome":
			followed = h.At
			require.Contains(t, h.Reason, "device-2 timeout → succeeded")
		case h.To == "succeeded":
			ended = h.At
		}
	}
	require.False(t, followed.IsZero(), "the late outcome is in the history: %+v", final.History)
	require.False(t, ended.Before(followed), "ended %s, before device-2 followed its operation at %s", ended, followed)
	checkOnce(t, b.rolloutExecutions("late", func(string) time.Duration { return 0 }), 3, true)
	t.Logf("device-2: operation %v, command timed out at its ttl (%s) and succeeded late (action %s); rollout: %s",
		ops, ttl, slow, final.Reason)
	require.Contains(t, b.verify(), "invariant 8 PASS")
}

// Windows of 3 s every 10 s with ack_timeout 1.5 s, at 120 starts a minute
// (one every 525 ms): no device starts with less than 1.5 s left in its
// window, each command's expires_at (its window's end) is at least 1.5 s
// after its issue, and the devices that do not fit in a window wait for
// the next one; every device succeeds. Before the fix the fourth and later
// starts of a window got what was left of it (one 0.3 s).
func TestRolloutStartsWithAckTimeoutLeft(t *testing.T) {
	t.Parallel()
	const n = 6
	const ack = 1500 * time.Millisecond
	const every, open = 10 * time.Second, 3 * time.Second
	b := setup(t, setupOpts{devices: n, args: []string{"--ack-timeout", ack.String()}})
	spec := rollout.Spec{MaxPerMinute: 120, Windows: []rollout.Window{{Cron: "*/10 * * * * *", Duration: "3s"}}}
	_, _, err := b.client.CreateRollout(b.ctx(), rolloutJSON("ackwin", "set-config", `"device-*"`, spec))
	require.NoError(t, err)
	final := b.waitRollout(b.client, "ackwin", "the end", 2*time.Minute, over)
	require.Equal(t, "succeeded", final.Status, final.Reason)

	windowEnd := func(at time.Time) time.Time { return at.Truncate(every).Add(open) }
	windows := map[time.Time]int{}
	var left []string
	for _, row := range b.rows(`SELECT device_id, started_at FROM rollout_starts WHERE rollout_id = 'ackwin' ORDER BY started_at`) {
		dev, raw, _ := strings.Cut(row, "|")
		ms, err := strconv.ParseInt(raw, 10, 64)
		require.NoError(t, err)
		at := time.UnixMilli(ms)
		end := windowEnd(at)
		windows[end]++
		left = append(left, fmt.Sprintf("%s %s", dev, end.Sub(at)))
		require.True(t, at.Before(end), "%s started at %s, outside a window", dev, at.UTC().Format("15:04:05.000"))
		require.GreaterOrEqual(t, end.Sub(at), ack, "%s started with %s left in its window (ack_timeout %s)", dev, end.Sub(at), ack)
	}
	require.Len(t, left, n, "one start each")
	for _, row := range b.rows(`SELECT operation_id, expires_at - issued_at FROM commands WHERE operation_id LIKE 'ackwin:rollout:%'`) {
		op, raw, _ := strings.Cut(row, "|")
		ttl, err := strconv.ParseInt(raw, 10, 64)
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Duration(ttl)*time.Millisecond, ack, "%s: its command's ttl", op)
	}
	require.GreaterOrEqual(t, len(windows), 2, "the devices that did not fit waited for the next window")
	checkOnce(t, b.rolloutExecutions("ackwin", func(string) time.Duration { return 0 }), n, true)
	t.Logf("starts by window: %d windows; time left in its window at each start: %v", len(windows), left)
	require.Contains(t, b.verify(), "invariant 8 PASS")
}
