package store

import (
	"github.com/fleetctl/fleetctl/internal/store/driver"
)

// The store runs on a driver.Driver: package internal/store/sqlite or
// internal/store/postgres, picked from the --db value by
// internal/store/backend. What differs between the two lives there; the
// store refers to their statements by name (s.q, driver.Statements) and
// asks their capabilities (Capabilities), never their name.

// Backend is the name of the store's backend, "sqlite" or "postgres", for
// reports and logs only: branch on Capabilities.
func (s *DB) Backend() string { return s.d.Name() }

// Capabilities is what the store's backend lets the rest rely on (whether
// several instances share the database, whether receipts may be grouped,
// whether instances wake each other by notification).
func (s *DB) Capabilities() driver.Capabilities { return s.caps }

// lockingRead is query with the backend's row lock when q is a write
// transaction (reads outside one take no lock). Transitional: for the
// statements still written inline (see doc.go).
func lockingRead(q queryer, query string) string {
	if t, ok := q.(*tx); ok {
		return query + t.s.d.Locks().ForUpdate
	}
	return query
}

// args converts a statement's arguments for the backend.
func (s *DB) args(args []any) []any {
	for i, a := range args {
		args[i] = s.d.Arg(a)
	}
	return args
}

// guardedFiles are the driver's files as the guard holds them.
func guardedFiles(files []driver.File) []guardedFile {
	out := make([]guardedFile, len(files))
	for i, f := range files {
		out[i] = guardedFile{what: f.What, path: f.Path}
	}
	return out
}
