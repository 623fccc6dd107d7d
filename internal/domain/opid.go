package domain

// Operation ids and request hashes: the business-level idempotency key of
// the contract.
//
// An operation_id defaults to task_id:step:target:business_version, each part
// [A-Za-z0-9._-]{1,64} (no ':' inside a part, so parts never collide); a
// caller may give the whole id instead ([A-Za-z0-9._:-]{1,200}). Ids ending in
// ":approval-v<N>" are reserved for the task runner, and ids of the shape
// {rollout_id}:rollout:{device}:v<N> for the rollout scheduler, and ids
// ending in :compensate:{business_version} for compensations (made by
// POST .../compensations, never by a direct submit). request_hash is the
// SHA-256 of the RFC 8785 canonical JSON of {action, target, params}, so key
// order and number spelling never change it.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/wire"
)

var (
	reserved     = regexp.MustCompile(`:approval-v[0-9]+$`)
	rolloutShape = regexp.MustCompile(`^[A-Za-z0-9._-]+:rollout:[A-Za-z0-9._-]+:v[0-9]+$`)
	compensation = regexp.MustCompile(`.:compensate:[A-Za-z0-9._-]{1,64}$`)
	approvalLike = regexp.MustCompile(`^approval-v[0-9]+$`)
)

// OperationParts are the business intent an operation_id is derived from.
type OperationParts struct {
	TaskID, Step, Target, BusinessVersion string
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Derive returns task_id:step:target:business_version after checking each part.
func DeriveOperationID(p OperationParts) (string, error) {
	for _, f := range []struct{ name, v string }{
		{"task_id", p.TaskID}, {"step", p.Step}, {"target", p.Target}, {"business_version", p.BusinessVersion},
	} {
		if !wire.IDChars(f.v, 64, false) {
			return "", invalid("%s %q must match [A-Za-z0-9._-]{1,64} (no ':')", f.name, f.v)
		}
	}
	return p.TaskID + ":" + p.Step + ":" + p.Target + ":" + p.BusinessVersion, nil
}

// ValidateWhole checks a caller-given whole operation_id; maxLen is 200 for
// a submit and 400 for derived ids such as compensations.
func ValidateOperationID(id string, maxLen int) error {
	if !wire.IDChars(id, maxLen, true) {
		return invalid("operation_id %q must match [A-Za-z0-9._:-]{1,%d}", id, maxLen)
	}
	return nil
}

// Reserved reports whether id ends in ":approval-v<N>", the task runner's ids.
func TaskStepShaped(id string) bool {
	// Most ids lack the literal the pattern needs: no regexp for them.
	return strings.Contains(id, ":approval-v") && reserved.MatchString(id)
}

// TaskStepOperationID is a task step's operation id,
// {task_id}:{step}:{target}:approval-v{version}: the task runner's, reserved
// at submit (TaskStepShaped).
func TaskStepOperationID(taskID, step, target string, version int) string {
	return fmt.Sprintf("%s:%s:%s:approval-v%d", taskID, step, target, version)
}

// RolloutOperationID is the operation of one device of a rollout,
// {rollout_id}:rollout:{device}:v{version}: the rollout scheduler's,
// reserved at submit (RolloutShaped).
func RolloutOperationID(rolloutID, device string, version int) string {
	return fmt.Sprintf("%s:rollout:%s:v%d", rolloutID, device, version)
}

// CompensationOperationID is the operation compensating original,
// {original}:compensate:{business_version}: made by POST
// .../compensations only, reserved at a direct submit (CompensationShaped).
func CompensationOperationID(original, businessVersion string) string {
	return original + ":compensate:" + businessVersion
}

// TaskOf is the task_id of a task step's operation,
// {task_id}:{step}:{target}:approval-v<N> (a task_id holds no ':'), and
// whether id has that shape.
func TaskOf(id string) (string, bool) {
	if !TaskStepShaped(id) {
		return "", false
	}
	task, _, ok := strings.Cut(id, ":")
	return task, ok
}

// RolloutShaped reports whether id has the shape of a rollout device's
// operation, {rollout_id}:rollout:{device}:v<N> (four parts, the second
// "rollout", the last v and digits), which only the rollout scheduler may
// insert: submitted first by anyone else, it would stand in for (and fail)
// that device in a rollout created later. The parts are not held to their
// 64-character limit: the shape alone is reserved, whatever its length.
func RolloutShaped(id string) bool {
	return strings.Contains(id, ":rollout:") && rolloutShape.MatchString(id)
}

// CompensationShaped reports whether id has the shape of a compensation,
// {operation_id}:compensate:{business_version}, which only POST
// .../compensations may create: a direct submit of it first would take the
// compensation's id without its link to the original (a derived id whose
// target is a device named "compensate" has the shape too, and is refused
// with it).
func CompensationShaped(id string) bool {
	return strings.Contains(id, ":compensate:") && compensation.MatchString(id)
}

// ApprovalLike reports whether a business_version looks like approval-v<N>.
func ApprovalLike(v string) bool { return approvalLike.MatchString(v) }

// ValidateAction checks an action name.
func ValidateAction(a string) error {
	if !wire.IDChars(a, 64, false) {
		return invalid("action %q must match [A-Za-z0-9._-]{1,64}", a)
	}
	return nil
}

// CanonicalParams returns params as canonical JSON; absent or null is {},
// anything but an object is invalid.
func CanonicalParams(params json.RawMessage) (json.RawMessage, error) {
	trimmed := strings.TrimSpace(string(params))
	if trimmed == "" || trimmed == "null" {
		return json.RawMessage(`{}`), nil
	}
	if !strings.HasPrefix(trimmed, "{") {
		return nil, invalid("params must be a JSON object")
	}
	out, err := jcs.Canonicalize([]byte(trimmed))
	if err != nil {
		return nil, invalid("params: %v", err)
	}
	return out, nil
}

// Params checks a request's params and returns them twice: as sent
// (compacted, every value and key order kept, no HTML escaping), which is
// what the device receives, and canonical (RFC 8785), which only the hash
// uses. Absent or null is {}; anything but an I-JSON object is invalid.
func SplitParams(params json.RawMessage) (sent, canonical json.RawMessage, err error) {
	if jcs.Plain(params) {
		// Already compact, canonical and I-JSON: both forms are params.
		p := bytes.Clone(params)
		return p, p, nil
	}
	return splitParams(params)
}

// splitParams is SplitParams the full way: canonicalised, checked for
// I-JSON and compacted, whatever params are.
func splitParams(params json.RawMessage) (sent, canonical json.RawMessage, err error) {
	if canonical, err = CanonicalParams(params); err != nil {
		return nil, nil, err
	}
	if err := jcs.CheckIJSON(params); err != nil {
		return nil, nil, invalid("params: %v", err)
	}
	trimmed := bytes.TrimSpace(params)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return canonical, canonical, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, trimmed); err != nil {
		return nil, nil, invalid("params: %v", err)
	}
	return b.Bytes(), canonical, nil
}

// RequestHash is the hex SHA-256 of the canonical JSON of {action, target,
// params}, canonicalParams being canonical already (CanonicalParams,
// SplitParams). The document is written out, not encoded and canonicalized
// again: its names sort as action, params, target, and action and target
// are written as canonical strings.
func RequestHash(action, target string, canonicalParams json.RawMessage) string {
	// The names and punctuation, the two strings and their quotes, the params.
	b := make([]byte, 0, len(`{"action":,"params":,"target":}`)+len(action)+len(target)+4+len(canonicalParams))
	b = append(b, `{"action":`...)
	b = jcs.AppendString(b, action)
	b = append(b, `,"params":`...)
	b = append(b, canonicalParams...)
	b = append(b, `,"target":`...)
	b = jcs.AppendString(b, target)
	b = append(b, '}')
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
