package rollout

import (
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Decision is what one pass of the scheduler decides, with why nothing
// starts (Waiting) and when the next pass is worth making (Next).
type Decision struct {
	store.RolloutDecision
	// Waiting names what holds the next start back: "paused", "window",
	// "in_flight", "rate", "approval", "done", "late_outcome" (nothing is
	// left but outcomes a late final receipt may still change) or ""
	// (starting).
	Waiting string
	// Next is when the next pass should run at the latest (zero: the
	// scheduler's idle tick).
	Next time.Time
}

// Decide is the scheduler's rules, a pure function of the committed
// snapshot a pass read (the rollout's state, its counts by outcome as the
// pass settled them, the devices in flight, the provisional outcomes, its
// last start, the time) and of ack, the action's ack_timeout.
//
//   - waiting_approval: waits; execute_before passing first cancels it.
//   - scheduled: running once execute_after has passed (cancelled if
//     execute_before passed first).
//   - running or paused: aborted when an abort rule trips (min_finished
//     reached and the share of finished devices with that outcome at or over
//     its percent); succeeded or completed_with_failures when nothing is left
//     to start or in flight and no provisional outcome is younger than ack;
//     completed_with_failures when execute_before passes with devices not
//     started (they are cancelled).
//   - running: start the next device when a window is open with at least
//     ack left in it, fewer than max_in_flight are in flight, and the
//     interval of the current rate (the ramp's, from the committed
//     successes) has passed since the last committed start. Its command's
//     ttl is capped at the window's end, so it is at least ack.
//
// A device follows its operation to the operation's final state: the pass
// moves a timeout (or another outcome settled from a failed_retryable
// operation) to the outcome a late final receipt gave the operation before
// Decide reads the counts, so the abort rules and the end see it. The
// contract is silent on when such an outcome is final; these rules choose:
//
//   - The abort rules count a provisional timeout as a timeout: an abort
//     rule is a safety stop, and waiting for late receipts would let more
//     devices start against a fleet that does not answer. One that turned
//     into a success before the pass no longer counts.
//   - The rollout does not end (succeeded or completed_with_failures) while
//     a provisional outcome is younger than ack: a device that took the
//     command just before it expired answers within about its ack_timeout,
//     and an operator expects the final status to be the fleet's, not to
//     flip after the rollout said it was done. A terminal status is never
//     rewritten: an even later receipt still moves the device and the
//     counts (the scheduler follows ended rollouts too), not the status.
//   - A start needs ack left in its window: a command that cannot be
//     answered and asked about once before its expiry would time out by
//     construction. The device waits for the next window, or is cancelled
//     with the others not started when execute_before passes.
func Decide(spec Spec, snap store.RolloutSnapshot, ack time.Duration) Decision {
	r, now := snap.Rollout, snap.Now
	counts := r.Counts
	win := spec.WindowAt(now)
	var d Decision
	switch r.Status {
	case fsm.RolloutWaitingApproval:
		if win.Missed {
			d.To, d.Reason = fsm.RolloutCancelled, "window_missed: execute_before passed before the approval"
			return d
		}
		d.Waiting = "approval"
		return d
	case fsm.RolloutScheduled:
		if win.Missed {
			d.To, d.Reason = fsm.RolloutCancelled, "window_missed: execute_before passed before the start"
			return d
		}
		if spec.ExecuteAfter != nil && now.Before(*spec.ExecuteAfter) {
			d.Waiting, d.Next = "window", *spec.ExecuteAfter
			return d
		}
		d.To, d.Reason = fsm.RolloutRunning, "started"
		r.Status = fsm.RolloutRunning
	case fsm.RolloutRunning, fsm.RolloutPaused:
	default:
		d.Waiting = "done"
		return d
	}
	for _, a := range spec.AbortStates(counts) {
		if a.Tripped {
			d.To, d.Reason, d.Start = fsm.RolloutAborted, a.String(), false
			return d
		}
	}
	left := counts[fsm.DevPending] + counts[fsm.DevRetry]
	inFlight := snap.InFlight
	if left == 0 && inFlight == 0 {
		if until := snap.ProvisionalSince.Add(ack); snap.Provisional > 0 && now.Before(until) {
			d.Waiting, d.Next = "late_outcome", until
			return d
		}
		d.To = fsm.RolloutSucceeded
		if counts[fsm.DevSucceeded] != r.DevicesTotal {
			d.To = fsm.RolloutCompletedWithFailures
		}
		d.Reason = summary(counts)
		return d
	}
	if win.Missed && left > 0 {
		d.To = fsm.RolloutCompletedWithFailures
		d.Reason = fmt.Sprintf("execute_before passed: %d devices not started are cancelled; %s", left, summary(counts))
		return d
	}
	switch {
	case r.Status == fsm.RolloutPaused:
		d.Waiting = "paused"
		return d
	case left == 0 || snap.Candidate == nil:
		d.Waiting = "in_flight" // only the devices in flight are left
		return d
	case !win.Open:
		d.Waiting, d.Next = "window", win.Opens
		return d
	case !win.Ends.IsZero() && win.Ends.Sub(now) < ack:
		// Too little of this window left for the action: wait for the
		// next one (or for execute_before to end the rollout).
		d.Waiting, d.Next = "window", win.Ends
		if next := spec.WindowAt(win.Ends); !next.Open && !next.Opens.IsZero() {
			d.Next = next.Opens
		}
		return d
	case inFlight >= r.MaxInFlight:
		d.Waiting = "in_flight"
		return d
	}
	rate := spec.Rate(counts[fsm.DevSucceeded])
	d.Interval = Interval(rate)
	if r.LastStartAt != nil {
		if next := r.LastStartAt.Add(d.Interval); now.Before(next) {
			d.Waiting, d.Next = "rate", next
			return d
		}
	}
	d.Start = true
	if !win.Ends.IsZero() {
		d.CommandTTL = win.Ends.Sub(now)
	}
	return d
}

// summary is the counts by outcome, in one line.
func summary(counts map[fsm.RolloutDeviceState]int) string {
	s := ""
	for _, st := range fsm.RolloutDevice.States() {
		if n := counts[st]; n > 0 {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%s %d", st, n)
		}
	}
	return s
}
