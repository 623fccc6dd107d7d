// Package ops holds the domain rules of operations, tasks and grants, so
// that every caller (the HTTP API, the task runner, and later the MCP
// server) applies the same ones: how an operation_id is chosen and checked,
// the request hash, the one QoS rule, the action's ttl and the submitting
// instance's lease, compensation, step operation ids, plan validation and
// hashing, grants, four-eyes. It speaks in store records and its own
// *Error; the HTTP layer decodes, calls it and maps errors in one place.
package ops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// DefaultMaxCommandBytes bounds an encoded command: what devicesim accepts
// (wire.MaxPayload), well under the shipped broker's max_packet_size.
const DefaultMaxCommandBytes = wire.MaxPayload

// Config configures a Service.
type Config struct {
	Store    store.Store
	Instance string // the submitting instance takes each new operation's lease
	LeaseTTL time.Duration
	// Policy returns the policy of an action (ttl, approval).
	Policy     func(action string) command.Policy
	Failpoints *failpoint.Set
	// EnforceGrants: grants are checked (auth is on).
	EnforceGrants bool
	// FourEyes: an approver may not approve a version they wrote.
	FourEyes bool
	// MaxCommandBytes bounds an encoded command (DefaultMaxCommandBytes when 0).
	MaxCommandBytes int
	Now             func() time.Time
}

// Service applies the domain rules.
type Service struct{ cfg Config }

// New builds a Service.
func New(cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxCommandBytes <= 0 {
		cfg.MaxCommandBytes = DefaultMaxCommandBytes
	}
	return &Service{cfg: cfg}
}

// Intent is one business intent as a caller states it. The operation_id
// is the whole OperationID when given, else task_id:step:target:business_version.
type Intent struct {
	OperationID     string
	TaskID          string
	Step            string
	Target          string
	BusinessVersion string
	Action          string
	Params          json.RawMessage
}

// Submit validates a direct submission through the API and inserts it, or
// returns the stored record (created false). key is the Idempotency-Key
// header ("" if absent); who is the caller.
func (s *Service) Submit(ctx context.Context, in Intent, key, who string) (domain.Operation, bool, error) {
	return s.SubmitVia(ctx, in, key, who, domain.ViaAPI)
}

// SubmitVia is Submit through a channel (domain.ViaAPI or domain.ViaMCP),
// which the new operation records with who as its submitter. A replay
// returns the stored record, attributed as it was first submitted.
func (s *Service) SubmitVia(ctx context.Context, in Intent, key, who, via string) (domain.Operation, bool, error) {
	id, err := operationID(in, key)
	if err != nil {
		return domain.Operation{}, false, err
	}
	if err := reserved(id); err != nil {
		return domain.Operation{}, false, err
	}
	if domain.CompensationShaped(id) {
		return domain.Operation{}, false, domain.Errorf(domain.CodeReservedOperationID,
			"operation id %s has the shape {operation_id}:compensate:{business_version}, which belongs to compensations: POST /v1/operations/{id}/compensations", id)
	}
	n, err := s.Prepare(ctx, id, in)
	if err != nil {
		return domain.Operation{}, false, err
	}
	if err := s.authorizeDirect(ctx, who, in.Action, in.Target); err != nil {
		return domain.Operation{}, false, err
	}
	n.SubmittedBy, n.Via = who, via
	return s.insert(ctx, n)
}

// reserved refuses (403 reserved_operation_id) an id that only the
// controller's own runners insert: a task step's (:approval-v<N>) or a
// rollout device's ({rollout_id}:rollout:{device}:v<N>). Every id a caller
// names whole or derives goes through it; the runners insert theirs through
// Prepare and PrepareStep, which do not.
func reserved(id string) error {
	switch {
	case domain.TaskStepShaped(id):
		return domain.Errorf(domain.CodeReservedOperationID,
			"operation ids ending in :approval-v<N> belong to approved tasks")
	case domain.RolloutShaped(id):
		return domain.Errorf(domain.CodeReservedOperationID,
			"operation id %s has the shape {rollout_id}:rollout:{device}:v<N>, which belongs to rollouts", id)
	}
	return nil
}

// Prepare validates target, action and params and builds the record a
// first submission of id inserts: the request hash, a new command id (used
// only if the operation is new), the action's ttl and this instance's
// lease; the device's QoS and presence are the transaction's to read.
func (s *Service) Prepare(ctx context.Context, id string, in Intent) (store.NewOperation, error) {
	return s.prepare(ctx, id, in, domain.SplitParams)
}

// stepParams are the params of an approved plan's step: checked as I-JSON
// when the plan was submitted and stored canonical, where a large double
// may be spelt as an integer (1e16 as 10000000000000000), which the I-JSON
// check of a caller's params would refuse.
func stepParams(p json.RawMessage) (sent, canonical json.RawMessage, err error) {
	c, err := domain.CanonicalParams(p)
	return c, c, err
}

func (s *Service) prepare(ctx context.Context, id string, in Intent,
	checkParams func(json.RawMessage) (sent, canonical json.RawMessage, err error)) (store.NewOperation, error) {
	if !wire.ValidDeviceID(in.Target) {
		return store.NewOperation{}, fmt.Errorf("%w: target %q is not a device id ([A-Za-z0-9._-]{1,64}, not controller-*)", domain.ErrInvalid, in.Target)
	}
	if err := domain.ValidateAction(in.Action); err != nil {
		return store.NewOperation{}, err
	}
	params, canonical, err := checkParams(in.Params)
	if err != nil {
		return store.NewOperation{}, err
	}
	hash := domain.RequestHash(in.Action, in.Target, canonical)
	pol := s.cfg.Policy(in.Action)
	if err := s.checkSize(id, in.Action, params, pol); err != nil {
		return store.NewOperation{}, err
	}
	// The device's presence and capabilities (the first publish decision,
	// the QoS) are read by the submit's own transaction (FromDevice).
	return store.NewOperation{
		OperationID: id, Action: in.Action, Target: in.Target, Params: params, RequestHash: hash,
		TaskID: in.TaskID, Step: in.Step, BusinessVersion: in.BusinessVersion,
		CommandID: command.NewCommandID(s.cfg.Now()), CommandTTL: pol.TTL, FromDevice: true,
		Owner: s.cfg.Instance, LeaseTTL: s.cfg.LeaseTTL, Serial: pol.Serial(), Supersede: pol.Supersede,
		FirstCheck: s.cfg.Now().Add(pol.Backoff(0)), QueuedCheck: s.cfg.Now().Add(pol.QueuedRecheck()),
	}, nil
}

// checkSize refuses (too_large) an operation whose command, encoded as it
// will be published, would exceed MaxCommandBytes: a broker or a device
// refusing it later would leave the operation in doubt.
func (s *Service) checkSize(id, action string, params []byte, pol command.Policy) error {
	now := s.cfg.Now()
	payload, err := wire.Encode(wire.Command{CommandID: command.NewCommandID(now), OperationID: id, Action: action,
		Params: params, IssuedAt: now, ExpiresAt: now.Add(pol.TTL), Attempt: pol.MaxAttempts})
	if err != nil {
		return err
	}
	if len(payload) > s.cfg.MaxCommandBytes {
		return domain.Errorf(domain.CodeTooLarge, "the command would be %d bytes, over --max-command-bytes %d", len(payload), s.cfg.MaxCommandBytes)
	}
	return nil
}

// operationID picks the whole id (body, else header) or derives it from the
// parts; a header that differs from the body's id is refused. A whole id is
// up to 200 characters; a derived one is valid by its parts (up to 259).
func operationID(in Intent, key string) (string, error) {
	id, derived := in.OperationID, false
	if id == "" && (in.TaskID != "" || in.Step != "" || in.BusinessVersion != "") {
		d, err := domain.DeriveOperationID(domain.OperationParts{TaskID: in.TaskID, Step: in.Step, Target: in.Target, BusinessVersion: in.BusinessVersion})
		if err != nil {
			return "", err
		}
		id, derived = d, true
	}
	switch {
	case key != "" && id != "" && key != id:
		return "", domain.Errorf(domain.CodeKeyMismatch, "Idempotency-Key %q differs from the operation_id %q", key, id)
	case id == "":
		id = key
	}
	if id == "" {
		return "", fmt.Errorf("%w: give operation_id (or an Idempotency-Key header), or task_id, step and business_version", domain.ErrInvalid)
	}
	if !derived {
		if err := domain.ValidateOperationID(id, 200); err != nil {
			return "", err
		}
	}
	return id, nil
}

// authorizeDirect is what an operation outside a task needs: an action that
// does not require approval (approval_required) and a grant for it on the
// device (permission_denied).
func (s *Service) authorizeDirect(ctx context.Context, who, action, device string) error {
	if s.cfg.Policy(action).Approval == command.ApprovalRequired {
		return domain.Errorf(domain.CodeApprovalRequired, "action %s needs an approved task (POST /v1/tasks)", action)
	}
	return s.CheckGrant(ctx, who, action, device)
}

// CheckGrant refuses (permission_denied) an action on a device that no live
// grant of the principal covers; grants are enforced only with auth on.
func (s *Service) CheckGrant(ctx context.Context, who, action, device string) error {
	if !s.cfg.EnforceGrants {
		return nil
	}
	ok, err := s.cfg.Store.Allowed(ctx, who, action, device)
	if err != nil {
		return err
	}
	if !ok {
		return domain.Errorf(domain.CodePermissionDenied, "%s holds no grant for %s on %s", who, action, device)
	}
	return nil
}

func (s *Service) insert(ctx context.Context, n store.NewOperation) (domain.Operation, bool, error) {
	res, err := s.cfg.Store.Submit(ctx, n, func() error { return s.cfg.Failpoints.HitContext(ctx, failpoint.SubmitBeforeCommit) })
	if err != nil {
		return domain.Operation{}, false, err
	}
	// Its command, due for a first decision, is the store's fact (FactDue).
	return res.Operation, res.Created, nil
}

// Compensation is a compensating action for a final operation.
type Compensation struct {
	Action          string
	Params          json.RawMessage
	Reason          string
	BusinessVersion string
}

// Compensate creates {id}:compensate:{business_version}, a new operation on
// the original's target, once the original is final (not_final otherwise).
// It is an ordinary operation: a replay returns it, other content is
// ErrKeyReused, an action that needs approval is refused.
func (s *Service) Compensate(ctx context.Context, originalID string, c Compensation, who string) (domain.Operation, bool, error) {
	orig, err := s.cfg.Store.GetOperation(ctx, originalID)
	if err != nil {
		return domain.Operation{}, false, err
	}
	if !orig.Status.Terminal() {
		return domain.Operation{}, false, domain.Errorf(domain.CodeNotFinal,
			"operation %s is %s: compensate once it is succeeded or failed_final", orig.OperationID, orig.Status)
	}
	if domain.ApprovalLike(c.BusinessVersion) {
		return domain.Operation{}, false, fmt.Errorf("%w: business_version %q looks like approval-v<N>", domain.ErrInvalid, c.BusinessVersion)
	}
	if _, err := domain.DeriveOperationID(domain.OperationParts{TaskID: "t", Step: "s", Target: "d", BusinessVersion: c.BusinessVersion}); err != nil {
		return domain.Operation{}, false, err
	}
	id := domain.CompensationOperationID(orig.OperationID, c.BusinessVersion)
	if err := domain.ValidateOperationID(id, 400); err != nil {
		return domain.Operation{}, false, err
	}
	// "r:rollout" compensated with business_version v1 would be the
	// operation of device "compensate" in rollout r.
	if err := reserved(id); err != nil {
		return domain.Operation{}, false, err
	}
	n, err := s.Prepare(ctx, id, Intent{Target: orig.Target, Action: c.Action, Params: c.Params, BusinessVersion: c.BusinessVersion})
	if err != nil {
		return domain.Operation{}, false, err
	}
	if err := s.authorizeDirect(ctx, who, c.Action, orig.Target); err != nil {
		return domain.Operation{}, false, err
	}
	n.Compensates = orig.OperationID
	n.SubmittedBy, n.Via, n.CompensationReason = who, domain.ViaCompensation, c.Reason
	return s.insert(ctx, n)
}

// Cancel cancels a command that was never published.
func (s *Service) Cancel(ctx context.Context, commandID, who string) (domain.Command, error) {
	c, err := s.cfg.Store.Cancel(ctx, commandID, who)
	if err != nil {
		return domain.Command{}, err
	}
	return c, nil
}

// Resolve records a person's resolution (succeeded or failed) of a
// needs_attention command. A resolve that lost the race to a final receipt
// is kept as the command's late outcome and refused (illegal_state).
func (s *Service) Resolve(ctx context.Context, commandID, outcome, note, who string) (domain.Command, error) {
	if outcome != string(fsm.CmdSucceeded) && outcome != string(fsm.CmdFailed) {
		return domain.Command{}, fmt.Errorf("%w: outcome must be succeeded or failed", domain.ErrInvalid)
	}
	out, err := s.cfg.Store.Resolve(ctx, commandID, fsm.CommandState(outcome), note, who)
	if err != nil {
		return domain.Command{}, err
	}
	if out.Lost {
		return domain.Command{}, domain.Errorf(domain.CodeIllegalState,
			"a final receipt settled this command first (%s); your resolve is kept as its late outcome", out.Command.Status)
	}
	return out.Command, nil
}

// ResetPresence forgets a device's presence rank, so its next presence
// message applies whatever its session (see store.ResetPresence).
func (s *Service) ResetPresence(ctx context.Context, device, who string) (domain.Device, error) {
	if !wire.ValidDeviceID(device) {
		return domain.Device{}, fmt.Errorf("%w: %q is not a device id", domain.ErrInvalid, device)
	}
	return s.cfg.Store.ResetPresence(ctx, device, who)
}

// PrepareStep builds the operation record of step i of a task's approved
// plan, attributed to the task's requester (the author of the approved
// version), via task, with its approver and the approved version.
func (s *Service) PrepareStep(ctx context.Context, k domain.Task, i int) (store.NewOperation, error) {
	st := k.Approval.Steps[i]
	n, err := s.prepare(ctx, domain.TaskStepOperationID(k.TaskID, st.Step, st.Target, k.Approval.Version), Intent{TaskID: k.TaskID, Step: st.Step,
		Target: st.Target, BusinessVersion: "approval-v" + strconv.Itoa(k.Approval.Version), Action: st.Action, Params: st.Params},
		stepParams)
	n.SubmittedBy, n.Via = k.Requester(), domain.ViaTask
	n.ApprovedBy, n.ApprovedVersion = k.Approval.Approver, k.Approval.Version
	return n, err
}

func invalidPlan(format string, args ...any) error {
	return domain.Errorf(domain.CodeInvalidPlan, format, args...)
}

// Plan validates a plan's steps for who (each step's ids, action and
// params; (step, target) unique; a grant for each step) and returns its
// canonical JSON and plan_hash (SHA-256 of the JCS of the steps).
func (s *Service) Plan(ctx context.Context, steps []domain.Step, who string) (json.RawMessage, string, error) {
	if len(steps) == 0 {
		return nil, "", invalidPlan("a plan needs at least one step")
	}
	seen := map[[2]string]bool{}
	for i := range steps {
		st := &steps[i]
		if _, err := domain.DeriveOperationID(domain.OperationParts{TaskID: "t", Step: st.Step, Target: st.Target, BusinessVersion: "v"}); err != nil {
			return nil, "", invalidPlan("step %d: %v", i+1, err)
		}
		if !wire.ValidDeviceID(st.Target) {
			return nil, "", invalidPlan("step %d: target %q is not a device id", i+1, st.Target)
		}
		if err := domain.ValidateAction(st.Action); err != nil {
			return nil, "", invalidPlan("step %d: %v", i+1, err)
		}
		params, err := domain.CanonicalParams(st.Params)
		if err != nil {
			return nil, "", invalidPlan("step %d: %v", i+1, err)
		}
		st.Params = params
		key := [2]string{st.Step, st.Target}
		if seen[key] {
			return nil, "", invalidPlan("(step %q, target %q) appears twice", st.Step, st.Target)
		}
		seen[key] = true
		if err := s.CheckGrant(ctx, who, st.Action, st.Target); err != nil {
			return nil, "", err
		}
	}
	canon, err := jcs.Marshal(steps)
	if err != nil {
		return nil, "", err
	}
	return canon, sha(canon), nil
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TaskRequest is a new task: its id, plan and maintenance window.
type TaskRequest struct {
	TaskID        string
	ExecuteAfter  *time.Time
	ExecuteBefore *time.Time
	Steps         []domain.Step
}

// CreateTask stores a task with its first plan version, or returns it
// (created false) for a replay with the same steps and window; other
// content is ErrKeyReused.
func (s *Service) CreateTask(ctx context.Context, req TaskRequest, who string) (domain.Task, bool, error) {
	if _, err := domain.DeriveOperationID(domain.OperationParts{TaskID: req.TaskID, Step: "s", Target: "t", BusinessVersion: "v"}); err != nil {
		return domain.Task{}, false, err
	}
	if req.ExecuteAfter != nil && req.ExecuteBefore != nil && !req.ExecuteBefore.After(*req.ExecuteAfter) {
		return domain.Task{}, false, invalidPlan("execute_before must be after execute_after")
	}
	steps, planHash, err := s.Plan(ctx, req.Steps, who)
	if err != nil {
		return domain.Task{}, false, err
	}
	createBody, err := jcs.Marshal(struct {
		Steps         json.RawMessage `json:"steps"`
		ExecuteAfter  *time.Time      `json:"execute_after"`
		ExecuteBefore *time.Time      `json:"execute_before"`
	}{steps, utc(req.ExecuteAfter), utc(req.ExecuteBefore)})
	if err != nil {
		return domain.Task{}, false, err
	}
	return s.cfg.Store.CreateTask(ctx, store.NewTask{TaskID: req.TaskID, Steps: steps, PlanHash: planHash,
		CreateHash: sha(createBody), ExecuteAfter: req.ExecuteAfter, ExecuteBefore: req.ExecuteBefore, Author: who})
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// UpdatePlan records a new plan version by who (the current one for an
// unchanged plan); baseVersion, when given, must be the current version.
func (s *Service) UpdatePlan(ctx context.Context, taskID string, steps []domain.Step, baseVersion *int, who string) (domain.Task, error) {
	if _, err := s.cfg.Store.GetTask(ctx, taskID); err != nil {
		return domain.Task{}, err
	}
	canon, planHash, err := s.Plan(ctx, steps, who)
	if err != nil {
		return domain.Task{}, err
	}
	task, _, err := s.cfg.Store.UpdatePlan(ctx, taskID, canon, planHash, who, baseVersion)
	return task, err
}

// Approve approves a plan version by who, with four-eyes when it is on.
func (s *Service) Approve(ctx context.Context, taskID string, version int, planHash, who string) (domain.Approval, bool, error) {
	return s.cfg.Store.Approve(ctx, taskID, version, planHash, who, s.cfg.FourEyes)
}

// Reject rejects a task waiting for approval or approved.
func (s *Service) Reject(ctx context.Context, taskID, reason, who string) (domain.Task, error) {
	return s.cfg.Store.Reject(ctx, taskID, reason, who)
}

// principalPattern is the rule of a grant's principal: the id charset plus
// '@' (a principal may be an e-mail address), 1 to 64 characters. The
// principals of the tokens file are names such as alice, agent or admin; a
// grant's principal is matched exactly, never as a glob, so a space or a
// glob character ('*', '?', '[') could only make a grant that no token holds.
var principalPattern = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// CreateGrant lets principal run action on the devices glob, or returns the
// live grant with the same three (created false).
func (s *Service) CreateGrant(ctx context.Context, principal, action, devices, by string) (domain.Grant, bool, error) {
	if principal == "" || action == "" || devices == "" {
		return domain.Grant{}, false, fmt.Errorf("%w: principal, action and devices are required", domain.ErrInvalid)
	}
	if !principalPattern.MatchString(principal) {
		return domain.Grant{}, false, fmt.Errorf("%w: principal %.64q must match [A-Za-z0-9._@-]{1,64} (a name, matched exactly: no spaces or glob characters)",
			domain.ErrInvalid, principal)
	}
	g, created, err := s.cfg.Store.CreateGrant(ctx, command.NewID("g-", s.cfg.Now()), principal, action, devices, by)
	if errors.Is(err, domain.ErrIllegalState) {
		err = fmt.Errorf("%w: %v", domain.ErrInvalid, err)
	}
	return g, created, err
}
