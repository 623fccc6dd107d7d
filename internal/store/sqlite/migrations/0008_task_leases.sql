-- Each task carries its runner's lease, as a rollout carries its
-- scheduler's: the instance that drives it (owner), a token that changes
-- whenever the lease changes hands (fencing_token, checked in the
-- conditional write of each of the runner's decisions) and when the lease
-- runs out, after which another instance takes the task over.
ALTER TABLE tasks ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN fencing_token INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN lease_expires_at INTEGER NOT NULL DEFAULT 0;
