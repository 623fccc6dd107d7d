-- A retry of a failed_retryable operation first asks about its last command:
-- retry_until bounds that wait (NULL when no retry is asking).
ALTER TABLE operations ADD COLUMN retry_until INTEGER;
CREATE INDEX operations_retrying ON operations(owner, retry_until) WHERE retry_until IS NOT NULL;
CREATE INDEX commands_device_open ON commands(device_id)
	WHERE status NOT IN ('succeeded','failed','timeout','cancelled');
