package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
)

// RenewLeases extends the leases owner holds on its started operations, in
// one statement. A heartbeat neither bumps versions nor changes tokens, and
// it cannot revive a lease that has already run out (a peer may have taken
// it; the owner must claim it again with a new token). It returns how many
// leases it extended.
func (s *DB) RenewLeases(ctx context.Context, owner string, ttl time.Duration) (int64, time.Time, error) {
	var n int64
	var until time.Time
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		until = t.now.Add(ttl)
		// A lease another instance's change holds right now (a receipt
		// finishing its operation) is renewed at the next heartbeat.
		r, err := t.Exec(t.s.q.LeaseRenew,
			ms(until), owner, ms(t.now), owner, ms(t.now))
		if err != nil {
			return fmt.Errorf("renew leases of %s: %w", owner, err)
		}
		n, _ = r.RowsAffected()
		return t.heartbeat(owner, ttl, false)
	})
	return n, until, err
}

// heartbeat records that owner is alive (GET /v1/instances); start marks a
// new process of it.
func (t *tx) heartbeat(owner string, ttl time.Duration, start bool) error {
	q := t.s.q.InstanceHeartbeat
	if start {
		q = t.s.q.InstanceHeartbeatStart
	}
	if _, err := t.Exec(q, owner, ms(t.now), ms(t.now), ttl.Milliseconds()); err != nil {
		return fmt.Errorf("heartbeat of %s: %w", owner, err)
	}
	return nil
}

// ListInstances lists the instances that ever ran on this database, live
// or not, by id, with the leases each holds now.
func (s *DB) ListInstances(ctx context.Context) ([]domain.InstanceInfo, error) {
	rows, err := s.rq.QueryContext(ctx, s.q.InstanceList)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	defer rows.Close()
	now := s.now()
	out := []domain.InstanceInfo{}
	for rows.Next() {
		var in domain.InstanceInfo
		var started, beat, ttl int64
		if err := rows.Scan(&in.InstanceID, &started, &beat, &ttl, &in.Leases); err != nil {
			return nil, fmt.Errorf("list instances: %w", err)
		}
		in.StartedAt, in.HeartbeatAt, in.LeaseTTL = fromMS(started), fromMS(beat), time.Duration(ttl)*time.Millisecond
		in.Live = in.HeartbeatAt.Add(in.LeaseTTL).After(now)
		out = append(out, in)
	}
	return out, rows.Err()
}

// ReclaimOwn takes over, with a new fencing token each, the started
// operations that owner held before it restarted. The caller must hold the
// instance's lock, which proves the previous process is dead; a decision
// the dead process had in flight then fails its fence.
//
// It works in rounds of short transactions that lock one table each: the
// operations (skipping any another instance's change holds, to take at the
// next round), then their commands' questions. A receipt applied by another
// instance locks a command, then its operation; one transaction that locked
// many operations, then wanted their commands, would deadlock with it.
func (s *DB) ReclaimOwn(ctx context.Context, owner string, ttl time.Duration) (int64, error) {
	// Every reclaimed lease runs until this, later than any the dead process
	// left: lease_expires_at < until marks the ones not reclaimed yet.
	until := ms(s.now().Add(ttl))
	var last sql.NullInt64
	if err := s.rq.QueryRowContext(ctx, s.q.LeaseLastExpiry,
		owner).Scan(&last); err != nil {
		return 0, fmt.Errorf("reclaim leases of %s: %w", owner, err)
	}
	if last.Valid && last.Int64 >= until {
		until = last.Int64 + 1
	}
	var n int64
	for round := 0; ; round++ {
		var ids []string
		left := 0
		err := s.write(ctx, func(ctx context.Context, t *tx) error {
			var err error
			ids, err = queryStrings(ctx, t, t.s.q.LeaseReclaimOwn, until, owner, until, owner, until)
			if err != nil {
				return fmt.Errorf("reclaim leases of %s: %w", owner, err)
			}
			return t.QueryRowContext(ctx, s.q.LeaseCountExpired,
				owner, until).Scan(&left)
		})
		if err != nil {
			return n, err
		}
		n += int64(len(ids))
		if err := s.forgetQuestionsOf(ctx, ids); err != nil {
			return n, err
		}
		if left == 0 {
			break
		}
		if len(ids) == 0 { // all that is left is held by other instances' changes
			if round > 200 {
				return n, fmt.Errorf("reclaim leases of %s: %d operations stayed locked by other instances", owner, left)
			}
			select {
			case <-ctx.Done():
				return n, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		if err := t.heartbeat(owner, ttl, true); err != nil {
			return err
		}
		if n > 0 {
			return t.event("lease", owner, "", "reclaimed", fmt.Sprintf("%d operations after restart", n), 0)
		}
		return nil
	})
	return n, err
}

// forgetQuestionsOf makes the open commands of the operations due now with
// no question outstanding, in a transaction of its own.
func (s *DB) forgetQuestionsOf(ctx context.Context, operationIDs []string) error {
	if len(operationIDs) == 0 {
		return nil
	}
	return s.writeLocking(ctx, rowLocks{operations: operationIDs}, func(ctx context.Context, t *tx) error {
		for _, id := range operationIDs {
			if err := t.forgetQuestions(id); err != nil {
				return err
			}
		}
		return nil
	})
}

// TakeOver claims, for owner, the started operations whose lease has run
// out (their holder stalled or died), each with a new fencing token, and
// makes their open commands due with the last question forgotten: the new
// holder asks each device about its in-doubt command_id before any re-send
// or new command_id. It returns the operation ids taken.
//
// Owner's own expired leases are taken too, once they have been expired
// for a whole ttl more: a heartbeat cannot revive a lease that ran out
// (RenewLeases), so an instance that stalled past its lease ttl (a starved
// host, a long pause) with no peer to take over would otherwise never
// decide about those operations again. The extra ttl leaves them to a live
// peer first (whose heartbeats come every third of a ttl), rather than to
// the instance whose heartbeat just proved unreliable. The new token fences
// whatever the stalled process still had in flight.
func (s *DB) TakeOver(ctx context.Context, owner string, ttl time.Duration, limit int) ([]string, error) {
	var ids []string
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		ids = ids[:0] // a change may run twice (its batch fell back, or lost a deadlock)
		rows, err := t.QueryContext(ctx, t.s.q.LeaseTakeOver,
			owner, ms(t.now.Add(ttl)), ms(t.now), ms(t.now), owner, ms(t.now.Add(-ttl)), limit, ms(t.now), owner, ms(t.now.Add(-ttl)))
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
			if err := t.event("lease", tk.id, "", owner, "takeover of an expired lease", tk.token); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The questions in a transaction of their own (see ReclaimOwn). A crash
	// in between leaves them to the restart, whose ReclaimOwn forgets them.
	return ids, s.forgetQuestionsOf(ctx, ids)
}

// forgetQuestions makes an operation's open commands due now with no
// question outstanding, so that their new holder asks first.
func (t *tx) forgetQuestions(operationID string) error {
	_, err := t.Exec(t.s.q.CommandForgetQuestions, ms(t.now), operationID)
	if err != nil {
		return fmt.Errorf("forget questions of %s: %w", operationID, err)
	}
	return nil
}
