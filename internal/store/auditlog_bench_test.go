package store

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// BenchmarkCountByStatus measures the state gauges' refresh (both GROUP BY
// status counts, in one read snapshot) over a million operations and a
// million commands, 2% of them open (fillBenchRows), on each backend; the
// database is filled once.
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
			const openEvery = 50
			fillBenchRows(b, s, openEvery)
			for _, open := range []bool{false, true} {
				c, err := s.CountByStatus(ctx, open)
				if err != nil {
					b.Fatal(err)
				}
				if c.Commands["needs_attention"] != benchListRows/openEvery || c.Operations["started"] != benchListRows/openEvery {
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
