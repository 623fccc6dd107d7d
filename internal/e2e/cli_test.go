package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/api"
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
	var op api.Operation
	require.NoError(t, json.Unmarshal([]byte(out), &op))
	require.Equal(t, "succeeded", op.Status)

	out, err = b.run("cmd", "get", op.CommandID)
	require.NoError(t, err, out)
	for _, want := range []string{"status", "succeeded", "receipts:", "received", "executing", "applied", "events:", "pending → sent"} {
		require.Contains(t, out, want)
	}

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
}
