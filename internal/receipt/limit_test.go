package receipt

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBucketsRefillAtTheirRate(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newLimiter(ReceiptRate(50), DefaultPresenceRate, 0)
	n := 0
	for l.allow("d1", false, now) {
		n++
		require.Less(t, n, 1000)
	}
	require.Equal(t, 100, n, "the burst")
	require.True(t, l.allow("d2", false, now), "another device has its own bucket")
	require.True(t, l.allow("d1", true, now), "presence has its own bucket")

	now = now.Add(time.Second)
	n = 0
	for l.allow("d1", false, now) {
		n++
	}
	require.Equal(t, 50, n, "a second's refill")

	// A steady 2,000/s for 5 s lets 100 + 50×5 through.
	l = newLimiter(ReceiptRate(50), DefaultPresenceRate, 0)
	start, passed := now, 0
	for i := range 10000 {
		if l.allow("flood", false, start.Add(time.Duration(i)*500*time.Microsecond)) {
			passed++
		}
	}
	require.InDelta(t, 100+50*5, passed, 1)

	// Presence: 20 at once, then 5 a second.
	l = newLimiter(ReceiptRate(50), DefaultPresenceRate, 0)
	n = 0
	for l.allow("d1", true, now) {
		n++
	}
	require.Equal(t, 20, n)
	require.False(t, l.allow("d1", true, now.Add(100*time.Millisecond)))
	require.True(t, l.allow("d1", true, now.Add(200*time.Millisecond)))
}

func TestUnlimitedRateLimitsNothing(t *testing.T) {
	t.Parallel()
	l := newLimiter(ReceiptRate(0), Rate{}, 0)
	now := time.Unix(0, 0)
	for range 10000 {
		require.True(t, l.allow("d", false, now))
		require.True(t, l.allow("d", true, now))
	}
	require.Zero(t, l.tracked(), "nothing is tracked when nothing is limited")
}

// A spray of fake device ids never grows the map past its bound, and idle
// buckets are forgotten.
func TestLimiterMemoryIsBounded(t *testing.T) {
	t.Parallel()
	const bound = 1000
	l := newLimiter(ReceiptRate(50), DefaultPresenceRate, bound)
	now := time.Unix(1000, 0)
	for i := range 200000 {
		l.allow(fmt.Sprintf("fake-%d", i), i%2 == 0, now.Add(time.Duration(i)*time.Microsecond))
		require.LessOrEqual(t, len(l.devices), bound)
	}
	// Idle past a full refill (4 s for presence's 20 at 5/s): all forgotten
	// at the next sweep.
	l.allow("d", false, now.Add(time.Minute))
	require.Equal(t, 1, l.tracked())

	// A flooding device stays tracked (its bucket is not full) while idle
	// ones are swept.
	l = newLimiter(ReceiptRate(50), DefaultPresenceRate, bound)
	for i := range 300 {
		l.allow("flood", false, now)
		l.allow(fmt.Sprintf("idle-%d", i), false, now)
	}
	later := now.Add(1500 * time.Millisecond) // the flood's bucket refilled 75 of 100
	require.True(t, l.allow("flood", false, later))
	require.Equal(t, 1, l.tracked(), "the idle ones are full again and forgotten")
}
