package ops

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/wire"
)

type testBundle struct {
	ctx       context.Context
	st        *store.DB
	svc       *Service
	submitted []string
	inserted  []store.OpenCommand // the copies that came with them
}

// Publish is the store's feed: the commands made due (the dispatcher's
// kicks), with the copies that came with them. The store publishes before
// it answers, so a submit that returned is recorded.
func (b *testBundle) Publish(f store.Fact) {
	if f.Kind != store.FactDue {
		return
	}
	b.submitted = append(b.submitted, f.ID)
	if f.Inserted != nil {
		b.inserted = append(b.inserted, *f.Inserted)
	}
}

// succeed publishes op's command and applies the device's final
// succeeded receipt: op is final.
func (b *testBundle) succeed(t *testing.T, op domain.Operation) {
	t.Helper()
	_, err := b.st.ClaimSend(b.ctx, op.CommandID, fsm.CmdPending, 0, 1, domain.Fence{Owner: op.Owner, Token: op.FencingToken},
		time.Now().Add(time.Minute))
	require.NoError(t, err)
	_, err = b.st.ApplyReceipt(b.ctx, op.Target, wire.Receipt{CommandID: op.CommandID, OperationID: op.OperationID,
		Status: wire.ReceiptSucceeded, Seq: 3, Result: json.RawMessage(`{}`)}, nil)
	require.NoError(t, err)
}

func setup(t *testing.T, enforceGrants bool) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background()}
	st, err := backend.Open(b.ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1", Feed: b})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	b.st = st
	b.svc = New(Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second, EnforceGrants: enforceGrants, FourEyes: true,
		Policy: func(action string) command.Policy {
			p := command.Policy{TTL: time.Minute, MaxAttempts: 3, Approval: command.ApprovalNone}
			if action == "wipe" {
				p.Approval = command.ApprovalRequired
			}
			if action == "tune" {
				p.Concurrency, p.Supersede = command.ConcurrencySerial, true
			}
			return p
		},
	})
	return b
}

func (b *testBundle) birth(t *testing.T, device string, caps wire.Capabilities) {
	t.Helper()
	_, err := b.st.ApplyPresence(b.ctx, device, wire.Presence{Online: true, Session: 1, Capabilities: &caps})
	require.NoError(t, err)
}

func code(err error) string { return string(domain.ErrorCode(err)) }

func TestSubmitDerivesTheIdAndReplays(t *testing.T) {
	b := setup(t, false)
	in := Intent{TaskID: "task-12", Step: "create-ticket", Target: "device-1", BusinessVersion: "v1", Action: "restart",
		Params: json.RawMessage(`{"b":1.0,"a":"x"}`)}
	op, created, err := b.svc.Submit(b.ctx, in, "", "alice")
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, "task-12:create-ticket:device-1:v1", op.OperationID)
	require.Equal(t, []string{op.CommandID}, b.submitted, "a new operation is kicked once")

	in.Params = json.RawMessage(`{"a":"x","b":1}`) // the same params, spelt otherwise
	again, created, err := b.svc.Submit(b.ctx, in, "task-12:create-ticket:device-1:v1", "alice")
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, op.CommandID, again.CommandID)
	require.Equal(t, op.RequestHash, again.RequestHash)
	require.Len(t, b.submitted, 1, "a replay kicks nothing")

	in.Params = json.RawMessage(`{"a":"y"}`)
	_, _, err = b.svc.Submit(b.ctx, in, "", "alice")
	require.ErrorIs(t, err, domain.ErrKeyReused)
}

func TestSubmitRefusals(t *testing.T) {
	b := setup(t, false)
	for _, tc := range []struct {
		name, key, code string
		in              Intent
		invalid         bool
	}{
		{name: "reserved id", code: "reserved_operation_id",
			in: Intent{OperationID: "t:s:device-1:approval-v3", Target: "device-1", Action: "restart"}},
		{name: "header differs", key: "other", code: "idempotency_key_mismatch",
			in: Intent{OperationID: "op-1", Target: "device-1", Action: "restart"}},
		{name: "needs approval", code: "approval_required",
			in: Intent{OperationID: "op-2", Target: "device-1", Action: "wipe"}},
		{name: "no id", invalid: true, in: Intent{Target: "device-1", Action: "restart"}},
		{name: "bad target", invalid: true, in: Intent{OperationID: "op-3", Target: "fleet/../x", Action: "restart"}},
		{name: "controller target", invalid: true, in: Intent{OperationID: "op-4", Target: "controller-c1", Action: "restart"}},
		{name: "params not an object", invalid: true, in: Intent{OperationID: "op-5", Target: "device-1", Action: "restart", Params: json.RawMessage(`[1]`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := b.svc.Submit(b.ctx, tc.in, tc.key, "alice")
			require.Error(t, err)
			if tc.invalid {
				require.ErrorIs(t, err, domain.ErrInvalid)
			} else {
				require.Equal(t, tc.code, code(err), "%v", err)
			}
		})
	}
	require.Empty(t, b.submitted, "nothing was stored")
}

func TestGrantsAreEnforcedOnlyWithAuth(t *testing.T) {
	b := setup(t, true)
	in := Intent{OperationID: "op-1", Target: "device-1", Action: "restart"}
	_, _, err := b.svc.Submit(b.ctx, in, "", "agent")
	require.Equal(t, "permission_denied", code(err))
	_, created, err := b.svc.CreateGrant(b.ctx, "agent", "restart", "device-*", "admin")
	require.NoError(t, err)
	require.True(t, created)
	_, created, err = b.svc.Submit(b.ctx, in, "", "agent")
	require.NoError(t, err)
	require.True(t, created)

	_, _, err = setup(t, false).svc.Submit(context.Background(), in, "", "agent")
	require.NoError(t, err, "without auth grants are not enforced")
}

// One QoS rule: 0 for a device that cannot deduplicate and for one never
// seen, 1 for a conforming device, read by the submit's transaction; an
// online device's command is published at submit, an unseen one's waits.
func TestSubmitQoS(t *testing.T) {
	b := setup(t, false)
	b.birth(t, "conforming", wire.Capabilities{Dedupe: true, Query: true})
	b.birth(t, "legacy", wire.Capabilities{Query: true})
	for device, want := range map[string]int{"conforming": 1, "legacy": 0, "never-seen": 0} {
		n, err := b.svc.Prepare(b.ctx, "op:"+device, Intent{Target: device, Action: "restart"})
		require.NoError(t, err)
		require.Equal(t, time.Minute, n.CommandTTL)
		require.Equal(t, "i1", n.Owner)
		res, err := b.st.Submit(b.ctx, n, nil)
		require.NoError(t, err)
		require.Equal(t, want, res.Inserted.Command.QoS, device)
		c, err := b.st.GetCommand(b.ctx, n.CommandID)
		require.NoError(t, err)
		require.Equal(t, want, c.QoS, device)
		require.Equal(t, device != "never-seen", res.Inserted.Claimed, device)
		require.Equal(t, res.Inserted.Command.Status, c.Status, device)
	}
}

func TestCompensate(t *testing.T) {
	b := setup(t, false)
	orig, _, err := b.svc.Submit(b.ctx, Intent{OperationID: "op-1", Target: "device-1", Action: "set-config"}, "", "alice")
	require.NoError(t, err)
	comp := Compensation{Action: "set-config", Params: json.RawMessage(`{"fw":"4.1"}`), BusinessVersion: "v1"}
	_, _, err = b.svc.Compensate(b.ctx, orig.OperationID, comp, "alice")
	require.Equal(t, "not_final", code(err), "the original is still started")

	// Published, and the device succeeds: the original is final.
	b.succeed(t, orig)
	op, created, err := b.svc.Compensate(b.ctx, orig.OperationID, comp, "alice")
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, "op-1:compensate:v1", op.OperationID)
	require.Equal(t, "op-1", op.Compensates)
	_, created, err = b.svc.Compensate(b.ctx, orig.OperationID, comp, "alice")
	require.NoError(t, err)
	require.False(t, created, "a replay returns it")
	comp.Params = json.RawMessage(`{"fw":"4.0"}`)
	_, _, err = b.svc.Compensate(b.ctx, orig.OperationID, comp, "alice")
	require.ErrorIs(t, err, domain.ErrKeyReused)
	comp.BusinessVersion = "approval-v2"
	_, _, err = b.svc.Compensate(b.ctx, orig.OperationID, comp, "alice")
	require.ErrorIs(t, err, domain.ErrInvalid)
	_, _, err = b.svc.Compensate(b.ctx, "nope", comp, "alice")
	require.ErrorIs(t, err, domain.ErrNotFound)
}

func TestPlanValidationAndHash(t *testing.T) {
	b := setup(t, false)
	steps := func(params string) []domain.Step {
		return []domain.Step{{Step: "restart-device", Action: "restart", Target: "device-1001", Params: json.RawMessage(params)}}
	}
	_, h1, err := b.svc.Plan(b.ctx, steps(`{"a":1,"b":[true]}`), "alice")
	require.NoError(t, err)
	_, h2, err := b.svc.Plan(b.ctx, steps(`{"b":[true],"a":1.0}`), "alice")
	require.NoError(t, err)
	require.Equal(t, h1, h2, "the plan hash is over canonical JSON")

	for name, bad := range map[string][]domain.Step{
		"empty":      {},
		"twice":      append(steps(`{}`), steps(`{}`)...),
		"bad target": {{Step: "s", Action: "restart", Target: "a/b"}},
		"bad step":   {{Step: "a:b", Action: "restart", Target: "device-1"}},
	} {
		_, _, err := b.svc.Plan(b.ctx, bad, "alice")
		require.Equal(t, "invalid_plan", code(err), name)
	}

	task, created, err := b.svc.CreateTask(b.ctx, TaskRequest{TaskID: "task-88", Steps: steps(`{}`)}, "agent")
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, fsm.TaskWaitingApproval, task.Status)
	_, created, err = b.svc.CreateTask(b.ctx, TaskRequest{TaskID: "task-88", Steps: steps(`{}`)}, "agent")
	require.NoError(t, err)
	require.False(t, created)
	_, _, err = b.svc.CreateTask(b.ctx, TaskRequest{TaskID: "task-88", Steps: steps(`{"x":1}`)}, "agent")
	require.ErrorIs(t, err, domain.ErrKeyReused)

	_, _, err = b.svc.Approve(b.ctx, "task-88", 1, "", "agent")
	require.ErrorIs(t, err, domain.ErrFourEyes)
	b.birth(t, "device-1001", wire.Capabilities{Dedupe: true, Query: true})
	a, created, err := b.svc.Approve(b.ctx, "task-88", 1, "", "alice")
	require.NoError(t, err)
	require.True(t, created)
	task, err = b.st.GetTask(b.ctx, "task-88")
	require.NoError(t, err)
	n, err := b.svc.PrepareStep(b.ctx, task, 0)
	require.NoError(t, err)
	require.Equal(t, "task-88:restart-device:device-1001:approval-v1", n.OperationID)
	require.Equal(t, n.OperationID, domain.TaskStepOperationID("task-88", task.Approval.Steps[0].Step, task.Approval.Steps[0].Target, a.Version))
	require.Equal(t, "approval-v1", n.BusinessVersion)
}

func TestResolveValidatesTheOutcome(t *testing.T) {
	b := setup(t, false)
	_, err := b.svc.Resolve(b.ctx, "c-1", "maybe", "", "alice")
	require.ErrorIs(t, err, domain.ErrInvalid)
	_, err = b.svc.Resolve(b.ctx, "c-1", "succeeded", "", "alice")
	require.ErrorIs(t, err, domain.ErrNotFound)
}

// The device receives params as the caller sent them (compacted); only the
// hash uses the canonical form. Values that would change are refused.
func TestParamsAsSentAndIJSON(t *testing.T) {
	b := setup(t, false)
	n, err := b.svc.Prepare(b.ctx, "op-1", Intent{Target: "device-1", Action: "restart",
		Params: json.RawMessage(`{ "z": "<b>", "a": 1.50, "n": 9007199254740991 }`)})
	require.NoError(t, err)
	require.Equal(t, `{"z":"<b>","a":1.50,"n":9007199254740991}`, string(n.Params))
	m, err := b.svc.Prepare(b.ctx, "op-1", Intent{Target: "device-1", Action: "restart",
		Params: json.RawMessage(`{"n":9007199254740991,"a":1.5,"z":"\u003cb>"}`)})
	require.NoError(t, err)
	require.Equal(t, n.RequestHash, m.RequestHash, "JSON-equivalent params are the same request")

	for _, bad := range []string{`{"n":9007199254740993}`, `{"n":1` + "0000000000000000000000000000000000000000" + `}`,
		`{"a":1,"a":2}`, `{"f":1e400}`} {
		_, err := b.svc.Prepare(b.ctx, "op-2", Intent{Target: "device-1", Action: "restart", Params: json.RawMessage(bad)})
		require.ErrorIs(t, err, domain.ErrInvalid, bad)
	}
}

func TestCommandSizeIsCheckedAtSubmit(t *testing.T) {
	b := setup(t, false)
	b.svc.cfg.MaxCommandBytes = 2048
	small := json.RawMessage(`{"s":"` + strings.Repeat("<", 1000) + `"}`) // 1 byte each on the wire
	_, _, err := b.svc.Submit(b.ctx, Intent{OperationID: "op-1", Target: "device-1", Action: "restart", Params: small}, "", "alice")
	require.NoError(t, err)
	big := json.RawMessage(`{"s":"` + strings.Repeat("x", 2048) + `"}`)
	_, _, err = b.svc.Submit(b.ctx, Intent{OperationID: "op-2", Target: "device-1", Action: "restart", Params: big}, "", "alice")
	require.Equal(t, "too_large", code(err))
	_, err = b.st.GetOperation(b.ctx, "op-2")
	require.ErrorIs(t, err, domain.ErrNotFound, "nothing was stored")
}

// A new operation's first command is told with its copy as inserted; a
// replay tells nothing.
func TestSubmittedGetsTheInsertedCommand(t *testing.T) {
	b := setup(t, false)
	in := Intent{TaskID: "task-1", Step: "s", Target: "device-1", BusinessVersion: "v1", Action: "restart", Params: json.RawMessage(`{}`)}
	op, created, err := b.svc.Submit(b.ctx, in, "", "alice")
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, []string{op.CommandID}, b.submitted)
	require.Len(t, b.inserted, 1)
	require.Equal(t, op.CommandID, b.inserted[0].CommandID)
	require.Equal(t, fsm.CmdPending, b.inserted[0].Status)
	require.Equal(t, domain.Fence{Owner: "i1", Token: 1}, b.inserted[0].Fence)

	_, created, err = b.svc.Submit(b.ctx, in, "", "alice")
	require.NoError(t, err)
	require.False(t, created)
	require.Len(t, b.submitted, 1, "a replay is no new command")
}

// Ids of a rollout device's shape, {rollout_id}:rollout:{device}:v<N>, are
// the scheduler's: a direct submit of one (whole, derived from its parts or
// as the Idempotency-Key) and a compensation that would make one are
// refused (403 reserved_operation_id) and store nothing; Prepare, the
// scheduler's way in, still builds it.
func TestRolloutShapedIdsAreReserved(t *testing.T) {
	b := setup(t, false)
	for _, tc := range []struct {
		name, key, id string
		in            Intent
	}{
		{"whole", "", "fw-42:rollout:device-1:v1", Intent{OperationID: "fw-42:rollout:device-1:v1", Target: "device-1", Action: "restart"}},
		{"a later version", "", "fw-42:rollout:device-1:v12", Intent{OperationID: "fw-42:rollout:device-1:v12", Target: "device-1", Action: "restart"}},
		{"another target", "", "fw-42:rollout:device-2:v1", Intent{OperationID: "fw-42:rollout:device-2:v1", Target: "device-1", Action: "restart"}},
		{"derived", "", "fw-42:rollout:device-1:v1", Intent{TaskID: "fw-42", Step: "rollout", Target: "device-1", BusinessVersion: "v1", Action: "restart"}},
		{"header", "fw-42:rollout:device-1:v1", "fw-42:rollout:device-1:v1", Intent{Target: "device-1", Action: "restart"}},
	} {
		_, _, err := b.svc.Submit(b.ctx, tc.in, tc.key, "alice")
		require.Equal(t, "reserved_operation_id", code(err), "%s: %v", tc.name, err)
		require.Contains(t, err.Error(), "rollout", tc.name)
		_, err = b.st.GetOperation(b.ctx, tc.id)
		require.ErrorIs(t, err, domain.ErrNotFound, tc.name)
	}
	require.Empty(t, b.submitted, "nothing was stored")

	// Near the shape but not it: ordinary ids.
	for _, id := range []string{"fw-42:rollout:device-1", "fw-42:rollout:device-1:v", "fw-42:rollout:device-1:version1",
		"x:fw-42:rollout:device-1:v1", "fw-42:rollouts:device-1:v1", "fw-42:rollout:device-1:v1:compensate-v2"} {
		_, created, err := b.svc.Submit(b.ctx, Intent{OperationID: id, Target: "device-1", Action: "restart"}, "", "alice")
		require.NoError(t, err, id)
		require.True(t, created, id)
	}

	// The scheduler's way in.
	n, err := b.svc.Prepare(b.ctx, "fw-42:rollout:device-1:v1",
		Intent{TaskID: "fw-42", Step: "rollout", Target: "device-1", BusinessVersion: "v1", Action: "restart"})
	require.NoError(t, err)
	require.Equal(t, "fw-42:rollout:device-1:v1", n.OperationID)

	// "fw-43:rollout" compensated with business_version v1 would be device
	// "compensate" of rollout fw-43.
	orig, _, err := b.svc.Submit(b.ctx, Intent{OperationID: "fw-43:rollout", Target: "device-1", Action: "restart"}, "", "alice")
	require.NoError(t, err)
	_, err = b.svc.Cancel(b.ctx, orig.CommandID, "alice") // never published: the original ends failed_final
	require.NoError(t, err)
	_, _, err = b.svc.Compensate(b.ctx, orig.OperationID, Compensation{Action: "restart", BusinessVersion: "v1"}, "alice")
	require.Equal(t, "reserved_operation_id", code(err), "%v", err)
	_, err = b.st.GetOperation(b.ctx, "fw-43:rollout:compensate:v1")
	require.ErrorIs(t, err, domain.ErrNotFound)
	_, created, err := b.svc.Compensate(b.ctx, orig.OperationID, Compensation{Action: "restart", BusinessVersion: "fix-1"}, "alice")
	require.NoError(t, err, "another business_version is an ordinary compensation")
	require.True(t, created)
}

// A grant's principal follows the id charset plus '@', 1 to 64
// characters: a space or a glob character is refused and stores nothing.
func TestGrantPrincipalRule(t *testing.T) {
	b := setup(t, true)
	for _, p := range []string{"ali ce", "agent*", "agent?", "[ab]gent", " agent", "agent\n", "agént", "a/b", "a:b",
		strings.Repeat("a", 65)} {
		_, _, err := b.svc.CreateGrant(b.ctx, p, "restart", "device-*", "admin")
		require.ErrorIs(t, err, domain.ErrInvalid, "%q", p)
		require.ErrorContains(t, err, "principal", "%q", p)
	}
	gs, err := b.st.ListGrants(b.ctx, store.GrantFilter{Revoked: true}, store.Page{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, gs.Items, "nothing stored")
	for _, p := range []string{"agent", "alice@example.com", "ci.bot-1_x", strings.Repeat("a", 64)} {
		_, created, err := b.svc.CreateGrant(b.ctx, p, "restart", "device-*", "admin")
		require.NoError(t, err, p)
		require.True(t, created, p)
	}
}

// A compensation's id is made by POST .../compensations only: a direct
// submit of that shape is refused (403 reserved_operation_id) and stores
// nothing, so nobody can take a compensation's id first; the compensation
// itself is still made.
func TestCompensationShapedIdsAreReserved(t *testing.T) {
	b := setup(t, false)
	orig, _, err := b.svc.Submit(b.ctx, Intent{OperationID: "orig-1", Target: "device-1", Action: "restart"}, "", "alice")
	require.NoError(t, err)
	for _, tc := range []struct {
		name, key string
		in        Intent
	}{
		{"whole", "", Intent{OperationID: "orig-1:compensate:v1", Target: "device-1", Action: "restart"}},
		{"header", "orig-1:compensate:v1", Intent{Target: "device-1", Action: "restart"}},
		{"derived, a device named compensate", "", Intent{TaskID: "t", Step: "s", Target: "compensate", BusinessVersion: "v1", Action: "restart"}},
	} {
		_, _, err := b.svc.Submit(b.ctx, tc.in, tc.key, "alice")
		require.Equal(t, "reserved_operation_id", code(err), "%s: %v", tc.name, err)
	}
	_, err = b.st.GetOperation(b.ctx, "orig-1:compensate:v1")
	require.ErrorIs(t, err, domain.ErrNotFound)
	require.True(t, domain.CompensationShaped(orig.OperationID+":compensate:v1"))
	for _, id := range []string{"orig-1:compensate", "orig-1:compensate:", "compensate:v1", "orig-1:compensated:v1", "orig-1:compensate:v1:x"} {
		require.False(t, domain.CompensationShaped(id), id)
	}
}

// The action's ordering policy reaches every way an operation is made: a
// submit and a rollout's start (Prepare), a task's step (PrepareStep) and
// a compensation, whose command takes its place in the device's queue.
func TestOrderingPolicyOnEveryPath(t *testing.T) {
	b := setup(t, false)
	n, err := b.svc.Prepare(b.ctx, "op:tune", Intent{Target: "device-1", Action: "tune"})
	require.NoError(t, err)
	require.True(t, n.Serial && n.Supersede)
	n, err = b.svc.Prepare(b.ctx, "op:restart", Intent{Target: "device-1", Action: "restart"})
	require.NoError(t, err)
	require.False(t, n.Serial || n.Supersede, "parallel by default")
	k := domain.Task{TaskID: "task-1", Approval: &domain.Approval{Version: 2, Approver: "bob", Author: "alice",
		Steps: []domain.Step{{Step: "s", Action: "tune", Target: "device-1", Params: json.RawMessage(`{}`)}}}}
	n, err = b.svc.PrepareStep(b.ctx, k, 0)
	require.NoError(t, err)
	require.True(t, n.Serial && n.Supersede)

	orig, _, err := b.svc.Submit(b.ctx, Intent{OperationID: "op-1", Target: "device-1", Action: "tune"}, "", "alice")
	require.NoError(t, err)
	c, err := b.st.GetCommand(b.ctx, orig.CommandID)
	require.NoError(t, err)
	require.EqualValues(t, 1, c.SerialSeq)
	b.succeed(t, orig)
	comp, created, err := b.svc.Compensate(b.ctx, orig.OperationID, Compensation{Action: "tune", BusinessVersion: "v1"}, "alice")
	require.NoError(t, err)
	require.True(t, created)
	c, err = b.st.GetCommand(b.ctx, comp.CommandID)
	require.NoError(t, err)
	require.EqualValues(t, 2, c.SerialSeq, "the compensation queues on the device like any operation")
}
