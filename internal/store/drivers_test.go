package store

import (
	"context"

	"github.com/fleetctl/fleetctl/internal/store/driver"
	"github.com/fleetctl/fleetctl/internal/store/postgres"
	"github.com/fleetctl/fleetctl/internal/store/sqlite"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// The store's own tests open their databases through these, with the
// driver of the database they made (package backend, which picks it from
// a --db value, imports the store).

// testDriver is the driver of a test's database: PostgreSQL for one that
// testenv made, SQLite for a file.
func testDriver(dsn string) driver.Driver {
	if testenv.MadeDatabase(dsn) {
		return postgres.New()
	}
	return sqlite.New()
}

// testOpen is Open with the test database's driver.
func testOpen(ctx context.Context, cfg Config) (*DB, error) {
	cfg.Driver = testDriver(cfg.Path)
	return Open(ctx, cfg)
}

// testOpenAudit is OpenAudit with the test database's driver.
func testOpenAudit(ctx context.Context, dsn string) (*Audit, error) {
	return OpenAudit(ctx, testDriver(dsn), dsn)
}
