-- Rollouts: one action across a fleet (DESIGN "Rollouts"). The rollout row
-- carries the scheduler's lease (owner, fencing_token, lease_expires_at)
-- and the time of its last committed start, which every start decision is
-- conditioned on; rollout_devices is the device set resolved at creation,
-- one row per device with its state; rollout_starts logs every committed
-- start (a retry is a start too), the record the rate limits are computed
-- from and invariant 8 is checked against.

CREATE TABLE rollouts (
	rollout_id        TEXT COLLATE "C" PRIMARY KEY NOT NULL,
	status            TEXT COLLATE "C" NOT NULL CHECK (status IN ('waiting_approval','scheduled','running','paused',
	                                         'succeeded','completed_with_failures','aborted','cancelled')),
	reason            TEXT COLLATE "C" NOT NULL DEFAULT '',
	version           BIGINT NOT NULL DEFAULT 1 CHECK (version >= 1),   -- the content version approvals name
	row_version       BIGINT NOT NULL DEFAULT 1,                        -- bumped by each status change
	action            TEXT COLLATE "C" NOT NULL,
	params            TEXT COLLATE "C" NOT NULL,      -- canonical JSON object
	selector          TEXT COLLATE "C" NOT NULL,      -- "devices" as given: a JSON string (glob) or array
	spec              TEXT COLLATE "C" NOT NULL,      -- canonical JSON: limits, ramp, abort, windows, retries
	create_hash       TEXT COLLATE "C" NOT NULL,      -- of the whole create request but its rollout_id
	max_per_minute    BIGINT NOT NULL CHECK (max_per_minute >= 1),
	max_in_flight     BIGINT NOT NULL CHECK (max_in_flight >= 1),
	retries           BIGINT NOT NULL DEFAULT 0 CHECK (retries >= 0),
	execute_after     BIGINT,
	execute_before    BIGINT,
	approval_required BIGINT NOT NULL DEFAULT 0 CHECK (approval_required IN (0, 1)),
	approved_version  BIGINT,
	approver          TEXT COLLATE "C" NOT NULL DEFAULT '',
	approved_at       BIGINT,
	devices_total     BIGINT NOT NULL CHECK (devices_total >= 1),
	created_by        TEXT COLLATE "C" NOT NULL,
	created_at        BIGINT NOT NULL,
	updated_at        BIGINT NOT NULL,
	ended_at          BIGINT,
	owner             TEXT COLLATE "C" NOT NULL DEFAULT '',      -- the scheduler's lease holder (instance id)
	fencing_token     BIGINT NOT NULL DEFAULT 0,    -- changes whenever the lease changes hands
	lease_expires_at  BIGINT NOT NULL DEFAULT 0,
	starts            BIGINT NOT NULL DEFAULT 0,    -- committed starts (retries included)
	last_start_at     BIGINT                        -- the latest committed start
);
CREATE INDEX rollouts_status ON rollouts(status);

CREATE TABLE rollout_devices (
	rollout_id   TEXT COLLATE "C" NOT NULL REFERENCES rollouts(rollout_id),
	device_id    TEXT COLLATE "C" NOT NULL,
	position     BIGINT NOT NULL,              -- start order
	operation_id TEXT COLLATE "C" NOT NULL,                 -- {rollout_id}:rollout:{device}:v{version}
	status       TEXT COLLATE "C" NOT NULL CHECK (status IN ('pending','started','retry','succeeded','failed','timeout',
	                                    'rejected','needs_attention','cancelled')),
	reason       TEXT COLLATE "C" NOT NULL DEFAULT '',
	attempts     BIGINT NOT NULL DEFAULT 0 CHECK (attempts >= 0),   -- committed starts of this device
	started_at   BIGINT,
	finished_at  BIGINT,
	updated_at   BIGINT NOT NULL,
	PRIMARY KEY (rollout_id, device_id)
);
CREATE INDEX rollout_devices_status ON rollout_devices(rollout_id, status, position);
CREATE UNIQUE INDEX rollout_devices_operation ON rollout_devices(operation_id);

CREATE TABLE rollout_starts (
	rollout_id    TEXT COLLATE "C" NOT NULL,
	device_id     TEXT COLLATE "C" NOT NULL,
	attempt       BIGINT NOT NULL CHECK (attempt >= 1),
	started_at    BIGINT NOT NULL,
	instance      TEXT COLLATE "C" NOT NULL,
	fencing_token BIGINT NOT NULL,
	PRIMARY KEY (rollout_id, device_id, attempt)
);
CREATE INDEX rollout_starts_time ON rollout_starts(rollout_id, started_at);
CREATE TRIGGER rollout_starts_append_only BEFORE UPDATE OR DELETE ON rollout_starts
	FOR EACH ROW EXECUTE FUNCTION fleetctl_append_only();

CREATE TABLE rollout_history (
	id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	rollout_id TEXT COLLATE "C" NOT NULL,
	at         BIGINT NOT NULL,
	principal  TEXT COLLATE "C" NOT NULL,
	action     TEXT COLLATE "C" NOT NULL,
	from_state TEXT COLLATE "C" NOT NULL DEFAULT '',
	to_state   TEXT COLLATE "C" NOT NULL DEFAULT '',
	version    BIGINT NOT NULL DEFAULT 0,
	reason     TEXT COLLATE "C" NOT NULL DEFAULT ''
);
CREATE INDEX rollout_history_rollout ON rollout_history(rollout_id, id);
CREATE TRIGGER rollout_history_append_only BEFORE UPDATE OR DELETE ON rollout_history
	FOR EACH ROW EXECUTE FUNCTION fleetctl_append_only();

-- The events log records rollout transitions and refusals too.
ALTER TABLE events DROP CONSTRAINT events_machine_check;
ALTER TABLE events ADD CONSTRAINT events_machine_check
	CHECK (machine IN ('operation','command','device','lease','task','rollout'));
