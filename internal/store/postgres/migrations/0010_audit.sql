-- Who did what (issue 27). Every change a person causes (cancel, resolve,
-- compensation, plan, approval, rejection, grant and revoke, presence reset,
-- a rollout's create, approval, pause, resume and cancel, a task's create)
-- writes one audit row in the transaction of the change, and the events it
-- caused carry the person's principal ('' for the controller's own).
-- Needs nothing of 0009: this migration only adds.
ALTER TABLE events ADD COLUMN principal TEXT COLLATE "C" NOT NULL DEFAULT '';

CREATE TABLE audit (
	id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	at        BIGINT NOT NULL,
	principal TEXT COLLATE "C" NOT NULL,
	action    TEXT COLLATE "C" NOT NULL,
	kind      TEXT COLLATE "C" NOT NULL CHECK (kind IN ('operation','command','device','task','grant','rollout')),
	entity_id TEXT COLLATE "C" NOT NULL,
	detail    TEXT NOT NULL DEFAULT '{}'   -- JSON object: what changed
);
-- GET /v1/audit: newest first, all or one principal's.
CREATE INDEX audit_at ON audit(at DESC, id DESC);
CREATE INDEX audit_principal ON audit(principal, at DESC, id DESC);
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
	FOR EACH ROW EXECUTE FUNCTION fleetctl_append_only();

-- The gauge controller_commands{status} counts commands by status over
-- commands_status_created (0009), which starts with status; operations
-- over operations_status_started.
