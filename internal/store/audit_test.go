package store

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// auditRun is a small run written through the Store's own API, for the
// Audit to read back: the database file and the writer that made it.
type auditRun struct {
	path string
	s    *DB
	now  time.Time // the store's clock; each step below advances it
	t0   time.Time
}

var auditFence = domain.Fence{Owner: "i1", Token: 1}

func (r *auditRun) clock() time.Time { return r.now }

func (r *auditRun) tick() { r.now = r.now.Add(time.Second) }

func (r *auditRun) submit(t *testing.T, op, cmd, target, params string) {
	t.Helper()
	r.tick()
	_, err := r.s.Submit(context.Background(), NewOperation{OperationID: op, Action: "restart", Target: target,
		Params: json.RawMessage(params), RequestHash: "h-" + op, CommandID: cmd, CommandTTL: time.Minute, QoS: 1,
		Owner: "i1", LeaseTTL: time.Hour}, nil)
	require.NoError(t, err)
}

func (r *auditRun) send(t *testing.T, cmd string, expect fsm.CommandState, attempt int) {
	t.Helper()
	r.tick()
	_, err := r.s.ClaimSend(context.Background(), cmd, expect, attempt, 1, auditFence, r.now.Add(time.Second))
	require.NoError(t, err)
}

func (r *auditRun) receipt(t *testing.T, device string, rc wire.Receipt) string {
	t.Helper()
	r.tick()
	rc.At = r.now
	out, err := r.s.ApplyReceipt(context.Background(), device, rc, nil)
	require.NoError(t, err)
	return out.Effect
}

func (r *auditRun) presence(t *testing.T, device string, p wire.Presence) {
	t.Helper()
	r.tick()
	out, err := r.s.ApplyPresence(context.Background(), device, p)
	require.NoError(t, err)
	require.True(t, out.Applied)
}

// newAuditRun writes:
//   - op-1/c-1 on device-1: sent, asked about (q-1), executing, succeeded as
//     the answer to q-1, then the same receipt again (a duplicate);
//   - op-2/c-2 on device-1: sent twice (a re-send), asked about (q-2, never
//     answered), timed out, then a late success;
//   - op-3/c-3 on device-2 (a device without dedupe): still pending, after a
//     send refused as fenced;
//   - presence: device-1 online then offline, device-2 online.
func newAuditRun(t *testing.T, be string) *auditRun {
	t.Helper()
	r := &auditRun{path: testDSN(t, be), now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	r.t0 = r.now
	s, err := testOpen(context.Background(), Config{Path: r.path, Instance: "i1", Now: r.clock})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	r.s = s
	ctx := context.Background()

	r.presence(t, "device-1", wire.Presence{Online: true, Session: 1, Capabilities: &wire.Capabilities{Dedupe: true, Query: true}})
	r.presence(t, "device-2", wire.Presence{Online: true, Session: 1, Capabilities: &wire.Capabilities{Dedupe: false, Query: true}})

	r.submit(t, "op-1", "c-1", "device-1", `{}`)
	r.send(t, "c-1", fsm.CmdPending, 0)
	r.tick()
	_, err = s.ClaimQuery(ctx, "c-1", "q-1", fsm.CmdSent, 0, true, auditFence, r.now.Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, EffectApplied, r.receipt(t, "device-1", wire.Receipt{CommandID: "c-1", OperationID: "op-1", Status: wire.ReceiptExecuting, Seq: 2}))
	final := wire.Receipt{CommandID: "c-1", OperationID: "op-1", Status: wire.ReceiptSucceeded, Seq: 3, QueryID: "q-1"}
	require.Equal(t, EffectApplied, r.receipt(t, "device-1", final))
	require.Equal(t, EffectDuplicate, r.receipt(t, "device-1", final))

	r.submit(t, "op-2", "c-2", "device-1", `{}`)
	r.send(t, "c-2", fsm.CmdPending, 0)
	r.send(t, "c-2", fsm.CmdSent, 1)
	r.tick()
	_, err = s.ClaimQuery(ctx, "c-2", "q-2", fsm.CmdSent, 0, true, auditFence, r.now.Add(time.Second))
	require.NoError(t, err)
	c2, err := s.GetCommand(ctx, "c-2")
	require.NoError(t, err)
	r.tick()
	_, err = s.Move(ctx, "c-2", fsm.CmdSent, c2.Version, fsm.CmdTimeout, fsm.ReasonTimeout, auditFence, r.now)
	require.NoError(t, err)
	require.Equal(t, EffectLate, r.receipt(t, "device-1", wire.Receipt{CommandID: "c-2", OperationID: "op-2", Status: wire.ReceiptSucceeded, Seq: 3}))

	r.submit(t, "op-3", "c-3", "device-2", `{"a":1}`)
	r.tick()
	_, err = s.ClaimSend(ctx, "c-3", fsm.CmdPending, 0, 1, domain.Fence{Owner: "i1", Token: 7}, r.now)
	require.ErrorIs(t, err, ErrFenced)

	r.presence(t, "device-1", wire.Presence{Online: false, Session: 1})
	return r
}

func openAudit(t *testing.T, path string) *Audit {
	t.Helper()
	a, err := testOpenAudit(context.Background(), path)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

func TestAuditCounts(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		r := newAuditRun(t, be)
		a := openAudit(t, r.path)
		ctx := context.Background()

		ops, err := a.OperationsByStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, []AuditCount{{"started", 1}, {"succeeded", 2}}, ops, "op-2's late success decided it")
		cmds, err := a.CommandsByStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, []AuditCount{{"pending", 1}, {"succeeded", 1}, {"timeout", 1}}, cmds)
		effects, err := a.ReceiptsByEffect(ctx)
		require.NoError(t, err)
		require.Equal(t, []AuditCount{{EffectApplied, 2}, {EffectDuplicate, 1}, {EffectLate, 1}}, effects)
	})
}

func TestAuditOperationsCommandsAndDevices(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		r := newAuditRun(t, be)
		a := openAudit(t, r.path)
		ctx := context.Background()

		ops, err := a.Operations(ctx)
		require.NoError(t, err)
		require.Equal(t, []AuditOperation{
			{OperationID: "op-1", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`), Status: fsm.OpSucceeded},
			{OperationID: "op-2", Action: "restart", Target: "device-1", Params: json.RawMessage(`{}`), Status: fsm.OpSucceeded},
			{OperationID: "op-3", Action: "restart", Target: "device-2", Params: json.RawMessage(`{"a":1}`), Status: fsm.OpStarted},
		}, ops)

		cmds, err := a.Commands(ctx)
		require.NoError(t, err)
		require.Len(t, cmds, 3)
		for _, c := range cmds {
			stored, err := r.s.GetCommand(ctx, c.CommandID)
			require.NoError(t, err)
			require.Equal(t, AuditCommand{CommandID: stored.CommandID, OperationID: stored.OperationID, DeviceID: stored.DeviceID,
				Action: stored.Action, Params: stored.Params, Status: stored.Status, ExpiresAt: stored.ExpiresAt,
				Attempt: stored.Attempt, Queries: stored.Queries, ExecutedAs: stored.ExecutedAs, LateOutcome: stored.LateOutcome,
				CreatedAt: stored.CreatedAt}, c, "the same fields as the Store reads")
		}
		require.Equal(t, []string{"c-1", "c-2", "c-3"}, []string{cmds[0].CommandID, cmds[1].CommandID, cmds[2].CommandID}, "oldest first")
		require.Equal(t, 2, cmds[1].Attempt)
		require.Equal(t, 1, cmds[1].Queries)
		require.Equal(t, fsm.CmdTimeout, cmds[1].Status)
		require.Equal(t, "succeeded", cmds[1].LateOutcome)
		require.Equal(t, cmds[2].CreatedAt.Add(time.Minute), cmds[2].ExpiresAt)

		legacy, err := a.LegacyDevices(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"device-2"}, legacy)
	})
}

func TestAuditEventsReceiptsAndQueries(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		r := newAuditRun(t, be)
		a := openAudit(t, r.path)
		ctx := context.Background()

		all, err := a.Events(ctx)
		require.NoError(t, err)
		want, err := r.s.AllEvents(ctx)
		require.NoError(t, err)
		require.Equal(t, want, all)
		var fenced []domain.Event
		for _, e := range all {
			if e.Refused && e.Reason == ReasonFenced {
				fenced = append(fenced, e)
			}
		}
		require.Len(t, fenced, 1)
		require.Equal(t, "c-3", fenced[0].EntityID)
		require.EqualValues(t, 7, fenced[0].FencingToken)

		of, err := a.EventsOf(ctx, "c-2")
		require.NoError(t, err)
		want, err = r.s.Events(ctx, "c-2")
		require.NoError(t, err)
		require.Equal(t, want, of)
		none, err := a.EventsOf(ctx, "c-9")
		require.NoError(t, err)
		require.Empty(t, none)

		// device-1: online at t0+1s, offline at the end; device-2 online at t0+2s.
		pres, err := a.PresenceEvents(ctx, "device-1", r.t0, r.now)
		require.NoError(t, err)
		require.Len(t, pres, 2)
		require.Equal(t, []string{"online", "offline"}, []string{pres[0].To, pres[1].To})
		require.Equal(t, r.t0.Add(time.Second), pres[0].At)
		require.Equal(t, r.now, pres[1].At)
		pres, err = a.PresenceEvents(ctx, "device-1", r.t0.Add(time.Second), r.now.Add(-time.Millisecond))
		require.NoError(t, err)
		require.Len(t, pres, 1, "both ends inclusive, to the millisecond")
		require.Equal(t, "online", pres[0].To)
		for _, e := range pres {
			require.Equal(t, "device", e.Machine)
		}

		rcpts, err := a.Receipts(ctx, "c-1")
		require.NoError(t, err)
		wantR, err := r.s.Receipts(ctx, "c-1")
		require.NoError(t, err)
		require.Equal(t, wantR, rcpts)
		require.Len(t, rcpts, 3)
		require.Equal(t, "q-1", rcpts[1].QueryID)

		qs, err := a.Queries(ctx, "c-1")
		require.NoError(t, err)
		require.Len(t, qs, 1)
		require.Equal(t, "q-1", qs[0].QueryID)
		require.Equal(t, "i1", qs[0].Instance)
		require.EqualValues(t, 1, qs[0].FencingToken)
		require.NotNil(t, qs[0].AnsweredAt, "the succeeded receipt answered it")
		require.Equal(t, "succeeded", qs[0].Answer)
		qs, err = a.Queries(ctx, "c-2")
		require.NoError(t, err)
		require.Len(t, qs, 1)
		require.Nil(t, qs[0].AnsweredAt)
		require.Empty(t, qs[0].Answer)
	})
}

func TestAuditEventfulCommands(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		r := newAuditRun(t, be)
		a := openAudit(t, r.path)
		ctx := context.Background()

		got, err := a.EventfulCommands(ctx, 10)
		require.NoError(t, err)
		require.Equal(t, []EventfulCommand{
			// re-sent 3 + asked 2 + late 4 + timeout 3
			{CommandID: "c-2", OperationID: "op-2", DeviceID: "device-1", Status: fsm.CmdTimeout, Score: 12, Attempt: 2, Queries: 1, LateOutcome: "succeeded"},
			// asked 2; ties with c-3 and is older
			{CommandID: "c-1", OperationID: "op-1", DeviceID: "device-1", Status: fsm.CmdSucceeded, Score: 2, Attempt: 1, Queries: 1},
			// one refused transition 2
			{CommandID: "c-3", OperationID: "op-3", DeviceID: "device-2", Status: fsm.CmdPending, Score: 2},
		}, got)
		got, err = a.EventfulCommands(ctx, 1)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, "c-2", got[0].CommandID)
	})
}

func TestTroubledCommandStates(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, []fsm.CommandState{fsm.CmdFailed, fsm.CmdTimeout, fsm.CmdCancelled, fsm.CmdNeedsAttention}, troubledCommandStates())
}

// An Audit reads one snapshot: commits after OpenAudit are not seen by it,
// and a new Audit sees them.
func TestAuditReadsOneSnapshot(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		r := newAuditRun(t, be)
		a := openAudit(t, r.path)
		ctx := context.Background()

		r.submit(t, "op-4", "c-4", "device-1", `{}`)
		cmds, err := a.Commands(ctx)
		require.NoError(t, err)
		require.Len(t, cmds, 3, "the snapshot of OpenAudit")
		evs, err := a.EventsOf(ctx, "c-4")
		require.NoError(t, err)
		require.Empty(t, evs)

		b := openAudit(t, r.path)
		cmds, err = b.Commands(ctx)
		require.NoError(t, err)
		require.Len(t, cmds, 4)
	})
}

func TestOpenAuditNeverCreatesOrWrites(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.db")
	_, err := testOpenAudit(context.Background(), missing)
	require.Error(t, err)
	require.Contains(t, err.Error(), missing)
	_, statErr := os.Stat(missing)
	require.ErrorIs(t, statErr, os.ErrNotExist, "mode=ro does not create the file")

	_, err = testOpenAudit(context.Background(), "")
	require.Error(t, err)

	r := newAuditRun(t, "sqlite")
	a := openAudit(t, r.path)
	_, err = a.tx.Exec(`DELETE FROM queries`)
	require.ErrorContains(t, err, "readonly", "the connection is read-only")
	qs, err := a.Queries(context.Background(), "c-1")
	require.NoError(t, err, "a refused write leaves the snapshot usable")
	require.Len(t, qs, 1)
}

func TestAuditCloseTwice(t *testing.T) {
	t.Parallel()
	r := newAuditRun(t, "sqlite")
	a, err := testOpenAudit(context.Background(), r.path)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	require.NoError(t, a.Close())
	_, err = a.Commands(context.Background())
	require.Error(t, err, "a closed Audit reads nothing")
}

// A path with characters that mean something in a URI is a file name.
func TestOpenAuditPathIsAFileName(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a dir?x=1#frag%20")
	require.NoError(t, os.Mkdir(dir, 0o755))
	path := filepath.Join(dir, "c.db")
	s, err := testOpen(context.Background(), Config{Path: path, Instance: "i1"})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	a := openAudit(t, path)
	cmds, err := a.Commands(context.Background())
	require.NoError(t, err)
	require.Empty(t, cmds)
}
