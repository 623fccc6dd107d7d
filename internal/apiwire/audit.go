package apiwire

import (
	"encoding/json"
	"time"
)

// AuditEntry is one person's change in GET /v1/audit: when, who, what
// (action: cancel, resolve, compensate, plan, approve, reject, create,
// grant, revoke, presence_reset, pause, resume), the entity it changed
// (kind: operation, command, device, task, grant, rollout; and its id), and
// what changed (detail: a JSON object, e.g. a resolve's outcome and note).
type AuditEntry struct {
	At        time.Time       `json:"at"`
	Principal string          `json:"principal"`
	Action    string          `json:"action"`
	Kind      string          `json:"kind"`
	ID        string          `json:"id"`
	Detail    json.RawMessage `json:"detail"`
}
