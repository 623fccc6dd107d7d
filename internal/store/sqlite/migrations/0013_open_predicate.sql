-- The partial indexes of open commands said "open" as status NOT IN (four
-- terminal states). SQLite builds a temporary b-tree of such a list (of
-- more than two constants) at every run of a statement that evaluates it,
-- and it evaluates these predicates at every insert of a command and at
-- every change of its status: three temporary b-trees for each command
-- inserted, six for each change of its status.
-- The same predicate as a chain of <> builds nothing (status is NOT NULL,
-- so the two mean the same). A query uses a partial index only when its
-- own WHERE holds the same terms, so the statements that read open
-- commands write the same chain (queries.sql).
DROP INDEX commands_open;
CREATE INDEX commands_open ON commands(next_check_at)
	WHERE status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled';
DROP INDEX commands_device_open;
CREATE INDEX commands_device_open ON commands(device_id)
	WHERE status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled';
DROP INDEX commands_device_serial_open;
CREATE INDEX commands_device_serial_open ON commands(device_id, serial_seq)
	WHERE serial_seq IS NOT NULL
		AND status <> 'succeeded' AND status <> 'failed' AND status <> 'timeout' AND status <> 'cancelled';
