-- The store's statements on PostgreSQL, by name (driver.Statements), with
-- their row locks (see the package doc).

-- name: SchemaTable
CREATE TABLE IF NOT EXISTS schema_migrations (
	version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)

-- name: SchemaVersion
SELECT COALESCE(MAX(version), 0) FROM schema_migrations

-- name: SchemaApplied
INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)

-- The heads of the batch's multi-row INSERTs (the store appends the rows).

-- name: EventsInsertHead
INSERT INTO events (at, machine, entity_id, from_state, to_state, reason, instance, fencing_token, refused, principal) VALUES

-- name: ReceiptsInsertHead
INSERT INTO receipts (command_id, sent_as, device_id, operation_id, status, seq, at, received_at, query_id, effect, error, result, instance) VALUES

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

-- name: PreLockQueues
INSERT INTO device_queues (device_id)
SELECT d FROM unnest(CAST($1 AS text[])) AS d ORDER BY d COLLATE "C"
ON CONFLICT (device_id) DO UPDATE SET last_seq = device_queues.last_seq

-- Reads of one row. Inside a write transaction a change reads the row it
-- will write with the lock a plain UPDATE takes (the ...ForUpdate
-- statements; on PostgreSQL FOR NO KEY UPDATE): another instance applying a fact about the same row waits
-- for this change's commit, then reads what it committed.

-- name: CommandGet
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq
FROM commands WHERE command_id = $1

-- name: CommandGetForUpdate
SELECT command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq
FROM commands WHERE command_id = $1
FOR NO KEY UPDATE

-- name: OperationGetRow
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0)
FROM operations WHERE operation_id = $1

-- name: OperationGetRowForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0)
FROM operations WHERE operation_id = $1
FOR NO KEY UPDATE

-- An operation with the ids of its commands (by creation) and of its
-- compensations (by start, then id), comma-joined.

-- name: OperationsEnded
-- Of the operations named in a JSON array of ids, those no longer started:
-- one read for every ?wait= caller that polls.
SELECT operation_id FROM operations
	WHERE operation_id IN (SELECT jsonb_array_elements_text($1::jsonb)) AND status <> 'started'

-- name: OperationGet
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = o.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = o.operation_id), '')
FROM operations o WHERE o.operation_id = $1

-- name: OperationGetForUpdate
SELECT operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
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
	next_check_at = $3, last_sent_at = $4, last_query_id = '', last_answer = '', updated_at = $5,
	reason = CASE WHEN reason = 'queued' THEN '' ELSE reason END
WHERE command_id = (SELECT command_id FROM commands WHERE command_id = $6 FOR NO KEY UPDATE) AND status = $7 AND attempt = $8
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $9 AND fencing_token = $10 AND lease_expires_at > $11 FOR KEY SHARE)
	AND (serial_seq IS NULL OR attempt > 0 OR NOT EXISTS (SELECT 1 FROM commands a WHERE a.device_id = commands.device_id
		AND a.serial_seq < commands.serial_seq AND a.status NOT IN ('succeeded','failed','timeout','cancelled')))
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandClaimQuery
UPDATE commands SET queries = queries + $1, last_query_id = $2, last_answer = '', next_check_at = $3, updated_at = $4
WHERE command_id = (SELECT command_id FROM commands WHERE command_id = $5 FOR NO KEY UPDATE) AND status = $6 AND queries = $7
	AND EXISTS (SELECT 1 FROM operations WHERE operations.operation_id = commands.operation_id
		AND owner = $8 AND fencing_token = $9 AND lease_expires_at > $10 FOR KEY SHARE)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

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
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

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


-- commands.go: receipts of a command, decisions' lease read-back, queries, wake-ups

-- name: ReceiptList
SELECT command_id, sent_as, device_id, status, seq, at, received_at, query_id,
	effect, error, result, instance FROM receipts WHERE command_id = $1 ORDER BY id

-- name: OperationLeaseExpiry
SELECT lease_expires_at FROM operations WHERE operation_id = $1

-- name: QueryInsert
INSERT INTO queries (query_id, command_id, instance, fencing_token, sent_at) VALUES ($1, $2, $3, $4, $5)

-- name: CommandWakeDevice
UPDATE commands SET next_check_at = $1, version = version + 1 WHERE device_id = $2
	AND status NOT IN ('succeeded','failed','timeout','cancelled') RETURNING command_id

-- operations.go: submit, commands' insert, outcomes

-- name: OperationInsert
INSERT INTO operations (operation_id, action, target, params, request_hash, status,
		attempt, command_id, version, owner, lease_expires_at, fencing_token,
		task_id, step, business_version, compensates, started_at, updated_at,
		submitted_by, via, approved_by, approved_version)
	VALUES ($1, $2, $3, $4, $5, 'started', 1, $6, 1, $7, $8, 1, $9, $10, $11, NULLIF($12, ''), $13, $14, $15, $16, $17, NULLIF($18, 0))
	ON CONFLICT (operation_id) DO NOTHING

-- name: CommandInsert
INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, qos, version, next_check_at, last_sent_at, created_at, updated_at, serial_seq, reason)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)

-- name: CommandInsertForDevice
-- CommandInsert with the first publish decision made from the device's row
-- as this transaction reads it: claimed (sent, attempt 1, its next check
-- and last send the claim's) when the caller may claim it and the device
-- is online, pending otherwise; QoS 1 when the device deduplicates. It
-- returns the status and QoS it wrote.
INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, qos, version, next_check_at, last_sent_at, created_at, updated_at, serial_seq, reason)
	SELECT $1, $2, $3, $4, $5, $6, $7,
		CASE WHEN d.claim THEN 'sent' ELSE 'pending' END, CASE WHEN d.claim THEN 1 ELSE 0 END, d.dedupe,
		CASE WHEN d.claim THEN 2 ELSE 1 END, CASE WHEN d.claim THEN $8::bigint ELSE $9::bigint END,
		CASE WHEN d.claim THEN $10::bigint END, $11, $12, $13, $14
	FROM (SELECT $15::bigint = 1 AND COALESCE((SELECT online FROM devices WHERE device_id = $3), 0) = 1 AS claim,
		COALESCE((SELECT dedupe FROM devices WHERE device_id = $3), 0) AS dedupe) d
RETURNING status, qos

-- name: OperationCommandInsert
-- OperationInsert and CommandInsertForDevice in one statement
-- (Capabilities.WritesTogether), for a submit of no serial queue and no
-- supersede: the command is inserted only with its operation, and no row
-- comes back when the operation_id is taken.
WITH op AS (
	INSERT INTO operations (operation_id, action, target, params, request_hash, status,
			attempt, command_id, version, owner, lease_expires_at, fencing_token,
			task_id, step, business_version, compensates, started_at, updated_at,
			submitted_by, via, approved_by, approved_version)
		VALUES ($1, $2, $3, $4, $5, 'started', 1, $6, 1, $7, $8, 1, $9, $10, $11, NULLIF($12, ''), $13, $14, $15, $16, $17, NULLIF($18, 0))
		ON CONFLICT (operation_id) DO NOTHING
	RETURNING operation_id
)
INSERT INTO commands (command_id, operation_id, device_id, action, params, issued_at, expires_at,
		status, attempt, qos, version, next_check_at, last_sent_at, created_at, updated_at, serial_seq, reason)
	SELECT $6, op.operation_id, $3, $2, $4, $19::bigint, $20::bigint,
		CASE WHEN d.claim THEN 'sent' ELSE 'pending' END, CASE WHEN d.claim THEN 1 ELSE 0 END, d.dedupe,
		CASE WHEN d.claim THEN 2 ELSE 1 END, CASE WHEN d.claim THEN $21::bigint ELSE $22::bigint END,
		CASE WHEN d.claim THEN $19::bigint END, $19::bigint, $19::bigint, NULL, ''
	FROM op, (SELECT $23::bigint = 1 AND COALESCE((SELECT online FROM devices WHERE device_id = $3), 0) = 1 AS claim,
		COALESCE((SELECT dedupe FROM devices WHERE device_id = $3), 0) AS dedupe) d
RETURNING status, qos

-- name: OperationFinish
UPDATE operations SET status = $1, result = $2, reason = $3, retry_until = NULL, version = version + 1, updated_at = $4
	WHERE operation_id = $5 AND status = $6 AND version = $7
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
UPDATE operations SET status = $1, result = $2, reason = $3, retry_until = NULL, version = version + 1, updated_at = $4
	WHERE operation_id = $5 AND status = 'started' AND command_id = $6
RETURNING operation_id, action, target, params, request_hash, status, result, reason, attempt,
	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
	COALESCE(compensates, ''), started_at, updated_at,
	submitted_by, via, approved_by, COALESCE(approved_version, 0),
	COALESCE((SELECT string_agg(c.command_id, ',' ORDER BY c.created_at, c.command_id)
		FROM commands c WHERE c.operation_id = operations.operation_id), ''),
	COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
		FROM operations k WHERE k.compensates = operations.operation_id), '')

-- name: CommandSupersede
UPDATE commands SET status = $1, reason = $2, version = version + 1, updated_at = $3
	WHERE command_id = $4 AND status = $5 AND version = $6 AND attempt = 0

-- Per-device ordering (queues.go): a serial command's number, the
-- command ahead of it, the head of a device's queue, what a new
-- submit supersedes, and a device's commands in flight and queued.

-- name: QueueNext
INSERT INTO device_queues (device_id, last_seq) VALUES ($1, 1)
ON CONFLICT (device_id) DO UPDATE SET last_seq = device_queues.last_seq + 1 RETURNING last_seq

-- name: QueueAhead
SELECT command_id FROM commands WHERE device_id = $1 AND serial_seq < $2
	AND status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY serial_seq DESC LIMIT 1

-- name: QueueHead
SELECT command_id, attempt FROM commands WHERE device_id = $1 AND serial_seq IS NOT NULL
	AND status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY serial_seq LIMIT 1

-- name: QueueSupersedable
SELECT c.command_id FROM operations o JOIN commands c ON c.command_id = o.command_id
WHERE o.target = $1 AND o.action = $2 AND o.status = 'started' AND o.operation_id <> $3
	AND c.attempt = 0 AND c.status IN ('pending','waiting_device')
ORDER BY c.command_id

-- name: QueueInFlight
SELECT command_id FROM commands WHERE device_id = $1 AND attempt > 0
	AND status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY created_at, command_id

-- name: QueueWaiting
SELECT command_id FROM commands WHERE device_id = $1 AND serial_seq IS NOT NULL AND attempt = 0
	AND status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY serial_seq

-- retry.go: retries, cancel, resolve

-- name: CommandRetryAsk
UPDATE commands SET last_query_id = '', last_answer = '', next_check_at = $1 WHERE command_id = $2

-- name: OperationRetrying
SELECT operation_id, retry_until FROM operations
	WHERE command_id = $1 AND owner = $2 AND status = 'started' AND retry_until IS NOT NULL

-- name: OperationRetryingCommands
SELECT command_id FROM operations
	WHERE owner = $1 AND status = 'started' AND retry_until IS NOT NULL LIMIT $2

-- name: OperationMintCommand
UPDATE operations SET command_id = $1, attempt = attempt + 1, retry_until = NULL, version = version + 1, updated_at = $2
	WHERE operation_id = $3 AND status = $4 AND version = $5 AND owner = $6 AND fencing_token = $7 AND lease_expires_at > $8

-- name: OperationAbandonRetry
UPDATE operations SET status = $1, reason = $2, retry_until = NULL, version = version + 1, updated_at = $3
	WHERE operation_id = $4 AND status = $5 AND version = $6 AND owner = $7 AND fencing_token = $8 AND lease_expires_at > $9

-- name: CommandCancel
UPDATE commands SET status = $1, reason = $2, version = version + 1, updated_at = $3
	WHERE command_id = $4 AND status = $5 AND version = $6 AND attempt = 0 RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandLateResolve
UPDATE commands SET late_outcome = $1, late_conflict = $2, updated_at = $3 WHERE command_id = $4

-- name: CommandResolve
UPDATE commands SET status = $1, reason = $2, resolved_by = $3,
		version = version + 1, updated_at = $4
	WHERE command_id = $5 AND status = $6 AND version = $7 RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- leases.go: instances and leases

-- name: InstanceList
SELECT i.instance_id, i.started_at, i.heartbeat_at, i.lease_ttl_ms,
		(SELECT COUNT(*) FROM operations o WHERE o.status = 'started' AND o.owner = i.instance_id)
	FROM instances i ORDER BY i.instance_id

-- name: LeaseLastExpiry
SELECT MAX(lease_expires_at) FROM operations WHERE owner = $1 AND status = 'started'

-- name: LeaseCountExpired
SELECT COUNT(*) FROM operations WHERE owner = $1 AND status = 'started' AND lease_expires_at < $2

-- name: CommandForgetQuestions
UPDATE commands SET last_query_id = '', last_answer = '', next_check_at = $1
	WHERE operation_id = $2 AND status NOT IN ('succeeded','failed','timeout','cancelled')

-- devices.go: presence

-- name: DeviceGet
SELECT device_id, online, confirmed, seen, session, presence_rank, dedupe, query, clock_skew_ms,
	stale_presence, last_stale_session, last_seen_at, updated_at FROM devices WHERE device_id = $1

-- name: DeviceInsert
INSERT INTO devices (device_id, updated_at) VALUES ($1, $2) ON CONFLICT (device_id) DO NOTHING

-- name: DeviceStalePresence
UPDATE devices SET stale_presence = stale_presence + 1, last_stale_session = $1
	WHERE device_id = $2

-- name: DevicePresence
UPDATE devices SET online = $1, confirmed = 1, seen = $2, session = $3, presence_rank = $4,
		dedupe = $5, query = $6, clock_skew_ms = $7, last_seen_at = $8, updated_at = $9
	WHERE device_id = $10 AND presence_rank < $11

-- name: DeviceResetPresence
UPDATE devices SET presence_rank = -1, stale_presence = 0,
	last_stale_session = 0, updated_at = $1 WHERE device_id = $2 RETURNING device_id, online, confirmed, seen, session, presence_rank, dedupe, query, clock_skew_ms,
	stale_presence, last_stale_session, last_seen_at, updated_at

-- receipts.go: receipts and answers

-- name: QueryCommand
SELECT command_id FROM queries WHERE query_id = $1

-- name: QueryAnswer
UPDATE queries SET answered_at = $1, answer = $2 WHERE query_id = $3 AND answered_at IS NULL

-- name: CommandLastAnswer
UPDATE commands SET last_answer = $1 WHERE command_id = $2

-- name: CommandDueNow
UPDATE commands SET next_check_at = $1 WHERE command_id = $2

-- name: CommandUnpark
UPDATE commands SET next_check_at = $1 WHERE command_id = $2 AND next_check_at >= expires_at

-- name: CommandAdvance
UPDATE commands SET status = $1, status_rank = $2, last_seq = $3, reason = $4,
		result = COALESCE($5, result), executed_as = $6, version = version + 1, updated_at = $7
	WHERE command_id = $8 AND status = $9 AND status_rank < $10

-- name: CommandAdvanceFrom
-- A receipt's change in one statement, when its command is in the state
-- expected before the receipt (store: advanceExpected): it moves on only
-- from that state, below the receipt's rank, on the receipt's device and of
-- the receipt's operation (any, when the receipt names none). It returns the
-- command as CommandGet reads it, after the change; no row: nothing changed.
UPDATE commands SET status = $1, status_rank = $2, last_seq = $3, reason = $4,
		result = COALESCE($5, result), version = version + 1, updated_at = $6
	WHERE command_id = $7 AND status = $8 AND status_rank < $9 AND device_id = $10
		AND operation_id = COALESCE(NULLIF($11, ''), operation_id)
RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
	attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
	late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq

-- name: CommandAdvanceFinish
-- CommandAdvanceFrom ($1 to $11) to a final state and OperationFinishCurrent
-- in one statement (Capabilities.WritesTogether): the operation, when it is
-- started and the command is its current one, ends as $12 with the result
-- $13 and the command's reason. It returns the command as CommandAdvanceFrom
-- does, then whether the operation ended, then the operation as
-- OperationFinishCurrent returns it (zeros and empty strings when it did
-- not end). No row: the command did not move, and nothing changed.
WITH c AS (
	UPDATE commands SET status = $1, status_rank = $2, last_seq = $3, reason = $4,
			result = COALESCE($5, result), version = version + 1, updated_at = $6
		WHERE command_id = $7 AND status = $8 AND status_rank < $9 AND device_id = $10
			AND operation_id = COALESCE(NULLIF($11, ''), operation_id)
	RETURNING command_id, operation_id, device_id, action, params, issued_at, expires_at, status, status_rank,
		attempt, queries, qos, version, reason, result, last_seq, executed_as, resolved_by, late_outcome, late_result,
		late_conflict, last_query_id, last_answer, next_check_at, last_sent_at, created_at, updated_at, serial_seq
), o AS (
	-- By its key alone, the state and the command inside a CASE: with
	-- status = 'started' written plainly (or a join with c), the planner
	-- took the index of operations' states and went through every started
	-- operation.
	UPDATE operations SET status = $12, result = $13, reason = $4, retry_until = NULL, version = version + 1, updated_at = $6
		WHERE operation_id = (SELECT operation_id FROM c)
			AND CASE WHEN status = 'started' THEN command_id END = (SELECT command_id FROM c)
	RETURNING operation_id, action, target, params, request_hash, status, result, reason, attempt,
		command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
		COALESCE(compensates, '') AS compensates, started_at, updated_at,
		submitted_by, via, approved_by, COALESCE(approved_version, 0) AS approved_version,
		COALESCE((SELECT string_agg(k.command_id, ',' ORDER BY k.created_at, k.command_id)
			FROM commands k WHERE k.operation_id = operations.operation_id), '') AS command_ids,
		COALESCE((SELECT string_agg(k.operation_id, ',' ORDER BY k.started_at, k.operation_id)
			FROM operations k WHERE k.compensates = operations.operation_id), '') AS compensations
)
SELECT c.*, o.operation_id IS NOT NULL,
	COALESCE(o.operation_id, ''), COALESCE(o.action, ''), COALESCE(o.target, ''), o.params,
	COALESCE(o.request_hash, ''), COALESCE(o.status, ''), o.result, COALESCE(o.reason, ''),
	COALESCE(o.attempt, 0), COALESCE(o.command_id, ''), COALESCE(o.version, 0), COALESCE(o.owner, ''),
	COALESCE(o.lease_expires_at, 0), COALESCE(o.fencing_token, 0), COALESCE(o.task_id, ''), COALESCE(o.step, ''),
	COALESCE(o.business_version, ''), COALESCE(o.compensates, ''), COALESCE(o.started_at, 0),
	COALESCE(o.updated_at, 0), COALESCE(o.submitted_by, ''), COALESCE(o.via, ''), COALESCE(o.approved_by, ''),
	COALESCE(o.approved_version, 0), COALESCE(o.command_ids, ''), COALESCE(o.compensations, '')
FROM c LEFT JOIN o ON true

-- name: CommandLateConflict
UPDATE commands SET late_conflict = 1, updated_at = $1 WHERE command_id = $2

-- name: CommandLateOutcome
UPDATE commands SET late_outcome = $1, late_result = $2, late_conflict = $3, status_rank = $4,
	updated_at = $5 WHERE command_id = $6 AND late_outcome = ''

-- rollouts.go: rollouts, their devices, starts and history

-- name: RolloutCounts
SELECT status, COUNT(*) FROM rollout_devices WHERE rollout_id = $1 GROUP BY status

-- name: RolloutStartsSince
SELECT COUNT(*) FROM rollout_starts WHERE rollout_id = $1 AND started_at > $2

-- name: RolloutHistoryInsert
INSERT INTO rollout_history (rollout_id, at, principal, action, from_state, to_state, version, reason)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8)

-- name: DeviceListSeen
SELECT device_id FROM devices WHERE seen = 1 ORDER BY device_id

-- name: RolloutCreateHash
SELECT create_hash FROM rollouts WHERE rollout_id = $1

-- name: RolloutInsert
INSERT INTO rollouts (rollout_id, status, version, row_version, action, params, selector, spec,
		create_hash, max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required,
		devices_total, created_by, created_at, updated_at, owner, fencing_token, lease_expires_at)
	VALUES ($1, $2, 1, 1, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, 1, $19)

-- name: RolloutDeviceInsert
INSERT INTO rollout_devices (rollout_id, device_id, position, operation_id, status, updated_at)
	VALUES ($1, $2, $3, $4, 'pending', $5)

-- name: RolloutHistoryList
SELECT at, principal, action, from_state, to_state, version, reason
	FROM rollout_history WHERE rollout_id = $1 ORDER BY id

-- name: RolloutStartList
SELECT device_id, attempt, started_at, instance, fencing_token
	FROM rollout_starts WHERE rollout_id = $1 ORDER BY started_at, device_id, attempt

-- name: RolloutApprove
UPDATE rollouts SET status = $1, approved_version = $2, approver = $3, approved_at = $4,
		row_version = row_version + 1, updated_at = $5
	WHERE rollout_id = $6 AND status = $7 AND version = $8 AND row_version = $9

-- name: RolloutMove
UPDATE rollouts SET status = $1, reason = $2, row_version = row_version + 1, updated_at = $3,
		ended_at = COALESCE(ended_at, $4)
	WHERE rollout_id = $5 AND status = $6 AND row_version = $7

-- name: RolloutCancelWaiting
UPDATE rollout_devices SET status = 'cancelled', reason = $1, finished_at = $2, updated_at = $3
	WHERE rollout_id = $4 AND status IN ('pending', 'retry')

-- name: RolloutUnpublished
SELECT d.device_id, d.operation_id, c.command_id FROM rollout_devices d
	JOIN operations o ON o.operation_id = d.operation_id JOIN commands c ON c.command_id = o.command_id
	WHERE d.rollout_id = $1 AND d.status = 'started' AND o.status = 'started' AND c.attempt = 0
		AND c.status IN ('pending', 'waiting_device')

-- name: RolloutCancelDevice
UPDATE rollout_devices SET status = 'cancelled', reason = $1, finished_at = $2, updated_at = $3
	WHERE rollout_id = $4 AND device_id = $5 AND status = 'started'

-- The ended rollouts' devices are found by status (rollout_devices_by_status)
-- and their operations by key, never by the operations' status.
-- name: RolloutListActive
SELECT rollout_id, status, owner, fencing_token, lease_expires_at FROM rollouts
	WHERE status IN ('waiting_approval','scheduled','running','paused')
		OR (ended_at IS NOT NULL AND rollout_id IN (SELECT rollout_id FROM rollout_devices
			WHERE status IN ('started', 'needs_attention')))
		OR (ended_at IS NOT NULL AND rollout_id IN (SELECT d.rollout_id FROM rollout_devices d
			JOIN operations o ON o.operation_id = d.operation_id
			WHERE d.status IN ('timeout', 'rejected', 'failed', 'retry')
				AND ((o.status = 'succeeded' AND d.reason NOT LIKE 'idempotency_key_reused%')
			OR (o.status = 'failed_final' AND d.status IN ('timeout', 'retry')))))
	ORDER BY created_at, rollout_id

-- name: RolloutAcquire
UPDATE rollouts SET owner = $1, fencing_token = fencing_token + 1, lease_expires_at = $2
	WHERE rollout_id = $3 AND owner = $4 AND fencing_token = $5

-- name: RolloutNextCandidate
SELECT rollout_id, device_id, position, operation_id, status, reason, attempts, started_at, finished_at, updated_at FROM rollout_devices
	WHERE rollout_id = $1 AND status = $2 ORDER BY position LIMIT 1

-- name: RolloutRenew
UPDATE rollouts SET lease_expires_at = $1
	WHERE rollout_id = $2 AND owner = $3 AND fencing_token = $4 AND lease_expires_at > $5

-- name: RolloutDeviceGet
SELECT rollout_id, device_id, position, operation_id, status, reason, attempts, started_at, finished_at, updated_at FROM rollout_devices
	WHERE rollout_id = $1 AND device_id = $2

-- name: RolloutCountStart
UPDATE rollouts SET starts = starts + 1, last_start_at = $1
	WHERE rollout_id = $2 AND status = 'running' AND (last_start_at IS NULL OR last_start_at <= $3) AND owner = $4 AND fencing_token = $5 AND lease_expires_at > $6

-- name: RolloutDeviceStart
UPDATE rollout_devices SET status = 'started', attempts = $1, reason = '', started_at = $2,
		finished_at = NULL, updated_at = $3
	WHERE rollout_id = $4 AND device_id = $5 AND status = $6 AND attempts = $7

-- name: RolloutStartInsert
INSERT INTO rollout_starts (rollout_id, device_id, attempt, started_at, instance, fencing_token)
	VALUES ($1, $2, $3, $4, $5, $6)

-- name: RolloutDeviceFailStart
UPDATE rollout_devices SET status = 'failed', reason = $1, finished_at = $2, updated_at = $3
	WHERE rollout_id = $4 AND device_id = $5

-- name: RolloutSettleList
SELECT d.device_id, d.status, d.attempts, o.status, o.reason, c.status, c.reason,
		EXISTS (SELECT 1 FROM receipts x WHERE x.command_id = c.command_id AND x.status = 'rejected')
	FROM rollout_devices d JOIN operations o ON o.operation_id = d.operation_id
		JOIN commands c ON c.command_id = o.command_id
	WHERE d.rollout_id = $1 AND (d.status IN ('started', 'needs_attention') OR ((o.status = 'succeeded' AND d.status IN ('timeout', 'rejected', 'failed', 'retry')
		AND d.reason NOT LIKE 'idempotency_key_reused%')
	OR (o.status = 'failed_final' AND d.status IN ('timeout', 'retry'))))

-- name: RolloutDeviceSettle
UPDATE rollout_devices SET status = $1, reason = $2, finished_at = $3, updated_at = $4
	WHERE rollout_id = $5 AND device_id = $6 AND status = $7 AND attempts = $8

-- name: RolloutProvisional
SELECT COUNT(*), MAX(d.finished_at) FROM rollout_devices d
		JOIN operations o ON o.operation_id = d.operation_id
	WHERE d.rollout_id = $1 AND d.status IN ('timeout', 'rejected', 'failed') AND o.status = 'failed_retryable'

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
	FROM queries WHERE command_id = $1 ORDER BY sent_at

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
	fencing_token, refused FROM events WHERE entity_id = $1 ORDER BY id

-- name: EventListPresence
SELECT id, at, machine, entity_id, from_state, to_state, reason, instance,
	fencing_token, refused FROM events WHERE machine = $1 AND entity_id = $2 AND at BETWEEN $3 AND $4 ORDER BY id

-- Open commands of started operations, with their operation's lease: an
-- owner's due ones (next check or expiry come), all of an owner's (the
-- ask-after-reconnect), one by id.

-- name: CommandListDue
SELECT c.command_id, c.operation_id, c.device_id, c.action, c.params, c.issued_at, c.expires_at, c.status, c.status_rank,
	c.attempt, c.queries, c.qos, c.version, c.reason, c.result, c.last_seq, c.executed_as, c.resolved_by, c.late_outcome, c.late_result,
	c.late_conflict, c.last_query_id, c.last_answer, c.next_check_at, c.last_sent_at, c.created_at, c.updated_at, c.serial_seq,
	COALESCE((SELECT a.command_id FROM commands a WHERE a.device_id = c.device_id AND a.serial_seq < c.serial_seq
		AND a.status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY a.serial_seq DESC LIMIT 1), ''),
	o.owner, o.fencing_token, o.lease_expires_at
FROM commands c JOIN operations o ON o.operation_id = c.operation_id
WHERE c.status NOT IN ('succeeded','failed','timeout','cancelled') AND o.status = 'started'
	AND o.owner = $1 AND o.lease_expires_at > $2 AND (c.next_check_at <= $3 OR c.expires_at <= $4)
ORDER BY c.next_check_at LIMIT $5

-- name: CommandListOpen
SELECT c.command_id, c.operation_id, c.device_id, c.action, c.params, c.issued_at, c.expires_at, c.status, c.status_rank,
	c.attempt, c.queries, c.qos, c.version, c.reason, c.result, c.last_seq, c.executed_as, c.resolved_by, c.late_outcome, c.late_result,
	c.late_conflict, c.last_query_id, c.last_answer, c.next_check_at, c.last_sent_at, c.created_at, c.updated_at, c.serial_seq,
	COALESCE((SELECT a.command_id FROM commands a WHERE a.device_id = c.device_id AND a.serial_seq < c.serial_seq
		AND a.status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY a.serial_seq DESC LIMIT 1), ''),
	o.owner, o.fencing_token, o.lease_expires_at
FROM commands c JOIN operations o ON o.operation_id = c.operation_id
WHERE c.status NOT IN ('succeeded','failed','timeout','cancelled') AND o.status = 'started'
	AND o.owner = $1 AND o.lease_expires_at > $2
ORDER BY c.next_check_at LIMIT $3

-- name: CommandOpen
SELECT c.command_id, c.operation_id, c.device_id, c.action, c.params, c.issued_at, c.expires_at, c.status, c.status_rank,
	c.attempt, c.queries, c.qos, c.version, c.reason, c.result, c.last_seq, c.executed_as, c.resolved_by, c.late_outcome, c.late_result,
	c.late_conflict, c.last_query_id, c.last_answer, c.next_check_at, c.last_sent_at, c.created_at, c.updated_at, c.serial_seq,
	COALESCE((SELECT a.command_id FROM commands a WHERE a.device_id = c.device_id AND a.serial_seq < c.serial_seq
		AND a.status NOT IN ('succeeded','failed','timeout','cancelled') ORDER BY a.serial_seq DESC LIMIT 1), ''),
	o.owner, o.fencing_token, o.lease_expires_at
FROM commands c JOIN operations o ON o.operation_id = c.operation_id
WHERE c.status NOT IN ('succeeded','failed','timeout','cancelled') AND o.status = 'started'
	AND c.command_id = $1

-- An instance's heartbeat; at its start, the start time too.

-- name: InstanceHeartbeat
INSERT INTO instances (instance_id, started_at, heartbeat_at, lease_ttl_ms) VALUES ($1, $2, $3, $4)
ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, lease_ttl_ms = excluded.lease_ttl_ms

-- name: InstanceHeartbeatStart
INSERT INTO instances (instance_id, started_at, heartbeat_at, lease_ttl_ms) VALUES ($1, $2, $3, $4)
ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, lease_ttl_ms = excluded.lease_ttl_ms, started_at = excluded.started_at


-- Tasks: plans and their versions, approvals, the runner's lease and its
-- decisions (store/tasks.go), and grants (store/grants.go).

-- name: TaskHistoryInsert
INSERT INTO task_history (task_id, at, principal, action, from_state, to_state, version, reason)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8)

-- name: TaskCreateHash
SELECT create_hash FROM tasks WHERE task_id = $1

-- name: TaskInsert
INSERT INTO tasks (task_id, status, version, create_hash, execute_after, execute_before,
	created_by, created_at, updated_at) VALUES ($1, 'waiting_approval', 1, $2, $3, $4, $5, $6, $7)

-- name: TaskVersionInsert
INSERT INTO task_versions (task_id, version, steps, plan_hash, author, created_at)
	VALUES ($1, $2, $3, $4, $5, $6)

-- name: TaskState
SELECT status, version, row_version FROM tasks WHERE task_id = $1

-- name: TaskVersionHash
SELECT plan_hash FROM task_versions WHERE task_id = $1 AND version = $2

-- name: TaskNewVersion
UPDATE tasks SET version = version + 1, row_version = row_version + 1, updated_at = $1
	WHERE task_id = $2 AND status = $3 AND row_version = $4

-- name: TaskApprovalGet
SELECT version, approver FROM approvals WHERE task_id = $1

-- name: TaskVersionAuthor
SELECT plan_hash, author FROM task_versions WHERE task_id = $1 AND version = $2

-- name: TaskApprove
UPDATE tasks SET status = $1, approved_version = $2, row_version = row_version + 1, updated_at = $3
	WHERE task_id = $4 AND status = $5 AND version = $6 AND row_version = $7

-- name: TaskApprovalInsert
INSERT INTO approvals (task_id, version, approver, plan_hash, approved_at) VALUES ($1, $2, $3, $4, $5)

-- name: TaskRejectState
SELECT status, row_version, version FROM tasks WHERE task_id = $1

-- name: TaskMove
UPDATE tasks SET status = $1, reason = $2,
	step_index = CASE WHEN $3 >= 0 THEN $4 ELSE step_index END, row_version = row_version + 1, updated_at = $5
	WHERE task_id = $6 AND status = $7 AND row_version = $8

-- name: TaskMoveFenced
UPDATE tasks SET status = $1, reason = $2,
	step_index = CASE WHEN $3 >= 0 THEN $4 ELSE step_index END, row_version = row_version + 1, updated_at = $5
	WHERE task_id = $6 AND status = $7 AND row_version = $8
	AND owner = $9 AND fencing_token = $10 AND lease_expires_at > $11

-- name: TaskFenceHeld
SELECT EXISTS (SELECT 1 FROM tasks WHERE task_id = $1 AND owner = $2 AND fencing_token = $3 AND lease_expires_at > $4)

-- name: TaskListActive
SELECT task_id, status, owner, fencing_token, lease_expires_at FROM tasks
	WHERE status IN ('approved','running') ORDER BY updated_at, task_id

-- name: TaskLeaseGetForUpdate
SELECT owner, fencing_token, lease_expires_at FROM tasks WHERE task_id = $1
FOR NO KEY UPDATE

-- name: TaskAcquire
UPDATE tasks SET owner = $1, fencing_token = fencing_token + 1, lease_expires_at = $2
	WHERE task_id = $3 AND owner = $4 AND fencing_token = $5

-- name: TaskRenew
UPDATE tasks SET lease_expires_at = $1
	WHERE task_id = $2 AND owner = $3 AND fencing_token = $4 AND lease_expires_at > $5

-- name: TaskGet
SELECT k.task_id, k.status, k.reason, k.version, v.plan_hash, v.steps, v.author,
	k.execute_after, k.execute_before, k.created_by, k.approved_version, k.step_index, k.row_version,
	k.owner, k.fencing_token, k.lease_expires_at, k.created_at, k.updated_at
FROM tasks k JOIN task_versions v ON v.task_id = k.task_id AND v.version = k.version WHERE k.task_id = $1

-- name: TaskStepOperationStatus
SELECT status FROM operations WHERE operation_id = $1

-- name: TaskDeviceSeen
SELECT seen FROM devices WHERE device_id = $1

-- name: TaskHistoryList
SELECT at, principal, action, from_state, to_state, version, reason
	FROM task_history WHERE task_id = $1 ORDER BY id

-- name: TaskApprovalRead
SELECT a.version, a.approver, a.plan_hash, a.approved_at, v.author, v.steps
	FROM approvals a JOIN task_versions v ON v.task_id = a.task_id AND v.version = a.version WHERE a.task_id = $1

-- name: GrantInsert
INSERT INTO grants (grant_id, principal, action, devices, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (principal, action, devices) WHERE revoked_at IS NULL DO NOTHING

-- name: GrantLive
SELECT grant_id, principal, action, devices, created_by, created_at, revoked_at FROM grants
	WHERE principal = $1 AND action = $2 AND devices = $3 AND revoked_at IS NULL

-- name: GrantRevoke
UPDATE grants SET revoked_at = $1 WHERE grant_id = $2 AND revoked_at IS NULL

-- name: GrantGet
SELECT grant_id, principal, action, devices, created_by, created_at, revoked_at FROM grants WHERE grant_id = $1

-- name: GrantsOf
SELECT action, devices FROM grants WHERE principal = $1 AND revoked_at IS NULL

-- auditlog.go: the audit log, events with their principal, the gauges' counts (issue 27: audit)

-- name: AuditInsert
INSERT INTO audit (at, principal, action, kind, entity_id, detail) VALUES ($1, $2, $3, $4, $5, $6)

-- name: EventListOfBy
SELECT id, at, machine, entity_id, from_state, to_state, reason, instance,
	fencing_token, refused, principal FROM events WHERE entity_id = $1 ORDER BY id

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

-- oplists.go: the lists by device

-- name: DeviceListOperations
-- Not used: every row is in its device index when written
-- (Capabilities.ListsDevicesInBulk).
SELECT NULL WHERE FALSE

-- name: DeviceListCommands
SELECT NULL WHERE FALSE
