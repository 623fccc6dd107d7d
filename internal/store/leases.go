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
func (s *SQLite) RenewLeases(ctx context.Context, owner string, ttl time.Duration) (int64, time.Time, error) {
	var n int64
	var until time.Time
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
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
func (s *SQLite) ReclaimOwn(ctx context.Context, owner string, ttl time.Duration) (int64, error) {
	var n int64
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		ids, err := queryStrings(ctx, t, `UPDATE operations SET fencing_token = fencing_token + 1, lease_expires_at = ?
			WHERE owner = ? AND status = 'started' RETURNING operation_id`, ms(t.now.Add(ttl)), owner)
		if err != nil {
			return fmt.Errorf("reclaim leases of %s: %w", owner, err)
		}
		for _, id := range ids {
			if err := t.forgetQuestions(id); err != nil {
				return err
			}
		}
		n = int64(len(ids))
		if n > 0 {
			return t.event("lease", owner, "", "reclaimed", fmt.Sprintf("%d operations after restart", n), 0)
		}
		return nil
	})
	return n, err
}

// TakeOver claims, for owner, the started operations whose lease has run
// out (their holder stalled or died), each with a new fencing token, and
// makes their open commands due with the last question forgotten: the new
// holder asks each device about its in-doubt command_id before any re-send
// or new command_id. It returns the operation ids taken.
func (s *SQLite) TakeOver(ctx context.Context, owner string, ttl time.Duration, limit int) ([]string, error) {
	var ids []string
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		rows, err := t.QueryContext(ctx, `UPDATE operations SET owner = ?, fencing_token = fencing_token + 1,
				lease_expires_at = ?, updated_at = ?
			WHERE operation_id IN (SELECT operation_id FROM operations
				WHERE status = 'started' AND lease_expires_at <= ? AND owner != ? LIMIT ?)
			RETURNING operation_id, fencing_token`,
			owner, ms(t.now.Add(ttl)), ms(t.now), ms(t.now), owner, limit)
		if err != nil {
			return fmt.Errorf("take over expired leases: %w", err)
		}
		type taken struct {
			id    string
			token int64
		}
		var all []taken
		for rows.Next() {
			var tk taken
			if err := rows.Scan(&tk.id, &tk.token); err != nil {
				rows.Close()
				return err
			}
			all = append(all, tk)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, tk := range all {
			ids = append(ids, tk.id)
			if err := t.forgetQuestions(tk.id); err != nil {
				return err
			}
			if err := t.event("lease", tk.id, "", owner, "takeover of an expired lease", tk.token); err != nil {
				return err
			}
		}
		return nil
	})
	return ids, err
}

// forgetQuestions makes an operation's open commands due now with no
// question outstanding, so that their new holder asks first.
func (t *tx) forgetQuestions(operationID string) error {
	_, err := t.Exec(`UPDATE commands SET last_query_id = '', last_answer = '', next_check_at = ?
		WHERE operation_id = ? AND status NOT IN `+terminalCommands, ms(t.now), operationID)
	if err != nil {
		return fmt.Errorf("forget questions of %s: %w", operationID, err)
	}
	return nil
}
