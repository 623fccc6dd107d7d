-- Presence messages ignored because their rank is lower than the stored one
-- (a device whose session counter went backwards, or a rank poisoned by a
-- forged retained message): counted and shown, so such a device is visible,
-- and cleared by an admin's presence reset.
ALTER TABLE devices ADD COLUMN stale_presence INTEGER NOT NULL DEFAULT 0;
ALTER TABLE devices ADD COLUMN last_stale_session INTEGER NOT NULL DEFAULT 0;
