-- Grants, tasks with versioned plans, approvals and the task history.

CREATE TABLE grants (
	grant_id   TEXT PRIMARY KEY NOT NULL,
	principal  TEXT NOT NULL,
	action     TEXT NOT NULL,   -- shell glob
	devices    TEXT NOT NULL,   -- shell glob
	created_by TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
) STRICT;
-- A grant is unique by (principal, action, devices) among the live ones.
CREATE UNIQUE INDEX grants_live ON grants(principal, action, devices) WHERE revoked_at IS NULL;

CREATE TABLE tasks (
	task_id          TEXT PRIMARY KEY NOT NULL,
	status           TEXT NOT NULL CHECK (status IN ('waiting_approval','approved','running','completed','rejected','failed')),
	reason           TEXT NOT NULL DEFAULT '',
	version          INTEGER NOT NULL CHECK (version >= 1),   -- the current plan version
	create_hash      TEXT NOT NULL,     -- of {steps, execute_after, execute_before} of the create
	execute_after    INTEGER,
	execute_before   INTEGER,
	created_by       TEXT NOT NULL,
	approved_version INTEGER,
	step_index       INTEGER NOT NULL DEFAULT 0,  -- the checkpoint: the step being run
	row_version      INTEGER NOT NULL DEFAULT 1,
	created_at       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL
) STRICT;
CREATE INDEX tasks_active ON tasks(status) WHERE status IN ('approved','running');

CREATE TABLE task_versions (
	task_id    TEXT NOT NULL REFERENCES tasks(task_id),
	version    INTEGER NOT NULL,
	steps      TEXT NOT NULL,    -- canonical JSON array
	plan_hash  TEXT NOT NULL,
	author     TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (task_id, version)
) STRICT;

CREATE TABLE approvals (
	task_id     TEXT NOT NULL REFERENCES tasks(task_id),
	version     INTEGER NOT NULL,
	approver    TEXT NOT NULL,
	plan_hash   TEXT NOT NULL,
	approved_at INTEGER NOT NULL,
	PRIMARY KEY (task_id)          -- one approval per task: a double click is one approval
) STRICT;

CREATE TABLE task_history (
	id         INTEGER PRIMARY KEY,
	task_id    TEXT NOT NULL,
	at         INTEGER NOT NULL,
	principal  TEXT NOT NULL,
	action     TEXT NOT NULL,
	from_state TEXT NOT NULL DEFAULT '',
	to_state   TEXT NOT NULL DEFAULT '',
	version    INTEGER NOT NULL DEFAULT 0,
	reason     TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX task_history_task ON task_history(task_id, id);
CREATE TRIGGER task_history_append_only_update BEFORE UPDATE ON task_history
BEGIN SELECT RAISE(ABORT, 'task history is append-only'); END;
CREATE TRIGGER task_history_append_only_delete BEFORE DELETE ON task_history
BEGIN SELECT RAISE(ABORT, 'task history is append-only'); END;

-- The events log records task transitions too: widen its machine CHECK
-- (SQLite changes a CHECK by rebuilding the table).
CREATE TABLE events_new (
	id            INTEGER PRIMARY KEY,
	at            INTEGER NOT NULL,
	machine       TEXT NOT NULL CHECK (machine IN ('operation','command','device','lease','task')),
	entity_id     TEXT NOT NULL,
	from_state    TEXT NOT NULL DEFAULT '',
	to_state      TEXT NOT NULL DEFAULT '',
	reason        TEXT NOT NULL DEFAULT '',
	instance      TEXT NOT NULL DEFAULT '',
	fencing_token INTEGER NOT NULL DEFAULT 0,
	refused       INTEGER NOT NULL DEFAULT 0 CHECK (refused IN (0, 1))
) STRICT;
INSERT INTO events_new SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_entity ON events(entity_id, id);
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
