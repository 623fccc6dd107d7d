package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// verify runs `controller verify` on the run's database and witnesses and
// requires every invariant to pass; the verdict lines go to the test log,
// and are returned.
func (b *bundle) verify() string {
	b.t.Helper()
	out, err := exec.Command(testenv.Binary(b.t, "controller"), "verify", "--db", b.db, "--state-dir", b.stateDir).CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		b.t.Log(line)
	}
	require.NoError(b.t, err, "invariants:\n%s", out)
	// Invariants 1-7 and 10, and the eighth for a run with rollouts.
	require.Contains(b.t, []int{8, 9}, strings.Count(string(out), " PASS: "), "%s", out)
	require.Contains(b.t, string(out), "invariant 10 PASS")
	return string(out)
}

// The checker must be able to fail: a database with a command rewritten
// after its terminal state and an operation executed twice.
func TestVerifyCatchesViolations(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	op, _, err := b.client.Submit(b.ctx(), req("verify", "device-1"), "")
	require.NoError(t, err)
	b.waitFinal(op.OperationID)
	b.verify()
	b.ctl.Kill()
	w := testenv.OpenWriter(t, b.db)
	_, err = w.Exec(`UPDATE commands SET status = 'sent' WHERE command_id = ?`, op.CommandID)
	require.NoError(t, err)
	_, err = w.Exec(`UPDATE operations SET status = 'failed_final' WHERE operation_id = ?`, op.OperationID)
	require.NoError(t, err)
	w.Close()
	out, err := exec.Command(testenv.Binary(t, "controller"), "verify", "--db", b.db, "--state-dir", b.stateDir).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "invariant 2 FAIL")
	require.Contains(t, string(out), "invariant 7 FAIL")
	t.Logf("%s", out)
}

// Invariant 10 on the real binary: two serial restarts on one device pass;
// with their queue numbers swapped in the database (as if the second submit
// had committed first) the checker fails it.
func TestVerifyCatchesSerialOutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: policyArgs(t, `{"actions":{"restart":{"concurrency":"serial"}}}`)})
	var ops, cmds []string
	for _, task := range []string{"serial-1", "serial-2"} {
		op, _, err := b.client.Submit(b.ctx(), req(task, "device-1"), "")
		require.NoError(t, err)
		ops, cmds = append(ops, op.OperationID), append(cmds, op.CommandID)
	}
	for _, id := range ops {
		require.Equal(t, "succeeded", b.waitFinal(id).Status)
	}
	require.Contains(t, b.verify(), "invariant 10 PASS: serial commands never overlap on a device and go out in submit order: 2 serial commands on 1 devices")
	b.ctl.Kill()
	w := testenv.OpenWriter(t, b.db)
	for _, s := range []struct {
		seq int
		cmd string
	}{{100, cmds[0]}, {1, cmds[1]}, {2, cmds[0]}} {
		_, err := w.Exec(`UPDATE commands SET serial_seq = ? WHERE command_id = ?`, s.seq, s.cmd)
		require.NoError(t, err)
	}
	w.Close()
	out, err := exec.Command(testenv.Binary(t, "controller"), "verify", "--db", b.db, "--state-dir", b.stateDir).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "invariant 10 FAIL")
	require.Regexp(t, cmds[0]+` \(serial_seq 2\) published \(event [0-9]+\) ahead of `+cmds[1]+` \(serial_seq 1\), not yet ended`, string(out))
	t.Logf("%s", out)
}
