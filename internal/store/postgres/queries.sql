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
