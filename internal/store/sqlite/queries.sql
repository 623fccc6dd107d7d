-- The store's statements on SQLite, by name (driver.Statements). One
-- writer is the lock: no statement takes a row lock.

-- name: SchemaTable
CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT

-- name: SchemaVersion
SELECT COALESCE(MAX(version), 0) FROM schema_migrations

-- name: SchemaApplied
INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)

-- The batch's pre-lock is not run on SQLite (Capabilities.RowLocks is
-- false); these stand in for the names.

-- name: PreLockCommands
SELECT NULL WHERE 0

-- name: PreLockInsertDevices
SELECT NULL WHERE 0

-- name: PreLockDevices
SELECT NULL WHERE 0

-- Reads of one row. Inside a write transaction a change reads the row it
-- will write with the lock a plain UPDATE takes (the ...ForUpdate
-- statements; on PostgreSQL FOR NO KEY UPDATE): another instance applying a fact about the same row waits
-- for this change's commit, then reads what it committed.

-- name: CommandGet
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at
FROM commands WHERE command_id = ?

-- name: CommandGetForUpdate
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at
FROM commands WHERE command_id = ?

-- name: OperationGetRow
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at
FROM operations WHERE operation_id = ?

-- name: OperationGetRowForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at
FROM operations WHERE operation_id = ?

-- An operation with the ids of its commands (by creation) and of its
-- compensations (by start, then id), comma-joined.

-- name: OperationGet
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = o.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = o.operation_id), '')
FROM operations o WHERE o.operation_id = ?

-- name: OperationGetForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
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
UPDATE commands SET status = ?, attempt = attempt + 1, version = version + 1, qos = ?,
	next_check_at = ?, last_sent_at = ?, last_query_id = '', last_answer = '', updated_at = ?
WHERE command_id = ? AND status = ? AND attempt = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at

-- name: CommandClaimQuery
UPDATE commands SET queries = queries + ?, last_query_id = ?, last_answer = '', next_check_at = ?, updated_at = ?
WHERE command_id = ? AND status = ? AND queries = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at

-- name: CommandPostpone
UPDATE commands SET next_check_at = ?
WHERE command_id = ? AND version = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)

-- name: CommandMove
UPDATE commands SET status = ?, reason = ?, version = version + 1, next_check_at = ?, updated_at = ?,
	last_query_id = CASE WHEN ? = 1 THEN '' ELSE last_query_id END,
	last_answer = CASE WHEN ? = 1 THEN '' ELSE last_answer END
WHERE command_id = ? AND status = ? AND version = ?
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = ? AND fencing_token = ? AND lease_expires_at > ?)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at

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

