package store

import (
	"context"
	"fmt"
	"time"
)

// RenewLeases extends the leases owner holds on its started operations, in
// one statement. A heartbeat neither bumps versions nor changes tokens, and
// it cannot revive a lease that has already run out (a peer may have taken
// it; the owner must claim it again with a new token). It returns how many
// leases it extended.
func (s *Store) RenewLeases(ctx context.Context, owner string, ttl time.Duration) (int64, time.Time, error) {
	var n int64
	var until time.Time
	err := s.write(ctx, func(t *tx) error {
		until = t.now.Add(ttl)
		r, err := t.Exec(`UPDATE operations SET lease_expires_at = ?
			WHERE owner = ? AND status = 'started' AND lease_expires_at > ?`, ms(until), owner, ms(t.now))
		if err != nil {
			return fmt.Errorf("renew leases of %s: %w", owner, err)
		}
		n, _ = r.RowsAffected()
		return nil
	})
	return n, until, err
}

// ReclaimOwn takes over, with a new fencing token each, the started
// operations that owner held before it restarted. The caller must hold the
// instance's OS lock, which proves the previous process is dead; a decision
// the dead process had in flight then fails its fence.
func (s *Store) ReclaimOwn(ctx context.Context, owner string, ttl time.Duration) (int64, error) {
	var n int64
	err := s.write(ctx, func(t *tx) error {
		r, err := t.Exec(`UPDATE operations SET fencing_token = fencing_token + 1, lease_expires_at = ?
			WHERE owner = ? AND status = 'started'`, ms(t.now.Add(ttl)), owner)
		if err != nil {
			return fmt.Errorf("reclaim leases of %s: %w", owner, err)
		}
		n, _ = r.RowsAffected()
		if n > 0 {
			return t.event("lease", owner, "", "reclaimed", fmt.Sprintf("%d operations after restart", n), 0)
		}
		return nil
	})
	return n, err
}
