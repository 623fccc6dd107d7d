package command

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/wire"
)

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// The decision table: state × capabilities × policy × last answer → decision.
func TestDecideTable(t *testing.T) {
	conforming := domain.Device{Online: true, Seen: true, Capabilities: wire.Capabilities{Dedupe: true, Query: true}}
	noQuery := domain.Device{Online: true, Seen: true, Capabilities: wire.Capabilities{Dedupe: true}}
	legacy := domain.Device{Online: true, Seen: true}
	legacyQuery := domain.Device{Online: true, Seen: true, Capabilities: wire.Capabilities{Query: true}}
	offline := conforming
	offline.Online = false
	legacyOffline := legacy
	legacyOffline.Online = false
	unseen := store.UnseenDevice("d")

	wait := Policy{MaxAttempts: 3, Offline: OfflineWait, OnUnknown: UnknownNeedsAttention}
	fail := wait
	fail.Offline = OfflineFail
	resend := wait
	resend.OnUnknown = UnknownResend

	expires := t0.Add(time.Minute)
	cmd := func(st fsm.CommandState, attempt, queries int, lastQuery, lastAnswer string) domain.Command {
		return domain.Command{Status: st, Attempt: attempt, Queries: queries, LastQueryID: lastQuery, LastAnswer: lastAnswer,
			ExpiresAt: expires, NextCheckAt: t0}
	}
	moveTo := func(to fsm.CommandState) Decision { return Decision{Kind: Move, To: to, Until: expires} }
	serialWait := Policy{AckTimeout: time.Second, MaxAttempts: 3, Offline: OfflineWait, OnUnknown: UnknownNeedsAttention, Concurrency: ConcurrencySerial}
	serialLong := serialWait
	serialLong.AckTimeout = time.Minute
	serialFail := serialWait
	serialFail.Offline = OfflineFail
	queued := func(behind string, next time.Time) domain.Command {
		c := cmd(fsm.CmdPending, 0, 0, "", "")
		c.SerialSeq, c.QueuedBehind, c.Reason, c.NextCheckAt = 2, behind, store.ReasonQueued, next
		return c
	}
	serialHead := func(next time.Time) domain.Command {
		c := cmd(fsm.CmdPending, 0, 0, "", "")
		c.SerialSeq, c.NextCheckAt = 1, next
		return c
	}
	postpone := func(until time.Time) Decision { return Decision{Kind: Postpone, Until: until} }

	for _, tc := range []struct {
		name string
		c    domain.Command
		dev  domain.Device
		pol  Policy
		now  time.Time
		want Decision
	}{
		{"next check not due", cmd(fsm.CmdSent, 1, 0, "", ""), conforming, wait, t0.Add(-time.Second), Decision{Kind: Wait}},
		{"pending, online", cmd(fsm.CmdPending, 0, 0, "", ""), conforming, wait, t0, Decision{Kind: Send}},
		{"pending, legacy online", cmd(fsm.CmdPending, 0, 0, "", ""), legacy, wait, t0, Decision{Kind: Send}},
		{"pending, offline, wait", cmd(fsm.CmdPending, 0, 0, "", ""), offline, wait, t0, moveTo(fsm.CmdWaitingDevice)},
		{"pending, never seen, wait", cmd(fsm.CmdPending, 0, 0, "", ""), unseen, wait, t0, moveTo(fsm.CmdWaitingDevice)},
		{"pending, offline, fail", cmd(fsm.CmdPending, 0, 0, "", ""), offline, fail, t0, moveTo(fsm.CmdFailed)},
		{"waiting, still offline", cmd(fsm.CmdWaitingDevice, 0, 0, "", ""), offline, wait, t0, postpone(expires)},
		{"waiting, back, never published", cmd(fsm.CmdWaitingDevice, 0, 0, "", ""), conforming, wait, t0, Decision{Kind: Send}},
		{"waiting, back, published before: ask first", cmd(fsm.CmdWaitingDevice, 1, 0, "", ""), conforming, wait, t0, Decision{Kind: Ask}},
		{"waiting, back, asked, no answer: re-send", cmd(fsm.CmdWaitingDevice, 1, 1, "q-1", ""), conforming, wait, t0, Decision{Kind: Send}},
		{"sent, no answer yet: ask", cmd(fsm.CmdSent, 1, 0, "", ""), conforming, wait, t0, Decision{Kind: Ask}},
		{"sent, asked, unanswered: re-send same id", cmd(fsm.CmdSent, 1, 1, "q-1", ""), conforming, wait, t0, Decision{Kind: Send}},
		{"sent, device said unknown: re-send", cmd(fsm.CmdSent, 1, 1, "q-1", "unknown"), conforming, wait, t0, Decision{Kind: Send}},
		{"sent, sends used up: ask", cmd(fsm.CmdSent, 3, 1, "q-1", ""), conforming, wait, t0, Decision{Kind: Ask}},
		{"sent, asks used up, question forgotten by a takeover: ask first", cmd(fsm.CmdSent, 2, 5, "", ""), conforming, wait, t0, Decision{Kind: Ask}},
		{"sent, sends and asks used up: wait for expiry", cmd(fsm.CmdSent, 3, 3, "q-3", ""), conforming, wait, t0, postpone(expires)},
		{"sent, no query capability: re-send", cmd(fsm.CmdSent, 1, 0, "", ""), noQuery, wait, t0, Decision{Kind: Send}},
		{"received, asked, unanswered: ask again, never re-send", cmd(fsm.CmdReceived, 1, 1, "q-1", ""), conforming, wait, t0, Decision{Kind: Ask}},
		{"executing, asks used up: asked again (slowly) until expiry", cmd(fsm.CmdExecuting, 1, 3, "q-3", ""), conforming, wait, t0, Decision{Kind: Ask}},
		{"received, asks used up: asked again (slowly) until expiry", cmd(fsm.CmdReceived, 1, 5, "q-5", "received"), conforming, wait, t0, Decision{Kind: Ask}},
		{"legacy received, asks used up: needs_attention", cmd(fsm.CmdReceived, 1, 3, "q-3", ""), legacyQuery, wait, t0, moveTo(fsm.CmdNeedsAttention)},
		{"executing, went offline: waiting_device", cmd(fsm.CmdExecuting, 1, 0, "", ""), offline, wait, t0, moveTo(fsm.CmdWaitingDevice)},
		{"legacy, sent: asks", cmd(fsm.CmdSent, 1, 0, "", ""), legacyQuery, wait, t0, Decision{Kind: Ask}},
		{"legacy, sent, asks used up: needs_attention", cmd(fsm.CmdSent, 1, 3, "q-3", ""), legacyQuery, wait, t0, moveTo(fsm.CmdNeedsAttention)},
		{"legacy, cannot ask: needs_attention", cmd(fsm.CmdSent, 1, 0, "", ""), legacy, wait, t0, moveTo(fsm.CmdNeedsAttention)},
		{"legacy, offline after publish: needs_attention, never a re-send", cmd(fsm.CmdSent, 1, 0, "", ""), legacyOffline, wait, t0, moveTo(fsm.CmdNeedsAttention)},
		{"legacy, on_unknown resend: re-send", cmd(fsm.CmdSent, 1, 1, "q-1", "unknown"), legacyQuery, resend, t0, Decision{Kind: Send}},
		{"expired, dedupe: timeout", cmd(fsm.CmdSent, 2, 2, "q-2", ""), conforming, wait, expires, moveTo(fsm.CmdTimeout)},
		{"expired, never published: timeout", cmd(fsm.CmdWaitingDevice, 0, 0, "", ""), offline, wait, expires, moveTo(fsm.CmdTimeout)},
		{"expired, legacy published: needs_attention", cmd(fsm.CmdSent, 1, 0, "", ""), legacy, wait, expires, moveTo(fsm.CmdNeedsAttention)},
		{"expired, needs_attention: stays for a person", cmd(fsm.CmdNeedsAttention, 1, 3, "", ""), legacy, wait, expires, Decision{Kind: Wait}},
		{"needs_attention before expiry: look again much later", cmd(fsm.CmdNeedsAttention, 1, 3, "", ""), legacy, wait, t0, postpone(expires.Add(24 * time.Hour))},
		{"serial, queued behind another: postponed, fallback at 8x the ack timeout", queued("c-0", t0), conforming, serialWait, t0, postpone(t0.Add(8 * time.Second))},
		{"serial, queued, fallback never past the expiry", queued("c-0", t0), conforming, serialLong, t0, postpone(expires)},
		{"serial, queued, offline: stays queued, not waiting_device", queued("c-0", t0), offline, serialWait, t0, postpone(t0.Add(8 * time.Second))},
		{"serial, its turn came, check set later: send now", queued("", t0.Add(30*time.Second)), conforming, serialWait, t0, Decision{Kind: Send}},
		{"serial, its turn came, offline: waiting_device", queued("", t0.Add(30*time.Second)), offline, serialWait, t0, moveTo(fsm.CmdWaitingDevice)},
		{"serial, its turn came, offline, fail: failed", queued("", t0.Add(30*time.Second)), offline, serialFail, t0, moveTo(fsm.CmdFailed)},
		{"serial, queued past its expiry: timeout unpublished", queued("c-0", t0), conforming, serialWait, expires, moveTo(fsm.CmdTimeout)},
		{"serial head, not queued, check not due: wait", serialHead(t0.Add(time.Second)), conforming, serialWait, t0, Decision{Kind: Wait}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.c, tc.dev, tc.pol, tc.now)
			got.Reason = ""
			require.Equal(t, tc.want, got)
		})
	}
}

// Every decision the table makes for a legacy device after a publish is
// something other than a re-send, unless its policy accepts duplicates.
func TestDecideNeverResendsToALegacyDevice(t *testing.T) {
	legacy := domain.Device{Online: true, Seen: true, Capabilities: wire.Capabilities{Query: true}}
	pol := Policy{MaxAttempts: 5, Offline: OfflineWait, OnUnknown: UnknownNeedsAttention}
	for _, st := range []fsm.CommandState{fsm.CmdSent, fsm.CmdReceived, fsm.CmdExecuting, fsm.CmdWaitingDevice} {
		for _, answer := range []string{"", "unknown", "received"} {
			for q := 0; q <= 5; q++ {
				c := domain.Command{Status: st, Attempt: 1, Queries: q, LastQueryID: "q", LastAnswer: answer,
					ExpiresAt: t0.Add(time.Minute), NextCheckAt: t0}
				require.NotEqual(t, Send, Decide(c, legacy, pol, t0).Kind, "%s, answer %q, %d queries", st, answer, q)
			}
		}
	}
}

type fakePublisher struct {
	mu   sync.Mutex
	sent []string // topics
}

func (p *fakePublisher) Publish(_ context.Context, topic string, _ byte, _ bool, _ []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, topic)
	return nil
}

func (p *fakePublisher) topics() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.sent...)
}

// storeWithDevice is a real SQLite store on an injected clock, with d1
// online (it deduplicates and answers queries).
func storeWithDevice(t *testing.T) (*store.DB, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	st, err := backend.Open(context.Background(), store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1", Now: clk.Now})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	_, err = st.ApplyPresence(context.Background(), "d1", wire.Presence{Online: true, Session: 1,
		Capabilities: &wire.Capabilities{Dedupe: true, Query: true}})
	require.NoError(t, err)
	return st, clk
}

// The dispatcher carries the table out against a real SQLite store, with a
// fake publisher and an injected clock: send, then after the ack timeout ask,
// then re-send the same command_id, then time out at expires_at.
func TestDispatcherStepsThroughTheTable(t *testing.T) {
	ctx := context.Background()
	st, clk := storeWithDevice(t)
	pol := Policy{AckTimeout: time.Second, MaxAttempts: 2, TTL: 10 * time.Second, Offline: OfflineWait, OnUnknown: UnknownNeedsAttention}
	res, err := st.Submit(ctx, store.NewOperation{OperationID: "t:s:d1:v1", Action: "restart", Target: "d1",
		Params: json.RawMessage(`{}`), RequestHash: "h", CommandID: "c-1", CommandTTL: pol.TTL, QoS: 1,
		Owner: "i1", LeaseTTL: time.Hour}, nil)
	require.NoError(t, err)
	require.True(t, res.Created)

	pub := &fakePublisher{}
	d := New(Config{Store: st, Publisher: pub, Instance: "i1", TopicRoot: "fleet", Policy: func(string) Policy { return pol },
		Metrics: metrics.New(), Now: clk.Now})
	status := func() fsm.CommandState {
		c, err := st.GetCommand(ctx, "c-1")
		require.NoError(t, err)
		return c.Status
	}

	d.step(ctx, "c-1")
	require.Equal(t, []string{"fleet/d1/commands"}, pub.topics())
	require.Equal(t, fsm.CmdSent, status())

	d.step(ctx, "c-1") // before the ack timeout: nothing
	require.Len(t, pub.topics(), 1)

	clk.Advance(pol.Backoff(0) + time.Millisecond)
	d.step(ctx, "c-1")
	require.Equal(t, "fleet/d1/queries", pub.topics()[1], "after the ack timeout it asks first")

	clk.Advance(pol.Backoff(1) + time.Millisecond)
	d.step(ctx, "c-1")
	require.Equal(t, "fleet/d1/commands", pub.topics()[2], "an unanswered question: the same command again")
	c, err := st.GetCommand(ctx, "c-1")
	require.NoError(t, err)
	require.Equal(t, 2, c.Attempt)

	clk.Advance(pol.TTL)
	d.step(ctx, "c-1")
	require.Equal(t, fsm.CmdTimeout, status())
	op, err := st.GetOperation(ctx, "t:s:d1:v1")
	require.NoError(t, err)
	require.Equal(t, fsm.OpFailedRetryable, op.Status)
	require.Equal(t, []string{"c-1"}, op.CommandIDs, "no new command_id was minted")
}

// The asks after a reconnect are not counted against max_attempts.
func TestReconnectAsksDoNotUseTheBudget(t *testing.T) {
	ctx := context.Background()
	st, clk := storeWithDevice(t)
	pol := Policy{AckTimeout: time.Second, MaxAttempts: 2, TTL: time.Minute, Offline: OfflineWait, OnUnknown: UnknownNeedsAttention}
	_, err := st.Submit(ctx, store.NewOperation{OperationID: "op", Action: "restart", Target: "d1", Params: json.RawMessage(`{}`),
		RequestHash: "h", CommandID: "c-1", CommandTTL: pol.TTL, QoS: 1, Owner: "i1", LeaseTTL: time.Hour}, nil)
	require.NoError(t, err)
	pub := &fakePublisher{}
	d := New(Config{Store: st, Publisher: pub, Instance: "i1", TopicRoot: "fleet", Policy: func(string) Policy { return pol },
		Metrics: metrics.New(), Now: clk.Now})
	d.step(ctx, "c-1") // published
	for i := 0; i < 3; i++ {
		d.reconnected(ctx)
	}
	c, err := st.GetCommand(ctx, "c-1")
	require.NoError(t, err)
	require.Equal(t, 0, c.Queries, "three reconnect asks, none counted")
	require.Len(t, pub.topics(), 4, "one command and three queries were published")
}

// countingStore counts the dispatcher's reads of open commands.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	reads int
}

func (s *countingStore) OpenCommand(ctx context.Context, id string) (store.OpenCommand, error) {
	s.mu.Lock()
	s.reads++
	s.mu.Unlock()
	return s.Store.OpenCommand(ctx, id)
}

// A new command handed on as its submit inserted it is sent without being
// read; the copy is used once, and a copy out of date by then (the command
// was cancelled meanwhile) is refused by the decision's conditional write:
// nothing is published.
func TestInsertedCommandIsSentWithoutARead(t *testing.T) {
	ctx := context.Background()
	st, clk := storeWithDevice(t)
	pol := Policy{AckTimeout: time.Second, MaxAttempts: 2, TTL: time.Minute, Offline: OfflineWait, OnUnknown: UnknownNeedsAttention}
	submit := func(op, cmd string) store.OpenCommand {
		res, err := st.Submit(ctx, store.NewOperation{OperationID: op, Action: "restart", Target: "d1", Params: json.RawMessage(`{}`),
			RequestHash: "h", CommandID: cmd, CommandTTL: pol.TTL, QoS: 1, Owner: "i1", LeaseTTL: time.Hour}, nil)
		require.NoError(t, err)
		require.True(t, res.Created)
		return res.Inserted
	}
	cs := &countingStore{Store: st}
	pub := &fakePublisher{}
	d := New(Config{Store: cs, Publisher: pub, Instance: "i1", TopicRoot: "fleet", Policy: func(string) Policy { return pol },
		Metrics: metrics.New(), Now: clk.Now})
	stepKicked := func() {
		id := <-d.work
		d.step(ctx, id)
		d.done(id)
	}

	first := submit("op-1", "c-1")
	d.Submitted(first.CommandID, &first)
	stepKicked()
	require.Equal(t, []string{"fleet/d1/commands"}, pub.topics())
	require.Zero(t, cs.reads, "the inserted copy decided the send")
	c, err := st.GetCommand(ctx, "c-1")
	require.NoError(t, err)
	require.Equal(t, fsm.CmdSent, c.Status)
	d.step(ctx, "c-1") // the copy is gone: a later step reads
	require.Equal(t, 1, cs.reads)

	stale := submit("op-2", "c-2")
	_, err = st.Cancel(ctx, "c-2", "someone")
	require.NoError(t, err)
	d.Submitted(stale.CommandID, &stale)
	stepKicked()
	require.Len(t, pub.topics(), 1, "a cancelled command is not published from an old copy")
	c, err = st.GetCommand(ctx, "c-2")
	require.NoError(t, err)
	require.Equal(t, fsm.CmdCancelled, c.Status)
}
