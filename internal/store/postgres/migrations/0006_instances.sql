-- Controller instances sharing the database (GET /v1/instances): each one's
-- start, its last heartbeat and the lease ttl it renews with, so that a
-- reader can tell a live one (heartbeat_at + lease_ttl_ms in the future).
CREATE TABLE instances (
	instance_id  TEXT COLLATE "C" PRIMARY KEY NOT NULL,
	started_at   BIGINT NOT NULL,
	heartbeat_at BIGINT NOT NULL,
	lease_ttl_ms BIGINT NOT NULL CHECK (lease_ttl_ms > 0)
);
