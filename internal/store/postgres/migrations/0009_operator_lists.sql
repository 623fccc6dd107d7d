-- Operators' view (issue 27): attribution of every operation, and the
-- indexes of the operator lists GET /v1/operations and GET /v1/commands.
--
-- Attribution: submitted_by is the principal whose token submitted the
-- operation ("anonymous" without --tokens; a task step's requester, a
-- rollout's creator); via is the channel (api, mcp, task, rollout,
-- compensation); a task step's and a rollout device's operation also keep
-- the approver and the approved version. Operations that existed before
-- this migration keep '' (submitted_by, via, approved_by) and NULL
-- (approved_version): who submitted them was never recorded.
ALTER TABLE operations ADD COLUMN submitted_by TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN via TEXT COLLATE "C" NOT NULL DEFAULT ''
	CHECK (via IN ('', 'api', 'mcp', 'task', 'rollout', 'compensation'));
ALTER TABLE operations ADD COLUMN approved_by TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN approved_version BIGINT;

-- The lists are newest first by start (operations.started_at,
-- commands.created_at, neither ever updated), then id, and page by keyset on
-- that pair. Each filter is the first column of an index ending in that
-- pair, so a filtered page is one range of it walked backwards (no sort)
-- and its count reads the index alone; an unfiltered page walks the plain
-- (start, id) index. A page of commands of one operation uses
-- commands_operation (an operation has a handful of commands).
CREATE INDEX operations_started ON operations(started_at, operation_id);
CREATE INDEX operations_status_started ON operations(status, started_at, operation_id);
CREATE INDEX operations_target_started ON operations(target, started_at, operation_id);
CREATE INDEX operations_action_started ON operations(action, started_at, operation_id);
CREATE INDEX operations_submitted_by_started ON operations(submitted_by, started_at, operation_id);
CREATE INDEX operations_task_started ON operations(task_id, started_at, operation_id) WHERE task_id <> '';

CREATE INDEX commands_created ON commands(created_at, command_id);
CREATE INDEX commands_status_created ON commands(status, created_at, command_id);
CREATE INDEX commands_device_created ON commands(device_id, created_at, command_id);
CREATE INDEX commands_action_created ON commands(action, created_at, command_id);
