package conformtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// The rules, in the contract's order.
const (
	RulePresenceBirth            = "presence-birth"
	RuleReceiptsOrdered          = "receipts-ordered"
	RuleDedupeCommandID          = "dedupe-command-id"
	RuleDedupeOperationID        = "dedupe-operation-id"
	RuleDedupeBeforeExpiry       = "dedupe-before-expiry"
	RuleExpiredRejected          = "expired-rejected"
	RuleQueryKnown               = "query-known"
	RuleQueryByOperation         = "query-by-operation"
	RuleQueryUnknown             = "query-unknown"
	RuleMalformedIgnored         = "malformed-ignored"
	RulePresenceSessionIncreases = "presence-session-increases"
	RuleDedupeSurvivesRestart    = "dedupe-survives-restart"
)

// Rules names every rule in the order Check runs and reports them.
var Rules = []string{
	RulePresenceBirth, RuleReceiptsOrdered, RuleDedupeCommandID, RuleDedupeOperationID,
	RuleDedupeBeforeExpiry, RuleExpiredRejected, RuleQueryKnown, RuleQueryByOperation,
	RuleQueryUnknown, RuleMalformedIgnored, RulePresenceSessionIncreases, RuleDedupeSurvivesRestart,
}

// Defaults of Options.
const (
	DefaultAction  = "restart"
	DefaultTimeout = 10 * time.Second
)

// Options say which device to check and how.
type Options struct {
	// MQTT is the broker URL (tcp://, ssl://); Device the device id.
	MQTT, Device string
	// TopicRoot is the topic root (wire.DefaultTopicRoot when empty).
	TopicRoot string
	// Username and Password log in to the broker; TLS is used for ssl://
	// URLs (a nil TLS uses the system's roots).
	Username, Password string
	TLS                *tls.Config
	// Action and Params make the commands the suite sends (DefaultAction
	// and {} when empty). The device must run it (succeed or fail), not
	// reject it.
	Action string
	Params json.RawMessage
	// Timeout bounds each wait for the device (DefaultTimeout when 0).
	Timeout time.Duration
	// Restart kills the device abruptly (as kill -9 would) and starts it
	// again; it returns once the device is starting. Nil: the restart rules
	// are SKIP. ShellRestart makes one from a shell command.
	Restart func(ctx context.Context) error
	// Logf, when set, traces what the suite sends and sees.
	Logf func(format string, args ...any)
}

// Validate checks the options Check needs, before anything connects.
func (o Options) Validate() error {
	switch {
	case o.MQTT == "":
		return errors.New("the broker URL is required")
	case !wire.ValidDeviceID(o.Device):
		return fmt.Errorf("device id %q: want [A-Za-z0-9._-]{1,64}, not starting with controller-", o.Device)
	case o.Timeout < 0:
		return fmt.Errorf("timeout %s: must be positive", o.Timeout)
	}
	if len(o.Params) > 0 {
		var p map[string]any
		if err := json.Unmarshal(o.Params, &p); err != nil || p == nil {
			return fmt.Errorf("params %s: want a JSON object", o.Params)
		}
	}
	if o.Action != "" && !validAction(o.Action) {
		return fmt.Errorf("action %q: want [A-Za-z0-9._-]{1,64}", o.Action)
	}
	return nil
}

func validAction(a string) bool { return wire.IDChars(a, 64, false) }

// Outcome is a rule's verdict.
type Outcome string

const (
	Pass Outcome = "PASS"
	Fail Outcome = "FAIL"
	Skip Outcome = "SKIP"
)

// Result is one rule's verdict; Detail says, for FAIL, what the suite sent
// and what it saw, and for SKIP why the rule did not run.
type Result struct {
	Rule    string  `json:"rule"`
	Outcome Outcome `json:"outcome"`
	Detail  string  `json:"detail,omitempty"`
}

// String is the result's line: "PASS <rule>", "FAIL <rule>: <detail>" or
// "SKIP <rule>: <detail>".
func (r Result) String() string {
	if r.Detail == "" {
		return string(r.Outcome) + " " + r.Rule
	}
	return string(r.Outcome) + " " + r.Rule + ": " + r.Detail
}

// Summary is the line after the results: "N passed, N failed, N skipped".
func Summary(rs []Result) string {
	n := map[Outcome]int{}
	for _, r := range rs {
		n[r.Outcome]++
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", n[Pass], n[Fail], n[Skip])
}

// Failed reports whether any rule failed.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Outcome == Fail {
			return true
		}
	}
	return false
}

// TB is the part of testing.TB that Run uses.
type TB interface {
	Helper()
	Context() context.Context
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Run checks the device from a Go test: one t.Errorf per failed rule, the
// others logged; t.Fatalf when the suite cannot run at all.
func Run(t TB, o Options) []Result {
	t.Helper()
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	rs, err := Check(t.Context(), o)
	if err != nil {
		t.Fatalf("conformtest: %v", err)
		return nil
	}
	for _, r := range rs {
		if r.Outcome == Fail {
			t.Errorf("%s", r)
		} else {
			t.Logf("%s", r)
		}
	}
	t.Logf("%s", Summary(rs))
	return rs
}

// ShellRestart returns a Restart that runs command with /bin/sh -c, its
// output to out (nil: discarded). The command must kill the device
// abruptly and start it again in the background, then return; a background
// process should not keep out open unless out is an *os.File (the suite
// stops waiting for the output a second after the shell exits).
func ShellRestart(command string, out io.Writer) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = out, out
		if out == nil {
			cmd.Stderr = &buf
		}
		cmd.WaitDelay = time.Second
		err := cmd.Run()
		if err == nil || errors.Is(err, exec.ErrWaitDelay) {
			return nil
		}
		if s := strings.TrimSpace(buf.String()); s != "" {
			return fmt.Errorf("%q: %w: %s", command, err, shorten(s, 200))
		}
		return fmt.Errorf("%q: %w", command, err)
	}
}
