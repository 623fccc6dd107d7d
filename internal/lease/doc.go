// Package lease keeps the operation leases of one controller instance: the
// heartbeat that extends them and the takeover of a peer's expired ones.
//
// # State model
//
// Every started operation row carries its lease: owner (an instance id),
// lease_expires_at, and fencing_token. Submitting inserts the operation with
// the submitting instance as owner, token 1 and a lease of --lease-ttl. The
// token changes whenever ownership changes (takeover, restart of the same
// instance, the retry of a failed_retryable operation) and never otherwise:
// heartbeats only move lease_expires_at and do not bump the row's version.
//
// # What each write checks
//
//   - Heartbeat (Keeper, every ttl/3): UPDATE ... SET lease_expires_at = now+ttl
//     WHERE owner = me AND status = 'started' AND lease_expires_at > now. It
//     cannot revive a lease that already ran out: a peer may hold it by then.
//   - Takeover (Keeper, after each heartbeat): UPDATE ... SET owner = me,
//     fencing_token = fencing_token + 1 WHERE status = 'started' AND
//     lease_expires_at <= now AND owner != me. The taken operations' open
//     commands forget their last question and become due, so the new holder
//     asks each device about its in-doubt command_id before any re-send or
//     new command_id.
//   - Restart of the same instance (store.ReclaimOwn, at start): an OS flock
//     on <db>.instance-<id>.lock proves the previous process is dead (the
//     kernel drops it on kill -9), so the new process takes its operations
//     over at once with new tokens instead of waiting for the leases to run out.
//   - Decisions (package command: publish, re-send, query, timeout,
//     needs_attention, a new command_id) are conditional writes that name
//     owner and token on a live lease (store's fenceCondition). A zero-row
//     result is a refused decision, recorded and counted in
//     controller_fencing_refused_total. Facts (receipts, presence) are not
//     fenced: any instance applies them under their state or rank guard.
//
// # Trust window
//
// Between a committed decision and the action it permits (an MQTT publish)
// the holder may stall: GC, SIGSTOP, a slow disk, the before-publish
// failpoint. Right before acting it checks, by its own clock, that the lease
// the decision's write saw is still inside its trust window: lease_expires_at
// minus min(ttl/5, 2s). The check uses the expiry that write returned, not a
// later heartbeat's, so a stalled dispatcher goroutine next to a healthy
// heartbeat is caught too. Outside the window the action is dropped and
// counted in controller_fencing_refused_total; the command is then asked
// about by whoever holds it.
//
// # Failure handling
//
// A holder that dies or stalls past its lease loses its operations to the
// first peer whose heartbeat finds them expired; whatever the old holder does
// afterwards fails its fence or its trust window. A heartbeat that fails
// (the before-lease-renew failpoint, a database error) is skipped, and the
// leases run out after ttl unless a later one succeeds. Clocks: leases are
// compared with each instance's clock; instances on different hosts need
// clocks synchronised well within the trust margin.
package lease
