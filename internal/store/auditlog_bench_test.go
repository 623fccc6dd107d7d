package store

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// gaugeRows is the size of the database the gauges' count is measured on.
const gaugeRows = 1_000_000

// gaugeFill inserts gaugeRows operations and as many commands in two bulk
// statements: 97% succeeded, 1% each failed, needs_attention (its
// operation started) and pending (started); the shape of a fleet that has
// run for a while.
var gaugeFill = map[string][]string{
	"sqlite": {
		`INSERT INTO operations (operation_id, action, target, params, request_hash, status, attempt, command_id, version,
			owner, lease_expires_at, fencing_token, started_at, updated_at)
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		SELECT 'op-' || i, 'restart', 'device-' || (i % 1000), '{}', 'h',
			CASE i % 100 WHEN 0 THEN 'failed_final' WHEN 1 THEN 'started' WHEN 2 THEN 'started' ELSE 'succeeded' END,
			1, 'c-' || i, 1, 'i1', 0, 1, i, i FROM n`,
		`INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at, status, version,
			next_check_at, created_at, updated_at)
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		SELECT 'c-' || i, 'op-' || i, 'device-' || (i % 1000), 'restart', '{}', i, i + 60000,
			CASE i % 100 WHEN 0 THEN 'failed' WHEN 1 THEN 'needs_attention' WHEN 2 THEN 'pending' ELSE 'succeeded' END,
			1, i, i, i FROM n`,
		`ANALYZE`,
	},
	"postgres": {
		`INSERT INTO operations (operation_id, action, target, params, request_hash, status, attempt, command_id, version,
			owner, lease_expires_at, fencing_token, started_at, updated_at)
		SELECT 'op-' || i, 'restart', 'device-' || (i % 1000), '{}', 'h',
			CASE i % 100 WHEN 0 THEN 'failed_final' WHEN 1 THEN 'started' WHEN 2 THEN 'started' ELSE 'succeeded' END,
			1, 'c-' || i, 1, 'i1', 0, 1, i, i FROM generate_series(1, $1::bigint) AS i`,
		`INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at, status, version,
			next_check_at, created_at, updated_at)
		SELECT 'c-' || i, 'op-' || i, 'device-' || (i % 1000), 'restart', '{}', i, i + 60000,
			CASE i % 100 WHEN 0 THEN 'failed' WHEN 1 THEN 'needs_attention' WHEN 2 THEN 'pending' ELSE 'succeeded' END,
			1, i, i, i FROM generate_series(1, $1::bigint) AS i`,
		// What autovacuum does after a bulk load: statistics, and the
		// visibility map an index-only scan needs.
		`VACUUM ANALYZE operations`,
		`VACUUM ANALYZE commands`,
	},
}

// BenchmarkCountByStatus measures the state gauges' refresh (both GROUP BY
// status counts, in one read snapshot) over a million operations and a
// million commands, on each backend; the database is filled once.
func BenchmarkCountByStatus(b *testing.B) {
	for _, be := range backends {
		b.Run(be, func(b *testing.B) {
			ctx := context.Background()
			dsn := filepath.Join(b.TempDir(), "c.db")
			if be == "postgres" {
				dsn = testenv.SharedPostgres(b).NewDatabase(b)
			}
			s, err := testOpen(ctx, Config{Path: dsn, Instance: "i1"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			for _, q := range gaugeFill[be] {
				var args []any
				if q[0] == 'I' {
					args = []any{gaugeRows}
				}
				if _, err := s.w.ExecContext(ctx, q, args...); err != nil {
					b.Fatalf("fill: %v", err)
				}
			}
			for _, open := range []bool{false, true} {
				c, err := s.CountByStatus(ctx, open)
				if err != nil {
					b.Fatal(err)
				}
				if c.Commands["needs_attention"] != gaugeRows/100 || c.Operations["started"] != 2*gaugeRows/100 {
					b.Fatalf("counts %v", c)
				}
			}
			// every state: a scan of the whole index; open: its range
			// of open states (2% of the rows here).
			for _, open := range []bool{false, true} {
				name := map[bool]string{false: "every-state", true: "open-states"}[open]
				b.Run(name, func(b *testing.B) {
					for range b.N {
						if _, err := s.CountByStatus(ctx, open); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
