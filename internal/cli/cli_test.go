package cli

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
)

// run runs the controller's command line in-process.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb strings.Builder
	code = Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// help returns a command's --help.
func help(t *testing.T, path ...string) string {
	t.Helper()
	code, out, stderr := run(t, append(path, "--help")...)
	require.Equal(t, 0, code, stderr)
	return out
}

// leaves are the runnable commands of the tree without subcommands, by
// path without the root ("task get").
func leaves() map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.HasSubCommands() {
			out[strings.TrimPrefix(c.CommandPath(), "controller ")] = c
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRoot())
	return out
}

// clientGroups are the groups that talk to the HTTP API.
var clientGroups = []string{"op", "cmd", "device", "task", "grant", "rollout"}

func isClient(path string) bool {
	group, _, _ := strings.Cut(path, " ")
	for _, g := range clientGroups {
		if g == group {
			return true
		}
	}
	return false
}

var (
	clientOnly = []string{"--server", "--token", "--json"}
	serveOnly  = []string{"--db", "--mqtt", "--http", "--topic-root", "--ack-timeout", "--command-ttl", "--max-attempts",
		"--offline", "--policy", "--lease-ttl", "--instance-id", "--tokens", "--four-eyes", "--sweep-interval", "--log-level",
		"--receipt-rate", "--http-host"}
)

func hasFlag(help, flag string) bool {
	for _, l := range strings.Split(help, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && (f[0] == flag || len(f) > 1 && strings.TrimSuffix(f[0], ",") != f[0] && f[1] == flag) {
			return true
		}
	}
	return false
}

func TestHelpKeepsServeAndClientFlagsApart(t *testing.T) {
	t.Parallel()
	serve := help(t, "serve")
	for _, f := range clientOnly {
		require.False(t, hasFlag(serve, f), "serve --help shows %s:\n%s", f, serve)
	}
	for _, f := range serveOnly {
		require.True(t, hasFlag(serve, f), "serve --help lacks %s", f)
	}
	n := 0
	for path := range leaves() {
		h := help(t, strings.Fields(path)...)
		if path == "mcp" {
			// The MCP server is a client of the API too (--server, --token),
			// but it speaks MCP on stdout: no --json.
			require.True(t, hasFlag(h, "--server") && hasFlag(h, "--token") && !hasFlag(h, "--json"), h)
			for _, f := range serveOnly {
				require.False(t, hasFlag(h, f) && f != "--log-level", "%s --help shows %s:\n%s", path, f, h)
			}
			continue
		}
		if !isClient(path) {
			for _, f := range clientOnly {
				require.False(t, hasFlag(h, f), "%s --help shows %s", path, f)
			}
			continue
		}
		n++
		for _, f := range clientOnly {
			require.True(t, hasFlag(h, f), "%s --help lacks %s:\n%s", path, f, h)
		}
		for _, f := range serveOnly {
			require.False(t, hasFlag(h, f), "%s --help shows %s:\n%s", path, f, h)
		}
	}
	require.GreaterOrEqual(t, n, 15)
	root := help(t)
	for _, f := range append(clientOnly, serveOnly...) {
		require.False(t, hasFlag(root, f), "controller --help shows %s", f)
	}
}

func TestEveryFlagNamesItsVariable(t *testing.T) {
	t.Parallel()
	for path, c := range leaves() {
		h := help(t, strings.Fields(path)...)
		n := 0
		check := func(f *pflag.Flag) {
			n++
			if f.Name == "help" {
				return
			}
			env := "(env " + cmdline.EnvName(EnvPrefix, f.Name) + ")"
			require.Equal(t, 1, strings.Count(f.Usage, env), "%s --%s: %q", path, f.Name, f.Usage)
			require.Contains(t, h, env, "%s --help", path)
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		if isClient(path) {
			require.GreaterOrEqual(t, n, 3, path) // --server, --token, --json at least
		}
	}
	require.Contains(t, help(t, "serve"), "ask the device after this long with no final receipt (env CONTROLLER_ACK_TIMEOUT) (default 5s)")
	require.Contains(t, help(t, "task", "get"), "(env CONTROLLER_TOKEN)")
}

func TestExamples(t *testing.T) {
	t.Parallel()
	all := leaves()
	for _, path := range []string{"serve", "op submit", "op get", "cmd resolve", "task create", "task plan", "task approve",
		"task reject", "grant add", "mcp", "verify", "report"} {
		require.NotEmpty(t, all[path].Example, path)
		require.Contains(t, help(t, strings.Fields(path)...), "Examples:\n  ", path)
	}
	n, err := cmdline.CheckExamples(NewRoot, EnvPrefix)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 15)
}

// fakeAPI answers every route the client subcommands use with a fixed
// record, and keeps the requests.
type fakeAPI struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []fakeReq
}

type fakeReq struct {
	Method, Path, Query, Auth string
	Body                      map[string]any
}

func (f *fakeAPI) last() fakeReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reqs[len(f.reqs)-1]
}

var (
	at0     = time.Date(2025, 6, 1, 2, 0, 0, 0, time.UTC)
	at1     = at0.Add(2 * time.Hour)
	opID    = "task-88:restart-device:device-1001:approval-v3"
	fakeOp  = apiwire.Operation{OperationID: "t:s:device-1:v1", Status: "succeeded", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`), Result: json.RawMessage(`{"ok":true}`), CommandID: "c-1", CommandIDs: []string{"c-1"}, Attempt: 1, RequestHash: "abc", StartedAt: at0, UpdatedAt: at0}
	fakeCmd = apiwire.Command{CommandID: "c-1", OperationID: "t:s:device-1:v1", DeviceID: "device-1", Action: "restart", Params: json.RawMessage(`{}`), Status: "succeeded", Result: json.RawMessage(`{"ok":true}`), Receipts: []apiwire.Receipt{{Status: "succeeded", Seq: 3, Effect: "applied"}}, Events: []apiwire.Event{{From: "pending", To: "sent"}}}
	fakeDev = apiwire.Device{DeviceID: "device-1", Online: true, Confirmed: true, Session: 4, Capabilities: apiwire.Caps{Dedupe: true, Query: true}, LastSeenAt: &at0}
	fakeTsk = apiwire.TaskView{TaskID: "task-88", Status: "failed", Reason: "step_failed:restart-device", Version: 3, PlanHash: "9f86d081", Requester: "alice",
		CreatedBy: "alice", ExecuteAfter: &at0, ExecuteBefore: &at1,
		Approval: &apiwire.ApprovalV{TaskID: "task-88", Version: 3, Approver: "bob", ApprovedAt: at0, PlanHash: "9f86d081"},
		Steps:    []apiwire.TaskStep{{Step: apiwire.Step{Step: "restart-device", Action: "restart", Target: "device-1001", Params: json.RawMessage(`{"why":"stuck"}`)}, OperationID: &opID}},
		History: []apiwire.HistoryEv{{At: at0, Principal: "alice", Action: "create", To: "waiting_approval", Version: 1},
			{At: at1, Principal: "bob", Action: "approve", From: "waiting_approval", To: "approved", Version: 3}}}
	fakeApp   = apiwire.ApprovalV{TaskID: "task-88", Version: 3, Approver: "bob", ApprovedAt: at0, PlanHash: "9f86d081"}
	fakeGrant = apiwire.GrantView{GrantID: "g-1", Principal: "agent", Action: "restart", Devices: "device-*", CreatedBy: "admin", CreatedAt: at0, RevokedAt: &at1}
	fakeRoll  = apiwire.RolloutView{RolloutID: "fw-42", Status: "succeeded", Version: 1, Action: "set-config", Params: json.RawMessage(`{"fw":"4.2"}`),
		Devices: json.RawMessage(`"device-*"`), DevicesTotal: 2, Counts: map[string]int{"succeeded": 2}, Finished: 2,
		RolloutSpec: apiwire.RolloutSpec{MaxPerMinute: 600, MaxInFlight: 100}, CreatedBy: "alice", CreatedAt: at0,
		History: []apiwire.HistoryEv{{At: at0, Principal: "alice", Action: "create", To: "scheduled"}}}
	fakeRDev = apiwire.RolloutDeviceView{DeviceID: "device-1", OperationID: "fw-42:rollout:device-1:v1", Status: "succeeded", Attempts: 1}
)

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{}
	mux := http.NewServeMux()
	answer := func(pattern string, status int, v any) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			req := fakeReq{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Auth: r.Header.Get("Authorization")}
			if b, _ := io.ReadAll(r.Body); len(b) > 0 {
				require.NoError(t, json.Unmarshal(b, &req.Body))
			}
			f.mu.Lock()
			f.reqs = append(f.reqs, req)
			f.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(v)
		})
	}
	answer("POST /v1/operations", 201, fakeOp)
	answer("GET /v1/operations/{id}", 200, fakeOp)
	answer("GET /v1/operations", 200, []apiwire.Operation{fakeOp})
	answer("GET /v1/commands", 200, []apiwire.Command{fakeCmd})
	answer("GET /v1/commands/{id}", 200, fakeCmd)
	answer("POST /v1/commands/c-1/cancel", 200, fakeCmd)
	answer("POST /v1/commands/{id}/cancel", 409, apiwire.Error{Code: "already_published", Message: "published"})
	answer("POST /v1/commands/{id}/resolve", 200, fakeCmd)
	answer("GET /v1/devices", 200, []apiwire.Device{fakeDev})
	answer("GET /v1/devices/{id}", 200, fakeDev)
	answer("POST /v1/devices/{id}/presence/reset", 200, fakeDev)
	answer("POST /v1/tasks", 201, fakeTsk)
	answer("PUT /v1/tasks/{id}/plan", 200, fakeTsk)
	answer("POST /v1/tasks/{id}/approvals", 201, fakeApp)
	answer("POST /v1/tasks/{id}/rejections", 200, fakeTsk)
	answer("GET /v1/tasks/{id}", 200, fakeTsk)
	answer("POST /v1/grants", 200, fakeGrant)
	answer("GET /v1/grants", 200, []apiwire.GrantView{fakeGrant})
	answer("DELETE /v1/grants/{id}", 200, fakeGrant)
	answer("POST /v1/rollouts", 201, fakeRoll)
	answer("GET /v1/rollouts", 200, []apiwire.RolloutView{fakeRoll})
	answer("GET /v1/rollouts/{id}", 200, fakeRoll)
	answer("GET /v1/rollouts/{id}/devices", 200, []apiwire.RolloutDeviceView{fakeRDev})
	answer("POST /v1/rollouts/{id}/pause", 200, fakeRoll)
	answer("POST /v1/rollouts/{id}/resume", 200, fakeRoll)
	answer("POST /v1/rollouts/{id}/cancel", 200, fakeRoll)
	answer("POST /v1/rollouts/{id}/approvals", 201, fakeRoll)
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

const steps = `[{"step":"restart-device","action":"restart","target":"device-1001","params":{"why":"stuck"}}]`

// clientCases run every client subcommand once; want is in the text view.
var clientCases = map[string]struct {
	args []string
	want []string
}{
	"op submit": {[]string{"--target", "device-1", "--action", "restart", "--task", "t", "--step", "s", "--business-version", "v1"},
		[]string{"operation", "t:s:device-1:v1", "succeeded  [new]"}},
	"op get":                {[]string{"t:s:device-1:v1"}, []string{"status", "succeeded", `{"ok":true}`}},
	"op list":               {[]string{"--status", "open"}, []string{"OPERATION", "SUBMITTED BY", "t:s:device-1:v1", "succeeded"}},
	"cmd list":              {[]string{"--status", "needs_attention"}, []string{"COMMAND", "c-1", "device-1"}},
	"cmd get":               {[]string{"c-1"}, []string{"receipts:", "applied", "pending → sent"}},
	"cmd cancel":            {[]string{"c-1"}, []string{"command", "c-1", "status"}},
	"cmd resolve":           {[]string{"c-1", "--outcome", "succeeded", "--note", "seen"}, []string{"command", "c-1"}},
	"device list":           {nil, []string{"DEVICE", "device-1"}},
	"device get":            {[]string{"device-1"}, []string{"DEVICE", "device-1"}},
	"device reset-presence": {[]string{"device-1"}, []string{"STALE PRESENCE", "device-1"}},
	"task create":           {[]string{"task-88", "--steps", steps}, []string{"task", "task-88", "[new]", opID}},
	"task plan":             {[]string{"task-88", "--steps", steps}, []string{"plan hash", "9f86d081"}},
	"task approve": {[]string{"task-88", "--version", "3"},
		[]string{"approved version", "3  [new]", "approver", "bob"}},
	"task reject":  {[]string{"task-88", "--reason", "no"}, []string{"status", "failed"}},
	"task get":     {[]string{"task-88"}, []string{"history:", "approve"}},
	"grant add":    {[]string{"--principal", "agent", "--action", "restart", "--devices", "device-*"}, []string{"grant", "g-1", "principal", "agent"}},
	"grant list":   {[]string{"--all"}, []string{"GRANT", "g-1", "device-*"}},
	"grant revoke": {[]string{"g-1"}, []string{"revoked at", "2025-06-01T04:00:00Z"}},
	"rollout create": {[]string{"fw-42", "--action", "set-config", "--params", `{"fw":"4.2"}`, "--devices", "device-*",
		"--max-per-minute", "600", "--abort", "failed:5:20", "--window", "0 2 * * * 2h"}, []string{"rollout", "fw-42  [new]", "succeeded 2"}},
	"rollout get":     {[]string{"fw-42"}, []string{"status", "succeeded", "history:", "create"}},
	"rollout list":    {nil, []string{"ROLLOUT", "fw-42", "set-config"}},
	"rollout devices": {[]string{"fw-42"}, []string{"DEVICE", "fw-42:rollout:device-1:v1"}},
	"rollout pause":   {[]string{"fw-42"}, []string{"rollout", "fw-42"}},
	"rollout resume":  {[]string{"fw-42"}, []string{"rollout", "fw-42"}},
	"rollout cancel":  {[]string{"fw-42"}, []string{"rollout", "fw-42"}},
	"rollout approve": {[]string{"fw-42", "--version", "1"}, []string{"rollout", "fw-42  [new]"}},
	"rollout watch":   {[]string{"fw-42"}, []string{"100% 2/2 succeeded", "succeeded 2", "rollout fw-42 succeeded"}},
}

func TestEveryClientSubcommandHasJSONAndText(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t)
	var tested []string
	for path := range leaves() {
		if isClient(path) {
			tested = append(tested, path)
		}
	}
	sort.Strings(tested)
	var cases []string
	for path := range clientCases {
		cases = append(cases, path)
	}
	sort.Strings(cases)
	require.Equal(t, tested, cases, "every client subcommand has a case here")

	for path, tc := range clientCases {
		args := append(append(strings.Fields(path), tc.args...), "--server", f.URL)
		code, text, stderr := run(t, args...)
		require.Equal(t, 0, code, "%s: %s", path, stderr)
		require.Empty(t, stderr, path)
		require.False(t, json.Valid([]byte(text)), "%s without --json prints text:\n%s", path, text)
		for _, w := range tc.want {
			require.Contains(t, text, w, "%s:\n%s", path, text)
		}

		code, out, stderr := run(t, append(args, "--json")...)
		require.Equal(t, 0, code, "%s --json: %s", path, stderr)
		require.True(t, json.Valid([]byte(out)), "%s --json:\n%s", path, out)
		require.True(t, strings.HasPrefix(out, "{\n  \"") || strings.HasPrefix(out, "[\n  {"), "%s --json is indented:\n%s", path, out)
	}
}

func TestJSONFromTheEnvironment(t *testing.T) {
	f := newFakeAPI(t)
	t.Setenv("CONTROLLER_JSON", "true")
	t.Setenv("CONTROLLER_SERVER", f.URL)
	t.Setenv("CONTROLLER_TOKEN", "s3cret")
	code, out, stderr := run(t, "grant", "list")
	require.Equal(t, 0, code, stderr)
	var gs []apiwire.GrantView
	require.NoError(t, json.Unmarshal([]byte(out), &gs))
	require.Equal(t, []apiwire.GrantView{fakeGrant}, gs)
	require.Equal(t, "Bearer s3cret", f.last().Auth)
}

func TestClientSendsWhatTheFlagsSay(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t)
	code, _, stderr := run(t, "task", "create", "task-88", "--steps", steps, "--execute-after", "2025-06-01T02:00:00Z",
		"--execute-before", "2025-06-01T04:00:00+00:00", "--server", f.URL, "--token", "tk")
	require.Equal(t, 0, code, stderr)
	r := f.last()
	require.Equal(t, "POST /v1/tasks Bearer tk", r.Method+" "+r.Path+" "+r.Auth)
	require.Equal(t, "task-88", r.Body["task_id"])
	require.Equal(t, "2025-06-01T02:00:00Z", r.Body["execute_after"])
	require.Equal(t, "2025-06-01T04:00:00Z", r.Body["execute_before"])
	require.Len(t, r.Body["steps"], 1)

	code, _, stderr = run(t, "task", "plan", "task-88", "--steps", steps, "--base-version", "0", "--server", f.URL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, float64(0), f.last().Body["base_version"], "a given --base-version is sent, 0 too")
	code, _, stderr = run(t, "task", "plan", "task-88", "--steps", steps, "--server", f.URL)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, f.last().Body, "base_version")

	code, _, stderr = run(t, "task", "approve", "task-88", "--version", "3", "--plan-hash", "9f86", "--server", f.URL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, map[string]any{"version": float64(3), "plan_hash": "9f86"}, f.last().Body)

	code, _, stderr = run(t, "grant", "list", "--server", f.URL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "", f.last().Query)
	code, _, stderr = run(t, "grant", "list", "--all", "--server", f.URL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "all=1", f.last().Query)

	code, _, stderr = run(t, "op", "submit", "--operation-id", "ticket-1", "--target", "device-1", "--action", "set-config",
		"--params", `{"fw":"4.2"}`, "--server", f.URL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, map[string]any{"operation_id": "ticket-1", "target": "device-1", "action": "set-config",
		"params": map[string]any{"fw": "4.2"}}, f.last().Body)
}

// order asserts that each of want appears in text after the one before.
func order(t *testing.T, text string, want ...string) {
	t.Helper()
	pos := 0
	for _, w := range want {
		i := strings.Index(text[pos:], w)
		require.GreaterOrEqual(t, i, 0, "%q missing after byte %d of:\n%s", w, pos, text)
		pos += i + len(w)
	}
}

func TestTaskTextView(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	require.NoError(t, printTask(&b, fakeTsk, http.StatusOK))
	out := b.String()
	order(t, out,
		"task", "task-88\n",
		"status", "failed\n",
		"reason", "step_failed:restart-device\n",
		"version", "3\n",
		"plan hash", "9f86d081\n",
		"requester", "alice\n",
		"window", "2025-06-01T02:00:00Z → 2025-06-01T04:00:00Z\n",
		"approval", "version 3 by bob at 2025-06-01T02:00:00Z\n",
		"\nsteps:\n", "STEP", "OPERATION\n",
		"restart-device", "restart", "device-1001", `{"why":"stuck"}`, opID+"\n",
		"\nhistory:\n", "AT", "PRINCIPAL", "ACTION", "FROM → TO", "VERSION", "REASON\n",
		"2025-06-01T02:00:00Z", "alice", "create", "- → waiting_approval", "1\n",
		"2025-06-01T04:00:00Z", "bob", "approve", "waiting_approval → approved", "3\n")
	require.Regexp(t, `(?m)^task +task-88$`, out, "key and value aligned in columns")

	// Before approval: no requester, no operation ids, no window.
	k := fakeTsk
	k.Status, k.Reason, k.Requester, k.Approval, k.ExecuteAfter, k.ExecuteBefore = "waiting_approval", "", "", nil, nil, nil
	k.Steps = []apiwire.TaskStep{{Step: fakeTsk.Steps[0].Step}}
	b.Reset()
	require.NoError(t, printTask(&b, k, http.StatusCreated))
	out = b.String()
	require.Contains(t, out, "waiting_approval  [new]\n")
	require.NotContains(t, out, "reason")
	require.Regexp(t, `requester +- \(the author of the version that gets approved\)`, out)
	require.Regexp(t, `window +none`, out)
	require.Regexp(t, `approval +none`, out)
	require.Contains(t, out, "- (set at approval)")
	b.Reset()
	k.ExecuteBefore = &at1
	require.NoError(t, printTask(&b, k, http.StatusOK))
	require.Regexp(t, `window +until 2025-06-01T04:00:00Z`, b.String())
}

func TestGrantTextView(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	live := fakeGrant
	live.RevokedAt = nil
	require.NoError(t, printGrant(&b, live, http.StatusCreated))
	out := b.String()
	order(t, out, "grant", "g-1  [new]\n", "principal", "agent\n", "action", "restart\n", "devices", "device-*\n",
		"created by", "admin\n", "created at", "2025-06-01T02:00:00Z\n", "revoked at", "- (live)\n")
	b.Reset()
	require.NoError(t, printGrants(&b, []apiwire.GrantView{live, fakeGrant}))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^GRANT +PRINCIPAL +ACTION +DEVICES +CREATED BY +CREATED AT +REVOKED AT$`, lines[0])
	require.Regexp(t, `^g-1 +agent +restart +device-\* +admin +2025-06-01T02:00:00Z +-$`, lines[1])
	require.Regexp(t, `2025-06-01T04:00:00Z$`, lines[2])
}

func TestUsageErrorsExitTwoWithAHint(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t)
	srv := []string{"--server", f.URL}
	for name, tc := range map[string]struct {
		args []string
		msg  string
		cmd  string // the command the hint names
	}{
		"unknown flag":       {[]string{"op", "submit", "--target", "d", "--action", "a", "--bogus"}, "unknown flag: --bogus", "op submit"},
		"missing required":   {[]string{"op", "submit", "--target", "d"}, "required flag(s) --action not set", "op submit"},
		"missing several":    {[]string{"grant", "add", "--principal", "p"}, "required flag(s) --action, --devices not set", "grant add"},
		"no argument":        {[]string{"task", "get"}, "accepts 1 arg(s), received 0", "task get"},
		"extra argument":     {[]string{"device", "list", "x"}, `unknown command "x" for "controller device list"`, "device list"},
		"bad duration":       {[]string{"op", "get", "x", "--wait", "soon"}, `invalid argument "soon" for "--wait"`, "op get"},
		"bad int":            {[]string{"task", "approve", "t", "--version", "three"}, `invalid argument "three" for "--version"`, "task approve"},
		"bad outcome":        {[]string{"cmd", "resolve", "c-1", "--outcome", "maybe"}, "want succeeded, failed", "cmd resolve"},
		"bad params":         {[]string{"op", "submit", "--target", "d", "--action", "a", "--params", "{oops"}, "--params: not valid JSON", "op submit"},
		"bad steps":          {[]string{"task", "create", "t", "--steps", `[{"step":"s","tagret":"d"}]`}, `--steps: want [{`, "task create"},
		"bad time":           {[]string{"task", "create", "t", "--steps", steps, "--execute-after", "tomorrow"}, "--execute-after: want RFC 3339", "task create"},
		"unknown subcommand": {[]string{"task", "aprove"}, `unknown command "aprove" for "controller task"; did you mean approve?`, "task"},
		"unknown command":    {[]string{"tsak"}, `unknown command "tsak" for "controller"`, ""},
		"serve bad enum":     {[]string{"serve", "--offline", "maybe"}, `invalid argument "maybe" for "--offline" flag: want wait, fail`, "serve"},
		"serve bad value":    {[]string{"serve", "--lease-ttl", "10ms"}, "--lease-ttl 10ms: at least 1s", "serve"},
		"serve argument":     {[]string{"serve", "now"}, `unknown command "now" for "controller serve"`, "serve"},
		"serve http-host repeated": {[]string{"serve", "--http-host", "ok.test", "--http-host", "bad/host"},
			`--http-host "bad/host": want a name or name:port`, "serve"},
		"serve http-host comma-separated": {[]string{"serve", "--http-host", "ok.test,user@x"}, `--http-host "user@x"`, "serve"},
		"serve bad receipt rate":          {[]string{"serve", "--receipt-rate", "-1"}, "--receipt-rate -1: receipts a second per device", "serve"},
	} {
		args := tc.args
		if isClient(args[0]) {
			args = append(args, srv...)
		}
		code, out, stderr := run(t, args...)
		require.Equal(t, 2, code, "%s: %s", name, stderr)
		require.Empty(t, out, name)
		hint := strings.TrimSpace("controller " + tc.cmd)
		require.Equal(t, "controller: ", stderr[:12], name)
		require.Contains(t, stderr, tc.msg, name)
		require.True(t, strings.HasSuffix(stderr, "\nRun '"+hint+" --help' for usage.\n"), "%s:\n%s", name, stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.reqs, "a usage error sends nothing")
}

func TestServeUsageErrorOpensNothing(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "c.db")
	code, _, stderr := run(t, "serve", "--db", db, "--max-attempts", "0", "--instance-id", "x")
	require.Equal(t, 2, code, stderr)
	_, err := os.Stat(db)
	require.True(t, os.IsNotExist(err), "nothing opened")
}

func TestAPIErrorExitsOne(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t)
	code, out, stderr := run(t, "cmd", "cancel", "c-2", "--server", f.URL)
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Equal(t, "controller: 409 already_published: published\n", stderr)
}

func TestConnectionRefusedSaysWhatToDo(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	code, _, stderr := run(t, "op", "get", "x", "--server", url)
	require.Equal(t, 1, code, "the command line was right: not a usage error")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	require.Len(t, lines, 2, stderr)
	require.Equal(t, "controller: cannot reach the controller at "+url+": dial tcp "+ln.Addr().String()+": connect: connection refused", lines[0])
	require.Contains(t, lines[1], "--server")
	require.Contains(t, lines[1], "CONTROLLER_SERVER")
	require.Contains(t, lines[1], "controller serve")
}

// TestDeviceListFollowsThePages: `device list` sends its filter and page
// size and reads every page the Link headers name.
func TestDeviceListFollowsThePages(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		asked []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.RequestURI())
		mu.Unlock()
		w.Header().Set("X-Total-Count", "3")
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Query().Get("after") {
		case "":
			w.Header().Set("Link", `</v1/devices?limit=2&after=device-2&online=false>; rel="next"`)
			_ = json.NewEncoder(w).Encode([]apiwire.Device{{DeviceID: "device-1"}, {DeviceID: "device-2"}})
		default:
			_ = json.NewEncoder(w).Encode([]apiwire.Device{{DeviceID: "device-3"}})
		}
	}))
	t.Cleanup(srv.Close)
	code, out, stderr := run(t, "device", "list", "--online", "false", "--page-size", "2", "--json", "--server", srv.URL)
	require.Equal(t, 0, code, stderr)
	var devs []apiwire.Device
	require.NoError(t, json.Unmarshal([]byte(out), &devs))
	require.Len(t, devs, 3)
	require.Equal(t, "device-3", devs[2].DeviceID)
	mu.Lock()
	require.Equal(t, []string{"/v1/devices?limit=2&online=false", "/v1/devices?limit=2&after=device-2&online=false"}, asked)
	mu.Unlock()

	code, _, stderr = run(t, "device", "list", "--page-size", "10001", "--server", srv.URL)
	require.Equal(t, 2, code, "a usage error")
	require.Contains(t, stderr, "--page-size 10001")
	code, _, stderr = run(t, "device", "list", "--online", "maybe", "--server", srv.URL)
	require.Equal(t, 2, code, stderr)
}

// The daemon's collector target is serveGCPercent unless GOGC names one.
func TestServeSetsGOGCUnlessTheEnvironmentDoes(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	tuneGC(func(string) string { return "" })
	require.Equal(t, serveGCPercent, debug.SetGCPercent(50))
	tuneGC(func(k string) string { return map[string]string{"GOGC": "50"}[k] })
	require.Equal(t, 50, debug.SetGCPercent(100), "GOGC=50 in the environment stays")
}
