package rollout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/approval"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Version is the content version of every rollout: no route changes a
// rollout's content, so each is v1, the version its approval names and its
// devices' operation ids end in.
const Version = 1

// Step is the step part of a rollout device's operation id.
const Step = "rollout"

// OperationID is the operation of one device of a rollout:
// {rollout_id}:rollout:{device}:v{version}.
func OperationID(rolloutID, device string) string {
	return domain.RolloutOperationID(rolloutID, device, Version)
}

// Config configures a Service.
type Config struct {
	Store store.Store
	// Ops builds each device's operation record and checks grants.
	Ops      *ops.Service
	Policy   func(action string) command.Policy
	Instance string // takes the scheduler's lease of a rollout it creates
	LeaseTTL time.Duration
	// FourEyes: nobody approves a rollout they created.
	FourEyes bool
}

// Service applies the domain rules of rollouts for the API (and the CLI
// through it).
type Service struct{ cfg Config }

// NewService builds a Service.
// A create, an approval, a pause, resume or cancel is the store's fact
// (store.FactRollout): the scheduler hears of it from the feed.
func NewService(cfg Config) *Service {
	return &Service{cfg: cfg}
}

// Create validates a rollout, resolves its device set against the devices
// seen so far and stores it, or returns it (created false) for a replay of
// the same request; other content with the same rollout_id is
// domain.ErrKeyReused. Every device needs a grant of who's for the action
// (when grants are enforced); an action whose policy needs approval makes
// the rollout wait for one.
func (s *Service) Create(ctx context.Context, req apiwire.RolloutRequest, who string) (domain.Rollout, bool, error) {
	if _, err := domain.DeriveOperationID(domain.OperationParts{TaskID: req.RolloutID, Step: Step, Target: "d", BusinessVersion: "v1"}); err != nil {
		return domain.Rollout{}, false, fmt.Errorf("rollout_id: %w", err)
	}
	if err := domain.ValidateAction(req.Action); err != nil {
		return domain.Rollout{}, false, err
	}
	params, canonical, err := domain.SplitParams(req.Params)
	if err != nil {
		return domain.Rollout{}, false, err
	}
	spec := Spec(req.RolloutSpec)
	if err := spec.Validate(); err != nil {
		return domain.Rollout{}, false, err
	}
	selector, devices, err := s.resolve(ctx, req.Devices)
	if err != nil {
		return domain.Rollout{}, false, err
	}
	specJSON, err := jcs.Marshal(spec)
	if err != nil {
		return domain.Rollout{}, false, err
	}
	createBody, err := jcs.Marshal(struct {
		Action  string          `json:"action"`
		Params  json.RawMessage `json:"params"`
		Devices json.RawMessage `json:"devices"`
		Spec    json.RawMessage `json:"spec"`
	}{req.Action, canonical, selector, specJSON})
	if err != nil {
		return domain.Rollout{}, false, err
	}
	sum := sha256.Sum256(createBody)
	n := store.NewRollout{RolloutID: req.RolloutID, Action: req.Action, Params: params, Selector: selector, Spec: specJSON,
		CreateHash: hex.EncodeToString(sum[:]), MaxPerMinute: spec.MaxPerMinute, MaxInFlight: spec.MaxInFlight,
		Retries: spec.Retries, ExecuteAfter: spec.ExecuteAfter, ExecuteBefore: spec.ExecuteBefore,
		ApprovalRequired: s.cfg.Policy(req.Action).Approval == command.ApprovalRequired,
		CreatedBy:        who, Owner: s.cfg.Instance, LeaseTTL: s.cfg.LeaseTTL}
	for _, d := range devices {
		id := OperationID(req.RolloutID, d)
		if err := domain.ValidateOperationID(id, 200); err != nil {
			return domain.Rollout{}, false, err
		}
		if err := s.cfg.Ops.CheckGrant(ctx, who, req.Action, d); err != nil {
			return domain.Rollout{}, false, err
		}
		n.Devices, n.OperationIDs = append(n.Devices, d), append(n.OperationIDs, id)
	}
	// The command, as every device will get it, must fit (413 too_large).
	if _, err := s.cfg.Ops.Prepare(ctx, n.OperationIDs[0], intent(n.RolloutID, req.Action, params, devices[0])); err != nil {
		return domain.Rollout{}, false, err
	}
	r, created, err := s.cfg.Store.CreateRollout(ctx, n)
	if err != nil {
		return domain.Rollout{}, false, err
	}
	return r, created, nil
}

// intent is the business intent of one device of a rollout.
func intent(rolloutID, action string, params json.RawMessage, device string) ops.Intent {
	return ops.Intent{TaskID: rolloutID, Step: Step, Target: device, BusinessVersion: fmt.Sprintf("v%d", Version),
		Action: action, Params: params}
}

// resolve reads "devices": a glob, matched against the devices seen so
// far, or a list of device ids, each seen. It returns the selector as
// stored (canonical JSON) and the devices in start order.
func (s *Service) resolve(ctx context.Context, raw json.RawMessage) (json.RawMessage, []string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, invalid(`devices: give a glob ("device-*") or a list of device ids`)
	}
	seen, err := s.cfg.Store.SeenDevices(ctx)
	if err != nil {
		return nil, nil, err
	}
	var glob string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &glob); err != nil {
			return nil, nil, invalid("devices: %v", err)
		}
		devices, err := approval.MatchDevices(glob, seen)
		if err != nil {
			return nil, nil, invalid("devices: %v", err)
		}
		sort.SliceStable(devices, func(i, j int) bool { return naturalLess(devices[i], devices[j]) })
		if len(devices) == 0 {
			return nil, nil, domain.Errorf(domain.CodeInvalid, "devices: %q matches none of the %d devices seen so far", glob, len(seen))
		}
		sel, err := json.Marshal(glob)
		return sel, devices, err
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, nil, invalid(`devices: a glob string or an array of device ids: %v`, err)
	}
	if len(list) == 0 {
		return nil, nil, invalid("devices: an empty list")
	}
	known := make(map[string]bool, len(seen))
	for _, id := range seen {
		known[id] = true
	}
	dup := map[string]bool{}
	for _, id := range list {
		switch {
		case !wire.ValidDeviceID(id):
			return nil, nil, invalid("devices: %q is not a device id", id)
		case dup[id]:
			return nil, nil, invalid("devices: %q appears twice", id)
		case !known[id]:
			return nil, nil, domain.Errorf(domain.CodeDeviceUnknown, "devices: %s was never seen (no birth yet)", id)
		}
		dup[id] = true
	}
	sel, err := json.Marshal(list)
	return sel, list, err
}

// naturalLess orders ids with their numbers by value: device-2 before
// device-10 (a glob's devices start in this order).
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// Approve approves a rollout's version by who (four-eyes when on); an exact
// replay returns it (created false).
func (s *Service) Approve(ctx context.Context, id string, version int, who string) (domain.Rollout, bool, error) {
	return s.cfg.Store.ApproveRollout(ctx, id, version, who, s.cfg.FourEyes)
}

// Move is a person's pause, resume or cancel.
func (s *Service) Move(ctx context.Context, id string, action store.RolloutAction, who string) (domain.Rollout, error) {
	r, err := s.cfg.Store.MoveRollout(ctx, id, action, "", who)
	if errors.Is(err, domain.ErrIllegalState) {
		cur, gerr := s.cfg.Store.GetRollout(ctx, id)
		if gerr == nil {
			return domain.Rollout{}, domain.Errorf(domain.CodeIllegalState, "cannot %s rollout %s: it is %s", action, id, cur.Status)
		}
	}
	return r, err
}
