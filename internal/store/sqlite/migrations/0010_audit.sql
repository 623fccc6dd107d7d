-- Who did what (issue 27). Every change a person causes (cancel, resolve,
-- compensation, plan, approval, rejection, grant and revoke, presence reset,
-- a rollout's create, approval, pause, resume and cancel, a task's create)
-- writes one audit row in the transaction of the change, and the events it
-- caused carry the person's principal ('' for the controller's own).
-- Needs nothing of 0009: this migration only adds.
ALTER TABLE events ADD COLUMN principal TEXT NOT NULL DEFAULT '';

CREATE TABLE audit (
	id        INTEGER PRIMARY KEY,
	at        INTEGER NOT NULL,
	principal TEXT NOT NULL,
	action    TEXT NOT NULL,
	kind      TEXT NOT NULL CHECK (kind IN ('operation','command','device','task','grant','rollout')),
	entity_id TEXT NOT NULL,
	detail    TEXT NOT NULL DEFAULT '{}'   -- JSON object: what changed
) STRICT;
-- GET /v1/audit: newest first, all or one principal's.
CREATE INDEX audit_at ON audit(at DESC, id DESC);
CREATE INDEX audit_principal ON audit(principal, at DESC, id DESC);
CREATE TRIGGER audit_append_only_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit is append-only'); END;
CREATE TRIGGER audit_append_only_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit is append-only'); END;

-- The gauge controller_commands{status} counts commands by status over
-- commands_status_created (0009), which starts with status; operations
-- over operations_status_started.
