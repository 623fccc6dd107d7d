package verify

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// inFlightSlack is how much earlier than a start an operation's end may be
// recorded and still count as seen by that start's decision: the two
// clocks are read when each change is applied, not when it commits.
const inFlightSlack = 250 * time.Millisecond

// 8. A rollout starts each device at most once per version, and never
// exceeds its rate or in-flight limits, across restarts and instances.
// From the committed starts (rollout_starts) and the operations' events:
// a device's first start is its only one unless its operation became
// failed_retryable before each later one (a retry, within retries); no 10 s
// window holds more than max_per_minute/6 starts (rounded up), no 60 s
// window more than max_per_minute; at each start, the devices started whose
// operation had not yet left started (by then, give or take inFlightSlack)
// are at most max_in_flight. Printed only for a run with rollouts.
func (r *run) rollouts(rs []store.AuditRollout) (Verdict, bool) {
	if len(rs) == 0 {
		return Verdict{}, false
	}
	// When each operation became failed_retryable, and left started.
	retryable := map[string][]time.Time{}
	left := map[string][]time.Time{}
	for _, e := range r.events {
		if e.Refused || e.Machine != fsm.Operation.Name() {
			continue
		}
		if e.To == string(fsm.OpFailedRetryable) {
			retryable[e.EntityID] = append(retryable[e.EntityID], e.At)
		}
		if e.From == string(fsm.OpStarted) && e.To != string(fsm.OpStarted) {
			left[e.EntityID] = append(left[e.EntityID], e.At)
		}
	}
	var bad []string
	starts, peak10, peakFlight := 0, 0, 0
	for _, ro := range rs {
		starts += len(ro.Starts)
		seen := map[string]int{}
		for _, s := range ro.Starts {
			seen[s.DeviceID]++
			if s.Attempt > 1 {
				ok := s.Attempt <= ro.Retries+1
				n := 0
				for _, at := range retryable[s.OperationID] {
					if !at.After(s.At) {
						n++
					}
				}
				if !ok || n < s.Attempt-1 {
					bad = append(bad, fmt.Sprintf("%s: %s started %d times without as many retryable outcomes before", ro.RolloutID, s.DeviceID, s.Attempt))
				}
			}
		}
		for _, w := range []struct {
			d   time.Duration
			max int
		}{{10 * time.Second, int(math.Ceil(float64(ro.MaxPerMinute) / 6))}, {time.Minute, ro.MaxPerMinute}} {
			n := maxInWindow(ro.Starts, w.d)
			if w.d == 10*time.Second {
				peak10 = max(peak10, n)
			}
			if n > w.max {
				bad = append(bad, fmt.Sprintf("%s: %d starts within %s (max %d)", ro.RolloutID, n, w.d, w.max))
			}
		}
		for i, s := range ro.Starts {
			flight := 0
			for _, p := range ro.Starts[:i+1] {
				if p.DeviceID == s.DeviceID && p.Attempt == s.Attempt {
					flight++
					continue
				}
				if ended(left[p.OperationID], p.At, s.At.Add(inFlightSlack)) {
					continue
				}
				flight++
			}
			peakFlight = max(peakFlight, flight)
			if flight > ro.MaxInFlight {
				bad = append(bad, fmt.Sprintf("%s: %d in flight at the start of %s (max %d)", ro.RolloutID, flight, s.DeviceID, ro.MaxInFlight))
				break
			}
		}
	}
	detail := fmt.Sprintf("%d rollouts, %d starts; busiest 10 s window %d starts; most in flight at a start %d; %d violations",
		len(rs), starts, peak10, peakFlight, len(bad))
	if len(bad) > 0 {
		detail += ": " + bad[0]
	}
	return Verdict{8, "rollouts start each device once per version, within their rate and in-flight limits", len(bad) == 0, detail}, true
}

// ended reports whether an operation started at from left started by by.
func ended(lefts []time.Time, from, by time.Time) bool {
	for _, at := range lefts {
		if !at.Before(from) && !at.After(by) {
			return true
		}
	}
	return false
}

// maxInWindow is the most starts in any half-open window of length w.
func maxInWindow(starts []store.AuditRolloutStart, w time.Duration) int {
	at := make([]time.Time, len(starts))
	for i, s := range starts {
		at[i] = s.At
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	best, j := 0, 0
	for i := range at {
		for at[i].Sub(at[j]) >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}
