package events

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fleetctl/fleetctl/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var at = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func publishN(b *Bus, n int, prefix string) {
	for i := range n {
		b.Publish(KindCommand, fmt.Sprintf("%s-%d", prefix, i), "succeeded", at)
	}
}

// receive takes n events from s as a reader would (waiting on Ready),
// failing after a deadline.
func receive(t *testing.T, s *Sub, n int) []Event {
	t.Helper()
	out := make([]Event, 0, n)
	deadline := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case <-s.Ready():
			out = s.Take(out, n-len(out))
		case <-s.Done():
			t.Fatalf("dropped after %d of %d events: %v", len(out), n, s.Err())
		case <-deadline:
			t.Fatalf("received %d of %d events", len(out), n)
		}
	}
	return out
}

func seqs(evs []Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func TestEventsAreNumberedFromFirstAndEncodedOnce(t *testing.T) {
	t.Parallel()
	b := New(Config{First: 1000})
	s, reset, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	require.False(t, reset)
	require.EqualValues(t, 999, s.Start)
	require.EqualValues(t, 1000, b.Publish(KindOperation, "task-1:restart:device-1:v1", "succeeded", at))
	require.EqualValues(t, 1001, b.Publish(KindDevice, "device-1", "online", at.Add(time.Second)))
	got := receive(t, s, 2)
	require.Equal(t, []uint64{1000, 1001}, seqs(got))
	require.JSONEq(t, `{"kind":"operation","id":"task-1:restart:device-1:v1","status":"succeeded","at":"2026-12-02T10:00:00Z"}`, string(got[0].Data))
	require.EqualValues(t, 2, b.Published())
	require.EqualValues(t, 1001, b.Last())
}

// TestResumeMissesNothingStillInTheBuffer: a reader that reconnects with
// the last id it saw gets exactly the events after it (the backlog, then
// the live ones, nothing missed or repeated), while a publisher keeps going.
func TestResumeMissesNothingStillInTheBuffer(t *testing.T) {
	t.Parallel()
	b := New(Config{Buffer: 4096})
	first, _, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	publishN(b, 1000, "a")
	seen := receive(t, first, 300) // the reader goes away after 300
	b.Unsubscribe(first)
	last := seen[len(seen)-1].Seq

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); publishN(b, 2000, "b") }() // goes on while the reader comes back
	again, reset, err := b.Subscribe(Resume{LastID: last, Given: true})
	require.NoError(t, err)
	require.False(t, reset)
	wg.Wait()
	all := append(seen, receive(t, again, int(b.Last()-last))...)
	require.Len(t, all, 3000)
	for i, ev := range all {
		require.EqualValues(t, i+1, ev.Seq, "event %d", i)
	}
	require.Equal(t, "b-1999", all[2999].ID)
}

func TestResumeFromAnIDOlderThanTheBufferIsAReset(t *testing.T) {
	t.Parallel()
	b := New(Config{Buffer: 16, First: 100})
	publishN(b, 40, "x") // 100..139; the ring holds 124..139
	for _, tc := range []struct {
		last  uint64
		reset bool
		n     int
	}{
		{last: 123, n: 16},             // the event after it is the oldest held
		{last: 122, reset: true},       // 123 was overwritten
		{last: 138, n: 1},              // one behind
		{last: 139, n: 0},              // up to date
		{last: 140, reset: true},       // not given yet: another run's id
		{last: 5, reset: true},         // long gone
		{last: 1 << 60, reset: true},   // a later run's id, or garbage
		{last: 99, reset: true},        // before the first
		{last: 0, reset: true},         // an id that did not parse
		{last: 200000000, reset: true}, // another epoch
	} {
		s, reset, err := b.Subscribe(Resume{LastID: tc.last, Given: true})
		require.NoError(t, err)
		require.Equal(t, tc.reset, reset, "last %d", tc.last)
		backlog := s.Take(nil, 100)
		require.Len(t, backlog, tc.n, "last %d", tc.last)
		if tc.n > 0 {
			require.EqualValues(t, tc.last+1, backlog[0].Seq)
			require.EqualValues(t, 139, backlog[len(backlog)-1].Seq)
		}
		b.Unsubscribe(s)
	}

	fresh := New(Config{Buffer: 16, First: 100})
	s, reset, err := fresh.Subscribe(Resume{LastID: 99, Given: true}) // nothing published yet
	require.NoError(t, err)
	require.False(t, reset)
	require.Empty(t, s.Take(nil, 100))
}

// TestAMissedEventMakesAnEarlierResumeAReset: an event that was not
// published (Missed) is one a reader from before it would have missed.
func TestAMissedEventMakesAnEarlierResumeAReset(t *testing.T) {
	t.Parallel()
	b := New(Config{First: 10})
	publishN(b, 5, "x") // 10..14
	b.Missed()          // would have been 15
	publishN(b, 2, "y") // 15, 16
	for last, reset := range map[uint64]bool{12: true, 14: true, 15: false, 16: false} {
		s, got, err := b.Subscribe(Resume{LastID: last, Given: true})
		require.NoError(t, err)
		require.Equal(t, reset, got, "last %d", last)
		b.Unsubscribe(s)
	}
}

// TestASlowSubscriberIsDroppedAndPublishingNeverBlocks: one subscriber
// never reads; publishing goes on, the slow one is dropped the moment its
// channel is full, and the one that reads sees everything. (A Publish that
// blocked would hang the loop: the test's timeout is the witness.)
func TestASlowSubscriberIsDroppedAndPublishingNeverBlocks(t *testing.T) {
	t.Parallel()
	const buffer, batch, n = 64, 50, 100_000
	b := New(Config{ClientBuffer: buffer})
	slow, _, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	fast, _, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	acks := make(chan int) // the fast reader's count after each batch
	go func() {
		got := 0
		var buf []Event
		for got < n {
			select {
			case <-fast.Ready():
				before := got
				buf = fast.Take(buf[:0], batch-got%batch)
				got += len(buf)
				if got%batch == 0 && got > before {
					acks <- got
				}
			case <-fast.Done():
				close(acks)
				return
			}
		}
	}()
	var publishing time.Duration
	for i := 0; i < n; i += batch {
		start := time.Now()
		for range batch {
			b.Publish(KindCommand, "c", "succeeded", at)
		}
		publishing += time.Since(start)
		if i+batch > buffer {
			select {
			case <-slow.Done():
			default:
				t.Fatalf("after %d events the slow subscriber (buffer %d) is still on", i+batch, buffer)
			}
		}
		select {
		case got, ok := <-acks:
			require.True(t, ok, "the reader that keeps up was dropped: %v", fast.Err())
			require.Equal(t, i+batch, got)
		case <-time.After(10 * time.Second):
			t.Fatal("the fast reader stalled")
		}
	}
	require.ErrorIs(t, slow.Err(), ErrSlow)
	require.NoError(t, fast.Err())
	require.EqualValues(t, 1, b.Dropped())
	require.Equal(t, 1, b.Subscribers())
	t.Logf("%d events published in %s of Publish calls (%.0f ns each), the reader that never read dropped after %d",
		n, publishing, float64(publishing.Nanoseconds())/n, buffer)
}

func TestCloseEndsEverySubscription(t *testing.T) {
	t.Parallel()
	b := New(Config{})
	s, _, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	b.Close()
	<-s.Done()
	require.ErrorIs(t, s.Err(), ErrClosed)
	_, _, err = b.Subscribe(Resume{})
	require.ErrorIs(t, err, ErrClosed)
	require.Zero(t, b.Publish(KindTask, "t", "completed", at))
	b.Unsubscribe(s) // again: harmless
}

func TestChangedPublishesTheStreamsKindsOnly(t *testing.T) {
	t.Parallel()
	b := New(Config{})
	s, _, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	b.Changed(store.Change{Machine: "lease", ID: "i1", To: "reclaimed", At: at})
	b.Changed(store.Change{Machine: "task", ID: "task-88", From: "waiting_approval", To: "approved", At: at})
	got := receive(t, s, 1)
	require.Equal(t, "task", got[0].Kind)
	require.Equal(t, "approved", got[0].Status)
	require.EqualValues(t, 1, b.Published())
	require.NotContains(t, string(got[0].Data), "principal", "the controller's own change names no principal")
}

// TestChangedCarriesThePrincipal: a person's change names them in the
// stream's data.
func TestChangedCarriesThePrincipal(t *testing.T) {
	t.Parallel()
	b := New(Config{})
	s, _, err := b.Subscribe(Resume{})
	require.NoError(t, err)
	b.Changed(store.Change{Machine: "command", ID: "c-1", From: "needs_attention", To: "succeeded", At: at, Principal: "alice"})
	got := receive(t, s, 1)
	require.Equal(t, "alice", got[0].Principal)
	require.JSONEq(t, `{"kind":"command","id":"c-1","status":"succeeded","at":"`+at.UTC().Format(time.RFC3339Nano)+`","principal":"alice"}`, string(got[0].Data))
}

// BenchmarkPublishWith50Readers: the cost of one Publish on the store's
// writer goroutine while 50 readers take what is published.
func BenchmarkPublishWith50Readers(b *testing.B) {
	bus := New(Config{})
	var wg sync.WaitGroup
	for range 50 {
		s, _, err := bus.Subscribe(Resume{})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []Event
			for {
				select {
				case <-s.Ready():
					buf = s.Take(buf[:0], 256)
				case <-s.Done():
					return
				}
			}
		}()
	}
	b.ResetTimer()
	for range b.N {
		bus.Publish(KindCommand, "c-01JF0000000000000000000000", "succeeded", at)
	}
	b.StopTimer()
	bus.Close()
	wg.Wait()
}
