-- The store's statements on PostgreSQL, by name (driver.Statements), with
-- their row locks (see the package doc).

-- name: SchemaTable
CREATE TABLE IF NOT EXISTS schema_migrations (
	version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)

-- name: SchemaVersion
SELECT COALESCE(MAX(version), 0) FROM schema_migrations

-- name: SchemaApplied
INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)

-- The batch's pre-lock: the commands its changes will lock (by id, or the
-- open commands of operations and devices), in command_id order; the
-- devices seen for the first time, inserted in device_id order; then the
-- devices' rows, in device_id order. Batches of several instances lock
-- the rows they share in the same order, so they wait for each other
-- instead of deadlocking. The status list is fsm's terminal command
-- states (TestStatementsStateLists).

-- name: PreLockCommands
SELECT command_id FROM commands
WHERE command_id = ANY($1)
   OR ((operation_id = ANY($2) OR device_id = ANY($3))
       AND status NOT IN ('succeeded','failed','timeout','cancelled'))
ORDER BY command_id
FOR NO KEY UPDATE

-- name: PreLockInsertDevices
INSERT INTO devices (device_id, updated_at)
SELECT d, $1 FROM unnest(CAST($2 AS text[])) AS d ORDER BY d COLLATE "C"
ON CONFLICT (device_id) DO NOTHING

-- name: PreLockDevices
SELECT device_id FROM devices WHERE device_id = ANY($1)
ORDER BY device_id
FOR NO KEY UPDATE

-- Reads of one row. Inside a write transaction a change reads the row it
-- will write with the lock a plain UPDATE takes (the ...ForUpdate
-- statements; on PostgreSQL FOR NO KEY UPDATE): another instance applying a fact about the same row waits
-- for this change's commit, then reads what it committed.

-- name: CommandGet
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at
FROM commands WHERE command_id = $1

-- name: CommandGetForUpdate
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at
FROM commands WHERE command_id = $1
FOR NO KEY UPDATE

-- name: OperationGetRow
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at
FROM operations WHERE operation_id = $1

-- name: OperationGetRowForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at
FROM operations WHERE operation_id = $1
FOR NO KEY UPDATE

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
FROM operations o WHERE o.operation_id = $1

-- name: OperationGetForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = o.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = o.operation_id), '')
FROM operations o WHERE o.operation_id = $1
FOR NO KEY UPDATE

-- name: RolloutGetRow
SELECT rollout_id, status, reason, version, row_version, action, params, selector, spec, create_hash,
	max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required, approved_version,
	approver, approved_at, devices_total, created_by, created_at, updated_at, ended_at, owner, fencing_token,
	lease_expires_at, starts, last_start_at
FROM rollouts WHERE rollout_id = $1

-- name: RolloutGetRowForUpdate
SELECT rollout_id, status, reason, version, row_version, action, params, selector, spec, create_hash,
	max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required, approved_version,
	approver, approved_at, devices_total, created_by, created_at, updated_at, ended_at, owner, fencing_token,
	lease_expires_at, starts, last_start_at
FROM rollouts WHERE rollout_id = $1
FOR NO KEY UPDATE

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
UPDATE commands SET status = $1, attempt = attempt + 1, version = version + 1, qos = $2,
	next_check_at = $3, last_sent_at = $4, last_query_id = '', last_answer = '', updated_at = $5
WHERE command_id = (SELECT command_id FROM commands WHERE command_id = $6 FOR NO KEY UPDATE) AND status = $7 AND attempt = $8
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $9 AND fencing_token = $10 AND lease_expires_at > $11 FOR KEY SHARE)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at

-- name: CommandClaimQuery
UPDATE commands SET queries = queries + $1, last_query_id = $2, last_answer = '', next_check_at = $3, updated_at = $4
WHERE command_id = (SELECT command_id FROM commands WHERE command_id = $5 FOR NO KEY UPDATE) AND status = $6 AND queries = $7
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $8 AND fencing_token = $9 AND lease_expires_at > $10 FOR KEY SHARE)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at

-- name: CommandPostpone
UPDATE commands SET next_check_at = $1
WHERE command_id = (SELECT command_id FROM commands WHERE command_id = $2 FOR NO KEY UPDATE) AND version = $3
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $4 AND fencing_token = $5 AND lease_expires_at > $6 FOR KEY SHARE)

-- name: CommandMove
UPDATE commands SET status = $1, reason = $2, version = version + 1, next_check_at = $3, updated_at = $4,
	last_query_id = CASE WHEN $5 = 1 THEN '' ELSE last_query_id END,
	last_answer = CASE WHEN $6 = 1 THEN '' ELSE last_answer END
WHERE command_id = (SELECT command_id FROM commands WHERE command_id = $7 FOR NO KEY UPDATE) AND status = $8 AND version = $9
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $10 AND fencing_token = $11 AND lease_expires_at > $12 FOR KEY SHARE)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at

-- Why a fenced decision was refused: does the caller's fence (owner,
-- token, now) still hold on the row? Fenced if not, stale if so.

-- name: CommandFenceHeld
SELECT EXISTS (SELECT 1 FROM commands WHERE command_id = $1
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $2 AND fencing_token = $3 AND lease_expires_at > $4))

-- name: OperationFenceHeld
SELECT EXISTS (SELECT 1 FROM operations WHERE operation_id = $1 AND owner = $2 AND fencing_token = $3 AND lease_expires_at > $4)

-- A retry of a failed_retryable operation moves its lease to a new
-- token: the row is locked as a takeover locks it (on PostgreSQL FOR
-- UPDATE, in an InitPlan), after any
-- decision whose fence holds it.

-- name: OperationStartRetry
UPDATE operations SET status = $1, reason = '', owner = $2, fencing_token = fencing_token + 1,
	lease_expires_at = $3, retry_until = $4, version = version + 1, updated_at = $5
WHERE operation_id = (SELECT operation_id FROM operations WHERE operation_id = $6 FOR UPDATE) AND status = $7 AND version = $8

-- Bulk changes select their rows passing over those another instance's
-- transaction holds (on PostgreSQL FOR UPDATE SKIP LOCKED, a fence included): they are
-- taken at the next round instead of deadlocking with it, or being taken
-- from under a decision. The conditions are repeated on the row itself:
-- PostgreSQL re-checks them against the newest version of a row another
-- instance changed first.

-- name: LeaseRenew
UPDATE operations SET lease_expires_at = $1
WHERE operation_id IN (SELECT operation_id FROM operations
	WHERE owner = $2 AND status = 'started' AND lease_expires_at > $3 FOR UPDATE SKIP LOCKED)
	AND owner = $4 AND status = 'started' AND lease_expires_at > $5

-- name: LeaseReclaimOwn
UPDATE operations SET fencing_token = fencing_token + 1, lease_expires_at = $1
WHERE operation_id IN (SELECT operation_id FROM operations
	WHERE owner = $2 AND status = 'started' AND lease_expires_at < $3 LIMIT 500 FOR UPDATE SKIP LOCKED)
	AND owner = $4 AND status = 'started' AND lease_expires_at < $5
RETURNING operation_id

-- name: LeaseTakeOver
UPDATE operations SET owner = $1, fencing_token = fencing_token + 1,
	lease_expires_at = $2, updated_at = $3
WHERE operation_id IN (SELECT operation_id FROM operations
	WHERE status = 'started' AND lease_expires_at <= $4
		AND (owner != $5 OR lease_expires_at <= $6) LIMIT $7 FOR UPDATE SKIP LOCKED)
	AND status = 'started' AND lease_expires_at <= $8 AND (owner != $9 OR lease_expires_at <= $10)
RETURNING operation_id, fencing_token

-- name: DeviceTouch
UPDATE devices SET confirmed = 1, last_seen_at = $1, updated_at = $2
WHERE device_id IN (SELECT device_id FROM devices WHERE device_id = $3
	AND (confirmed = 0 OR last_seen_at IS NULL OR last_seen_at <= $4) FOR UPDATE SKIP LOCKED)

-- name: DeviceUnconfirmAll
UPDATE devices SET confirmed = 0
WHERE device_id IN (SELECT device_id FROM devices WHERE confirmed = 1 FOR UPDATE SKIP LOCKED)
	AND confirmed = 1

