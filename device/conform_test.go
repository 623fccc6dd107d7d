package device_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/device/conformtest"
)

// conformTimeout bounds each of the suite's waits: the devices answer on
// loopback within milliseconds.
const conformTimeout = 3 * time.Second

// judge checks the suite's results: every rule in its order, the ones in
// skips SKIP (with a reason), every other one PASS. conformtest.Run already
// reported a FAIL as a test error; this also catches a SKIP where a PASS
// was due, or the reverse.
func judge(t *testing.T, rs []conformtest.Result, skips ...string) {
	t.Helper()
	require.Len(t, rs, len(conformtest.Rules))
	skip := map[string]bool{}
	for _, r := range skips {
		skip[r] = true
	}
	for i, r := range rs {
		require.Equal(t, conformtest.Rules[i], r.Rule)
		if skip[r.Rule] {
			assert.Equal(t, conformtest.Skip, r.Outcome, "%s", r)
			assert.NotEmpty(t, r.Detail, "a SKIP says why: %s", r.Rule)
		} else {
			assert.Equal(t, conformtest.Pass, r.Outcome, "%s", r)
		}
	}
}

// onceEach is a restart action that counts its runs by command_id.
type onceEach struct {
	mu   sync.Mutex
	runs map[string]int
}

func (o *onceEach) handler(_ context.Context, c *device.Command) (any, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs[c.ID]++
	// Like devicesim's, the result changes with every run, so a second run
	// would show in a repeat's answer too.
	n := 0
	for _, k := range o.runs {
		n += k
	}
	return map[string]any{"restarted": true, "runs": n}, nil
}

func (o *onceEach) twice() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []string
	for id, n := range o.runs {
		if n > 1 {
			ids = append(ids, id)
		}
	}
	return ids
}

// A device built on the library passes the conformance suite in process:
// every rule that needs no restart; every rule with a restart that is
// Device.Kill and a new Device booting from the same StateDir; and declared
// dedupe:false, the dedupe rules (and query-by-operation, which needs the
// dedupe record) are SKIP. TestLibraryConformsAcrossKill9 restarts a
// process with SIGKILL instead.
func TestLibraryConforms(t *testing.T) {
	noRestart := []string{conformtest.RulePresenceSessionIncreases, conformtest.RuleDedupeSurvivesRestart}
	for _, tc := range []struct {
		name    string
		caps    *device.Capabilities
		restart bool
		skips   []string
	}{
		{name: "conforming", skips: noRestart},
		{name: "restart by Kill", restart: true},
		{name: "dedupe false", caps: &device.Capabilities{Dedupe: false, Query: true}, skips: append([]string{
			conformtest.RuleDedupeCommandID, conformtest.RuleDedupeOperationID, conformtest.RuleDedupeBeforeExpiry,
			conformtest.RuleQueryByOperation}, noRestart...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var unused atomic.Int64
			o := e.options("dev-conform", &unused)
			runs := &onceEach{runs: map[string]int{}}
			o.Actions["restart"] = runs.handler
			o.Capabilities = tc.caps
			r := start(t, o)

			co := conformtest.Options{MQTT: e.broker.URL(), Device: "dev-conform", Timeout: conformTimeout}
			if tc.restart {
				co.Restart = func(context.Context) error {
					r.kill(t)
					r = start(t, o)
					return nil
				}
			}
			rs := conformtest.Run(t, co)
			judge(t, rs, tc.skips...)
			if tc.caps == nil {
				assert.Empty(t, runs.twice(), "no command ran twice")
			}
		})
	}
}

// The whole suite, restart rules included, against a device process (this
// test binary in child mode, crash_test.go's childMain) that the suite's
// Restart kills with SIGKILL and starts again on the same state directory:
// every rule passes, and the device's own execution log (one durable line
// per run) shows that no command ran twice.
func TestLibraryConformsAcrossKill9(t *testing.T) {
	e := newEnv(t)
	c, lines := child(t, e, "normal")
	expectLine(t, lines, "ONLINE")
	restarts := 0
	restart := func(context.Context) error {
		// Called by the suite on the test's goroutine: require may stop it.
		killChild(t, c)
		c, _ = child(t, e, "normal") // the suite waits for its new birth
		restarts++
		return nil
	}

	rs := conformtest.Run(t, conformtest.Options{MQTT: e.broker.URL(), Device: "dev-1", Timeout: conformTimeout, Restart: restart})
	judge(t, rs)
	assert.Equal(t, 1, restarts)
	ran := runLines(t, e.dir)
	require.NotEmpty(t, ran)
	seen := map[string]bool{}
	for _, id := range ran {
		assert.False(t, seen[id], "%s ran twice", id)
		seen[id] = true
	}
}
