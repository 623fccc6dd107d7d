package rollout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Spec is a rollout's rules: everything that decides when a device starts
// and when the rollout ends. It is stored as canonical JSON. Its fields and
// their JSON are apiwire.RolloutSpec's, the body of POST /v1/rollouts, so
// that what is sent and what is stored cannot drift; Spec adds the methods
// that apply the rules.
type Spec apiwire.RolloutSpec

// Ramp, AbortRule and Window are the parts of a Spec (see apiwire).
type (
	Ramp      = apiwire.Ramp
	AbortRule = apiwire.AbortRule
	Window    = apiwire.MaintenanceWindow
)

// Outcomes an abort rule can name (when).
var abortWhens = []string{string(fsm.DevFailed), string(fsm.DevTimeout), string(fsm.DevRejected),
	string(fsm.DevNeedsAttention), "any"}

// Limits of the rules.
const (
	DefaultMaxPerMinute = apiwire.DefaultMaxPerMinute
	DefaultMaxInFlight  = apiwire.DefaultMaxInFlight
	MaxRetries          = 10
	maxRate             = 1_000_000
	maxWindow           = 7 * 24 * time.Hour
)

// PacingMargin stretches the interval between two starts beyond 60 s /
// rate, by 5 %: a device executes a little after its start was committed
// (the publish, its broker, its own journal), and that jitter, up to 0.4 s,
// must not make the starts the devices see exceed the rate in any window
// of 10 s.
const PacingMargin = 1.05

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", domain.ErrInvalid, fmt.Sprintf(format, args...))
}

// CheckGivenLimits refuses a request body (POST /v1/rollouts) that gives
// max_per_minute or max_in_flight as 0. Absent (or null) means the default;
// 0 given is no rate at all, not a request for the default, and Validate,
// which sees only the decoded Spec (where both are 0), cannot tell them
// apart. A Go caller's apiwire.RolloutRequest omits a zero limit
// (omitempty): the default.
func CheckGivenLimits(body []byte) error {
	var given struct {
		MaxPerMinute *int `json:"max_per_minute"`
		MaxInFlight  *int `json:"max_in_flight"`
	}
	if err := json.Unmarshal(body, &given); err != nil {
		return nil // not this check's to refuse: the body's own decoding does
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{{"max_per_minute", given.MaxPerMinute, DefaultMaxPerMinute}, {"max_in_flight", given.MaxInFlight, DefaultMaxInFlight}} {
		if f.v != nil && *f.v == 0 {
			return invalid("%s 0: from 1 to %d; leave it out for the default (%d)", f.name, maxRate, f.def)
		}
	}
	return nil
}

// Validate checks the rules and fills the defaults (a limit of 0 is one
// left out: CheckGivenLimits refuses a 0 given in a request's body).
func (s *Spec) Validate() error {
	if s.MaxPerMinute == 0 {
		s.MaxPerMinute = DefaultMaxPerMinute
	}
	if s.MaxPerMinute < 1 || s.MaxPerMinute > maxRate {
		return invalid("max_per_minute %d: from 1 to %d", s.MaxPerMinute, maxRate)
	}
	if s.MaxInFlight == 0 {
		s.MaxInFlight = DefaultMaxInFlight
	}
	if s.MaxInFlight < 1 || s.MaxInFlight > maxRate {
		return invalid("max_in_flight %d: from 1 to %d", s.MaxInFlight, maxRate)
	}
	if r := s.Ramp; r != nil {
		switch {
		case r.BasePerMinute < 1 || r.BasePerMinute > s.MaxPerMinute:
			return invalid("ramp.base_per_minute %d: from 1 to max_per_minute (%d)", r.BasePerMinute, s.MaxPerMinute)
		case !(r.Factor > 1) || r.Factor > 100:
			return invalid("ramp.factor %v: more than 1, at most 100", r.Factor)
		case r.EverySucceeded < 1:
			return invalid("ramp.every_succeeded %d: at least 1", r.EverySucceeded)
		}
	}
	for i, a := range s.Abort {
		ok := false
		for _, w := range abortWhens {
			ok = ok || a.When == w
		}
		switch {
		case !ok:
			return invalid("abort[%d].when %q: one of %s", i, a.When, strings.Join(abortWhens, ", "))
		case !(a.Percent > 0) || a.Percent > 100:
			return invalid("abort[%d].percent %v: more than 0, at most 100", i, a.Percent)
		case a.MinFinished < 0:
			return invalid("abort[%d].min_finished %d: not negative", i, a.MinFinished)
		}
	}
	if s.ExecuteAfter != nil && s.ExecuteBefore != nil && !s.ExecuteBefore.After(*s.ExecuteAfter) {
		return invalid("execute_before must be after execute_after")
	}
	for i, w := range s.Windows {
		if _, err := cronParser.Parse(w.Cron); err != nil {
			return invalid("windows[%d].cron %q: %v", i, w.Cron, err)
		}
		d, err := time.ParseDuration(w.Duration)
		if err != nil || d <= 0 || d > maxWindow {
			return invalid("windows[%d].duration %q: a Go duration, more than 0, at most %s", i, w.Duration, maxWindow)
		}
	}
	if s.Retries < 0 || s.Retries > MaxRetries {
		return invalid("retries %d: from 0 to %d", s.Retries, MaxRetries)
	}
	s.ExecuteAfter, s.ExecuteBefore = utc(s.ExecuteAfter), utc(s.ExecuteBefore)
	return nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// ParseSpec reads a stored spec.
func ParseSpec(b []byte) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("rollout spec: %w", err)
	}
	return s, nil
}

// Rate is the start rate allowed (per minute) once succeeded devices have
// succeeded: max_per_minute, or the ramp's base multiplied by its factor
// for each every_succeeded successes, up to max_per_minute.
func (s Spec) Rate(succeeded int) float64 {
	limit := float64(s.MaxPerMinute)
	if s.Ramp == nil {
		return limit
	}
	steps := float64(succeeded / s.Ramp.EverySucceeded)
	rate := float64(s.Ramp.BasePerMinute) * math.Pow(s.Ramp.Factor, steps)
	if math.IsInf(rate, 0) || math.IsNaN(rate) || rate > limit {
		return limit
	}
	return rate
}

// Interval is the least time between two starts at rate (per minute), with
// the PacingMargin: no window of 10 s holds more than rate/6 starts, even
// seen by devices that execute up to 0.4 s after their start.
// It is a whole number of milliseconds (rounded up), the resolution of the
// committed start times it is compared with.
func Interval(rate float64) time.Duration {
	return time.Duration(math.Ceil(float64(time.Minute)/rate*PacingMargin/float64(time.Millisecond))) * time.Millisecond
}

// WindowState says whether devices may start at a time: inside
// execute_after/execute_before and inside one of the recurring windows
// (when there are any).
type WindowState struct {
	Open bool
	// Ends is when the open window closes (zero: never).
	Ends time.Time
	// Opens is when the next window opens, when closed (zero: never again).
	Opens time.Time
	// Missed: execute_before has passed.
	Missed bool
}

// WindowAt is the window state at now.
func (s Spec) WindowAt(now time.Time) WindowState {
	now = now.UTC()
	var w WindowState
	if s.ExecuteBefore != nil && !now.Before(*s.ExecuteBefore) {
		w.Missed = true
		return w
	}
	if s.ExecuteAfter != nil && now.Before(*s.ExecuteAfter) {
		w.Opens = s.nextOpen(*s.ExecuteAfter)
		return w
	}
	if len(s.Windows) == 0 {
		w.Open = true
		if s.ExecuteBefore != nil {
			w.Ends = *s.ExecuteBefore
		}
		return w
	}
	w.Ends, w.Open = s.recurringAt(now)
	if w.Open {
		if s.ExecuteBefore != nil && s.ExecuteBefore.Before(w.Ends) {
			w.Ends = *s.ExecuteBefore
		}
		return w
	}
	w.Opens = s.nextOpen(now)
	return w
}

// nextOpen is the first time at or after t that devices may start (zero
// when execute_before comes first).
func (s Spec) nextOpen(t time.Time) time.Time {
	next := t
	if _, open := s.recurringAt(t); len(s.Windows) > 0 && !open {
		next = time.Time{}
		for _, win := range s.Windows {
			sched, err := cronParser.Parse(win.Cron)
			if err != nil {
				continue
			}
			if f := sched.Next(t); next.IsZero() || f.Before(next) {
				next = f
			}
		}
	}
	if s.ExecuteBefore != nil && !next.Before(*s.ExecuteBefore) {
		return time.Time{}
	}
	return next
}

// recurringAt says whether a recurring window is open at now, and until when.
func (s Spec) recurringAt(now time.Time) (time.Time, bool) {
	var ends time.Time
	open := false
	for _, win := range s.Windows {
		sched, err := cronParser.Parse(win.Cron)
		if err != nil {
			continue // validated at creation
		}
		d, _ := time.ParseDuration(win.Duration)
		// The first opening after now-d is the latest one that can still be
		// open at now: [f, f+d) holds now iff f <= now.
		if f := sched.Next(now.Add(-d)); !f.After(now) {
			if end := f.Add(d); !open || end.After(ends) {
				open, ends = true, end
			}
		}
	}
	return ends, open
}

// AbortState is one abort rule checked against the committed outcomes.
type AbortState struct {
	Rule     AbortRule
	Finished int
	Matching int
	// Share is the percent of the finished devices whose outcome is When.
	Share   float64
	Tripped bool
}

// Finished counts the devices with an outcome of their own.
func Finished(counts map[fsm.RolloutDeviceState]int) int {
	n := 0
	for st, c := range counts {
		if st.Finished() {
			n += c
		}
	}
	return n
}

// AbortStates checks every abort rule against the counts.
func (s Spec) AbortStates(counts map[fsm.RolloutDeviceState]int) []AbortState {
	finished := Finished(counts)
	out := make([]AbortState, 0, len(s.Abort))
	for _, a := range s.Abort {
		st := AbortState{Rule: a, Finished: finished}
		if a.When == "any" {
			st.Matching = finished - counts[fsm.DevSucceeded]
		} else {
			st.Matching = counts[fsm.RolloutDeviceState(a.When)]
		}
		if finished > 0 {
			st.Share = 100 * float64(st.Matching) / float64(finished)
		}
		st.Tripped = finished > 0 && finished >= a.MinFinished && float64(st.Matching)*100 >= a.Percent*float64(finished)
		out = append(out, st)
	}
	return out
}

func (a AbortState) String() string {
	return fmt.Sprintf("%s %d of %d finished (%.1f%%) reached %g%% (min_finished %d)",
		a.Rule.When, a.Matching, a.Finished, a.Share, a.Rule.Percent, a.Rule.MinFinished)
}
