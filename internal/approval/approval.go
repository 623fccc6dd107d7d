// Package approval holds the domain rules that tasks and rollouts share
// for a person's approval and for the re-checks made before each side
// effect: the order in which an approval is checked (exact replay, state,
// version, four eyes), the maintenance window, the grant matching (shell
// globs over actions and device ids), and the re-checks before a task's
// step or a rollout's device start. Each rule is a pure function of what
// the store read in the transaction that applies it: the store keeps the
// SQL (plan versions, approvals, histories), and calls these on what it
// read, as the rollout scheduler's Decide is called on a pass's snapshot.
package approval

import (
	"fmt"
	"path"
	"time"
)

// Verdict is the outcome of an approval's checks, in the contract's order
// after the caller's 401/403 and 404.
type Verdict string

// The verdicts; the store maps each refusal to its error (409
// illegal_state, 409 stale_version, 403 four_eyes).
const (
	Approve      Verdict = ""              // record the approval
	Replay       Verdict = "replay"        // the same approver approved the same version: return it
	IllegalState Verdict = "illegal_state" // not waiting for approval
	StaleVersion Verdict = "stale_version" // another version, or a plan_hash that differs
	FourEyes     Verdict = "four_eyes"     // the approver wrote the version
)

// Approved is an approval on record: which version, by whom.
type Approved struct {
	Version  int
	Approver string
}

// Request is an approval as asked, with the state of what it approves.
type Request struct {
	Version  int    // the version approved
	PlanHash string // the plan_hash the approver saw ("": not given)
	Approver string
	// Prior is the approval on record (nil: none).
	Prior *Approved
	// Waiting: the task or rollout is waiting for approval.
	Waiting bool
	// Current is the current version, CurrentHash its plan_hash ("": the
	// subject has no plan hash), Author who wrote it (a task's version's
	// author, a rollout's creator).
	Current     int
	CurrentHash string
	Author      string
	// FourEyes refuses an approval by the version's author.
	FourEyes bool
}

// Check is an approval's checks, in the contract's order: an exact replay,
// then illegal_state, stale_version, four_eyes.
func Check(r Request) Verdict {
	switch {
	case r.Prior != nil && r.Prior.Version == r.Version && r.Prior.Approver == r.Approver:
		return Replay
	case !r.Waiting:
		return IllegalState
	case r.Version != r.Current || (r.PlanHash != "" && r.PlanHash != r.CurrentHash):
		return StaleVersion
	case r.FourEyes && r.Author == r.Approver:
		return FourEyes
	}
	return Approve
}

// Window is a maintenance window: execute_after and execute_before, each
// optional.
type Window struct {
	After, Before *time.Time
}

// Missed: execute_before has passed.
func (w Window) Missed(now time.Time) bool { return w.Before != nil && now.After(*w.Before) }

// Waiting: execute_after has not come yet.
func (w Window) Waiting(now time.Time) bool { return w.After != nil && now.Before(*w.After) }

// Grant is what a live grant allows: actions and devices, each a shell
// glob (path.Match).
type Grant struct {
	Action  string
	Devices string
}

// ValidPattern reports whether glob is a pattern path.Match accepts.
func ValidPattern(glob string) error {
	_, err := path.Match(glob, "")
	return err
}

// MatchDevices resolves a device glob (a shell glob, as grants use; a rollout's device set)
// against ids.
func MatchDevices(glob string, ids []string) ([]string, error) {
	if _, err := path.Match(glob, ""); err != nil {
		return nil, fmt.Errorf("glob %q: %w", glob, err)
	}
	var out []string
	for _, id := range ids {
		if ok, _ := path.Match(glob, id); ok {
			out = append(out, id)
		}
	}
	return out, nil
}

// Allows reports whether one of grants covers action on device.
func Allows(grants []Grant, action, device string) bool {
	for _, g := range grants {
		okA, _ := path.Match(g.Action, action)
		okD, _ := path.Match(g.Devices, device)
		if okA && okD {
			return true
		}
	}
	return false
}

// The reasons a re-check gives.
const (
	PlanChanged       = "plan_changed"
	PermissionRevoked = "permission_revoked"
	DeviceUnknown     = "device_unknown"
	ApprovalMissing   = "approval_missing"
)

// Step is what a task step's re-checks (the walkthrough's step 5) read in
// the transaction that inserts the step's operation.
type Step struct {
	// ApprovedHash is the plan_hash the approval recorded; CurrentHash the
	// one of the approved version as stored now.
	ApprovedHash, CurrentHash string
	// EnforceGrants re-checks the requester's grants (Grants, its live
	// ones) for Action on Device.
	EnforceGrants bool
	Grants        []Grant
	Action        string
	Device        string
	// Seen: the device has been seen (a birth).
	Seen bool
}

// CheckStep is step 5: the plan hash is the approved one, the requester
// still holds a grant for the step, the device has been seen; it returns
// the first failure's reason (plan_changed, permission_revoked,
// device_unknown), or "".
func CheckStep(s Step) string {
	switch {
	case s.CurrentHash != s.ApprovedHash:
		return PlanChanged
	case s.EnforceGrants && !Allows(s.Grants, s.Action, s.Device):
		return PermissionRevoked
	case !s.Seen:
		return DeviceUnknown
	}
	return ""
}

// Start is what a rollout's re-checks before each device start read in
// the start's transaction.
type Start struct {
	ApprovalRequired bool
	Version          int // the rollout's current version
	ApprovedVersion  int
	Approver         string
	Creator          string
	FourEyes         bool
	EnforceGrants    bool
	Grants           []Grant // the creator's live grants
	Action           string
	Device           string
}

// CheckStart is a rollout's re-checks before a start: its approval (of the
// current version, by someone other than the creator when FourEyes), then
// the creator's grant for the action on the device; it returns the first
// failure's reason (approval_missing, four_eyes, permission_revoked), or "".
func CheckStart(s Start) string {
	if s.ApprovalRequired {
		switch {
		case s.ApprovedVersion != s.Version || s.Approver == "":
			return ApprovalMissing
		case s.FourEyes && s.Approver == s.Creator:
			return string(FourEyes)
		}
	}
	if s.EnforceGrants && !Allows(s.Grants, s.Action, s.Device) {
		return PermissionRevoked
	}
	return ""
}
