package failpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// EnvVar is the environment variable FromEnv reads.
const EnvVar = "CONTROLLER_FAILPOINTS"

// The controller's failure windows (docs/design.md, "Failpoints").
const (
	// SubmitBeforeCommit: submit, before its transaction commits. error:
	// the transaction rolls back and the caller gets 503.
	SubmitBeforeCommit = "submit-before-commit"
	// SubmitAfterCommit: submit, after the commit, before the HTTP answer
	// is written. error: a 503 although the commit stands.
	SubmitAfterCommit = "submit-after-commit"
	// BeforePublish: after the fenced pending → sent (or attempt n → n+1)
	// commit, before the MQTT publish.
	BeforePublish = "before-publish"
	// AfterPublish: after the publish, before anything else is recorded.
	// error: the publish counts as unconfirmed.
	AfterPublish = "after-publish"
	// BeforeReceiptCommit: a receipt decoded, before its transaction
	// commits. error: nothing is recorded.
	BeforeReceiptCommit = "before-receipt-commit"
	// BeforeLeaseRenew: before a heartbeat extends a lease. error: that
	// renewal is skipped.
	BeforeLeaseRenew = "before-lease-renew"
	// BeforeStepInsert: the task runner, before a step's check-and-insert
	// transaction.
	BeforeStepInsert = "before-step-insert"
	// BeforeDeviceListMove: the writer, before it moves the pending
	// operations and commands into the lists' device indexes (SQLite,
	// twice a second). error: the move fails, its batch's other changes
	// commit, and the rows stay pending until a later move.
	BeforeDeviceListMove = "before-device-list-move"
)

// Known lists every point the controller defines, for Parse and FromEnv.
var Known = []string{
	SubmitBeforeCommit,
	SubmitAfterCommit,
	BeforePublish,
	AfterPublish,
	BeforeReceiptCommit,
	BeforeLeaseRenew,
	BeforeStepInsert,
	BeforeDeviceListMove,
}

// CrashExitCode is the exit status of the crash action: 128+SIGKILL.
const CrashExitCode = 137

// ErrInjected is what every injected error unwraps to.
var ErrInjected = errors.New("failpoint: injected error")

// Error is the error an armed point with the error action returns.
type Error struct {
	Name string // the point that fired
}

func (e *Error) Error() string { return "failpoint " + e.Name + ": injected error" }

// Unwrap returns ErrInjected.
func (e *Error) Unwrap() error { return ErrInjected }

type kind uint8

const (
	actSleep kind = iota + 1
	actCrash
	actError
)

type point struct {
	name  string
	spec  string // "name=action", as Armed reports it
	kind  kind
	sleep time.Duration
	limit int64 // fire at most this many times; 0: every time
	fired atomic.Int64
}

// take reports whether this hit fires the action, counting it if so. Among
// concurrent callers exactly limit ever get true.
func (p *point) take() bool {
	if p.limit == 0 {
		p.fired.Add(1)
		return true
	}
	for {
		n := p.fired.Load()
		if n >= p.limit {
			return false
		}
		if p.fired.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Set is a parsed set of armed points. It is safe for concurrent use. A nil
// *Set is valid and disarmed: every method works on it and Hit returns nil.
type Set struct {
	points map[string]*point
	order  []*point
	onHit  atomic.Pointer[func(name string)]
}

// FromEnv parses the CONTROLLER_FAILPOINTS variable (see Parse). Unset or
// empty, it returns a nil *Set.
func FromEnv(known []string) (*Set, error) {
	s, err := Parse(os.Getenv(EnvVar), known)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	return s, nil
}

// Parse parses spec, a list of name=action items separated by ';' (see the
// package documentation). known lists the point names the program defines;
// any other name is an error. The error names the offending item. A spec with
// no items gives a nil *Set.
func Parse(spec string, known []string) (*Set, error) {
	isKnown := make(map[string]bool, len(known))
	for _, k := range known {
		isKnown[k] = true
	}
	s := &Set{points: make(map[string]*point)}
	itemOf := make(map[string]int)
	for i, item := range strings.Split(spec, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		n := i + 1
		name, action, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("failpoint item %d %q: want name=action", n, item)
		}
		name, action = strings.TrimSpace(name), strings.TrimSpace(action)
		if name == "" {
			return nil, fmt.Errorf("failpoint item %d %q: missing point name before '='", n, item)
		}
		if !isKnown[name] {
			return nil, fmt.Errorf("failpoint item %d %q: unknown point %q (known: %s)",
				n, item, name, strings.Join(known, ", "))
		}
		if prev, dup := itemOf[name]; dup {
			return nil, fmt.Errorf("failpoint item %d %q: point %q is already armed by item %d", n, item, name, prev)
		}
		p, err := parseAction(name, action)
		if err != nil {
			return nil, fmt.Errorf("failpoint item %d %q: %w", n, item, err)
		}
		itemOf[name] = n
		s.points[name] = p
		s.order = append(s.order, p)
	}
	if len(s.order) == 0 {
		return nil, nil
	}
	return s, nil
}

const actionHelp = "want sleep(<duration>), crash or error, optionally prefixed by N*"

func parseAction(name, action string) (*point, error) {
	p := &point{name: name}
	var prefix string
	if count, rest, ok := strings.Cut(action, "*"); ok {
		count = strings.TrimSpace(count)
		n, err := strconv.ParseInt(count, 10, 64)
		if err != nil || n < 1 || strings.HasPrefix(count, "+") {
			return nil, fmt.Errorf("count %q in %q: want a positive integer N in N*action", count, action)
		}
		p.limit = n
		prefix = strconv.FormatInt(n, 10) + "*"
		action = strings.TrimSpace(rest)
	}
	switch {
	case action == "crash":
		p.kind = actCrash
	case action == "error":
		p.kind = actError
	case strings.HasPrefix(action, "sleep(") && strings.HasSuffix(action, ")"):
		arg := strings.TrimSpace(action[len("sleep(") : len(action)-1])
		d, err := time.ParseDuration(arg)
		if err != nil {
			return nil, fmt.Errorf("sleep duration %q: want a Go duration such as 500ms or 2s", arg)
		}
		if d <= 0 {
			return nil, fmt.Errorf("sleep duration %q: want a positive duration", arg)
		}
		p.kind = actSleep
		p.sleep = d
		action = "sleep(" + arg + ")"
	case action == "":
		return nil, fmt.Errorf("missing action (%s)", actionHelp)
	default:
		return nil, fmt.Errorf("unknown action %q (%s)", action, actionHelp)
	}
	p.spec = name + "=" + prefix + action
	return p, nil
}

// Armed returns the armed points as "name=action" strings, in spec order,
// whitespace removed: the text of the daemon's "failpoint armed:" lines.
func (s *Set) Armed() []string {
	if s == nil || len(s.order) == 0 {
		return nil
	}
	out := make([]string, len(s.order))
	for i, p := range s.order {
		out[i] = p.spec
	}
	return out
}

// WriteArmed writes one line "failpoint armed: <name>=<action>" per armed
// point to w (the daemon's stderr), in spec order.
func (s *Set) WriteArmed(w io.Writer) error {
	for _, a := range s.Armed() {
		if _, err := fmt.Fprintf(w, "failpoint armed: %s\n", a); err != nil {
			return err
		}
	}
	return nil
}

// OnHit registers f to be called, synchronously and on the goroutine that
// reached the point, each time an armed point fires its action, before the
// action runs (before a crash too). A point that is not armed, or whose N*
// count is used up, does not call it. f replaces any earlier hook; nil
// removes it. On a nil *Set OnHit does nothing.
func (s *Set) OnHit(f func(name string)) {
	if s == nil {
		return
	}
	if f == nil {
		s.onHit.Store(nil)
		return
	}
	s.onHit.Store(&f)
}

// Hits returns how many times the point name has fired its action.
func (s *Set) Hits(name string) int64 {
	if s == nil {
		return 0
	}
	if p := s.points[name]; p != nil {
		return p.fired.Load()
	}
	return 0
}

// Hit is HitContext with a context that is never done: a sleep runs its
// full duration.
func (s *Set) Hit(name string) error {
	if s == nil {
		return nil
	}
	return s.hit(context.Background(), name)
}

// HitContext marks that the calling goroutine reached the point name. It
// returns nil at once unless the point is armed and fires; then it sleeps
// (and returns nil, or the context's error if ctx is done first), crashes
// the process, or returns an *Error that wraps ErrInjected.
func (s *Set) HitContext(ctx context.Context, name string) error {
	if s == nil {
		return nil
	}
	return s.hit(ctx, name)
}

func (s *Set) hit(ctx context.Context, name string) error {
	p := s.points[name]
	if p == nil || !p.take() {
		return nil
	}
	if f := s.onHit.Load(); f != nil {
		(*f)(name)
	}
	switch p.kind {
	case actSleep:
		t := time.NewTimer(p.sleep)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("failpoint %s: sleep interrupted: %w", name, ctx.Err())
		}
	case actCrash:
		// One write(2), unbuffered, then exit: no deferred function runs.
		_, _ = os.Stderr.WriteString("failpoint crash: " + name + "\n")
		os.Exit(CrashExitCode)
	case actError:
		return &Error{Name: name}
	}
	return nil
}
