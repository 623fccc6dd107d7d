package receipt

import (
	"context"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// chanSource hands out messages from a channel.
type chanSource chan mqttx.Message

func (c chanSource) Next(ctx context.Context) (mqttx.Message, error) {
	select {
	case m := <-c:
		return m, nil
	case <-ctx.Done():
		return mqttx.Message{}, ctx.Err()
	}
}

// fakeStore records what reaches the store; the ingestor calls nothing else.
type fakeStore struct {
	store.Store
	mu       sync.Mutex
	receipts []wire.Receipt
	presence []wire.Presence
	// hold, when set, runs first in each receipt's apply (a slow commit).
	hold func(device string)
}

func (f *fakeStore) ApplyReceipt(_ context.Context, device string, r wire.Receipt, _ func() error) (store.ReceiptOutcome, error) {
	if f.hold != nil {
		f.hold(device)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.receipts = append(f.receipts, r)
	return store.ReceiptOutcome{Effect: store.EffectUnknownCommand}, nil
}

func (f *fakeStore) ApplyReceipts(ctx context.Context, device string, rs []wire.Receipt, bc func() error) ([]store.ReceiptResult, error) {
	res := make([]store.ReceiptResult, len(rs))
	for i, r := range rs {
		res[i].Out, res[i].Err = f.ApplyReceipt(ctx, device, r, bc)
	}
	return res, nil
}

func (f *fakeStore) ApplyPresence(_ context.Context, device string, p wire.Presence) (store.PresenceOutcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.presence = append(f.presence, p)
	return store.PresenceOutcome{}, nil
}

type ingestBundle struct {
	src   chanSource
	st    *fakeStore
	met   *metrics.Metrics
	acks  chan int
	mu    sync.Mutex
	acked map[int]int
	n     int
}

func setupIngest(t *testing.T, cfg Config) *ingestBundle {
	t.Helper()
	b := &ingestBundle{src: make(chanSource), st: &fakeStore{}, met: metrics.New(), acks: make(chan int, 100000), acked: map[int]int{}}
	cfg.Store, cfg.Source, cfg.TopicRoot, cfg.Metrics = b.st, b.src, "fleet", b.met
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	in := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = in.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return b
}

// send delivers one message and returns its number.
func (b *ingestBundle) send(t *testing.T, topic, payload string) int {
	t.Helper()
	i := b.n
	b.n++
	m := mqttx.NewMessage(topic, []byte(payload), func() {
		b.mu.Lock()
		b.acked[i]++
		b.mu.Unlock()
		b.acks <- i
	})
	select {
	case b.src <- m:
	case <-time.After(10 * time.Second):
		t.Fatal("the ingestor took no message for 10s")
	}
	return i
}

// waitAcked waits until every message sent was acknowledged, and checks
// that each was acknowledged once.
func (b *ingestBundle) waitAcked(t *testing.T) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		n := len(b.acked)
		b.mu.Unlock()
		if n == b.n {
			break
		}
		select {
		case <-b.acks:
		case <-deadline:
			t.Fatalf("%d of %d messages acknowledged after 10s", n, b.n)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, n := range b.acked {
		require.Equal(t, 1, n, "message %d acknowledged %d times", i, n)
	}
}

func (b *ingestBundle) refused(source, reason string) int {
	return int(sample(b.met, fmt.Sprintf(`controller_inputs_refused_total{reason=%q,source=%q}`, reason, source)))
}

func (b *ingestBundle) malformed() int {
	return int(sample(b.met, `controller_receipts_total{effect="malformed"}`))
}

// sample reads one sample of m as /metrics serves it, 0 if absent.
func sample(m *metrics.Metrics, name string) float64 {
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

func receiptJSON(cmd string, seq int) string {
	return fmt.Sprintf(`{"command_id":%q,"operation_id":"op-1","status":"succeeded","seq":%d,"at":"2026-01-02T03:04:05Z"}`, cmd, seq)
}

// Every kind of hostile message is refused with its reason, acknowledged
// once, and never reaches the store; unknown fields are ignored.
func TestHostileMessagesAreRefusedAndAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupIngest(t, Config{ReceiptRate: ReceiptRate(50), PresenceRate: DefaultPresenceRate})
	deep := strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40)
	cases := []struct {
		topic, payload string
		source, reason string
	}{
		{"fleet/controller-x/receipts", receiptJSON("c-1", 1), "receipts", "bad_id"},
		{"fleet/a b/receipts", receiptJSON("c-1", 1), "receipts", "bad_id"},
		{"fleet/../presence", `{"online":true,"session":1}`, "presence", "bad_id"},
		{"fleet/d1/other", `{}`, "mqtt", "bad_topic"},
		{"fleet/d1/commands", `{}`, "mqtt", "bad_topic"},
		{"other/d1/receipts", receiptJSON("c-1", 1), "receipts", "bad_topic"},
		{"fleet/d1/receipts", `{"command_id":"c-1","pad":"` + strings.Repeat("x", 70<<10) + `"}`, "receipts", "too_large"},
		{"fleet/d1/presence", `{"online":true,"pad":"` + strings.Repeat("x", 70<<10) + `"}`, "presence", "too_large"},
		{"fleet/d1/receipts", `{"command_id":`, "receipts", "invalid_json"},
		{"fleet/d1/receipts", receiptJSON("c-1", 1) + `{}`, "receipts", "invalid_json"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"succeeded","seq":1,"result":{"a":` + deep + `}}`, "receipts", "too_deep"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"succeeded","status":"failed","seq":1}`, "receipts", "duplicate_key"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"succeeded","seq":1e30}`, "receipts", "bad_number"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"succeeded","seq":1,"result":{"n":1e999}}`, "receipts", "bad_number"},
		{"fleet/d1/receipts", `{"command_id":["c-1"],"status":"succeeded","seq":1}`, "receipts", "wrong_type"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"succeeded","seq":1,"at":"noon"}`, "receipts", "wrong_type"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"succeeded","seq":1,"result":"done"}`, "receipts", "wrong_type"},
		{"fleet/d1/receipts", `{"command_id":"c 1","status":"succeeded","seq":1}`, "receipts", "bad_id"},
		{"fleet/d1/receipts", `{"command_id":"c-1","status":"exploded","seq":1}`, "receipts", "invalid_value"},
		{"fleet/d1/presence", `{"online":"yes","session":1}`, "presence", "wrong_type"},
		{"fleet/d1/presence", `{"online":true,"session":-4}`, "presence", "bad_number"},
		{"fleet/d1/presence", `{"online":true,"session":1.5}`, "presence", "bad_number"},
		{"fleet/d1/presence", `nope`, "presence", "invalid_json"},
	}
	want := map[[2]string]int{}
	for _, c := range cases {
		b.send(t, c.topic, c.payload)
		want[[2]string{c.source, c.reason}]++
	}
	// Unknown fields are ignored: these two are applied.
	b.send(t, "fleet/d1/receipts", `{"command_id":"c-2","status":"succeeded","seq":1,"firmware_extra":{"x":1}}`)
	b.send(t, "fleet/d1/presence", `{"online":true,"session":3,"mood":"fine"}`)
	b.waitAcked(t)
	for k, n := range want {
		require.Equal(t, n, b.refused(k[0], k[1]), "%v", k)
	}
	require.Equal(t, len(cases), b.malformed())
	require.Len(t, b.st.receipts, 1)
	require.Equal(t, "c-2", b.st.receipts[0].CommandID)
	require.Len(t, b.st.presence, 1)
	require.EqualValues(t, 3, b.st.presence[0].Session)
}

// A device past its rate has its excess dropped (acknowledged, never
// applied, counted), while another device's messages all go through.
func TestFloodingDeviceIsThrottled(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b := setupIngest(t, Config{ReceiptRate: ReceiptRate(50), PresenceRate: DefaultPresenceRate, Now: clock})
	for i := range 1000 {
		b.send(t, "fleet/flood/receipts", receiptJSON(fmt.Sprintf("c-f%d", i), 1))
		if i%10 == 0 {
			b.send(t, "fleet/calm/receipts", receiptJSON(fmt.Sprintf("c-c%d", i), 1))
		}
	}
	for i := range 30 {
		b.send(t, "fleet/flood/presence", fmt.Sprintf(`{"online":true,"session":%d}`, i+1))
	}
	b.waitAcked(t)
	require.Equal(t, 900, b.refused("receipts", "rate_limited"), "1,000 at once: the burst of 100 passes")
	require.Zero(t, b.refused("presence", "rate_limited"), "presence is never dropped by the limit")
	require.Equal(t, 9.0, sample(b.met, `controller_presence_total{effect="coalesced"}`),
		"30 presence at once: 20 pass, the other 10 are held as one")
	require.Len(t, b.presenceApplied(), 20)
	require.Zero(t, b.malformed(), "rate_limited is not malformed")
	calm := 0
	for _, r := range b.st.receipts {
		if strings.HasPrefix(r.CommandID, "c-c") {
			calm++
		}
	}
	require.Equal(t, 100, calm, "the calm device is never throttled")
	require.Len(t, b.st.receipts, 200)

	// A second later, 50 more of the flood go through.
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	for i := range 100 {
		b.send(t, "fleet/flood/receipts", receiptJSON(fmt.Sprintf("c-g%d", i), 1))
	}
	b.waitAcked(t)
	require.Equal(t, 950, b.refused("receipts", "rate_limited"))
	require.Len(t, b.st.receipts, 250)
	// ... and the held presence, the newest session, went in with them.
	require.Eventually(t, func() bool { return len(b.presenceApplied()) == 21 }, 10*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 30, b.presenceApplied()[20].Session)
}

func (b *ingestBundle) presenceApplied() []wire.Presence {
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	return append([]wire.Presence(nil), b.st.presence...)
}

// A device that reconnects in a burst (41 presence messages, its sessions
// going up, a delayed LWT of an older session arriving last) is shown at
// its highest rank once its rate allows: presence is coalesced, never
// dropped, and the held message is the highest-ranked, not the last.
func TestFlappingDevicePresenceIsCoalescedToItsHighestRank(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b := setupIngest(t, Config{PresenceRate: DefaultPresenceRate, Now: clock})
	for s := int64(1); s <= 20; s++ {
		online := s%2 == 1
		b.send(t, "fleet/flap/presence", fmt.Sprintf(`{"online":%t,"session":%d}`, online, (s+1)/2))
	}
	for s := int64(11); s <= 21; s++ {
		b.send(t, "fleet/flap/presence", fmt.Sprintf(`{"online":false,"session":%d}`, s))
		b.send(t, "fleet/flap/presence", fmt.Sprintf(`{"online":true,"session":%d}`, s+1))
	}
	b.send(t, "fleet/flap/presence", `{"online":false,"session":19}`) // an old connection's LWT, late
	b.waitAcked(t)
	require.Len(t, b.presenceApplied(), 20, "the burst of 20 went in")
	mu.Lock()
	now = now.Add(200 * time.Millisecond) // one token at 5/s
	mu.Unlock()
	require.Eventually(t, func() bool { return len(b.presenceApplied()) == 21 }, 10*time.Second, 10*time.Millisecond)
	last := b.presenceApplied()[20]
	require.True(t, last.Online)
	require.EqualValues(t, 22, last.Session, "the highest rank, a birth of session 22, not the late LWT")
	require.Zero(t, b.refused("presence", "rate_limited"))
}

// callStore records the order of the store calls the ingestor makes, and
// fails the receipt named in failAt inside a group.
type callStore struct {
	store.Store
	mu     sync.Mutex
	calls  []string
	failAt string
}

func (c *callStore) note(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, s)
}

func (c *callStore) ApplyReceipt(_ context.Context, device string, r wire.Receipt, _ func() error) (store.ReceiptOutcome, error) {
	c.note(device + " one " + r.CommandID)
	return store.ReceiptOutcome{Effect: store.EffectApplied}, nil
}

func (c *callStore) ApplyReceipts(_ context.Context, device string, rs []wire.Receipt, _ func() error) ([]store.ReceiptResult, error) {
	var ids []string
	var res []store.ReceiptResult
	for _, r := range rs {
		ids = append(ids, r.CommandID)
		if r.CommandID == c.failAt {
			res = append(res, store.ReceiptResult{Err: fmt.Errorf("boom")})
			break
		}
		res = append(res, store.ReceiptResult{Out: store.ReceiptOutcome{Effect: store.EffectApplied}})
	}
	c.note(device + " group " + strings.Join(ids, ","))
	return res, nil
}

func (c *callStore) ApplyPresence(_ context.Context, device string, _ wire.Presence) (store.PresenceOutcome, error) {
	c.note(device + " presence")
	return store.PresenceOutcome{}, nil
}

// A worker's queued messages: each device's receipts that follow each other
// go to the store as one group, in their order; presence and a malformed
// receipt go one at a time where they stand; a failure inside a group sends
// it and what follows one at a time; every message is acknowledged once.
func TestQueuedReceiptsOfADeviceGoAsOneGroupInOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		group  bool
		failAt string
		a, b   []string // the store calls for each device, in order
	}{
		{"grouped", true, "", []string{"da group a1,a2", "da presence", "da one a3"}, []string{"db group b1,b2"}},
		{"a failure inside a group", true, "a2", []string{"da group a1,a2", "da one a2", "da presence", "da one a3"}, []string{"db group b1,b2"}},
		{"not grouped", false, "", []string{"da one a1", "da one a2", "da presence", "da one a3"}, []string{"db one b1", "db one b2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &callStore{failAt: c.failAt}
			met := metrics.New()
			in := New(Config{Store: st, TopicRoot: "fleet", Metrics: met, GroupReceipts: c.group,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			var mu sync.Mutex
			acked := map[int]int{}
			var group []arrival
			add := func(topic, payload string) {
				i := len(group)
				group = append(group, in.arrive(mqttx.NewMessage(topic, []byte(payload), func() { mu.Lock(); acked[i]++; mu.Unlock() })))
			}
			add("fleet/da/receipts", receiptJSON("a1", 1))
			add("fleet/da/receipts", receiptJSON("a2", 1))
			add("fleet/db/receipts", receiptJSON("b1", 1))
			add("fleet/da/presence", `{"online":true,"session":1}`)
			add("fleet/da/receipts", receiptJSON("a3", 1))
			add("fleet/db/receipts", receiptJSON("b2", 1))
			add("fleet/da/receipts", `{"command_id":`)
			in.handleGroup(context.Background(), group)

			var a, b []string
			for _, call := range st.calls {
				if strings.HasPrefix(call, "da ") {
					a = append(a, call)
				} else {
					b = append(b, call)
				}
			}
			require.Equal(t, c.a, a)
			require.Equal(t, c.b, b)
			require.Len(t, acked, len(group))
			for i, n := range acked {
				require.Equal(t, 1, n, "message %d acknowledged %d times", i, n)
			}
			require.Equal(t, 1, int(sample(met, `controller_inputs_refused_total{reason="invalid_json",source="receipts"}`)))
		})
	}
}

// With Config.Linger, a worker whose messages are all progress (received,
// executing) waits for more: the final receipt that follows goes in with
// them as one change, and so does anything else that ends the wait; alone,
// progress goes in when the wait is over. An hour's wait in the first two
// cases means the test times out unless the next message ends it.
func TestProgressWaitsForWhatFollowsIt(t *testing.T) {
	t.Parallel()
	receipt := func(cmd, status string, seq int) string {
		return fmt.Sprintf(`{"command_id":%q,"operation_id":"op-1","status":%q,"seq":%d,"at":"2026-01-02T03:04:05Z"}`, cmd, status, seq)
	}
	for _, c := range []struct {
		name   string
		linger time.Duration
		send   [][2]string // topic, payload
		want   []string    // the store calls, sorted
	}{
		{"a final receipt ends the wait", time.Hour, [][2]string{
			{"fleet/da/receipts", receipt("c1", "received", 1)},
			{"fleet/da/receipts", receipt("c1", "executing", 2)},
			{"fleet/da/receipts", receipt("c1", "succeeded", 3)},
		}, []string{"da group c1,c1,c1"}},
		{"presence ends the wait", time.Hour, [][2]string{
			{"fleet/da/receipts", receipt("c1", "received", 1)},
			{"fleet/db/presence", `{"online":true,"session":1}`},
		}, []string{"da one c1", "db presence"}},
		{"alone, progress goes in when the wait is over", 10 * time.Millisecond, [][2]string{
			{"fleet/da/receipts", receipt("c1", "received", 1)},
		}, []string{"da one c1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st := &callStore{}
			src := make(chanSource)
			in := New(Config{Store: st, Source: src, TopicRoot: "fleet", Metrics: metrics.New(), Workers: 1,
				GroupReceipts: true, Linger: c.linger, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = in.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			acks := make(chan struct{}, len(c.send))
			for _, m := range c.send {
				select {
				case src <- mqttx.NewMessage(m[0], []byte(m[1]), func() { acks <- struct{}{} }):
				case <-time.After(10 * time.Second):
					t.Fatal("the ingestor took no message for 10s")
				}
			}
			for range c.send {
				select {
				case <-acks:
				case <-time.After(10 * time.Second):
					t.Fatal("a message was not acknowledged within 10s")
				}
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			slices.Sort(st.calls)
			require.Equal(t, c.want, st.calls)
		})
	}
}

// The controller's own probe is handed to OnProbe; another instance's
// probe is acknowledged and changes nothing, counted nowhere; anything
// else on a controller's receipts topic is refused as before.
func TestProbesOnControllerTopics(t *testing.T) {
	t.Parallel()
	probes := make(chan string, 4)
	b := setupIngest(t, Config{ProbeTopic: "fleet/controller-i1/receipts", OnProbe: func(p []byte) { probes <- string(p) }})
	b.send(t, "fleet/controller-i1/receipts", `{"probe":"0a1b"}`)
	b.send(t, "fleet/controller-i2/receipts", `{"probe":"0a1b"}`)
	b.send(t, "fleet/controller-i2/receipts", `{"probe":"0a1b","x":1}`)
	b.send(t, "fleet/controller-i2/x/receipts", `{"probe":"0a1b"}`)
	b.send(t, "other/controller-i2/receipts", `{"probe":"0a1b"}`)
	b.waitAcked(t)
	require.Equal(t, `{"probe":"0a1b"}`, <-probes)
	require.Len(t, probes, 0)
	require.Equal(t, 1, b.refused("receipts", "bad_id"))
	require.Equal(t, 2, b.refused("receipts", "bad_topic"))
	require.Equal(t, 3, b.malformed())
}

// A device whose receipts queue up behind a slow commit holds back only
// its own worker: another device's receipt is applied meanwhile, even
// with more of the slow device's waiting than a few.
func TestASlowDeviceHoldsBackNoOtherWorker(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	st := &fakeStore{hold: func(device string) {
		if device == "slow" {
			<-release
		}
	}}
	src := make(chanSource)
	in := New(Config{Store: st, Source: src, TopicRoot: "fleet", Metrics: metrics.New(), Workers: 2, GroupReceipts: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	other := ""
	for i := 0; other == ""; i++ {
		if d := fmt.Sprint("fast-", i); maphash.String(in.seed, d)%2 != maphash.String(in.seed, "slow")%2 {
			other = d
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = in.Run(ctx); close(done) }()
	defer func() { close(release); cancel(); <-done }()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := 0; i < 60; i++ {
			select {
			case src <- mqttx.NewMessage("fleet/slow/receipts", []byte(receiptJSON(fmt.Sprint("s", i), 1)), func() {}):
			case <-ctx.Done():
				return
			}
		}
		select {
		case src <- mqttx.NewMessage("fleet/"+other+"/receipts", []byte(receiptJSON("f1", 1)), func() {}):
		case <-ctx.Done():
		}
	}()
	require.Eventually(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.receipts) == 1 && st.receipts[0].CommandID == "f1"
	}, 10*time.Second, time.Millisecond, "the other device's receipt is applied while the slow one's wait")
}
