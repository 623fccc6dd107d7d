// Package fsm holds the state machines of the contract as explicit transition
// tables: the operation (the idempotency record) and the command (the
// controller's view of one command_id on one device).
//
// The tables here are the single definition of what is legal. The store
// enforces the same tables where it matters, in SQL: every state change is a
// conditional UPDATE naming the state (and version, or receipt rank) it
// expects, and a zero-row update is a refused transition, never an overwrite.
package fsm
