package e2e

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// run runs the controller binary's client subcommands against b's daemon.
func (b *bundle) run(args ...string) (string, error) {
	cmd := exec.Command(testenv.Binary(b.t, "controller"), append(args, "--server", b.ctl.URL)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestClientSubcommands(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.waitDevice("device-1", true)
	out, err := b.run("op", "submit", "--task", "cli", "--step", "set", "--target", "device-1", "--business-version", "v1",
		"--action", "set-config", "--params", `{"interval_s":30}`, "--wait", "20s")
	require.NoError(t, err, out)
	require.Regexp(t, `operation\s+cli:set:device-1:v1`, out)
	require.Regexp(t, `status\s+succeeded`, out)
	require.Contains(t, out, `"interval_s":30`, "the device's result is shown")

	out, err = b.run("op", "get", "cli:set:device-1:v1", "--json")
	require.NoError(t, err, out)
	var op apiwire.Operation
	require.NoError(t, json.Unmarshal([]byte(out), &op))
	require.Equal(t, "succeeded", op.Status)

	out, err = b.run("cmd", "get", op.CommandID)
	require.NoError(t, err, out)
	for _, want := range []string{"status", "succeeded", "receipts:", "received", "executing", "applied", "events:", "pending → sent"} {
		require.Contains(t, out, want)
	}

	out, err = b.run("op", "list", "--device", "device-1", "--status", "succeeded")
	require.NoError(t, err, out)
	require.Regexp(t, `cli:set:device-1:v1\s+succeeded\s+device-1\s+set-config\s+\S+\s+anonymous\s+api`, out)
	out, err = b.run("cmd", "list", "--operation-id", "cli:set:device-1:v1", "--all", "--json")
	require.NoError(t, err, out)
	var listed []apiwire.Command
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, op.CommandID, listed[0].CommandID)

	out, err = b.run("device", "list")
	require.NoError(t, err, out)
	require.Contains(t, out, "device-1")
	require.Equal(t, 4, len(strings.Split(strings.TrimSpace(out), "\n")), "a header and three devices:\n%s", out)

	out, err = b.run("cmd", "cancel", op.CommandID)
	require.Error(t, err)
	require.Contains(t, out, "already_published")

	out, err = b.run("op", "submit", "--task", "cli", "--step", "set", "--target", "device-1", "--business-version", "v1",
		"--action", "set-config", "--params", `{"interval_s":31}`)
	require.Error(t, err)
	require.Contains(t, out, "idempotency_key_reused")
	require.Equal(t, 1, exitCode(err), "an API refusal exits 1")

	// Grants and tasks, in text and as JSON, against the real API.
	out, err = b.run("grant", "add", "--principal", "agent", "--action", "restart", "--devices", "device-*")
	require.NoError(t, err, out)
	require.Regexp(t, `grant\s+g-\S+  \[new\]`, out)
	require.Regexp(t, `revoked at\s+- \(live\)`, out)
	out, err = b.run("grant", "list", "--json")
	require.NoError(t, err, out)
	var grants []apiwire.GrantView
	require.NoError(t, json.Unmarshal([]byte(out), &grants))
	require.Len(t, grants, 1)
	require.Equal(t, "device-*", grants[0].Devices)

	out, err = b.run("task", "create", "cli-task", "--steps", `[{"step":"restart","action":"restart","target":"device-2","params":{}}]`)
	require.NoError(t, err, out)
	require.Regexp(t, `status\s+waiting_approval  \[new\]`, out)
	require.Contains(t, out, "- (set at approval)")
	out, err = b.run("task", "approve", "cli-task", "--version", "1")
	require.NoError(t, err, out)
	require.Regexp(t, `approved version\s+1  \[new\]`, out)
	eventually(t, "cli-task completed", 30*time.Second, func() bool {
		out, err = b.run("task", "get", "cli-task", "--json")
		var task apiwire.TaskView
		return err == nil && json.Unmarshal([]byte(out), &task) == nil && task.Status == "completed"
	})
	out, err = b.run("task", "get", "cli-task")
	require.NoError(t, err, out)
	for _, re := range []string{`status\s+completed`, `version\s+1`, `steps:`, `cli-task:restart:device-2:approval-v1`, `history:`} {
		require.Regexp(t, re, out)
	}
	out, err = b.run("grant", "revoke", grants[0].GrantID)
	require.NoError(t, err, out)
	require.Regexp(t, `revoked at\s+\d{4}-\d\d-\d\dT`, out)

	// A usage error exits 2 and names the command's help.
	out, err = b.run("task", "get")
	require.Equal(t, 2, exitCode(err), out)
	require.Contains(t, out, "controller: accepts 1 arg(s), received 0\nRun 'controller task get --help' for usage.")
}

// exitCode is a finished child's exit status (0 for a nil error).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
