// Package store is the controller's store: the operations (the idempotency
// record and its lease), the commands (the transactional outbox and the
// controller's view of each command_id), the receipt log, queries, device
// presence, tasks, grants, the instances and the append-only events log.
//
// Two backends run the same code, each a package implementing
// driver.Driver, the way riverdriver splits River: an SQLite file, the
// embedded default (package sqlite), and a PostgreSQL database that
// several controller instances share (package postgres). Each owns what
// differs: opening its pools, its embedded migrations, its whole
// statements in its own dialect (queries.sql, by name: driver.Statements,
// with its lock clauses and placeholders written in), which errors end a
// transaction, its instance lock, how instances wake each other, the files
// the store guards, and its Capabilities, which the rest of the controller
// asks instead of the database's name. Package backend picks the driver
// from a --db value; this package links no database driver.
//
// Built here, because they are dynamic: the list pages' statements
// (page.go: a filter of variable conditions, through
// driver.Driver.Rebind), the audit's ranking of eventful commands (an IN
// list) and the events log's multi-row INSERTs (store.go, numbered with
// driver.Driver.Placeholder). None of them takes a row lock: every
// statement that does is a whole, named statement of its backend.
//
// SQLite: one writer connection (SetMaxOpenConns(1), _txlock=immediate, WAL,
// busy_timeout, synchronous=FULL so a commit the API reported survives a
// crash of the machine too) and a pool of read-only connections. Every
// transaction that reads then writes is IMMEDIATE, so it never meets
// SQLITE_BUSY half way.
//
// PostgreSQL: one writer connection per instance with synchronous_commit on,
// READ COMMITTED, and a read pool. Instances write concurrently; each
// conditional UPDATE is re-checked by the server against the newest version
// of its row, so a change another instance made first is a zero-row update.
//
// Every state change is a conditional UPDATE that names what it expects: the
// state and version for decisions, the receipt rank for facts. Decisions
// (publish, re-send, query, timeout) also name the lease holder's fencing
// token: a zero-row update is a refused transition, returned as a typed error
// (*RefusedError), recorded in the events log with refused=1 and counted, and
// never turned into an overwrite.
package store
