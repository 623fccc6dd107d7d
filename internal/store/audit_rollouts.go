package store

import (
	"context"
	"fmt"
	"time"
)

// AuditRollout is a rollout with its committed starts, as invariant 8 reads
// them.
type AuditRollout struct {
	RolloutID    string
	MaxPerMinute int
	MaxInFlight  int
	Retries      int
	Starts       []AuditRolloutStart // by time
}

// AuditRolloutStart is one committed start of a rollout's device.
type AuditRolloutStart struct {
	DeviceID    string
	OperationID string
	Attempt     int
	At          time.Time
}

// Rollouts lists every rollout with its starts (none on a database from
// before the rollouts' migration).
func (a *Audit) Rollouts(ctx context.Context) ([]AuditRollout, error) {
	var version int
	if err := a.q.QueryRowContext(ctx, stmts(a.q).SchemaVersion).Scan(&version); err != nil {
		return nil, fmt.Errorf("audit: schema version: %w", err)
	}
	if version < 7 {
		return nil, nil
	}
	rows, err := a.q.QueryContext(ctx, stmts(a.q).AuditRollouts)
	if err != nil {
		return nil, fmt.Errorf("audit: list rollouts: %w", err)
	}
	var out []AuditRollout
	index := map[string]int{}
	for rows.Next() {
		var r AuditRollout
		if err := rows.Scan(&r.RolloutID, &r.MaxPerMinute, &r.MaxInFlight, &r.Retries); err != nil {
			rows.Close()
			return nil, fmt.Errorf("audit: list rollouts: %w", err)
		}
		index[r.RolloutID] = len(out)
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: list rollouts: %w", err)
	}
	rows, err = a.q.QueryContext(ctx, stmts(a.q).AuditRolloutStarts)
	if err != nil {
		return nil, fmt.Errorf("audit: list rollout starts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var st AuditRolloutStart
		var at int64
		if err := rows.Scan(&id, &st.DeviceID, &st.OperationID, &st.Attempt, &at); err != nil {
			return nil, fmt.Errorf("audit: list rollout starts: %w", err)
		}
		st.At = fromMS(at)
		if i, ok := index[id]; ok {
			out[i].Starts = append(out[i].Starts, st)
		}
	}
	return out, rows.Err()
}
