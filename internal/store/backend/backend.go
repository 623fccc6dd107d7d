// Package backend is the one place that picks the store's database backend
// from a --db value: a postgres:// or postgresql:// URL is PostgreSQL
// (package internal/store/postgres), anything else an SQLite file path
// (package internal/store/sqlite). It links both database drivers; the
// store itself (package store and package driver) links neither.
package backend

import (
	"context"
	"strings"

	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/driver"
	"github.com/fleetctl/fleetctl/internal/store/postgres"
	"github.com/fleetctl/fleetctl/internal/store/sqlite"
)

// For is the driver of the database a --db value names.
func For(dsn string) driver.Driver {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return postgres.New()
	}
	return sqlite.New()
}

// Open is store.Open with the driver cfg.Path names.
func Open(ctx context.Context, cfg store.Config) (*store.DB, error) {
	cfg.Driver = For(cfg.Path)
	return store.Open(ctx, cfg)
}

// OpenAudit is store.OpenAudit with the driver dsn names.
func OpenAudit(ctx context.Context, dsn string) (*store.Audit, error) {
	return store.OpenAudit(ctx, For(dsn), dsn)
}
