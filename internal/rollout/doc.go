// Package rollout runs one action across a fleet: the contract's
// "Rollouts" (docs/rollouts.md), with invariant 8 (a rollout starts each device at
// most once per version and never exceeds its rate or in-flight limits,
// across restarts and instances).
//
// # State model
//
// A rollout (fsm.Rollout) is waiting_approval → scheduled → running ⇄
// paused → succeeded | completed_with_failures | aborted, or cancelled. Its
// device set is resolved once, at creation, and stored: one
// rollout_devices row per device (fsm.RolloutDevice: pending → started →
// succeeded | failed | timeout | rejected | needs_attention, or retry →
// started again, or cancelled). Each device's action is the ordinary
// operation {rollout_id}:rollout:{device}:v1, with its own idempotency,
// policy and offline handling; a retry of a device whose operation ended
// failed_retryable is that operation's own retry (the same POST again: it
// asks the device first).
//
// # The scheduler is a decision maker
//
// One instance at a time drives a rollout: the holder of the lease on the
// rollout's row (owner, fencing_token, lease_expires_at). The creating
// instance takes it; a lease that ran out is taken over by another
// instance with a new token; a restarted instance reclaims its own at once
// with a new token (the instance lock proves the old process dead). Every
// decision is one pass (store.RolloutPass), one transaction whose first
// write is fenced: the lease extension names owner, token and an unexpired
// lease, so a pass by a stalled or superseded holder is refused whole
// (recorded as fenced, counted in controller_fencing_refused_total) and
// writes nothing.
//
// # The start decision and its fence
//
// Within its pass, a start is one more conditional write on the rollout row:
// it names status running, the fence, and last_start_at at or before now
// minus the interval of the current rate; it sets last_start_at. In the same
// transaction the device moves pending (or retry) → started, the start is
// recorded in rollout_starts (instance and token), and the device's
// operation is inserted with its first command (the outbox), or retried.
// There is no window between "start committed" and "operation submitted":
// both commit or neither does, and the operation_id is deterministic, so a
// pass made again after a crash finds the device started and its operation
// there. The publish that follows is the dispatcher's own fenced decision
// under the operation's lease.
//
// Before each start the pass re-checks, in its transaction: the approval of
// the current version (four-eyes: not by the rollout's creator) when the
// action needs one, and the creator's grant for the action on the device
// when grants are enforced; a failed re-check aborts the rollout.
//
// # Limits from committed start times
//
// All limits are read from the database inside the pass, never from a
// process's memory, so a restart or another instance starts where the last
// committed start left off:
//
//   - rate: the ramp's rate (base_per_minute × factor^⌊succeeded /
//     every_succeeded⌋, at most max_per_minute, from the committed outcomes)
//     gives an interval of 60 s / rate × PacingMargin (5 %), rounded up to the
//     millisecond; a start needs that interval since the last committed start
//     (the conditional write above). Starts are evenly spaced, so no window of
//     10 s holds more than rate/6 of them, even as devices see them, up to
//     0.4 s late.
//   - in flight: the devices started whose operation has no outcome yet,
//     counted after the pass settled every started device from its
//     operation; at max_in_flight nothing starts.
//   - late outcomes: a device follows its operation to the operation's
//     final state. An outcome settled from a failed_retryable operation
//     (timeout, rejected, failed, or waiting for a retry) moves, in the next
//     pass, to what a late final receipt made of the operation (a late
//     success makes the device succeeded), before the counts and abort rules
//     are read; the rollout ends only once no such provisional outcome is
//     younger than the action's ack_timeout (see Decide), and an ended
//     rollout with a device to move is driven again to move it (its status
//     stays).
//   - abort: once min_finished devices have an outcome, a rule whose outcome
//     (failed, timeout, rejected, needs_attention, any) reaches its percent
//     of the finished devices aborts the rollout in that pass, before any
//     start: the devices not started and the started ones whose command was
//     never published are cancelled in the same transaction; the published
//     ones run to their end and are settled afterwards.
//   - windows: execute_after and execute_before bound the whole rollout
//     (devices not started when execute_before passes are cancelled); cron
//     windows (UTC, robfig/cron, five fields or six with seconds) must be open
//     for a start with at least the action's ack_timeout left, and a start's
//     command expires when its window closes (so never sooner than that), so
//     an offline device's command times out with the window and is retried in
//     a later one.
//
// Pause stops new starts (a person's conditional write; the scheduler's
// start condition names running); resume continues; cancel is an abort by a
// person.
package rollout
