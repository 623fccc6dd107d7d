package store

import (
	"fmt"

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

// statementsOf is the statements of the backend q reads, and whether q is
// a write transaction, whose reads of a row it will write lock it (the
// ...ForUpdate statements); reads outside one take no lock.
func statementsOf(q queryer) (st *driver.Statements, locking bool) {
	switch q := q.(type) {
	case *tx:
		return q.s.q, true
	case readers:
		return q.s.q, false
	case auditQueries:
		return q.d.Statements(), false
	}
	panic(fmt.Sprintf("store: statementsOf(%T)", q))
}

// stmts is the statements of the backend q reads.
func stmts(q queryer) *driver.Statements {
	st, _ := statementsOf(q)
	return st
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
