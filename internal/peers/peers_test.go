package peers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/stretchr/testify/require"
)

func devices(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("device-%d", i+1)
	}
	return out
}

// Every device has exactly one owner among the members, the shares are
// near even, and removing a member moves only that member's devices.
func TestOwnerDividesAndMovesOnlyTheLeaversDevices(t *testing.T) {
	three := []string{"a", "b", "c"}
	share := map[string]int{}
	for _, d := range devices(3000) {
		share[Owner(three, d)]++
	}
	require.Len(t, share, 3)
	for m, n := range share {
		require.InDelta(t, 1000, n, 150, "member %s's share", m)
	}
	for _, d := range devices(3000) {
		before := Owner(three, d)
		after := Owner([]string{"a", "c"}, d)
		if before != "b" {
			require.Equal(t, before, after, "device %s moved although its owner stayed", d)
		}
		require.NotEqual(t, "b", after)
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// Each instance applies its own share; after a membership change the
// former owner keeps applying for Grace, so two instances that see the
// change at different moments overlap instead of leaving a gap.
func TestOwnsKeepsTheFormerShareForGrace(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	mk := func(self string) *Division {
		return New(Config{Self: self, Grace: 3 * time.Second, Now: c.now})
	}
	a, b := mk("a"), mk("b")
	for _, d := range devices(200) {
		require.True(t, a.Owns(d), "no membership yet: apply everything")
	}
	a.Set([]string{"a", "b"})
	b.Set([]string{"a", "b"})
	for _, d := range devices(200) {
		require.NotEqual(t, a.Owns(d), b.Owns(d), "device %s: exactly one of two applies it", d)
	}
	// c joins; a sees it first, b has not yet.
	a.Set([]string{"a", "b", "c"})
	moved := 0
	for _, d := range devices(200) {
		if Owner([]string{"a", "b"}, d) == "a" && Owner([]string{"a", "b", "c"}, d) == "c" {
			moved++
			require.True(t, a.Owns(d), "device %s moved to c: a still applies it within grace", d)
		}
	}
	require.Positive(t, moved)
	c.t = c.t.Add(3 * time.Second)
	for _, d := range devices(200) {
		if Owner([]string{"a", "b", "c"}, d) != "a" {
			require.False(t, a.Owns(d), "device %s: after grace only the current share", d)
		}
	}
}

// Overlapping counts the replaced memberships still within grace: an
// instance that was alone applies every device until its grace ends.
func TestOverlappingCountsTheFormerMembershipsWithinGrace(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	d := New(Config{Self: "a", Grace: 3 * time.Second, Now: c.now})
	require.Zero(t, d.Overlapping(), "no membership yet")
	d.Set([]string{"a"})
	require.Zero(t, d.Overlapping(), "the first membership replaces none")
	c.t = c.t.Add(time.Second)
	d.Set([]string{"a", "b"})
	require.Equal(t, 1, d.Overlapping())
	for _, dev := range devices(50) {
		require.True(t, d.Owns(dev), "device %s: owned by a alone, within grace", dev)
	}
	c.t = c.t.Add(time.Second)
	d.Set([]string{"a", "b", "c"})
	require.Equal(t, 2, d.Overlapping())
	c.t = c.t.Add(2 * time.Second)
	require.Equal(t, 1, d.Overlapping(), "{a} past its grace, {a b} not")
	c.t = c.t.Add(time.Second)
	require.Zero(t, d.Overlapping())
}

type lister []domain.InstanceInfo

func (l lister) ListInstances(context.Context) ([]domain.InstanceInfo, error) { return l, nil }

// Refresh takes the live instances, and always this one.
func TestRefreshTakesTheLiveInstances(t *testing.T) {
	d := New(Config{Self: "a", Store: lister{{InstanceID: "b", Live: true}, {InstanceID: "c", Live: false}}})
	require.NoError(t, d.Refresh(context.Background()))
	require.Equal(t, []string{"a", "b"}, d.Members())
}

// Alone: only once this instance is the whole membership and the one it
// replaced is past its grace; never before the first read.
func TestAloneOnlyWhenNoOtherInstanceCanStillWrite(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	d := New(Config{Self: "a", Grace: 3 * time.Second, Now: c.now})
	require.False(t, d.Alone(), "no membership yet")
	d.Set([]string{"a"})
	require.True(t, d.Alone())
	d.Set([]string{"a", "b"})
	require.False(t, d.Alone())
	d.Set([]string{"a"})
	require.False(t, d.Alone(), "b left, within grace")
	c.t = c.t.Add(3 * time.Second)
	require.True(t, d.Alone(), "after grace")
}
