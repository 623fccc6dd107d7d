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
