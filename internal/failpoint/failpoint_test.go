package failpoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/failpoint"
)

// TestMain doubles as the crash child: with FP_CHILD=1 the test binary arms
// FP_SPEC, hits the points listed in FP_HITS in order, printing each
// result, and exits 0 only if it survives.
func TestMain(m *testing.M) {
	if os.Getenv("FP_CHILD") == "1" {
		os.Exit(crashChild())
	}
	os.Exit(m.Run())
}

func crashChild() int {
	defer fmt.Println("deferred cleanup ran") // must never print: a crash skips it
	s, err := failpoint.Parse(os.Getenv("FP_SPEC"), failpoint.Known)
	if err != nil {
		fmt.Println("parse:", err)
		return 2
	}
	for _, name := range strings.Split(os.Getenv("FP_HITS"), ",") {
		fmt.Printf("%s: %v\n", name, s.Hit(name))
	}
	fmt.Println("survived")
	return 0
}

func mustParse(t *testing.T, spec string) *failpoint.Set {
	t.Helper()
	s, err := failpoint.Parse(spec, failpoint.Known)
	require.NoError(t, err)
	require.NotNil(t, s)
	return s
}

func TestKnown(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{
		"submit-before-commit", "submit-after-commit", "before-publish", "after-publish",
		"before-receipt-commit", "before-lease-renew", "before-step-insert", "before-device-list-move",
	}, failpoint.Known)
}

func TestParseGood(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec  string
		armed []string
	}{
		{"before-publish=crash", []string{"before-publish=crash"}},
		{"before-publish=1*crash", []string{"before-publish=1*crash"}},
		{"after-publish=3*error", []string{"after-publish=3*error"}},
		{"before-lease-renew=2*sleep(1s)", []string{"before-lease-renew=2*sleep(1s)"}},
		{"before-lease-renew=sleep(1.5s)", []string{"before-lease-renew=sleep(1.5s)"}},
		{"before-lease-renew=sleep(250ms)", []string{"before-lease-renew=sleep(250ms)"}},
		{
			"submit-before-commit=error;submit-after-commit=1*error;before-step-insert=crash",
			[]string{"submit-before-commit=error", "submit-after-commit=1*error", "before-step-insert=crash"},
		},
		{
			"  before-publish = 1 * crash ; ; after-publish=error ;\n before-receipt-commit=sleep( 2s ) ; ",
			[]string{"before-publish=1*crash", "after-publish=error", "before-receipt-commit=sleep(2s)"},
		},
		{";before-publish=error;", []string{"before-publish=error"}},
	}
	for _, c := range cases {
		s, err := failpoint.Parse(c.spec, failpoint.Known)
		require.NoError(t, err, c.spec)
		require.Equal(t, c.armed, s.Armed(), c.spec)
	}
}

func TestParseEmptyIsDisarmed(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"", " ", ";", " ; ;\t", "\n"} {
		s, err := failpoint.Parse(spec, failpoint.Known)
		require.NoError(t, err, "%q", spec)
		require.Nil(t, s, "%q", spec)
	}
}

func TestParseBad(t *testing.T) {
	t.Parallel()
	const help = "want sleep(<duration>), crash or error, optionally prefixed by N*"
	cases := map[string]string{
		"before-publish":                          `failpoint item 1 "before-publish": want name=action`,
		"=crash":                                  `failpoint item 1 "=crash": missing point name before '='`,
		"before-publish=":                         `failpoint item 1 "before-publish=": missing action (` + help + `)`,
		"before-publish=panic":                    `failpoint item 1 "before-publish=panic": unknown action "panic" (` + help + `)`,
		"before-publish=CRASH":                    `failpoint item 1 "before-publish=CRASH": unknown action "CRASH" (` + help + `)`,
		"before-publish=sleep":                    `failpoint item 1 "before-publish=sleep": unknown action "sleep" (` + help + `)`,
		"before-publish=sleep(1s":                 `failpoint item 1 "before-publish=sleep(1s": unknown action "sleep(1s" (` + help + `)`,
		"before-publish=sleep(soon)":              `failpoint item 1 "before-publish=sleep(soon)": sleep duration "soon": want a Go duration such as 500ms or 2s`,
		"before-publish=sleep(5)":                 `failpoint item 1 "before-publish=sleep(5)": sleep duration "5": want a Go duration such as 500ms or 2s`,
		"before-publish=sleep()":                  `failpoint item 1 "before-publish=sleep()": sleep duration "": want a Go duration such as 500ms or 2s`,
		"before-publish=sleep(-1s)":               `failpoint item 1 "before-publish=sleep(-1s)": sleep duration "-1s": want a positive duration`,
		"before-publish=sleep(0s)":                `failpoint item 1 "before-publish=sleep(0s)": sleep duration "0s": want a positive duration`,
		"before-publish=0*crash":                  `failpoint item 1 "before-publish=0*crash": count "0" in "0*crash": want a positive integer N in N*action`,
		"before-publish=-1*crash":                 `failpoint item 1 "before-publish=-1*crash": count "-1" in "-1*crash": want a positive integer N in N*action`,
		"before-publish=+1*crash":                 `failpoint item 1 "before-publish=+1*crash": count "+1" in "+1*crash": want a positive integer N in N*action`,
		"before-publish=*crash":                   `failpoint item 1 "before-publish=*crash": count "" in "*crash": want a positive integer N in N*action`,
		"before-publish=x*crash":                  `failpoint item 1 "before-publish=x*crash": count "x" in "x*crash": want a positive integer N in N*action`,
		"before-publish=1*2*crash":                `failpoint item 1 "before-publish=1*2*crash": unknown action "2*crash" (` + help + `)`,
		"before-publish=3*":                       `failpoint item 1 "before-publish=3*": missing action (` + help + `)`,
		"after-publish=error;before-publsh=crash": `failpoint item 2 "before-publsh=crash": unknown point "before-publsh" (known: ` + strings.Join(failpoint.Known, ", ") + `)`,
		"after-publish=error;after-publish=crash": `failpoint item 2 "after-publish=crash": point "after-publish" is already armed by item 1`,
	}
	for spec, want := range cases {
		s, err := failpoint.Parse(spec, failpoint.Known)
		require.EqualError(t, err, want, spec)
		require.Nil(t, s)
	}
}

func TestParseOnlyKnownNames(t *testing.T) {
	t.Parallel()
	s, err := failpoint.Parse("my-point=error", []string{"my-point"})
	require.NoError(t, err)
	require.ErrorIs(t, s.Hit("my-point"), failpoint.ErrInjected)

	_, err = failpoint.Parse("my-point=error", nil)
	require.EqualError(t, err, `failpoint item 1 "my-point=error": unknown point "my-point" (known: )`)
}

func TestFromEnv(t *testing.T) { // not parallel: t.Setenv
	t.Setenv(failpoint.EnvVar, "")
	s, err := failpoint.FromEnv(failpoint.Known)
	require.NoError(t, err)
	require.Nil(t, s)

	t.Setenv(failpoint.EnvVar, "before-publish=1*crash; after-publish=error")
	s, err = failpoint.FromEnv(failpoint.Known)
	require.NoError(t, err)
	require.Equal(t, []string{"before-publish=1*crash", "after-publish=error"}, s.Armed())

	t.Setenv(failpoint.EnvVar, "before-publish=explode")
	s, err = failpoint.FromEnv(failpoint.Known)
	require.Nil(t, s)
	require.EqualError(t, err, `CONTROLLER_FAILPOINTS: failpoint item 1 "before-publish=explode": unknown action "explode" `+
		`(want sleep(<duration>), crash or error, optionally prefixed by N*)`)
}

func TestWriteArmed(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	s := mustParse(t, "before-publish = 1*crash;before-lease-renew=sleep(15s)")
	require.NoError(t, s.WriteArmed(&buf))
	require.Equal(t, "failpoint armed: before-publish=1*crash\nfailpoint armed: before-lease-renew=sleep(15s)\n", buf.String())

	buf.Reset()
	var none *failpoint.Set
	require.NoError(t, none.WriteArmed(&buf))
	require.Empty(t, buf.String())
}

func TestNilSetIsDisarmed(t *testing.T) {
	t.Parallel()
	var s *failpoint.Set
	for _, name := range slices.Concat(failpoint.Known, []string{"anything"}) {
		require.NoError(t, s.Hit(name))
		require.NoError(t, s.HitContext(context.Background(), name))
		require.Zero(t, s.Hits(name))
	}
	require.Nil(t, s.Armed())
	s.OnHit(func(string) { t.Error("hook on a nil set") })

	var zero failpoint.Set // the zero value is disarmed too
	require.NoError(t, zero.Hit(failpoint.BeforePublish))
	require.Nil(t, zero.Armed())
}

func TestUnarmedPointOfArmedSet(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "after-publish=error")
	s.OnHit(func(name string) { t.Errorf("hook for %s", name) })
	require.NoError(t, s.Hit(failpoint.BeforePublish))
	require.NoError(t, s.Hit("not-a-point"))
	require.Zero(t, s.Hits(failpoint.BeforePublish))
}

func TestErrorAction(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "submit-before-commit=error")
	for i := 1; i <= 3; i++ {
		err := fmt.Errorf("submit op-1: %w", s.Hit(failpoint.SubmitBeforeCommit))
		require.ErrorIs(t, err, failpoint.ErrInjected)
		var fe *failpoint.Error
		require.ErrorAs(t, err, &fe)
		require.Equal(t, failpoint.SubmitBeforeCommit, fe.Name)
		require.EqualError(t, err, "submit op-1: failpoint submit-before-commit: injected error")
		require.EqualValues(t, i, s.Hits(failpoint.SubmitBeforeCommit))
	}
}

func TestCountedErrorGoesInert(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "after-publish=2*error")
	var hooked []string
	s.OnHit(func(name string) { hooked = append(hooked, name) })
	require.ErrorIs(t, s.Hit(failpoint.AfterPublish), failpoint.ErrInjected)
	require.ErrorIs(t, s.HitContext(context.Background(), failpoint.AfterPublish), failpoint.ErrInjected)
	for range 5 {
		require.NoError(t, s.Hit(failpoint.AfterPublish))
	}
	require.EqualValues(t, 2, s.Hits(failpoint.AfterPublish))
	require.Equal(t, []string{failpoint.AfterPublish, failpoint.AfterPublish}, hooked)

	s.OnHit(nil) // removing the hook
	require.NoError(t, s.Hit(failpoint.AfterPublish))
}

// Exactly N of many goroutines reaching a point at once fire it.
func TestCountUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		spec string
		want int64
	}{
		{"before-receipt-commit=3*error", 3},
		{"before-receipt-commit=1*error", 1},
		{"before-receipt-commit=error", 256},
		{"before-receipt-commit=2*sleep(1ns)", 2},
	} {
		s := mustParse(t, c.spec)
		var hooked atomic.Int64
		s.OnHit(func(string) { hooked.Add(1) })
		var (
			start  = make(chan struct{})
			wg     sync.WaitGroup
			errs   atomic.Int64
			others atomic.Int64
		)
		for range 256 {
			wg.Go(func() {
				<-start
				err := s.Hit(failpoint.BeforeReceiptCommit)
				switch {
				case errors.Is(err, failpoint.ErrInjected):
					errs.Add(1)
				case err != nil:
					others.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Zero(t, others.Load(), c.spec)
		if strings.Contains(c.spec, "error") {
			require.Equal(t, c.want, errs.Load(), c.spec)
		}
		require.Equal(t, c.want, s.Hits(failpoint.BeforeReceiptCommit), c.spec)
		require.Equal(t, c.want, hooked.Load(), c.spec)
	}
}

// A sleeping point holds only the goroutine that reached it: others, at the
// same point (its one firing used up) or elsewhere, go on.
func TestSleepPausesOnlyTheCaller(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "before-lease-renew=1*sleep(1h);after-publish=error")
	reached := make(chan string, 1)
	s.OnHit(func(name string) {
		if name == failpoint.BeforeLeaseRenew {
			reached <- name
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.HitContext(ctx, failpoint.BeforeLeaseRenew) }()
	require.Equal(t, failpoint.BeforeLeaseRenew, <-reached) // it fired and is now sleeping

	// Meanwhile everyone else proceeds.
	require.NoError(t, s.Hit(failpoint.BeforeLeaseRenew)) // count used up: inert
	require.ErrorIs(t, s.Hit(failpoint.AfterPublish), failpoint.ErrInjected)
	other := make(chan error, 1)
	go func() { other <- s.Hit(failpoint.BeforeLeaseRenew) }()
	require.NoError(t, <-other)
	select {
	case err := <-done:
		t.Fatalf("the sleeper returned early: %v", err)
	default:
	}

	// Cancelling its context ends the pause, with the context's error.
	cancel()
	err := <-done
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, failpoint.ErrInjected)
	require.EqualError(t, err, "failpoint before-lease-renew: sleep interrupted: context canceled")
	require.EqualValues(t, 1, s.Hits(failpoint.BeforeLeaseRenew))
}

func TestSleepLasts(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "before-step-insert=sleep(30ms)")
	start := time.Now()
	require.NoError(t, s.Hit(failpoint.BeforeStepInsert))
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	start = time.Now()
	require.NoError(t, s.HitContext(ctx, failpoint.BeforeStepInsert))
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
}

// The crash action, in a child process: exit status exactly 137, nothing
// after the point runs, no deferred function runs.
func TestCrash(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, spec, hits string
		stdout           string // what the child printed before dying
	}{
		{"crash", "before-publish=crash", "before-publish", ""},
		{"1*crash", "before-publish=1*crash", "before-publish", ""},
		{
			"after other points",
			"before-publish=1*error;after-publish=crash", "before-publish,before-publish,after-publish,before-publish",
			"before-publish: failpoint before-publish: injected error\nbefore-publish: <nil>\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "FP_CHILD=1", "FP_SPEC="+c.spec, "FP_HITS="+c.hits)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()

			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "stdout %q stderr %q", stdout.String(), stderr.String())
			require.Equal(t, failpoint.CrashExitCode, ee.ExitCode())
			require.EqualError(t, err, "exit status 137")
			require.Equal(t, c.stdout, stdout.String())
			require.Contains(t, stderr.String(), "failpoint crash: ")
		})
	}

	// The same child survives when the point is not armed (the harness
	// itself works, so the cases above can fail).
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FP_CHILD=1", "FP_SPEC=after-publish=crash", "FP_HITS=before-publish")
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, "before-publish: <nil>\nsurvived\ndeferred cleanup ran\n", string(out))
}

var (
	sink     error
	disarmed *failpoint.Set // what FromEnv gives without the variable
	armed    *failpoint.Set
)

// BenchmarkHitDisarmed measures a point in a program with no failpoints
// armed: Hit on a nil *Set, inlined to a nil check.
func BenchmarkHitDisarmed(b *testing.B) {
	for i := 0; i < b.N; i++ {
		sink = disarmed.Hit(failpoint.BeforePublish)
	}
}

// BenchmarkHitOtherPointArmed measures a point that is not armed while
// another one is: a map lookup.
func BenchmarkHitOtherPointArmed(b *testing.B) {
	armed, _ = failpoint.Parse("after-publish=error", failpoint.Known)
	for i := 0; i < b.N; i++ {
		sink = armed.Hit(failpoint.BeforePublish)
	}
}
