package lease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClaimFor: what an instance does about a scheduler's lease it found.
func TestClaimFor(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		owner   string
		expires time.Time
		first   bool
		want    Claim
	}{
		{"nobody held it", "", time.Time{}, true, Take},
		{"a live peer", "i2", now.Add(time.Second), true, Leave},
		{"a peer's ran out", "i2", now.Add(-time.Millisecond), false, Take},
		{"runs out now", "i2", now, false, Take},
		{"its own, first look after a restart", "i1", now.Add(time.Second), true, Reclaim},
		{"its own, first look, ran out", "i1", now.Add(-time.Second), true, Reclaim},
		{"its own lost driver's, still live", "i1", now.Add(time.Second), false, Leave},
		{"its own, ran out", "i1", now.Add(-time.Second), false, Take},
	} {
		require.Equal(t, c.want, ClaimFor(c.owner, c.expires, "i1", c.first, now), c.name)
	}
}
