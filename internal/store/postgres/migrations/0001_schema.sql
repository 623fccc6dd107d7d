-- The PostgreSQL schema: the same tables, columns, CHECKs and UNIQUEs as the
-- SQLite migrations 0001 to 0005, in one file (a new backend starts from an
-- empty database, so it needs no history to replay).
-- Times are integer milliseconds since the Unix epoch (UTC), flags are 0/1
-- integers, as in SQLite; text compares bytewise (COLLATE "C"), so keyset
-- pages come in the same order on both backends.

CREATE FUNCTION fleetctl_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END;
$$;

CREATE TABLE operations (
	operation_id     TEXT COLLATE "C" PRIMARY KEY NOT NULL,      -- UNIQUE: decides concurrent first submissions
	action           TEXT COLLATE "C" NOT NULL,
	target           TEXT COLLATE "C" NOT NULL,
	params           TEXT COLLATE "C" NOT NULL,                  -- RFC 8785 canonical JSON object
	request_hash     TEXT COLLATE "C" NOT NULL,
	status           TEXT COLLATE "C" NOT NULL CHECK (status IN ('started','succeeded','failed_retryable','failed_final')),
	result           TEXT COLLATE "C",
	reason           TEXT COLLATE "C" NOT NULL DEFAULT '',
	attempt          BIGINT NOT NULL CHECK (attempt >= 1),  -- command_ids minted
	command_id       TEXT COLLATE "C" NOT NULL,                  -- the current command
	version          BIGINT NOT NULL CHECK (version >= 1),
	owner            TEXT COLLATE "C" NOT NULL,                  -- lease holder (instance id)
	lease_expires_at BIGINT NOT NULL,
	fencing_token    BIGINT NOT NULL CHECK (fencing_token >= 1),
	task_id          TEXT COLLATE "C" NOT NULL DEFAULT '',
	step             TEXT COLLATE "C" NOT NULL DEFAULT '',
	business_version TEXT COLLATE "C" NOT NULL DEFAULT '',
	compensates      TEXT COLLATE "C" REFERENCES operations(operation_id),
	started_at       BIGINT NOT NULL,
	updated_at       BIGINT NOT NULL
);
CREATE INDEX operations_lease ON operations(status, owner, lease_expires_at);
CREATE INDEX operations_compensates ON operations(compensates) WHERE compensates IS NOT NULL;

CREATE TABLE commands (
	command_id    TEXT COLLATE "C" PRIMARY KEY NOT NULL,          -- UNIQUE
	operation_id  TEXT COLLATE "C" NOT NULL REFERENCES operations(operation_id),
	device_id     TEXT COLLATE "C" NOT NULL,
	action        TEXT COLLATE "C" NOT NULL,
	params        TEXT COLLATE "C" NOT NULL,
	issued_at     BIGINT NOT NULL,
	expires_at    BIGINT NOT NULL,
	status        TEXT COLLATE "C" NOT NULL CHECK (status IN ('pending','waiting_device','sent','received','executing',
	                                             'succeeded','failed','timeout','cancelled','needs_attention')),
	status_rank   BIGINT NOT NULL DEFAULT 0 CHECK (status_rank BETWEEN 0 AND 3), -- highest receipt rank applied
	attempt       BIGINT NOT NULL DEFAULT 0 CHECK (attempt >= 0),  -- committed publish decisions
	queries       BIGINT NOT NULL DEFAULT 0 CHECK (queries >= 0),  -- committed query decisions
	qos           BIGINT NOT NULL DEFAULT 1 CHECK (qos IN (0, 1)),
	version       BIGINT NOT NULL CHECK (version >= 1),
	reason        TEXT COLLATE "C" NOT NULL DEFAULT '',
	result        TEXT COLLATE "C",
	last_seq      BIGINT NOT NULL DEFAULT 0,
	executed_as   TEXT COLLATE "C" NOT NULL DEFAULT '',
	resolved_by   TEXT COLLATE "C" NOT NULL DEFAULT '',           -- a person's resolve of needs_attention
	late_outcome  TEXT COLLATE "C" NOT NULL DEFAULT '',
	late_result   TEXT COLLATE "C",
	late_conflict BIGINT NOT NULL DEFAULT 0 CHECK (late_conflict IN (0, 1)),
	last_query_id TEXT COLLATE "C" NOT NULL DEFAULT '',
	last_answer   TEXT COLLATE "C" NOT NULL DEFAULT '',           -- the device's answer to the last query
	next_check_at BIGINT NOT NULL,                   -- when the sweeper looks at it next
	last_sent_at  BIGINT,
	created_at    BIGINT NOT NULL,
	updated_at    BIGINT NOT NULL
);
CREATE INDEX commands_operation ON commands(operation_id);
CREATE INDEX commands_open ON commands(next_check_at)
	WHERE status NOT IN ('succeeded','failed','timeout','cancelled');

CREATE TABLE receipts (
	id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	command_id   TEXT COLLATE "C" NOT NULL,          -- the command it was applied to (or named, if unknown)
	sent_as      TEXT COLLATE "C" NOT NULL DEFAULT '', -- the command_id the device put in it, when it differs
	device_id    TEXT COLLATE "C" NOT NULL,
	operation_id TEXT COLLATE "C" NOT NULL DEFAULT '',
	status       TEXT COLLATE "C" NOT NULL,
	seq          BIGINT NOT NULL,
	at           TEXT COLLATE "C" NOT NULL DEFAULT '',
	received_at  BIGINT NOT NULL,
	query_id     TEXT COLLATE "C" NOT NULL DEFAULT '',
	effect       TEXT COLLATE "C" NOT NULL CHECK (effect IN ('applied','duplicate','stale','late','mismatch','unknown_command')),
	error        TEXT COLLATE "C" NOT NULL DEFAULT '',
	result       TEXT COLLATE "C",
	instance     TEXT COLLATE "C" NOT NULL
);
CREATE INDEX receipts_command ON receipts(command_id);

CREATE TABLE queries (
	query_id      TEXT COLLATE "C" PRIMARY KEY NOT NULL,
	command_id    TEXT COLLATE "C" NOT NULL REFERENCES commands(command_id),
	instance      TEXT COLLATE "C" NOT NULL,
	fencing_token BIGINT NOT NULL,
	sent_at       BIGINT NOT NULL,
	answered_at   BIGINT,
	answer        TEXT COLLATE "C" NOT NULL DEFAULT ''
);
CREATE INDEX queries_command ON queries(command_id);

CREATE TABLE devices (
	device_id      TEXT COLLATE "C" PRIMARY KEY NOT NULL,
	online         BIGINT NOT NULL DEFAULT 0 CHECK (online IN (0, 1)),
	confirmed      BIGINT NOT NULL DEFAULT 0 CHECK (confirmed IN (0, 1)),
	session        BIGINT NOT NULL DEFAULT 0,
	presence_rank  BIGINT NOT NULL DEFAULT -1,
	dedupe         BIGINT NOT NULL DEFAULT 0 CHECK (dedupe IN (0, 1)),
	query          BIGINT NOT NULL DEFAULT 0 CHECK (query IN (0, 1)),
	seen           BIGINT NOT NULL DEFAULT 0 CHECK (seen IN (0, 1)),  -- a birth was ever applied
	clock_skew_ms  BIGINT NOT NULL DEFAULT 0,
	last_seen_at   BIGINT,
	updated_at     BIGINT NOT NULL
);

CREATE TABLE events (
	id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	at            BIGINT NOT NULL,
	machine       TEXT COLLATE "C" NOT NULL CHECK (machine IN ('operation','command','device','lease','task')),
	entity_id     TEXT COLLATE "C" NOT NULL,
	from_state    TEXT COLLATE "C" NOT NULL DEFAULT '',
	to_state      TEXT COLLATE "C" NOT NULL DEFAULT '',
	reason        TEXT COLLATE "C" NOT NULL DEFAULT '',
	instance      TEXT COLLATE "C" NOT NULL DEFAULT '',
	fencing_token BIGINT NOT NULL DEFAULT 0,
	refused       BIGINT NOT NULL DEFAULT 0 CHECK (refused IN (0, 1))
);
CREATE INDEX events_entity ON events(entity_id, id);


ALTER TABLE operations ADD COLUMN retry_until BIGINT;
CREATE INDEX operations_retrying ON operations(owner, retry_until) WHERE retry_until IS NOT NULL;
CREATE INDEX commands_device_open ON commands(device_id)
	WHERE status NOT IN ('succeeded','failed','timeout','cancelled');

CREATE TABLE grants (
	grant_id   TEXT COLLATE "C" PRIMARY KEY NOT NULL,
	principal  TEXT COLLATE "C" NOT NULL,
	action     TEXT COLLATE "C" NOT NULL,   -- shell glob
	devices    TEXT COLLATE "C" NOT NULL,   -- shell glob
	created_by TEXT COLLATE "C" NOT NULL,
	created_at BIGINT NOT NULL,
	revoked_at BIGINT
);
-- A grant is unique by (principal, action, devices) among the live ones.
CREATE UNIQUE INDEX grants_live ON grants(principal, action, devices) WHERE revoked_at IS NULL;

CREATE TABLE tasks (
	task_id          TEXT COLLATE "C" PRIMARY KEY NOT NULL,
	status           TEXT COLLATE "C" NOT NULL CHECK (status IN ('waiting_approval','approved','running','completed','rejected','failed')),
	reason           TEXT COLLATE "C" NOT NULL DEFAULT '',
	version          BIGINT NOT NULL CHECK (version >= 1),   -- the current plan version
	create_hash      TEXT COLLATE "C" NOT NULL,     -- of {steps, execute_after, execute_before} of the create
	execute_after    BIGINT,
	execute_before   BIGINT,
	created_by       TEXT COLLATE "C" NOT NULL,
	approved_version BIGINT,
	step_index       BIGINT NOT NULL DEFAULT 0,  -- the checkpoint: the step being run
	row_version      BIGINT NOT NULL DEFAULT 1,
	created_at       BIGINT NOT NULL,
	updated_at       BIGINT NOT NULL
);
CREATE INDEX tasks_active ON tasks(status) WHERE status IN ('approved','running');

CREATE TABLE task_versions (
	task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks(task_id),
	version    BIGINT NOT NULL,
	steps      TEXT COLLATE "C" NOT NULL,    -- canonical JSON array
	plan_hash  TEXT COLLATE "C" NOT NULL,
	author     TEXT COLLATE "C" NOT NULL,
	created_at BIGINT NOT NULL,
	PRIMARY KEY (task_id, version)
);

CREATE TABLE approvals (
	task_id     TEXT COLLATE "C" NOT NULL REFERENCES tasks(task_id),
	version     BIGINT NOT NULL,
	approver    TEXT COLLATE "C" NOT NULL,
	plan_hash   TEXT COLLATE "C" NOT NULL,
	approved_at BIGINT NOT NULL,
	PRIMARY KEY (task_id)          -- one approval per task: a double click is one approval
);

CREATE TABLE task_history (
	id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	task_id    TEXT COLLATE "C" NOT NULL,
	at         BIGINT NOT NULL,
	principal  TEXT COLLATE "C" NOT NULL,
	action     TEXT COLLATE "C" NOT NULL,
	from_state TEXT COLLATE "C" NOT NULL DEFAULT '',
	to_state   TEXT COLLATE "C" NOT NULL DEFAULT '',
	version    BIGINT NOT NULL DEFAULT 0,
	reason     TEXT COLLATE "C" NOT NULL DEFAULT ''
);
CREATE INDEX task_history_task ON task_history(task_id, id);

ALTER TABLE devices ADD COLUMN stale_presence BIGINT NOT NULL DEFAULT 0;
ALTER TABLE devices ADD COLUMN last_stale_session BIGINT NOT NULL DEFAULT 0;
CREATE INDEX devices_online ON devices(online, device_id);

CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
	FOR EACH ROW EXECUTE FUNCTION fleetctl_append_only();
CREATE TRIGGER task_history_append_only BEFORE UPDATE OR DELETE ON task_history
	FOR EACH ROW EXECUTE FUNCTION fleetctl_append_only();
