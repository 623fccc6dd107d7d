// Package command drives each command from the outbox to a final state: the
// lease holder's side of the command lifecycle.
//
// Lifecycle. A command is committed as pending together with its operation
// (the outbox). The Dispatcher of the instance holding the operation's lease
// publishes it: first a committed, fenced conditional update
// (pending → sent, attempt 0 → 1), then, if the lease is still inside its
// trust window, the MQTT publish. A crash between the two leaves a sent
// command that was never published; it is found by the ask-after-connect.
//
// Asking before acting. After every broker connect the Dispatcher asks the
// device (a Query for the same command_id) about every open command it owns;
// the sweeper does the same after the ack timeout, backing off. A dedupe
// device that answers "unknown", or does not answer, gets a re-send of the
// same command (attempt n → n+1), which it deduplicates by command_id. A
// command is never given a new command_id while it may still run. Publishes
// and queries are each bounded by max_attempts; at expires_at the command
// times out and its operation becomes failed_retryable.
//
// Fencing. Every decision (send, re-send, query, timeout) is a conditional
// write naming the operation's owner and fencing token and a live lease.
// Between that write and the action the holder may have stalled, so right
// before publishing it checks that the lease is still inside its trust
// window (lease_expires_at minus TrustMargin, by its own clock); if not, the
// action is dropped and counted in controller_fencing_refused_total.
package command
