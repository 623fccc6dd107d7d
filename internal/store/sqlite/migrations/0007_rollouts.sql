-- Rollouts: one action across a fleet (DESIGN "Rollouts"). The rollout row
-- carries the scheduler's lease (owner, fencing_token, lease_expires_at)
-- and the time of its last committed start, which every start decision is
-- conditioned on; rollout_devices is the device set resolved at creation,
-- one row per device with its state; rollout_starts logs every committed
-- start (a retry is a start too), the record the rate limits are computed
-- from and invariant 8 is checked against.

CREATE TABLE rollouts (
	rollout_id        TEXT PRIMARY KEY NOT NULL,
	status            TEXT NOT NULL CHECK (status IN ('waiting_approval','scheduled','running','paused',
	                                         'succeeded','completed_with_failures','aborted','cancelled')),
	reason            TEXT NOT NULL DEFAULT '',
	version           INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1),   -- the content version approvals name
	row_version       INTEGER NOT NULL DEFAULT 1,                        -- bumped by each status change
	action            TEXT NOT NULL,
	params            TEXT NOT NULL,      -- canonical JSON object
	selector          TEXT NOT NULL,      -- "devices" as given: a JSON string (glob) or array
	spec              TEXT NOT NULL,      -- canonical JSON: limits, ramp, abort, windows, retries
	create_hash       TEXT NOT NULL,      -- of the whole create request but its rollout_id
	max_per_minute    INTEGER NOT NULL CHECK (max_per_minute >= 1),
	max_in_flight     INTEGER NOT NULL CHECK (max_in_flight >= 1),
	retries           INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
	execute_after     INTEGER,
	execute_before    INTEGER,
	approval_required INTEGER NOT NULL DEFAULT 0 CHECK (approval_required IN (0, 1)),
	approved_version  INTEGER,
	approver          TEXT NOT NULL DEFAULT '',
	approved_at       INTEGER,
	devices_total     INTEGER NOT NULL CHECK (devices_total >= 1),
	created_by        TEXT NOT NULL,
	created_at        INTEGER NOT NULL,
	updated_at        INTEGER NOT NULL,
	ended_at          INTEGER,
	owner             TEXT NOT NULL DEFAULT '',      -- the scheduler's lease holder (instance id)
	fencing_token     INTEGER NOT NULL DEFAULT 0,    -- changes whenever the lease changes hands
	lease_expires_at  INTEGER NOT NULL DEFAULT 0,
	starts            INTEGER NOT NULL DEFAULT 0,    -- committed starts (retries included)
	last_start_at     INTEGER                        -- the latest committed start
) STRICT;
CREATE INDEX rollouts_status ON rollouts(status);

CREATE TABLE rollout_devices (
	rollout_id   TEXT NOT NULL REFERENCES rollouts(rollout_id),
	device_id    TEXT NOT NULL,
	position     INTEGER NOT NULL,              -- start order
	operation_id TEXT NOT NULL,                 -- {rollout_id}:rollout:{device}:v{version}
	status       TEXT NOT NULL CHECK (status IN ('pending','started','retry','succeeded','failed','timeout',
	                                    'rejected','needs_attention','cancelled')),
	reason       TEXT NOT NULL DEFAULT '',
	attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),   -- committed starts of this device
	started_at   INTEGER,
	finished_at  INTEGER,
	updated_at   INTEGER NOT NULL,
	PRIMARY KEY (rollout_id, device_id)
) STRICT;
CREATE INDEX rollout_devices_status ON rollout_devices(rollout_id, status, position);
CREATE UNIQUE INDEX rollout_devices_operation ON rollout_devices(operation_id);

CREATE TABLE rollout_starts (
	rollout_id    TEXT NOT NULL,
	device_id     TEXT NOT NULL,
	attempt       INTEGER NOT NULL CHECK (attempt >= 1),
	started_at    INTEGER NOT NULL,
	instance      TEXT NOT NULL,
	fencing_token INTEGER NOT NULL,
	PRIMARY KEY (rollout_id, device_id, attempt)
) STRICT;
CREATE INDEX rollout_starts_time ON rollout_starts(rollout_id, started_at);
CREATE TRIGGER rollout_starts_append_only_update BEFORE UPDATE ON rollout_starts
BEGIN SELECT RAISE(ABORT, 'rollout starts are append-only'); END;
CREATE TRIGGER rollout_starts_append_only_delete BEFORE DELETE ON rollout_starts
BEGIN SELECT RAISE(ABORT, 'rollout starts are append-only'); END;

CREATE TABLE rollout_history (
	id         INTEGER PRIMARY KEY,
	rollout_id TEXT NOT NULL,
	at         INTEGER NOT NULL,
	principal  TEXT NOT NULL,
	action     TEXT NOT NULL,
	from_state TEXT NOT NULL DEFAULT '',
	to_state   TEXT NOT NULL DEFAULT '',
	version    INTEGER NOT NULL DEFAULT 0,
	reason     TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX rollout_history_rollout ON rollout_history(rollout_id, id);
CREATE TRIGGER rollout_history_append_only_update BEFORE UPDATE ON rollout_history
BEGIN SELECT RAISE(ABORT, 'rollout history is append-only'); END;
CREATE TRIGGER rollout_history_append_only_delete BEFORE DELETE ON rollout_history
BEGIN SELECT RAISE(ABORT, 'rollout history is append-only'); END;

-- The events log records rollout transitions and refusals too: widen its
-- machine CHECK (SQLite changes a CHECK by rebuilding the table).
CREATE TABLE events_new (
	id            INTEGER PRIMARY KEY,
	at            INTEGER NOT NULL,
	machine       TEXT NOT NULL CHECK (machine IN ('operation','command','device','lease','task','rollout')),
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
