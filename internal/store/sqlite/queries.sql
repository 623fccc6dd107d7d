-- The store's statements on SQLite, by name (driver.Statements). One
-- writer is the lock: no statement takes a row lock.

-- name: SchemaTable
CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT

-- name: SchemaVersion
SELECT COALESCE(MAX(version), 0) FROM schema_migrations

-- name: SchemaApplied
INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)

-- The batch's lines of the events log and of the receipt log, written at
-- its end in multi-row INSERTs (the store appends the rows). OR FAIL here
-- and on the single-row UPDATE ... RETURNING of every operation's path
-- (CommandClaimSend, CommandMove, OperationFinish, OperationFinishCurrent,
-- CommandAdvanceFrom): under the default ABORT, SQLite copies every page
-- such a statement touches into a statement journal, so that a failing
-- statement can be undone alone. None needs that: a failing batch insert
-- fails the whole batch (rolled back), and a single-row statement checks
-- its row's constraints before it writes anything.

-- name: EventsInsertHead
INSERT OR FAIL INTO events (at, machine, entity_id, from_state, to_state, reason, instance, fencing_token, refused, principal) VALUES

-- name: ReceiptsInsertHead
INSERT OR FAIL INTO receipts (command_id, sent_as, device_id, operation_id, status, seq, at, received_at, query_id, effect, error, result, instance) VALUES

-- The batch's pre-lock is not run on SQLite (Capabilities.RowLocks is
-- false); these stand in for the names.

-- name: PreLockCommands
SELECT NULL WHERE 0

-- name: PreLockInsertDevices
SELECT NULL WHERE 0

-- name: PreLockDevices
SELECT NULL WHERE 0

-- name: PreLockQueues
SELECT NULL WHERE 0

-- Reads of one row. Inside a write transaction a change reads the row it
-- will write with the lock a plain UPDATE takes (the ...ForUpdate
-- statements; on PostgreSQL FOR NO KEY UPDATE): another instance applying a fact about the same row waits
-- for this change's commit, then reads what it committed.

-- name: CommandGet
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq
FROM commands WHERE command_id = ?

-- name: CommandGetForUpdate
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq
FROM commands WHERE command_id = ?

-- name: OperationGetRow
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0)
FROM operations WHERE operation_id = ?

-- name: OperationGetRowForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0)
FROM operations WHERE operation_id = ?

-- An operation with the ids of its commands (by creation) and of its
-- compensations (by start, then id), comma-joined.

-- name: OperationsEnded
-- Of the operations named in a JSON array of ids, those no longer started:
-- one read for every ?wait= caller that polls.
SELECT operation_id FROM operations
	WHERE operation_id IN (SELECT value FROM json_each(?)) AND status <> 'started'

-- name: OperationGet
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = o.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = o.operation_id), '')
FROM operations o WHERE o.operation_id = ?

-- name: OperationGetForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = o.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = o.operation_id), '')
FROM operations o WHERE o.operation_id = ?

-- name: RolloutGetRow
SELECT rollout_id, status, reason, version, row_version, action, params, selector, spec, create_hash,
	max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required, approved_version,
	approver, approved_at, devices_total, created_by, created_at, updated_at, ended_at, owner, fencing_token,
	lease_expires_at, starts, last_start_at
FROM rollouts WHERE rollout_id = ?

-- name: RolloutGetRowForUpdate
SELECT rollout_id, status, reason, version, row_version, action, params, selector, spec, create_hash,
	max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required, approved_version,
	approver, approved_at, devices_total, created_by, created_at, updated_at, ended_at, owner, fencing_token,
	lease_expires_at, starts, last_start_at
FROM rollouts WHERE rollout_id = ?

-- Fenced decisions about one command: the command by id (locked first,
-- in an InitPlan, before anything else the statement reads: the order in
-- which a receipt locks the two), the caller's conditions, then the fence:
-- the command's operation held by the caller's owner and token with a
-- lease not run out. The fence holds its operation's row (FOR KEY SHARE
-- on PostgreSQL) until the commit: a takeover passes over held rows and a
-- retry by another instance waits, so neither commits between the
-- decision and its commit. Arguments: the SET values, the command id, the
-- conditions, then owner, token and now.

-- name: CommandClaimSend
UPDATE OR FAIL commands SET status = ?, attempt = attempt + 1, version = version + 1, qos = ?,
	next_check_at = ?, last_sent_at = ?, last_query_id = '', last_answer = '', updated_at = ?,
	reason = CASE WHEN reason = 'queued' THEN '' ELSE reason END
WHERE command_id = ? AND status = ? AND attempt = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)
	AND (serial_seq IS NULL OR attempt > 0 OR NOT EXISTS (SELECT 1 FROM commands a WHERE a.device_id = commands.device_id
		AND a.serial_seq < commands.serial_seq AND a.status <> 'succeeded' AND a.status <> 'failed' AND a.status <> 'timeout' AND a.status <> 'cancelled'))
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandClaimQuery
UPDATE commands SET queries = queries + ?, last_query_id = ?, last_answer = '', next_check_at = ?, updated_at = ?
WHERE command_id = ? AND status = ? AND queries = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandPostpone
UPDATE commands SET next_check_at = ?
WHERE command_id = ? AND version = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)

-- name: CommandMove
UPDATE OR FAIL commands SET status = ?, reason = ?, version = version + 1, next_check_at = ?, updated_at = ?,
	last_query_id = CASE WHEN ? = 1 THEN '' ELSE last_query_id END,
	last_answer = CASE WHEN ? = 1 THEN '' ELSE last_answer END
WHERE command_id = ? AND status = ? AND version = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- Why a fenced decision was refused: does the caller's fence (owner,
-- token, now) still hold on the row? Fenced if not, stale if so.

-- name: CommandFenceHeld
SELECT EXISTS (SELECT 1 FROM commands WHERE command_id = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?))

-- name: OperationFenceHeld
SELECT EXISTS (SELECT 1 FROM operations WHERE operation_id = ? AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)

-- A retry of a failed_retryable operation moves its lease to a new
-- token: the row is locked as a takeover locks it (on PostgreSQL FOR
-- UPDATE, in an InitPlan), after any
-- decision whose fence holds it.

-- name: OperationStartRetry
UPDATE operations SET status = ?, reason = '', owner = ?, fencing_token = fencing_token + 1,
	lease_expires_at = ?, retry_until = ?, version = version + 1, updated_at = ?
WHERE operation_id = ? AND status = ? AND version = ?

-- Bulk changes select their rows passing over those another instance's
-- transaction holds (on PostgreSQL FOR UPDATE SKIP LOCKED, a fence included): they are
-- taken at the next round instead of deadlocking with it, or being taken
-- from under a decision. The conditions are repeated on the row itself:
-- PostgreSQL re-checks them against the newest version of a row another
-- instance changed first.

-- name: LeaseRenew
UPDATE operations SET lease_expires_at = ?
WHERE operation_id IN (SELECT operation_id FROM operations
	WHERE owner = ? AND status = 'started' AND lease_expires_at > ?)
	AND owner = ? AND status = 'started' AND lease_expires_at > ?

-- name: LeaseReclaimOwn
UPDATE operations SET fencing_token = fencing_token + 1, lease_expires_at = ?
WHERE operation_id IN (SELECT operation_id FROM operations
	WHERE owner = ? AND status = 'started' AND lease_expires_at < ? LIMIT 500)
	AND owner = ? AND status = 'started' AND lease_expires_at < ?
RETURNING operation_id

-- name: LeaseTakeOver
UPDATE operations SET owner = ?, fencing_token = fencing_token + 1,
	lease_expires_at = ?, updated_at = ?
WHERE operation_id IN (SELECT operation_id FROM operations
	WHERE status = 'started' AND lease_expires_at <= ?
		AND (owner != ? OR lease_expires_at <= ?) LIMIT ?)
	AND status = 'started' AND lease_expires_at <= ? AND (owner != ? OR lease_expires_at <= ?)
RETURNING operation_id, fencing_token

-- name: DeviceTouch
UPDATE devices SET confirmed = 1, last_seen_at = ?, updated_at = ?
WHERE device_id IN (SELECT device_id FROM devices WHERE device_id = ?
	AND (confirmed = 0 OR last_seen_at IS NULL OR last_seen_at <= ?))

-- name: DeviceUnconfirmAll
UPDATE devices SET confirmed = 0
WHERE device_id IN (SELECT device_id FROM devices WHERE confirmed = 1)
	AND confirmed = 1


-- commands.go: receipts of a command, decisions' lease read-back, queries, wake-ups

-- name: ReceiptList
SELECT command_id, sent_as, device_id, status, seq, at, received_at, query_id,
	effect, error, result, instance FROM receipts WHERE command_id = ? ORDER BY id

-- name: OperationLeaseExpiry
SELECT lease_expires_at FROM operations WHERE operation_id = ?

-- name: QueryInsert
INSERT INTO queries (query_id, command_id, instance, fencing_token, sent_at) VALUES (?, ?, ?, ?, ?)

-- name: CommandWakeDevice
UPDATE commands SET next_check_at = ?, version = version + 1 WHERE device_id = ?
	AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled' RETURNING command_id

-- operations.go: submit, commands' insert, outcomes

-- name: OperationInsert
INSERT INTO operations (operation_id, action, target, params, request_hash, status,
		attempt, command_id, version, owner, lease_expires_at, fencing_token,
		task_id, step, business_version, compensates, started_at, updated_at,
		submitted_by, via, approved_by, approved_version, device_listed)
	VALUES (?, ?, ?, ?, ?, 'started', 1, ?, 1, ?, ?, 1, ?, ?, ?, NULLIF(?, ''), ?, ?, ?, ?, ?, NULLIF(?, 0), 0)
	ON CONFLICT (operation_id) DO NOTHING

-- name: CommandInsert
INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, qos, version, next_check_at, last_sent_at, created_at, updated_at, serial_seq, reason, device_listed)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)

-- name: CommandInsertForDevice
-- CommandInsert with the first publish decision made from the device's row
-- as this transaction reads it: claimed (sent, attempt 1, its next check
-- and last send the claim's) when the caller may claim it and the device
-- is online, pending otherwise; QoS 1 when the device deduplicates. It
-- returns the status and QoS it wrote.
INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, qos, version, next_check_at, last_sent_at, created_at, updated_at, serial_seq, reason, device_listed)
	SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7,
		CASE WHEN d.claim THEN 'sent' ELSE 'pending' END, CASE WHEN d.claim THEN 1 ELSE 0 END, d.dedupe,
		CASE WHEN d.claim THEN 2 ELSE 1 END, CASE WHEN d.claim THEN ?8 ELSE ?9 END, CASE WHEN d.claim THEN ?10 END,
		?11, ?12, ?13, ?14, 0
	FROM (SELECT ?15 = 1 AND COALESCE((SELECT online FROM devices WHERE device_id = ?3), 0) = 1 AS claim,
		COALESCE((SELECT dedupe FROM devices WHERE device_id = ?3), 0) AS dedupe) d
RETURNING status, qos

-- name: OperationCommandInsert
-- Not used: SQLite has no data-modifying WITH (Capabilities.WritesTogether).
SELECT NULL WHERE 0

-- name: OperationFinish
UPDATE OR FAIL operations SET status = ?, result = ?, reason = ?, retry_until = NULL, version = version + 1, updated_at = ?
	WHERE operation_id = ? AND status = ? AND version = ?
RETURNING operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = operations.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = operations.operation_id), '')

-- name: OperationFinishCurrent
-- OperationFinish in one statement for the common case: a started
-- operation ended by its current command; no row when it is not that.
UPDATE OR FAIL operations SET status = ?, result = ?, reason = ?, retry_until = NULL, version = version + 1, updated_at = ?
	WHERE operation_id = ? AND status = 'started' AND command_id = ?
RETURNING operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = operations.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = operations.operation_id), '')

-- name: CommandSupersede
UPDATE commands SET status = ?, reason = ?, version = version + 1, updated_at = ?
	WHERE command_id = ? AND status = ? AND version = ? AND attempt = 0

-- Per-device ordering (queues.go): a serial command's number, the
-- command ahead of it, the head of a device's queue, what a new
-- submit supersedes, and a device's commands in flight and queued.

-- name: QueueNext
INSERT INTO device_queues (device_id, last_seq) VALUES (?, 1)
ON CONFLICT (device_id) DO UPDATE SET last_seq = last_seq + 1 RETURNING last_seq

-- name: QueueAhead
SELECT command_id FROM commands WHERE device_id = ? AND serial_seq < ?
	AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled' ORDER BY serial_seq DESC LIMIT 1

-- name: QueueHead
SELECT command_id, attempt FROM commands WHERE device_id = ? AND serial_seq IS NOT NULL
	AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled' ORDER BY serial_seq LIMIT 1

-- name: QueueSupersedable
-- From the device's open commands (commands_device_open, a handful), each
-- joined to its operation by key: left to itself the planner walked every
-- operation of the action (operations_action_started), the history
-- included, inside the writer.
SELECT c.command_id FROM commands c CROSS JOIN operations o ON o.operation_id = c.operation_id
WHERE c.device_id = ?1 AND c.status <> 'succeeded' AND c.status <> 'failed' AND c.status <> 'timeout' AND c.status <> 'cancelled'
	AND c.attempt = 0 AND c.status IN ('pending','waiting_device')
	AND o.command_id = c.command_id AND o.target = ?1 AND o.action = ?2 AND o.status = 'started' AND o.operation_id <> ?3
ORDER BY c.command_id

-- name: QueueInFlight
SELECT command_id FROM commands WHERE device_id = ? AND attempt > 0
	AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled' ORDER BY created_at, command_id

-- name: QueueWaiting
SELECT command_id FROM commands WHERE device_id = ? AND serial_seq IS NOT NULL AND attempt = 0
	AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled' ORDER BY serial_seq

-- retry.go: retries, cancel, resolve

-- name: CommandRetryAsk
UPDATE commands SET last_query_id = '', last_answer = '', next_check_at = ? WHERE command_id = ?

-- name: OperationRetrying
SELECT operation_id, retry_until FROM operations
	WHERE command_id = ? AND owner = ? AND status = 'started' AND retry_until IS NOT NULL

-- name: OperationRetryingCommands
SELECT command_id FROM operations
	WHERE owner = ? AND status = 'started' AND retry_until IS NOT NULL LIMIT ?

-- name: OperationMintCommand
UPDATE operations SET command_id = ?, attempt = attempt + 1, retry_until = NULL, version = version + 1, updated_at = ?
	WHERE operation_id = ? AND status = ? AND version = ? AND owner = ? AND fencing_token = ? AND lease_expires_at > ?

-- name: OperationAbandonRetry
UPDATE operations SET status = ?, reason = ?, retry_until = NULL, version = version + 1, updated_at = ?
	WHERE operation_id = ? AND status = ? AND version = ? AND owner = ? AND fencing_token = ? AND lease_expires_at > ?

-- name: CommandCancel
UPDATE commands SET status = ?, reason = ?, version = version + 1, updated_at = ?
	WHERE command_id = ? AND status = ? AND version = ? AND attempt = 0 RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandLateResolve
UPDATE commands SET late_outcome = ?, late_conflict = ?, updated_at = ? WHERE command_id = ?

-- name: CommandResolve
UPDATE commands SET status = ?, reason = ?, resolved_by = ?,
		version = version + 1, updated_at = ?
	WHERE command_id = ? AND status = ? AND version = ? RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- leases.go: instances and leases

-- name: InstanceList
SELECT i.instance_id, i.started_at, i.heartbeat_at, i.lease_ttl_ms,
		(SELECT COUNT(*) FROM operations o WHERE o.status = 'started' AND o.owner = i.instance_id)
	FROM instances i ORDER BY i.instance_id

-- name: LeaseLastExpiry
SELECT MAX(lease_expires_at) FROM operations WHERE owner = ? AND status = 'started'

-- name: LeaseCountExpired
SELECT COUNT(*) FROM operations WHERE owner = ? AND status = 'started' AND lease_expires_at < ?

-- name: CommandForgetQuestions
UPDATE commands SET last_query_id = '', last_answer = '', next_check_at = ?
	WHERE operation_id = ? AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled'

-- devices.go: presence

-- name: DeviceGet
SELECT device_id, online, confirmed, seen, session, presence_rank, dedupe, query, clock_skew_ms,
	stale_presence, last_stale_session, last_seen_at, updated_at FROM devices WHERE device_id = ?

-- name: DeviceInsert
INSERT INTO devices (device_id, updated_at) VALUES (?, ?) ON CONFLICT (device_id) DO NOTHING

-- name: DeviceStalePresence
UPDATE devices SET stale_presence = stale_presence + 1, last_stale_session = ?
	WHERE device_id = ?

-- name: DevicePresence
UPDATE devices SET online = ?, confirmed = 1, seen = ?, session = ?, presence_rank = ?,
		dedupe = ?, query = ?, clock_skew_ms = ?, last_seen_at = ?, updated_at = ?
	WHERE device_id = ? AND presence_rank < ?

-- name: DeviceResetPresence
UPDATE devices SET presence_rank = -1, stale_presence = 0,
	last_stale_session = 0, updated_at = ? WHERE device_id = ? RETURNING device_id, online, confirmed, seen, session, presence_rank, dedupe, query, clock_skew_ms,
	stale_presence, last_stale_session, last_seen_at, updated_at

-- receipts.go: receipts and answers

-- name: QueryCommand
SELECT command_id FROM queries WHERE query_id = ?

-- name: QueryAnswer
UPDATE queries SET answered_at = ?, answer = ? WHERE query_id = ? AND answered_at IS NULL

-- name: CommandLastAnswer
UPDATE commands SET last_answer = ? WHERE command_id = ?

-- name: CommandDueNow
UPDATE commands SET next_check_at = ? WHERE command_id = ?

-- name: CommandUnpark
UPDATE commands SET next_check_at = ? WHERE command_id = ? AND next_check_at >= expires_at

-- name: CommandAdvance
UPDATE commands SET status = ?, status_rank = ?, last_seq = ?, reason = ?,
		result = COALESCE(?, result), executed_as = ?, version = version + 1, updated_at = ?
	WHERE command_id = ? AND status = ? AND status_rank < ?

-- name: CommandAdvanceFrom
-- A receipt's change in one statement, when its command is in the state
-- expected before the receipt (store: advanceExpected): it moves on only
-- from that state, below the receipt's rank, on the receipt's device and of
-- the receipt's operation (any, when the receipt names none). It returns the
-- command as CommandGet reads it, after the change; no row: nothing changed.
UPDATE OR FAIL commands SET status = ?, status_rank = ?, last_seq = ?, reason = ?,
		result = COALESCE(?, result), version = version + 1, updated_at = ?
	WHERE command_id = ? AND status = ? AND status_rank < ? AND device_id = ?
		AND operation_id = COALESCE(NULLIF(?, ''), operation_id)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandAdvanceFinish
-- Not used: SQLite has no data-modifying WITH (Capabilities.WritesTogether).
SELECT NULL WHERE 0

-- name: CommandLateConflict
UPDATE commands SET late_conflict = 1, updated_at = ? WHERE command_id = ?

-- name: CommandLateOutcome
UPDATE commands SET late_outcome = ?, late_result = ?, late_conflict = ?, status_rank = ?,
	updated_at = ? WHERE command_id = ? AND late_outcome = ''

-- rollouts.go: rollouts, their devices, starts and history

-- name: RolloutCounts
SELECT status, COUNT(*) FROM rollout_devices WHERE rollout_id = ? GROUP BY status

-- name: RolloutStartsSince
SELECT COUNT(*) FROM rollout_starts WHERE rollout_id = ? AND started_at > ?

-- name: RolloutHistoryInsert
INSERT INTO rollout_history (rollout_id, at, principal, action, from_state, to_state, version, reason)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?)

-- name: DeviceListSeen
SELECT device_id FROM devices WHERE seen = 1 ORDER BY device_id

-- name: RolloutCreateHash
SELECT create_hash FROM rollouts WHERE rollout_id = ?

-- name: RolloutInsert
INSERT INTO rollouts (rollout_id, status, version, row_version, action, params, selector, spec,
		create_hash, max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required,
		devices_total, created_by, created_at, updated_at, owner, fencing_token, lease_expires_at)
	VALUES (?, ?, 1, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)

-- name: RolloutDeviceInsert
INSERT INTO rollout_devices (rollout_id, device_id, position, operation_id, status, updated_at)
	VALUES (?, ?, ?, ?, 'pending', ?)

-- name: RolloutHistoryList
SELECT at, principal, action, from_state, to_state, version, reason
	FROM rollout_history WHERE rollout_id = ? ORDER BY id

-- name: RolloutStartList
SELECT device_id, attempt, started_at, instance, fencing_token
	FROM rollout_starts WHERE rollout_id = ? ORDER BY started_at, device_id, attempt

-- name: RolloutApprove
UPDATE rollouts SET status = ?, approved_version = ?, approver = ?, approved_at = ?,
		row_version = row_version + 1, updated_at = ?
	WHERE rollout_id = ? AND status = ? AND version = ? AND row_version = ?

-- name: RolloutMove
UPDATE rollouts SET status = ?, reason = ?, row_version = row_version + 1, updated_at = ?,
		ended_at = COALESCE(ended_at, ?)
	WHERE rollout_id = ? AND status = ? AND row_version = ?

-- name: RolloutCancelWaiting
UPDATE rollout_devices SET status = 'cancelled', reason = ?, finished_at = ?, updated_at = ?
	WHERE rollout_id = ? AND status IN ('pending', 'retry')

-- name: RolloutUnpublished
SELECT d.device_id, d.operation_id, c.command_id FROM rollout_devices d
	JOIN operations o ON o.operation_id = d.operation_id JOIN commands c ON c.command_id = o.command_id
	WHERE d.rollout_id = ? AND d.status = 'started' AND o.status = 'started' AND c.attempt = 0
		AND c.status IN ('pending', 'waiting_device')

-- name: RolloutCancelDevice
UPDATE rollout_devices SET status = 'cancelled', reason = ?, finished_at = ?, updated_at = ?
	WHERE rollout_id = ? AND device_id = ? AND status = 'started'

-- The ended rollouts' devices are found by status (rollout_devices_by_status)
-- and their operations by key: CROSS JOIN keeps that order, which SQLite's
-- planner would otherwise turn round, reading every succeeded operation.
-- name: RolloutListActive
SELECT rollout_id, status, owner, fencing_token, lease_expires_at FROM rollouts
	WHERE status IN ('waiting_approval','scheduled','running','paused')
		OR (ended_at IS NOT NULL AND rollout_id IN (SELECT rollout_id FROM rollout_devices
			WHERE status IN ('started', 'needs_attention')))
		OR (ended_at IS NOT NULL AND rollout_id IN (SELECT d.rollout_id FROM rollout_devices d
			CROSS JOIN operations o ON o.operation_id = d.operation_id
			WHERE d.status IN ('timeout', 'rejected', 'failed', 'retry')
				AND ((o.status = 'succeeded' AND d.reason NOT LIKE 'idempotency_key_reused%')
			OR (o.status = 'failed_final' AND d.status IN ('timeout', 'retry')))))
	ORDER BY created_at, rollout_id

-- name: RolloutAcquire
UPDATE rollouts SET owner = ?, fencing_token = fencing_token + 1, lease_expires_at = ?
	WHERE rollout_id = ? AND owner = ? AND fencing_token = ?

-- name: RolloutNextCandidate
SELECT rollout_id, device_id, position, operation_id, status, reason, attempts, started_at, finished_at, updated_at FROM rollout_devices
	WHERE rollout_id = ? AND status = ? ORDER BY position LIMIT 1

-- name: RolloutRenew
UPDATE rollouts SET lease_expires_at = ?
	WHERE rollout_id = ? AND owner = ? AND fencing_token = ? AND lease_expires_at > ?

-- name: RolloutDeviceGet
SELECT rollout_id, device_id, position, operation_id, status, reason, attempts, started_at, finished_at, updated_at FROM rollout_devices
	WHERE rollout_id = ? AND device_id = ?

-- name: RolloutCountStart
UPDATE rollouts SET starts = starts + 1, last_start_at = ?
	WHERE rollout_id = ? AND status = 'running' AND (last_start_at IS NULL OR last_start_at <= ?) AND owner = ? AND fencing_token = ? AND lease_expires_at > ?

-- name: RolloutDeviceStart
UPDATE rollout_devices SET status = 'started', attempts = ?, reason = '', started_at = ?,
		finished_at = NULL, updated_at = ?
	WHERE rollout_id = ? AND device_id = ? AND status = ? AND attempts = ?

-- name: RolloutStartInsert
INSERT INTO rollout_starts (rollout_id, device_id, attempt, started_at, instance, fencing_token)
	VALUES (?, ?, ?, ?, ?, ?)

-- name: RolloutDeviceFailStart
UPDATE rollout_devices SET status = 'failed', reason = ?, finished_at = ?, updated_at = ?
	WHERE rollout_id = ? AND device_id = ?

-- name: RolloutSettleList
SELECT d.device_id, d.status, d.attempts, o.status, o.reason, c.status, c.reason,
		EXISTS (SELECT 1 FROM receipts x WHERE x.command_id = c.command_id AND x.status = 'rejected')
	FROM rollout_devices d JOIN operations o ON o.operation_id = d.operation_id
		JOIN commands c ON c.command_id = o.command_id
	WHERE d.rollout_id = ? AND (d.status IN ('started', 'needs_attention') OR ((o.status = 'succeeded' AND d.status IN ('timeout', 'rejected', 'failed', 'retry')
		AND d.reason NOT LIKE 'idempotency_key_reused%')
	OR (o.status = 'failed_final' AND d.status IN ('timeout', 'retry'))))

-- name: RolloutDeviceSettle
UPDATE rollout_devices SET status = ?, reason = ?, finished_at = ?, updated_at = ?
	WHERE rollout_id = ? AND device_id = ? AND status = ? AND attempts = ?

-- name: RolloutProvisional
SELECT COUNT(*), MAX(d.finished_at) FROM rollout_devices d
		JOIN operations o ON o.operation_id = d.operation_id
	WHERE d.rollout_id = ? AND d.status IN ('timeout', 'rejected', 'failed') AND o.status = 'failed_retryable'

-- audit.go: the audit's reads (one snapshot, read-only)

-- name: SchemaCount
SELECT COUNT(*) FROM schema_migrations

-- name: AuditOperationsByStatus
SELECT status, COUNT(*) FROM operations GROUP BY status ORDER BY status

-- name: AuditCommandsByStatus
SELECT status, COUNT(*) FROM commands GROUP BY status ORDER BY status

-- name: AuditReceiptsByInstance
SELECT instance, COUNT(*) FROM receipts GROUP BY instance ORDER BY instance

-- name: AuditReceiptsByEffect
SELECT effect, COUNT(*) FROM receipts GROUP BY effect ORDER BY effect

-- name: AuditOperations
SELECT operation_id, action, target, params, status FROM operations ORDER BY operation_id

-- name: AuditCommands
SELECT command_id, operation_id, device_id, action, params, status, expires_at,
	attempt, queries, executed_as, late_outcome, created_at FROM commands ORDER BY created_at, command_id

-- name: AuditLegacyDevices
SELECT device_id FROM devices WHERE seen = 1 AND dedupe = 0 ORDER BY device_id

-- name: AuditQueries
SELECT query_id, command_id, instance, fencing_token, sent_at, answered_at, answer
	FROM queries WHERE command_id = ? ORDER BY sent_at

-- audit_rollouts.go: the audit's reads of rollouts

-- name: AuditRollouts
SELECT rollout_id, max_per_minute, max_in_flight, retries FROM rollouts ORDER BY rollout_id

-- name: AuditRolloutStarts
SELECT s.rollout_id, s.device_id, d.operation_id, s.attempt, s.started_at
	FROM rollout_starts s JOIN rollout_devices d ON d.rollout_id = s.rollout_id AND d.device_id = s.device_id
	ORDER BY s.rollout_id, s.started_at, s.device_id, s.attempt

-- audit_serial.go: the audit's read of serial commands (issue 28: invariant 10 in verify)

-- name: AuditSerialCommands
SELECT command_id, device_id, serial_seq, status FROM commands
	WHERE serial_seq IS NOT NULL ORDER BY device_id, serial_seq

-- The events log: all of it, one entity's, one device's presence changes in a window.

-- name: EventList
SELECT id, at, machine, entity_id, from_state, to_state, reason, instance,
	fencing_token, refused FROM events ORDER BY id

-- name: EventListOf
SELECT id, at, machine, entity_id, from_state, to_state, reason, instance,
	fencing_token, refused FROM events WHERE entity_id = ? ORDER BY id

-- name: EventListPresence
SELECT id, at, machine, entity_id, from_state, to_state, reason, instance,
	fencing_token, refused FROM events WHERE machine = ? AND entity_id = ? AND at BETWEEN ? AND ? ORDER BY id

-- Open commands of started operations, with their operation's lease: an
-- owner's due ones (next check or expiry come), all of an owner's (the
-- ask-after-reconnect), one by id.

-- name: CommandListDue
SELECT c.command_id, c.operation_id, c.device_id, c.action, c.params, c.issued_at, c.expires_at, c.status, c.status_rank,
	c.attempt, c.queries, c.qos, c.version, c.reason, c.result, c.last_seq, c.executed_as, c.resolved_by, c.late_outcome, c.late_result,
	c.late_conflict, c.last_query_id, c.last_answer, c.next_check_at, c.last_sent_at, c.created_at, c.updated_at, c.serial_seq,
	COALESCE((SELECT a.command_id FROM commands a WHERE a.device_id = c.device_id AND a.serial_seq < c.serial_seq
		AND a.status <> 'succeeded' AND a.status <> 'failed' AND a.status <> 'timeout' AND a.status <> 'cancelled' ORDER BY a.serial_seq DESC LIMIT 1), ''),
	o.owner, o.fencing_token, o.lease_expires_at
FROM commands c JOIN operations o ON o.operation_id = c.operation_id
WHERE c.status <> 'succeeded' AND c.status <> 'failed' AND c.status <> 'timeout' AND c.status <> 'cancelled' AND o.status = 'started'
	AND o.owner = ? AND o.lease_expires_at > ? AND (c.next_check_at <= ? OR c.expires_at <= ?)
ORDER BY c.next_check_at LIMIT ?

-- name: CommandListOpen
SELECT c.command_id, c.operation_id, c.device_id, c.action, c.params, c.issued_at, c.expires_at, c.status, c.status_rank,
	c.attempt, c.queries, c.qos, c.version, c.reason, c.result, c.last_seq, c.executed_as, c.resolved_by, c.late_outcome, c.late_result,
	c.late_conflict, c.last_query_id, c.last_answer, c.next_check_at, c.last_sent_at, c.created_at, c.updated_at, c.serial_seq,
	COALESCE((SELECT a.command_id FROM commands a WHERE a.device_id = c.device_id AND a.serial_seq < c.serial_seq
		AND a.status <> 'succeeded' AND a.status <> 'failed' AND a.status <> 'timeout' AND a.status <> 'cancelled' ORDER BY a.serial_seq DESC LIMIT 1), ''),
	o.owner, o.fencing_token, o.lease_expires_at
FROM commands c JOIN operations o ON o.operation_id = c.operation_id
WHERE c.status <> 'succeeded' AND c.status <> 'failed' AND c.status <> 'timeout' AND c.status <> 'cancelled' AND o.status = 'started'
	AND o.owner = ? AND o.lease_expires_at > ?
ORDER BY c.next_check_at LIMIT ?

-- name: CommandOpen
SELECT c.command_id, c.operation_id, c.device_id, c.action, c.params, c.issued_at, c.expires_at, c.status, c.status_rank,
	c.attempt, c.queries, c.qos, c.version, c.reason, c.result, c.last_seq, c.executed_as, c.resolved_by, c.late_outcome, c.late_result,
	c.late_conflict, c.last_query_id, c.last_answer, c.next_check_at, c.last_sent_at, c.created_at, c.updated_at, c.serial_seq,
	COALESCE((SELECT a.command_id FROM commands a WHERE a.device_id = c.device_id AND a.serial_seq < c.serial_seq
		AND a.status <> 'succeeded' AND a.status <> 'failed' AND a.status <> 'timeout' AND a.status <> 'cancelled' ORDER BY a.serial_seq DESC LIMIT 1), ''),
	o.owner, o.fencing_token, o.lease_expires_at
FROM commands c JOIN operations o ON o.operation_id = c.operation_id
WHERE c.status <> 'succeeded' AND c.status <> 'failed' AND c.status <> 'timeout' AND c.status <> 'cancelled' AND o.status = 'started'
	AND c.command_id = ?

-- An instance's heartbeat; at its start, the start time too.

-- name: InstanceHeartbeat
INSERT INTO instances (instance_id, started_at, heartbeat_at, lease_ttl_ms) VALUES (?, ?, ?, ?)
ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, lease_ttl_ms = excluded.lease_ttl_ms

-- name: InstanceHeartbeatStart
INSERT INTO instances (instance_id, started_at, heartbeat_at, lease_ttl_ms) VALUES (?, ?, ?, ?)
ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, lease_ttl_ms = excluded.lease_ttl_ms, started_at = excluded.started_at


-- Tasks: plans and their versions, approvals, the runner's lease and its
-- decisions (store/tasks.go), and grants (store/grants.go).

-- name: TaskHistoryInsert
INSERT INTO task_history (task_id, at, principal, action, from_state, to_state, version, reason)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?)

-- name: TaskCreateHash
SELECT create_hash FROM tasks WHERE task_id = ?

-- name: TaskInsert
INSERT INTO tasks (task_id, status, version, create_hash, execute_after, execute_before,
	created_by, created_at, updated_at) VALUES (?, 'waiting_approval', 1, ?, ?, ?, ?, ?, ?)

-- name: TaskVersionInsert
INSERT INTO task_versions (task_id, version, steps, plan_hash, author, created_at)
	VALUES (?, ?, ?, ?, ?, ?)

-- name: TaskState
SELECT status, version, row_version FROM tasks WHERE task_id = ?

-- name: TaskVersionHash
SELECT plan_hash FROM task_versions WHERE task_id = ? AND version = ?

-- name: TaskNewVersion
UPDATE tasks SET version = version + 1, row_version = row_version + 1, updated_at = ?
	WHERE task_id = ? AND status = ? AND row_version = ?

-- name: TaskApprovalGet
SELECT version, approver FROM approvals WHERE task_id = ?

-- name: TaskVersionAuthor
SELECT plan_hash, author FROM task_versions WHERE task_id = ? AND version = ?

-- name: TaskApprove
UPDATE tasks SET status = ?, approved_version = ?, row_version = row_version + 1, updated_at = ?
	WHERE task_id = ? AND status = ? AND version = ? AND row_version = ?

-- name: TaskApprovalInsert
INSERT INTO approvals (task_id, version, approver, plan_hash, approved_at) VALUES (?, ?, ?, ?, ?)

-- name: TaskRejectState
SELECT status, row_version, version FROM tasks WHERE task_id = ?

-- name: TaskMove
UPDATE tasks SET status = ?, reason = ?,
	step_index = CASE WHEN ? >= 0 THEN ? ELSE step_index END, row_version = row_version + 1, updated_at = ?
	WHERE task_id = ? AND status = ? AND row_version = ?

-- name: TaskMoveFenced
UPDATE tasks SET status = ?, reason = ?,
	step_index = CASE WHEN ? >= 0 THEN ? ELSE step_index END, row_version = row_version + 1, updated_at = ?
	WHERE task_id = ? AND status = ? AND row_version = ?
	AND owner = ? AND fencing_token = ? AND lease_expires_at > ?

-- name: TaskFenceHeld
SELECT EXISTS (SELECT 1 FROM tasks WHERE task_id = ? AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)

-- name: TaskListActive
SELECT task_id, status, owner, fencing_token, lease_expires_at FROM tasks
	WHERE status IN ('approved','running') ORDER BY updated_at, task_id

-- name: TaskLeaseGetForUpdate
SELECT owner, fencing_token, lease_expires_at FROM tasks WHERE task_id = ?

-- name: TaskAcquire
UPDATE tasks SET owner = ?, fencing_token = fencing_token + 1, lease_expires_at = ?
	WHERE task_id = ? AND owner = ? AND fencing_token = ?

-- name: TaskRenew
UPDATE tasks SET lease_expires_at = ?
	WHERE task_id = ? AND owner = ? AND fencing_token = ? AND lease_expires_at > ?

-- name: TaskGet
SELECT k.task_id, k.status, k.reason, k.version, v.plan_hash, v.steps, v.author,
	k.execute_after, k.execute_before, k.created_by, k.approved_version, k.step_index, k.row_version,
	k.owner, k.fencing_token, k.lease_expires_at, k.created_at, k.updated_at
FROM tasks k JOIN task_versions v ON v.task_id = k.task_id AND v.version = k.version WHERE k.task_id = ?

-- name: TaskStepOperationStatus
SELECT status FROM operations WHERE operation_id = ?

-- name: TaskDeviceSeen
SELECT seen FROM devices WHERE device_id = ?

-- name: TaskHistoryList
SELECT at, principal, action, from_state, to_state, version, reason
	FROM task_history WHERE task_id = ? ORDER BY id

-- name: TaskApprovalRead
SELECT a.version, a.approver, a.plan_hash, a.approved_at, v.author, v.steps
	FROM approvals a JOIN task_versions v ON v.task_id = a.task_id AND v.version = a.version WHERE a.task_id = ?

-- name: GrantInsert
INSERT INTO grants (grant_id, principal, action, devices, created_by, created_at) VALUES (?, ?, ?, ?, ?, ?)
	ON CONFLICT (principal, action, devices) WHERE revoked_at IS NULL DO NOTHING

-- name: GrantLive
SELECT grant_id, principal, action, devices, created_by, created_at, revoked_at FROM grants
	WHERE principal = ? AND action = ? AND devices = ? AND revoked_at IS NULL

-- name: GrantRevoke
UPDATE grants SET revoked_at = ? WHERE grant_id = ? AND revoked_at IS NULL

-- name: GrantGet
SELECT grant_id, principal, action, devices, created_by, created_at, revoked_at FROM grants WHERE grant_id = ?

-- name: GrantsOf
SELECT action, devices FROM grants WHERE principal = ? AND revoked_at IS NULL

-- auditlog.go: the audit log, events with their principal, the gauges' counts (issue 27: audit)

-- name: AuditInsert
INSERT INTO audit (at, principal, action, kind, entity_id, detail) VALUES (?, ?, ?, ?, ?, ?)

-- name: EventListOfBy
SELECT id, at, machine, entity_id, from_state, to_state, reason, instance,
	fencing_token, refused, principal FROM events WHERE entity_id = ? ORDER BY id

-- name: OperationStatusCounts
SELECT status, count(*) FROM operations GROUP BY status

-- name: CommandStatusCounts
SELECT status, count(*) FROM commands GROUP BY status

-- The open states alone: a range of the same indexes, as long as the
-- open rows are few.

-- name: OperationOpenStatusCounts
SELECT status, count(*) FROM operations WHERE status IN ('started','failed_retryable') GROUP BY status

-- name: CommandOpenStatusCounts
SELECT status, count(*) FROM commands
	WHERE status IN ('pending','waiting_device','sent','received','executing','needs_attention') GROUP BY status

-- oplists.go: the lists by device (Capabilities.ListsDevicesInBulk)

-- name: DeviceListOperations
-- Moves the pending operations into operations_target_started
-- (migration 0014), found by their own index.
UPDATE operations SET device_listed = 1 WHERE device_listed = 0

-- name: DeviceListCommands
UPDATE commands SET device_listed = 1 WHERE device_listed = 0
