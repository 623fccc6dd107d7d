package conformtest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fleetctl/fleetctl/device/conformtest"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite catches what it claims: for each rule, a device that breaks
// that rule fails it, and a correct device passes every rule. Each case
// pins every rule's outcome, so a flaw that trips more rules than its own
// says so here (the ones listed after the first), and a false FAIL on a
// correct rule breaks the test.
func TestSuiteCatchesEveryFlaw(t *testing.T) {
	t.Parallel()
	broker := testenv.StartBroker(t)
	cases := []struct {
		name    string
		flaws   flaws
		restart bool
		fails   []string // the rule the flaw breaks first, then any it breaks too
		skips   []string
	}{
		{name: "correct", restart: true},
		{name: "correct-no-restart", skips: []string{conformtest.RulePresenceSessionIncreases, conformtest.RuleDedupeSurvivesRestart}},
		{name: "legacy", flaws: flaws{legacy: true}, restart: true, skips: []string{
			conformtest.RuleDedupeCommandID, conformtest.RuleDedupeOperationID, conformtest.RuleDedupeBeforeExpiry,
			conformtest.RuleQueryKnown, conformtest.RuleQueryByOperation, conformtest.RuleQueryUnknown,
			conformtest.RuleDedupeSurvivesRestart}},

		{name: "birth-not-retained", flaws: flaws{birthNotRetained: true}, restart: true,
			fails: []string{conformtest.RulePresenceBirth}},
		{name: "seq-from-zero", flaws: flaws{seqFromZero: true}, restart: true,
			fails: []string{conformtest.RuleReceiptsOrdered}},
		// Without the lookup by command_id every repeat runs again: after
		// expiry it is rejected instead, and after a restart it runs.
		{name: "reruns-repeats", flaws: flaws{rerunCommandID: true}, restart: true,
			fails: []string{conformtest.RuleDedupeCommandID, conformtest.RuleDedupeBeforeExpiry, conformtest.RuleDedupeSurvivesRestart}},
		// The restart rule sends a new command_id of an operation that ran too.
		{name: "no-operation-check", flaws: flaws{noOperationCheck: true}, restart: true,
			fails: []string{conformtest.RuleDedupeOperationID, conformtest.RuleDedupeSurvivesRestart}},
		{name: "expiry-before-dedupe", flaws: flaws{expiryBeforeDedupe: true}, restart: true,
			fails: []string{conformtest.RuleDedupeBeforeExpiry}},
		{name: "runs-expired", flaws: flaws{noExpiryCheck: true}, restart: true,
			fails: []string{conformtest.RuleExpiredRejected}},
		{name: "stale-query-answer", flaws: flaws{staleQueryKnown: true}, restart: true,
			fails: []string{conformtest.RuleQueryKnown}},
		{name: "query-ignores-operation", flaws: flaws{queryIgnoresOperation: true}, restart: true,
			fails: []string{conformtest.RuleQueryByOperation}},
		{name: "unknown-with-seq-1", flaws: flaws{unknownWithSeq1: true}, restart: true,
			fails: []string{conformtest.RuleQueryUnknown}},
		{name: "crashes-on-malformed", flaws: flaws{crashOnMalformed: true}, restart: true,
			fails: []string{conformtest.RuleMalformedIgnored}},
		{name: "same-session", flaws: flaws{sameSession: true}, restart: true,
			fails: []string{conformtest.RulePresenceSessionIncreases}},
		{name: "volatile-record", flaws: flaws{volatileRecord: true}, restart: true,
			fails: []string{conformtest.RuleDedupeSurvivesRestart}},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		if len(tc.fails) > 0 {
			covered[tc.fails[0]] = true
		}
	}
	for _, rule := range conformtest.Rules {
		require.True(t, covered[rule], "no broken device proves %s", rule)
	}
	// The checks mostly wait on the devices: run them all at once (t.Parallel
	// would run two at a time on two cores), then judge each case.
	type outcome struct {
		rs  []conformtest.Result
		err error
	}
	outcomes := make([]outcome, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		id := "ref-" + tc.name
		dev := startRefDevice(t, broker.URL(), id, tc.flaws)
		o := conformtest.Options{MQTT: broker.URL(), Device: id, Timeout: 3 * time.Second}
		if tc.restart {
			o.Restart = func(context.Context) error { dev.restart(); return nil }
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs, err := conformtest.Check(t.Context(), o)
			outcomes[i] = outcome{rs, err}
		}()
	}
	wg.Wait()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := outcomes[i].rs, outcomes[i].err
			require.NoError(t, err)
			require.Len(t, rs, len(conformtest.Rules))
			want := map[string]conformtest.Outcome{}
			for _, r := range tc.fails {
				want[r] = conformtest.Fail
			}
			for _, r := range tc.skips {
				want[r] = conformtest.Skip
			}
			var lines []string
			for _, r := range rs {
				lines = append(lines, r.String())
			}
			all := strings.Join(lines, "\n")
			for i, r := range rs {
				require.Equal(t, conformtest.Rules[i], r.Rule)
				w := want[r.Rule]
				if w == "" {
					w = conformtest.Pass
				}
				require.Equal(t, w, r.Outcome, "%s\n\nall:\n%s", r, all)
				if r.Outcome != conformtest.Pass {
					require.NotEmpty(t, r.Detail, r.Rule)
				}
			}
			t.Logf("%s\n%s", all, conformtest.Summary(rs))
		})
	}
}

// recordingTB is the part of testing.TB that Run uses, recording.
type recordingTB struct {
	*testing.T
	mu     sync.Mutex
	errors []string
	logs   []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// Run, the Go test helper, reports each failed rule with t.Errorf and the
// rest with t.Logf.
func TestRunReportsFailedRulesAsErrors(t *testing.T) {
	t.Parallel()
	broker := testenv.StartBroker(t)
	startRefDevice(t, broker.URL(), "ref-run", flaws{unknownWithSeq1: true})
	tb := &recordingTB{T: t}
	rs := conformtest.Run(tb, conformtest.Options{MQTT: broker.URL(), Device: "ref-run", Timeout: 3 * time.Second})
	require.Len(t, rs, len(conformtest.Rules))
	require.Len(t, tb.errors, 1, "%q", tb.errors)
	require.True(t, strings.HasPrefix(tb.errors[0], "FAIL query-unknown: "), tb.errors[0])
	require.Contains(t, tb.logs, "PASS presence-birth")
	require.Contains(t, tb.logs, "SKIP dedupe-survives-restart: needs --restart, a command that kills the device abruptly and starts it again")
	require.Contains(t, tb.logs, "9 passed, 1 failed, 2 skipped")
}

func TestShellRestart(t *testing.T) {
	t.Parallel()
	require.NoError(t, conformtest.ShellRestart("true", nil)(t.Context()))
	err := conformtest.ShellRestart("echo no such device >&2; exit 3", nil)(t.Context())
	require.ErrorContains(t, err, "exit status 3")
	require.ErrorContains(t, err, "no such device")
	var out strings.Builder
	require.NoError(t, conformtest.ShellRestart("echo restarted", &out)(t.Context()))
	require.Equal(t, "restarted\n", out.String())
}
