package lease

import "time"

// Claim is what an instance does about the lease on a row that a
// scheduler of its drives (a rollout, a task) and that it does not drive
// now.
type Claim int

// The claims.
const (
	// Leave: a live holder keeps it (this process's own lost driver too:
	// it waits for the lease to run out).
	Leave Claim = iota
	// Take: the lease ran out (its holder stalled or died, or nobody held
	// it yet): take it with a new fencing token.
	Take
	// Reclaim: this instance held it before it restarted (the first look
	// of this process); the instance lock proves the old process dead, so
	// it takes it back at once, with a new token that fences off anything
	// the old process still had in flight.
	Reclaim
)

// ClaimFor decides about a lease held by owner until expires, as instance
// me sees it at now; first is true on this process's first look at the row.
func ClaimFor(owner string, expires time.Time, me string, first bool, now time.Time) Claim {
	switch {
	case owner == me && first:
		return Reclaim
	case expires.After(now):
		return Leave
	}
	return Take
}
