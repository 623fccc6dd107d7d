package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

func TestTrustMargin(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ ttl, want time.Duration }{
		{0, 0},
		{time.Second, 200 * time.Millisecond},
		{5 * time.Second, time.Second},
		{10 * time.Second, 2 * time.Second}, // a fifth is exactly the cap
		{11 * time.Second, 2 * time.Second},
		{time.Minute, 2 * time.Second},
	} {
		require.Equal(t, c.want, TrustMargin(c.ttl), "ttl %s", c.ttl)
	}
}

// takeovers reads controller_takeovers_total as /metrics shows it.
func takeovers(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "controller_takeovers_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no controller_takeovers_total")
	return 0
}

// recordingStore records the Keeper's lease calls, in order.
type recordingStore struct {
	store.Store // any other call panics: the Keeper makes none
	mu          sync.Mutex
	calls       []string
	renewErr    error
	taken       []string
	takeErr     error
}

func (s *recordingStore) RenewLeases(_ context.Context, owner string, ttl time.Duration) (int64, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, fmt.Sprintf("renew %s %s", owner, ttl))
	return 1, time.Time{}, s.renewErr
}

func (s *recordingStore) TakeOver(_ context.Context, owner string, ttl time.Duration, limit int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, fmt.Sprintf("takeover %s %s %d", owner, ttl, limit))
	return s.taken, s.takeErr
}

func (s *recordingStore) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// TestBeat: one heartbeat renews this instance's leases, then takes over
// the expired ones; a failed renewal still takes over; the
// before-lease-renew failpoint skips the whole heartbeat (a stalled
// heartbeat: neither renewal nor takeover), as often as it is armed.
func TestBeat(t *testing.T) {
	t.Parallel()
	renew, take := "renew i1 9s", "takeover i1 9s 1000"
	boom := errors.New("disk on fire")
	for _, c := range []struct {
		name       string
		failpoints string
		renewErr   error
		taken      []string
		takeErr    error
		beats      int
		want       []string
		takeovers  float64
		log        string
	}{
		{name: "renews then takes over", beats: 1, want: []string{renew, take}},
		{name: "counts what it took", beats: 1, taken: []string{"op-1", "op-2"}, want: []string{renew, take}, takeovers: 2,
			log: "took over operations whose lease ran out"},
		{name: "renewal failed", beats: 1, renewErr: boom, taken: []string{"op-1"}, want: []string{renew, take}, takeovers: 1,
			log: "renew leases"},
		{name: "takeover failed", beats: 1, taken: []string{"op-1"}, takeErr: boom, want: []string{renew, take},
			log: "take over expired leases"},
		{name: "failpoint skips the heartbeat", failpoints: failpoint.BeforeLeaseRenew + "=error", beats: 2, want: nil,
			log: "lease renewal skipped"},
		{name: "failpoint armed once", failpoints: failpoint.BeforeLeaseRenew + "=1*error", beats: 2, want: []string{renew, take},
			log: "lease renewal skipped"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fps, err := failpoint.Parse(c.failpoints, failpoint.Known)
			require.NoError(t, err)
			st := &recordingStore{renewErr: c.renewErr, taken: c.taken, takeErr: c.takeErr}
			m := metrics.New()
			var logs testenv.SyncBuffer
			k := New(Config{Store: st, Instance: "i1", TTL: 9 * time.Second, Failpoints: fps, Metrics: m,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			for range c.beats {
				k.Beat(context.Background())
			}
			require.Equal(t, c.want, st.Calls())
			require.Equal(t, c.takeovers, takeovers(t, m))
			if c.log != "" {
				require.Contains(t, logs.String(), c.log)
			}
			if c.renewErr != nil || c.takeErr != nil {
				require.Contains(t, logs.String(), boom.Error())
			}
		})
	}
}

// TestBeatCancelledLogsNoError: a heartbeat cut short by shutdown is not
// an error worth a line.
func TestBeatCancelledLogsNoError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st := &recordingStore{renewErr: context.Canceled, takeErr: context.Canceled}
	var logs testenv.SyncBuffer
	k := New(Config{Store: st, Instance: "i1", TTL: 9 * time.Second, Metrics: metrics.New(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	k.Beat(ctx)
	require.NotContains(t, logs.String(), "level=ERROR")
}

// TestRunBeatsUntilCancelled: Run beats every third of the ttl and returns
// nil once its context ends.
func TestRunBeatsUntilCancelled(t *testing.T) {
	t.Parallel()
	st := &recordingStore{}
	k := New(Config{Store: st, Instance: "i1", TTL: 30 * time.Millisecond, Metrics: metrics.New(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(st.Calls()) < 4 { // two beats
		require.True(t, time.Now().Before(deadline), "Run did not beat twice in 5 s: %v", st.Calls())
		<-time.After(5 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	calls := st.Calls()
	for i, c := range calls {
		require.Equal(t, []string{"renew", "takeover"}[i%2], strings.Fields(c)[0], "call %d of %v", i, calls)
	}
}

// TestKeeperOnARealStore: against a real SQLite store and a fake clock,
// i1's heartbeat keeps its own lease alive past its first expiry and takes
// over i2's once it ran out (owner i1, a new fencing token, a lease from
// now); a heartbeat under the failpoint lets i1's lease run out, and i2
// takes it.
func TestKeeperOnARealStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	s, err := backend.Open(ctx, store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1", Now: clk.Now})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	const ttl = 10 * time.Second
	submit := func(id, owner string) {
		_, err := s.Submit(ctx, store.NewOperation{OperationID: id, Action: "restart", Target: "device-1",
			Params: json.RawMessage(`{}`), RequestHash: "h-" + id, CommandID: "c-" + id, CommandTTL: time.Hour, QoS: 1,
			Owner: owner, LeaseTTL: ttl}, nil)
		require.NoError(t, err)
	}
	submit("op-a", "i1")
	submit("op-b", "i2")
	lease := func(id string) (string, int64, time.Duration) {
		op, err := s.GetOperation(ctx, id)
		require.NoError(t, err)
		return op.Owner, op.FencingToken, op.LeaseExpiresAt.Sub(t0)
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	m1 := metrics.New()
	k1 := New(Config{Store: s, Instance: "i1", TTL: ttl, Metrics: m1, Logger: discard})

	clk.Advance(6 * time.Second)
	k1.Beat(ctx)
	owner, token, until := lease("op-a")
	require.Equal(t, "i1", owner)
	require.EqualValues(t, 1, token, "a renewal keeps the token")
	require.Equal(t, 16*time.Second, until, "renewed from now")
	owner, token, until = lease("op-b")
	require.Equal(t, "i2", owner, "not expired yet: not taken")
	require.EqualValues(t, 1, token)
	require.Equal(t, ttl, until)

	clk.Advance(6 * time.Second) // 12 s: op-b ran out at 10 s, op-a runs to 16 s
	k1.Beat(ctx)
	owner, token, until = lease("op-a")
	require.Equal(t, "i1", owner)
	require.Equal(t, 22*time.Second, until)
	owner, token, until = lease("op-b")
	require.Equal(t, "i1", owner, "taken over")
	require.EqualValues(t, 2, token, "a takeover moves the token")
	require.Equal(t, 22*time.Second, until)
	require.Equal(t, 1.0, takeovers(t, m1))

	// i1's heartbeat stalls (the failpoint) past its leases' expiry: they
	// are not renewed, and i2's heartbeat takes them.
	fps, err := failpoint.Parse(failpoint.BeforeLeaseRenew+"=error", failpoint.Known)
	require.NoError(t, err)
	stalled := New(Config{Store: s, Instance: "i1", TTL: ttl, Failpoints: fps, Metrics: m1, Logger: discard})
	clk.Advance(5 * time.Second) // 17 s
	stalled.Beat(ctx)
	_, _, until = lease("op-a")
	require.Equal(t, 22*time.Second, until, "the skipped heartbeat renewed nothing")
	clk.Advance(5 * time.Second) // 22 s: both ran out
	m2 := metrics.New()
	New(Config{Store: s, Instance: "i2", TTL: ttl, Metrics: m2, Logger: discard}).Beat(ctx)
	for _, id := range []string{"op-a", "op-b"} {
		owner, token, until = lease(id)
		require.Equal(t, "i2", owner, id)
		require.Equal(t, 32*time.Second, until, id)
	}
	_, token, _ = lease("op-a")
	require.EqualValues(t, 2, token)
	_, token, _ = lease("op-b")
	require.EqualValues(t, 3, token)
	require.Equal(t, 2.0, takeovers(t, m2))
	require.EqualValues(t, 1, fps.Hits(failpoint.BeforeLeaseRenew))
}
