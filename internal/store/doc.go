// Package store is the controller's SQLite store: the operations (the
// idempotency record and its lease), the commands (the transactional outbox
// and the controller's view of each command_id), the receipt log, queries,
// device presence and the append-only events log.
//
// Connections: one writer connection (SetMaxOpenConns(1), _txlock=immediate,
// WAL, busy_timeout, synchronous=FULL so a commit the API reported survives a
// crash of the machine too) and a pool of read-only connections. Every
// transaction that reads then writes is IMMEDIATE, so it never meets
// SQLITE_BUSY half way.
//
// Every state change is a conditional UPDATE that names what it expects: the
// state and version for decisions, the receipt rank for facts. Decisions
// (publish, re-send, query, timeout) also name the lease holder's fencing
// token: a zero-row update is a refused transition, returned as a typed error
// (*RefusedError), recorded in the events log with refused=1 and counted, and
// never turned into an overwrite.
package store
