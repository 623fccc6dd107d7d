package store

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// auditAll reads the whole audit log, newest first.
func auditAll(t *testing.T, b *testBundle) []AuditEntry {
	t.Helper()
	l, err := b.s.ListAudit(b.ctx, AuditFilter{}, StartPage{Limit: MaxOperatorLimit})
	require.NoError(t, err)
	require.EqualValues(t, len(l.Items), l.Total)
	return l.Items
}

// TestEveryPersonsChangeIsAuditedOnce: each kind of change a person causes
// writes exactly one audit row, with its principal and what changed, in
// its own transaction; a refused change and an idempotent repeat write
// none; the events the change wrote carry the principal.
func TestEveryPersonsChangeIsAuditedOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		var seen int
		// step makes one change (or a refused one) and checks the rows
		// it added: none, or one with these fields and this detail.
		step := func(name string, want *AuditEntry, detail map[string]any, change func() error, wantErr bool) {
			t.Helper()
			b.clk.Advance(time.Second)
			err := change()
			if wantErr {
				require.Error(t, err, name)
			} else {
				require.NoError(t, err, name)
			}
			all := auditAll(t, b)
			if want == nil {
				require.Len(t, all, seen, "%s: writes no audit row", name)
				return
			}
			require.Len(t, all, seen+1, "%s: writes one audit row", name)
			seen++
			got := all[0]
			require.Equal(t, want.Principal, got.Principal, name)
			require.Equal(t, want.Action, got.Action, name)
			require.Equal(t, want.Kind, got.Kind, name)
			require.Equal(t, want.EntityID, got.EntityID, name)
			require.Equal(t, b.clk.Now().UTC(), got.At, name)
			var d map[string]any
			require.NoError(t, json.Unmarshal(got.Detail, &d), name)
			for k, v := range detail {
				require.EqualValues(t, v, d[k], "%s: detail %s", name, k)
			}
		}
		none := (*AuditEntry)(nil)
		entry := func(who, action, kind, id string) *AuditEntry {
			return &AuditEntry{Principal: who, Action: action, Kind: kind, EntityID: id}
		}

		// A plain submit is no person's change of this log (it records
		// its submitter on the operation).
		step("submit", none, nil, func() error { _, err := b.s.Submit(b.ctx, newOp("op-1", "c-1"), nil); return err }, false)
		step("cancel", entry("bob", ActCancel, EntityCommand, "c-1"), map[string]any{"operation_id": "op-1", "from": "pending"},
			func() error { _, err := b.s.Cancel(b.ctx, "c-1", "bob"); return err }, false)
		step("cancel again", none, nil, func() error { _, err := b.s.Cancel(b.ctx, "c-1", "bob"); return err }, false)
		ev, err := b.s.Events(b.ctx, "c-1")
		require.NoError(t, err)
		require.Equal(t, "cancelled", ev[len(ev)-1].To)
		require.Equal(t, "bob", ev[len(ev)-1].Principal, "the cancel's event carries its principal")
		require.Equal(t, "", ev[0].Principal, "the controller's own events carry none")

		// A compensation of the cancelled (failed_final) op-1.
		comp := newOp(domain.CompensationOperationID("op-1", "v1"), "c-comp")
		comp.Compensates, comp.SubmittedBy, comp.Via, comp.CompensationReason = "op-1", "carol", domain.ViaCompensation, "undo it"
		step("compensate", entry("carol", ActCompensate, EntityOperation, comp.OperationID),
			map[string]any{"compensates": "op-1", "reason": "undo it", "retry": false},
			func() error { _, err := b.s.Submit(b.ctx, comp, nil); return err }, false)
		step("compensate again", none, nil, func() error { _, err := b.s.Submit(b.ctx, comp, nil); return err }, false)
		// A change that fails after its audit row was written takes the
		// row back with it: one transaction.
		comp2 := newOp(domain.CompensationOperationID("op-1", "v2"), "c-comp2")
		comp2.Compensates, comp2.SubmittedBy, comp2.Via = "op-1", "carol", domain.ViaCompensation
		step("compensate rolled back", none, nil, func() error {
			_, err := b.s.Submit(b.ctx, comp2, func() error { return errors.New("failpoint") })
			return err
		}, true)
		_, err = b.s.GetOperation(b.ctx, comp2.OperationID)
		require.ErrorIs(t, err, domain.ErrNotFound)
		ev, err = b.s.Events(b.ctx, comp.OperationID)
		require.NoError(t, err)
		require.Equal(t, "carol", ev[0].Principal)

		// A needs_attention command resolved.
		_, err = b.s.Submit(b.ctx, newOp("op-2", "c-2"), nil)
		require.NoError(t, err)
		_, err = b.s.ClaimSend(b.ctx, "c-2", fsm.CmdPending, 0, 1, fence, b.clk.Now().Add(time.Second))
		require.NoError(t, err)
		step("cancel of a published command", none, nil, func() error { _, err := b.s.Cancel(b.ctx, "c-2", "bob"); return err }, true)
		step("resolve of a sent command", none, nil, func() error {
			_, err := b.s.Resolve(b.ctx, "c-2", fsm.CmdSucceeded, "early", "alice")
			return err
		}, true)
		c, _ := b.s.GetCommand(b.ctx, "c-2")
		_, err = b.s.Move(b.ctx, "c-2", fsm.CmdSent, c.Version, fsm.CmdNeedsAttention, "asks used up", fence, b.clk.Now())
		require.NoError(t, err)
		step("resolve", entry("alice", ActResolve, EntityCommand, "c-2"),
			map[string]any{"outcome": "succeeded", "note": "checked on site", "operation_id": "op-2"},
			func() error {
				_, err := b.s.Resolve(b.ctx, "c-2", fsm.CmdSucceeded, "checked on site", "alice")
				return err
			}, false)
		step("resolve again", none, nil, func() error {
			_, err := b.s.Resolve(b.ctx, "c-2", fsm.CmdSucceeded, "checked on site", "alice")
			return err
		}, false)
		ev, err = b.s.Events(b.ctx, "c-2")
		require.NoError(t, err)
		require.Equal(t, "alice", ev[len(ev)-1].Principal)

		// Tasks: create, plan, approve, reject.
		step("task create", entry("agent", ActCreate, EntityTask, "task-1"), map[string]any{"version": 1, "plan_hash": "hash-task-1"},
			func() error { _, _, err := b.s.CreateTask(b.ctx, newTask("task-1", "agent")); return err }, false)
		step("task create again", none, nil,
			func() error { _, _, err := b.s.CreateTask(b.ctx, newTask("task-1", "agent")); return err }, false)
		steps := json.RawMessage(`[{"step":"restart-device","action":"restart","target":"device-2","params":{}}]`)
		step("plan", entry("bob", ActPlan, EntityTask, "task-1"), map[string]any{"version": 2, "supersedes": 1, "plan_hash": "hash-v2"},
			func() error { _, _, err := b.s.UpdatePlan(b.ctx, "task-1", steps, "hash-v2", "bob", nil); return err }, false)
		step("plan again", none, nil,
			func() error { _, _, err := b.s.UpdatePlan(b.ctx, "task-1", steps, "hash-v2", "bob", nil); return err }, false)
		step("approve a stale version", none, nil,
			func() error { _, _, err := b.s.Approve(b.ctx, "task-1", 1, "", "alice", true); return err }, true)
		step("approve", entry("alice", ActApprove, EntityTask, "task-1"), map[string]any{"version": 2, "plan_hash": "hash-v2"},
			func() error { _, _, err := b.s.Approve(b.ctx, "task-1", 2, "", "alice", true); return err }, false)
		step("approve again", none, nil,
			func() error { _, _, err := b.s.Approve(b.ctx, "task-1", 2, "", "alice", true); return err }, false)
		step("reject", entry("carol", ActReject, EntityTask, "task-1"), map[string]any{"reason": "not tonight", "from": "approved"},
			func() error { _, err := b.s.Reject(b.ctx, "task-1", "not tonight", "carol"); return err }, false)
		step("reject again", none, nil,
			func() error { _, err := b.s.Reject(b.ctx, "task-1", "not tonight", "carol"); return err }, false)
		step("plan of a rejected task", none, nil,
			func() error { _, _, err := b.s.UpdatePlan(b.ctx, "task-1", steps, "hash-v3", "bob", nil); return err }, true)

		// Grants.
		var grantID string
		step("grant", entry("admin", ActGrant, EntityGrant, "g-1"), map[string]any{"grantee": "agent", "action": "restart", "devices": "device-*"},
			func() error {
				g, _, err := b.s.CreateGrant(b.ctx, "g-1", "agent", "restart", "device-*", "admin")
				grantID = g.GrantID
				return err
			}, false)
		require.Equal(t, "g-1", grantID)
		step("grant again", none, nil, func() error {
			_, _, err := b.s.CreateGrant(b.ctx, "g-2", "agent", "restart", "device-*", "admin")
			return err
		}, false)
		step("revoke", entry("root", ActRevoke, EntityGrant, "g-1"), map[string]any{"grantee": "agent"},
			func() error { _, err := b.s.RevokeGrant(b.ctx, "g-1", "root"); return err }, false)
		step("revoke again", none, nil, func() error { _, err := b.s.RevokeGrant(b.ctx, "g-1", "root"); return err }, false)
		step("revoke of no grant", none, nil, func() error { _, err := b.s.RevokeGrant(b.ctx, "g-404", "root"); return err }, true)

		// Presence reset.
		_, err = b.s.ApplyPresence(b.ctx, "device-1", wire.Presence{Online: true, Session: 3})
		require.NoError(t, err)
		step("presence reset", entry("admin", ActPresenceReset, EntityDevice, "device-1"), map[string]any{"online": true, "session": 3},
			func() error { _, err := b.s.ResetPresence(b.ctx, "device-1", "admin"); return err }, false)
		step("presence reset of no device", none, nil,
			func() error { _, err := b.s.ResetPresence(b.ctx, "device-404", "admin"); return err }, true)
		ev, err = b.s.Events(b.ctx, "device-1")
		require.NoError(t, err)
		require.Equal(t, "admin", ev[len(ev)-1].Principal)

		// Rollouts: create, approve, pause, resume, cancel.
		n := newRollout("fw-1", 2)
		n.ApprovalRequired = true
		step("rollout create", entry("alice", ActCreate, EntityRollout, "fw-1"),
			map[string]any{"action": "restart", "devices": 2, "approval_required": true},
			func() error { _, _, err := b.s.CreateRollout(b.ctx, n); return err }, false)
		step("rollout create again", none, nil, func() error { _, _, err := b.s.CreateRollout(b.ctx, n); return err }, false)
		step("rollout pause while waiting", none, nil,
			func() error { _, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutResume, "", "bob"); return err }, true)
		step("rollout approve by its creator", none, nil,
			func() error { _, _, err := b.s.ApproveRollout(b.ctx, "fw-1", 1, "alice", true); return err }, true)
		step("rollout approve", entry("bob", ActApprove, EntityRollout, "fw-1"), map[string]any{"version": 1},
			func() error { _, _, err := b.s.ApproveRollout(b.ctx, "fw-1", 1, "bob", true); return err }, false)
		step("rollout approve again", none, nil,
			func() error { _, _, err := b.s.ApproveRollout(b.ctx, "fw-1", 1, "bob", true); return err }, false)
		step("rollout pause", entry("bob", ActPause, EntityRollout, "fw-1"), map[string]any{"from": "scheduled", "to": "paused"},
			func() error { _, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutPause, "", "bob"); return err }, false)
		step("rollout pause again", none, nil,
			func() error { _, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutPause, "", "bob"); return err }, false)
		step("rollout resume", entry("carol", ActResume, EntityRollout, "fw-1"), map[string]any{"from": "paused", "to": "running"},
			func() error { _, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutResume, "", "carol"); return err }, false)
		step("rollout cancel", entry("dave", ActCancel, EntityRollout, "fw-1"),
			map[string]any{"to": "cancelled", "reason": "wrong firmware", "cancelled_operations": 0},
			func() error {
				_, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutCancel, "wrong firmware", "dave")
				return err
			}, false)
		step("rollout cancel again", none, nil,
			func() error { _, err := b.s.MoveRollout(b.ctx, "fw-1", RolloutCancel, "", "dave"); return err }, false)

		// One principal's entries, newest first, paged by the cursor.
		l, err := b.s.ListAudit(b.ctx, AuditFilter{Principal: "bob"}, StartPage{Limit: 2})
		require.NoError(t, err)
		require.EqualValues(t, 4, l.Total, "bob: cancel, plan, rollout approve, pause")
		require.Equal(t, []string{ActPause, ActApprove}, []string{l.Items[0].Action, l.Items[1].Action})
		require.NotEmpty(t, l.Next)
		l, err = b.s.ListAudit(b.ctx, AuditFilter{Principal: "bob"}, StartPage{Limit: 2, After: l.Next})
		require.NoError(t, err)
		require.Equal(t, []string{ActPlan, ActCancel}, []string{l.Items[0].Action, l.Items[1].Action})
		require.Empty(t, l.Next)
		require.EqualValues(t, 4, l.Total)
	})
}

// TestAuditPagesWithinOneInstant: entries at the same millisecond page by
// id, compared as numbers (ids 9 and 10 among them), none repeated or
// skipped; since and until bound the time.
func TestAuditPagesWithinOneInstant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		t0 := b.clk.Now()
		const grants = 12
		var want []string
		for i := range grants {
			id := "g-" + string(rune('a'+i))
			_, _, err := b.s.CreateGrant(b.ctx, id, "agent", "restart", "device-"+string(rune('a'+i)), "admin")
			require.NoError(t, err)
			want = append([]string{"grant:" + id}, want...)
		}
		b.clk.Advance(time.Minute)
		_, err := b.s.RevokeGrant(b.ctx, "g-a", "admin")
		require.NoError(t, err)
		want = append([]string{"revoke:g-a"}, want...)
		var got []string
		for after := ""; ; {
			l, err := b.s.ListAudit(b.ctx, AuditFilter{}, StartPage{Limit: 5, After: after})
			require.NoError(t, err)
			require.EqualValues(t, grants+1, l.Total)
			for _, e := range l.Items {
				got = append(got, e.Action+":"+e.EntityID)
			}
			if after = l.Next; after == "" {
				break
			}
		}
		require.Equal(t, want, got)
		_, err = b.s.ListAudit(b.ctx, AuditFilter{}, StartPage{After: StartCursor{Start: 1, ID: "g-a"}.String()})
		require.ErrorIs(t, err, domain.ErrInvalid, "a cursor whose id is not an audit id")

		until := t0.Add(time.Second)
		l, err := b.s.ListAudit(b.ctx, AuditFilter{Until: until}, StartPage{})
		require.NoError(t, err)
		require.EqualValues(t, grants, l.Total)
		since := t0.Add(time.Second)
		l, err = b.s.ListAudit(b.ctx, AuditFilter{Since: since}, StartPage{})
		require.NoError(t, err)
		require.EqualValues(t, 1, l.Total)
		require.Equal(t, ActRevoke, l.Items[0].Action)
	})
}

// TestCountByStatusHasEveryState: every state of both machines is
// counted, 0 when none.
func TestCountByStatusHasEveryState(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		needsAttention(t, b)
		_, err := b.s.Submit(b.ctx, newOp("op-2", "c-2"), nil)
		require.NoError(t, err)
		got, err := b.s.CountByStatus(b.ctx, false)
		require.NoError(t, err)
		require.Len(t, got.Operations, len(fsm.Operation.States()))
		require.Len(t, got.Commands, len(fsm.Command.States()))
		require.EqualValues(t, 2, got.Operations["started"])
		require.EqualValues(t, 0, got.Operations["succeeded"])
		require.EqualValues(t, 1, got.Commands["needs_attention"])
		require.EqualValues(t, 1, got.Commands["pending"])
		require.EqualValues(t, 0, got.Commands["sent"])
		open, err := b.s.CountByStatus(b.ctx, true)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"started": 2, "failed_retryable": 0}, open.Operations, "the open states only")
		require.Equal(t, map[string]int64{"pending": 1, "waiting_device": 0, "sent": 0, "received": 0, "executing": 0,
			"needs_attention": 1}, open.Commands, "the open states only")
		for st := range open.Commands {
			require.False(t, fsm.CommandState(st).Terminal(), st)
		}
		require.Len(t, open.Commands, len(fsm.Command.States())-len(fsm.TerminalCommandStates()))

		_, err = b.s.Resolve(b.ctx, "c-1", fsm.CmdFailed, "gone", "alice")
		require.NoError(t, err)
		got, err = b.s.CountByStatus(b.ctx, false)
		require.NoError(t, err)
		require.EqualValues(t, 0, got.Commands["needs_attention"])
		require.EqualValues(t, 1, got.Commands["failed"])
		require.EqualValues(t, 1, got.Operations["failed_final"])
	})
}
