package store

import (
	"context"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
)

// leased is a row that carries a scheduler's lease (owner, fencing_token,
// lease_expires_at: a rollout, a task), as its transaction read it, with
// the machine its refusals are recorded under and the backend's statement
// that moves its lease (arguments: new owner, new expiry, id, old owner,
// old token).
type leased struct {
	machine, acquire, id string
	owner                string
	token                int64
	expires              time.Time
}

// takeLease takes the lease on l's row for owner with a new fencing token:
// when it has run out (its holder stalled or died), or, with reclaim, when
// owner itself held it before it restarted (the caller holds the instance
// lock, which proves that process dead). A lease another live holder keeps
// is refused (ErrRefused, lease_held). It returns the new fence and why it
// changed hands, for the caller's event and history.
func (t *tx) takeLease(ctx context.Context, l leased, owner string, ttl time.Duration, reclaim bool) (domain.Fence, string, error) {
	expired := !l.expires.After(t.now)
	if !expired && !(reclaim && l.owner == owner) {
		return domain.Fence{}, "", t.refuse(l.machine, l.id, l.owner, owner, "lease_held", l.token)
	}
	ch := change{machine: l.machine, id: l.id, from: l.owner, to: owner, token: l.token + 1}
	if err := t.cas(ctx, ch, nil, l.acquire,
		owner, ms(t.now.Add(ttl)), l.id, l.owner, l.token); err != nil {
		return domain.Fence{}, "", err
	}
	why := "takeover of an expired lease"
	if l.owner == owner {
		why = "reclaimed after restart"
	}
	return domain.Fence{Owner: owner, Token: l.token + 1}, why, nil
}
