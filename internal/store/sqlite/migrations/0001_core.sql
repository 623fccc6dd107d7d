-- Core schema: operations (the idempotency record with its lease), commands
-- (the outbox and the controller's view of each command_id), the receipt log,
-- queries, device presence, and the append-only events log.
-- Times are integer milliseconds since the Unix epoch (UTC).

CREATE TABLE operations (
	operation_id     TEXT PRIMARY KEY NOT NULL,      -- UNIQUE: decides concurrent first submissions
	action           TEXT NOT NULL,
	target           TEXT NOT NULL,
	params           TEXT NOT NULL,                  -- RFC 8785 canonical JSON object
	request_hash     TEXT NOT NULL,
	status           TEXT NOT NULL CHECK (status IN ('started','succeeded','failed_retryable','failed_final')),
	result           TEXT,
	reason           TEXT NOT NULL DEFAULT '',
	attempt          INTEGER NOT NULL CHECK (attempt >= 1),  -- command_ids minted
	command_id       TEXT NOT NULL,                  -- the current command
	version          INTEGER NOT NULL CHECK (version >= 1),
	owner            TEXT NOT NULL,                  -- lease holder (instance id)
	lease_expires_at INTEGER NOT NULL,
	fencing_token    INTEGER NOT NULL CHECK (fencing_token >= 1),
	task_id          TEXT NOT NULL DEFAULT '',
	step             TEXT NOT NULL DEFAULT '',
	business_version TEXT NOT NULL DEFAULT '',
	compensates      TEXT REFERENCES operations(operation_id),
	started_at       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL
) STRICT;
CREATE INDEX operations_lease ON operations(status, owner, lease_expires_at);
CREATE INDEX operations_compensates ON operations(compensates) WHERE compensates IS NOT NULL;

CREATE TABLE commands (
	command_id    TEXT PRIMARY KEY NOT NULL,          -- UNIQUE
	operation_id  TEXT NOT NULL REFERENCES operations(operation_id),
	device_id     TEXT NOT NULL,
	action        TEXT NOT NULL,
	params        TEXT NOT NULL,
	issued_at     INTEGER NOT NULL,
	expires_at    INTEGER NOT NULL,
	status        TEXT NOT NULL CHECK (status IN ('pending','waiting_device','sent','received','executing',
	                                             'succeeded','failed','timeout','cancelled','needs_attention')),
	status_rank   INTEGER NOT NULL DEFAULT 0 CHECK (status_rank BETWEEN 0 AND 3), -- highest receipt rank applied
	attempt       INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),  -- committed publish decisions
	queries       INTEGER NOT NULL DEFAULT 0 CHECK (queries >= 0),  -- committed query decisions
	qos           INTEGER NOT NULL DEFAULT 1 CHECK (qos IN (0, 1)),
	version       INTEGER NOT NULL CHECK (version >= 1),
	reason        TEXT NOT NULL DEFAULT '',
	result        TEXT,
	last_seq      INTEGER NOT NULL DEFAULT 0,
	executed_as   TEXT NOT NULL DEFAULT '',
	resolved_by   TEXT NOT NULL DEFAULT '',           -- a person's resolve of needs_attention
	late_outcome  TEXT NOT NULL DEFAULT '',
	late_result   TEXT,
	late_conflict INTEGER NOT NULL DEFAULT 0 CHECK (late_conflict IN (0, 1)),
	last_query_id TEXT NOT NULL DEFAULT '',
	last_answer   TEXT NOT NULL DEFAULT '',           -- the device's answer to the last query
	next_check_at INTEGER NOT NULL,                   -- when the sweeper looks at it next
	last_sent_at  INTEGER,
	created_at    INTEGER NOT NULL,
	updated_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX commands_operation ON commands(operation_id);
CREATE INDEX commands_open ON commands(next_check_at)
	WHERE status NOT IN ('succeeded','failed','timeout','cancelled');

CREATE TABLE receipts (
	id           INTEGER PRIMARY KEY,
	command_id   TEXT NOT NULL,          -- the command it was applied to (or named, if unknown)
	sent_as      TEXT NOT NULL DEFAULT '', -- the command_id the device put in it, when it differs
	device_id    TEXT NOT NULL,
	operation_id TEXT NOT NULL DEFAULT '',
	status       TEXT NOT NULL,
	seq          INTEGER NOT NULL,
	at           TEXT NOT NULL DEFAULT '',
	received_at  INTEGER NOT NULL,
	query_id     TEXT NOT NULL DEFAULT '',
	effect       TEXT NOT NULL CHECK (effect IN ('applied','duplicate','stale','late','mismatch','unknown_command')),
	error        TEXT NOT NULL DEFAULT '',
	result       TEXT,
	instance     TEXT NOT NULL
) STRICT;
CREATE INDEX receipts_command ON receipts(command_id);

CREATE TABLE queries (
	query_id      TEXT PRIMARY KEY NOT NULL,
	command_id    TEXT NOT NULL REFERENCES commands(command_id),
	instance      TEXT NOT NULL,
	fencing_token INTEGER NOT NULL,
	sent_at       INTEGER NOT NULL,
	answered_at   INTEGER,
	answer        TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX queries_command ON queries(command_id);

CREATE TABLE devices (
	device_id      TEXT PRIMARY KEY NOT NULL,
	online         INTEGER NOT NULL DEFAULT 0 CHECK (online IN (0, 1)),
	confirmed      INTEGER NOT NULL DEFAULT 0 CHECK (confirmed IN (0, 1)),
	session        INTEGER NOT NULL DEFAULT 0,
	presence_rank  INTEGER NOT NULL DEFAULT -1,
	dedupe         INTEGER NOT NULL DEFAULT 0 CHECK (dedupe IN (0, 1)),
	query          INTEGER NOT NULL DEFAULT 0 CHECK (query IN (0, 1)),
	seen           INTEGER NOT NULL DEFAULT 0 CHECK (seen IN (0, 1)),  -- a birth was ever applied
	clock_skew_ms  INTEGER NOT NULL DEFAULT 0,
	last_seen_at   INTEGER,
	updated_at     INTEGER NOT NULL
) STRICT;

CREATE TABLE events (
	id            INTEGER PRIMARY KEY,
	at            INTEGER NOT NULL,
	machine       TEXT NOT NULL CHECK (machine IN ('operation','command','device','lease')),
	entity_id     TEXT NOT NULL,
	from_state    TEXT NOT NULL DEFAULT '',
	to_state      TEXT NOT NULL DEFAULT '',
	reason        TEXT NOT NULL DEFAULT '',
	instance      TEXT NOT NULL DEFAULT '',
	fencing_token INTEGER NOT NULL DEFAULT 0,
	refused       INTEGER NOT NULL DEFAULT 0 CHECK (refused IN (0, 1))
) STRICT;
CREATE INDEX events_entity ON events(entity_id, id);

CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
