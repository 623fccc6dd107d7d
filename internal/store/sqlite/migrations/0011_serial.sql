-- Per-device ordering (issue 28). A command of an action whose policy is
-- "concurrency": "serial" takes its device's next serial number in its
-- submit's transaction (device_queues, one row per device that ever had a
-- serial command); parallel commands keep NULL. On a device, the open
-- serial command with the lowest number is the head of its queue: only the
-- head is ever published, and a command that was published stays the head
-- until it is terminal (needs_attention included), so serial commands never
-- overlap and go out in the order their submits committed.
ALTER TABLE commands ADD COLUMN serial_seq INTEGER CHECK (serial_seq IS NULL OR serial_seq >= 1);

CREATE TABLE device_queues (
	device_id TEXT PRIMARY KEY NOT NULL,
	last_seq  INTEGER NOT NULL DEFAULT 0 CHECK (last_seq >= 0)   -- the last serial number given out
) STRICT;

-- One number per device, given once; and the open ones by number: the
-- head of a device's queue and the command ahead of another are one
-- range of it.
CREATE UNIQUE INDEX commands_device_serial ON commands(device_id, serial_seq) WHERE serial_seq IS NOT NULL;
CREATE INDEX commands_device_serial_open ON commands(device_id, serial_seq)
	WHERE serial_seq IS NOT NULL AND status NOT IN ('succeeded','failed','timeout','cancelled');
