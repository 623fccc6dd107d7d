-- The scheduler lists the rollouts it must look at twice a second
-- (RolloutListActive): the active ones, and the ended ones with a device
-- still started or needing attention, or one whose failed_retryable
-- operation a late final receipt decided since. Found by device status,
-- that read visits those devices and their operations alone; before this
-- index, SQLite's plan read every succeeded operation in the database at
-- each look, so each look cost more as the history grew.
CREATE INDEX rollout_devices_by_status ON rollout_devices(status, rollout_id);
