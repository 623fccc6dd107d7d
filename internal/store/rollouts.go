package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/approval"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Rollouts: one action across a fleet. The rollout row holds the device
// set's size, the rules (spec), the approval and the scheduler's lease; one
// rollout_devices row per device holds its state; rollout_starts logs every
// committed start. The scheduler (internal/rollout) is a decision maker: each
// of its passes is one fenced transaction (RolloutPass) that settles device
// outcomes from their operations, reads the committed counts and start
// times, asks the domain's decide function what to do, and applies that
// with conditional writes that name what they expect: the lease (owner,
// token, unexpired), the status, the spacing since the last committed start.
// A start and its device's operation are inserted in the same transaction,
// so there is no window between "start committed" and "operation submitted".

// Rollouts is what the rollout service and scheduler need of the store.
type Rollouts interface {
	CreateRollout(ctx context.Context, n NewRollout) (domain.Rollout, bool, error)
	GetRollout(ctx context.Context, id string) (domain.Rollout, error)
	ListRollouts(ctx context.Context, f RolloutFilter, p Page) (Listed[domain.Rollout], error)
	ListRolloutDevices(ctx context.Context, id string, f RolloutDeviceFilter, p Page) (Listed[domain.RolloutDevice], error)
	RolloutStarts(ctx context.Context, id string) ([]RolloutStart, error)
	SeenDevices(ctx context.Context) ([]string, error)
	ApproveRollout(ctx context.Context, id string, version int, approver string, fourEyes bool) (domain.Rollout, bool, error)
	MoveRollout(ctx context.Context, id string, action RolloutAction, reason, who string) (domain.Rollout, error)
	ActiveRollouts(ctx context.Context) ([]RolloutLease, error)
	AcquireRollout(ctx context.Context, id, owner string, ttl time.Duration, reclaim bool) (domain.Fence, error)
	NextRolloutCandidate(ctx context.Context, id string) (domain.RolloutDevice, bool, error)
	RolloutPass(ctx context.Context, id string, f domain.Fence, ttl time.Duration, cand *RolloutCandidate, checks RolloutChecks,
		decide func(RolloutSnapshot) RolloutDecision) (RolloutPassResult, error)
}

var _ Rollouts = (*DB)(nil)

// ErrRolloutFenced: a pass by a scheduler whose lease on the rollout was
// lost (or ran out); nothing of it was written.
var ErrRolloutFenced = ErrFenced

// RolloutStart is one committed start: a device's first start or a retry.
type RolloutStart struct {
	DeviceID     string
	Attempt      int
	StartedAt    time.Time
	Instance     string
	FencingToken int64
}

// NewRollout is a rollout's creation: its rules and its resolved device set.
type NewRollout struct {
	RolloutID        string
	Action           string
	Params           json.RawMessage // canonical JSON object
	Selector         json.RawMessage
	Spec             json.RawMessage // canonical JSON
	CreateHash       string
	MaxPerMinute     int
	MaxInFlight      int
	Retries          int
	ExecuteAfter     *time.Time
	ExecuteBefore    *time.Time
	ApprovalRequired bool
	// Devices in start order, each with its operation id.
	Devices      []string
	OperationIDs []string
	CreatedBy    string
	// Owner takes the scheduler's lease at creation, for LeaseTTL.
	Owner    string
	LeaseTTL time.Duration
}

// RolloutFilter filters ListRollouts.
type RolloutFilter struct{ Status string }

// RolloutDeviceFilter filters ListRolloutDevices.
type RolloutDeviceFilter struct{ Status string }

// RolloutAction is a person's change of a rollout.
type RolloutAction string

// A person's changes of a rollout.
const (
	RolloutPause  RolloutAction = "pause"
	RolloutResume RolloutAction = "resume"
	RolloutCancel RolloutAction = "cancel"
)

// RolloutLease is an active rollout and who holds its scheduler's lease.
type RolloutLease struct {
	RolloutID      string
	Status         fsm.RolloutState
	Owner          string
	FencingToken   int64
	LeaseExpiresAt time.Time
}

// RolloutCandidate is the device the scheduler would start next, with the
// operation record a start inserts (built by the ops service beforehand).
type RolloutCandidate struct {
	Device    domain.RolloutDevice
	Operation NewOperation
}

// RolloutChecks are the re-checks made before each start, in its
// transaction: the approval (of the current version, by someone other than
// the creator when FourEyes) and the creator's grant for the action on the
// device (when EnforceGrants).
type RolloutChecks struct {
	EnforceGrants bool
	FourEyes      bool
}

// RolloutSnapshot is what a pass read, after settling outcomes: the basis
// of its decision, all of it committed.
type RolloutSnapshot struct {
	Rollout domain.Rollout // with Counts as settled by this pass
	Now     time.Time
	// InFlight counts the devices started and not finished.
	InFlight int
	// Candidate is the next device to start, if the scheduler gave one and
	// it is still pending (or waiting for its retry).
	Candidate *domain.RolloutDevice
	// Settled lists the devices whose outcome this pass recorded (a late
	// final receipt's outcome included).
	Settled []domain.RolloutDevice
	// Provisional counts the devices whose outcome (timeout, rejected,
	// failed) was settled from a failed_retryable operation that is still
	// failed_retryable: a late final receipt may yet decide it, and the
	// device then follows. ProvisionalSince is when the latest of those
	// outcomes was recorded (zero when there are none).
	Provisional      int
	ProvisionalSince time.Time
}

// RolloutDecision is what the domain's decide function asks a pass to do.
type RolloutDecision struct {
	// To moves the rollout ("" stays); Reason explains it in the history.
	To     fsm.RolloutState
	Reason string
	// Start starts the candidate, conditioned on Interval having passed
	// since the last committed start (the rate limit), with the command's
	// ttl capped at CommandTTL when it is > 0 (the window's end).
	Start      bool
	Interval   time.Duration
	CommandTTL time.Duration
}

// RolloutPassResult is what a pass did.
type RolloutPassResult struct {
	Snapshot RolloutSnapshot
	Decision RolloutDecision
	Moved    bool // Decision.To was applied
	// Started is the submit of the candidate's operation, when it started.
	Started *SubmitResult
	// StartRefused says why a start the decision asked for did not happen
	// (spacing not reached by the database's clock, a re-check failed, the
	// operation_id exists with other params).
	StartRefused string
	// Cancelled lists the operations whose unpublished command was
	// cancelled because the rollout ended.
	Cancelled []string
}

// rolloutColumns are the columns scanRollout reads, in its order: those of
// the backends' rollout statements (RolloutGetRow), and of the rollouts'
// list page, built here (page.go).
const rolloutColumns = `rollout_id, status, reason, version, row_version, action, params, selector, spec, create_hash,
	max_per_minute, max_in_flight, retries, execute_after, execute_before, approval_required, approved_version,
	approver, approved_at, devices_total, created_by, created_at, updated_at, ended_at, owner, fencing_token,
	lease_expires_at, starts, last_start_at`

func scanRollout(row interface{ Scan(...any) error }) (domain.Rollout, error) {
	var (
		r                                       domain.Rollout
		params, selector, spec                  string
		after, before, approvedAt, ended, start sql.NullInt64
		approvedVersion                         sql.NullInt64
		approval                                int64
		created, updated, lease                 int64
	)
	err := row.Scan(&r.RolloutID, &r.Status, &r.Reason, &r.Version, &r.RowVersion, &r.Action, &params, &selector, &spec,
		&r.CreateHash, &r.MaxPerMinute, &r.MaxInFlight, &r.Retries, &after, &before, &approval, &approvedVersion,
		&r.Approver, &approvedAt, &r.DevicesTotal, &r.CreatedBy, &created, &updated, &ended, &r.Owner, &r.FencingToken,
		&lease, &r.Starts, &start)
	if err != nil {
		return domain.Rollout{}, err
	}
	r.Params, r.Selector, r.Spec = json.RawMessage(params), json.RawMessage(selector), json.RawMessage(spec)
	r.ExecuteAfter, r.ExecuteBefore, r.ApprovedAt = fromNullMS(after), fromNullMS(before), fromNullMS(approvedAt)
	r.EndedAt, r.LastStartAt = fromNullMS(ended), fromNullMS(start)
	r.ApprovalRequired = approval == 1
	r.ApprovedVersion = int(approvedVersion.Int64)
	r.CreatedAt, r.UpdatedAt, r.LeaseExpiresAt = fromMS(created), fromMS(updated), fromMS(lease)
	return r, nil
}

// rolloutDeviceColumns are the columns scanRolloutDevice reads, in its
// order: those of the backends' statements (RolloutNextCandidate,
// RolloutDeviceGet), and of the list page, built here (page.go).
const rolloutDeviceColumns = `rollout_id, device_id, position, operation_id, status, reason, attempts, started_at, finished_at, updated_at`

func scanRolloutDevice(row interface{ Scan(...any) error }) (domain.RolloutDevice, error) {
	var (
		d                 domain.RolloutDevice
		started, finished sql.NullInt64
		updated           int64
	)
	if err := row.Scan(&d.RolloutID, &d.DeviceID, &d.Position, &d.OperationID, &d.Status, &d.Reason, &d.Attempts,
		&started, &finished, &updated); err != nil {
		return domain.RolloutDevice{}, err
	}
	d.StartedAt, d.FinishedAt, d.UpdatedAt = fromNullMS(started), fromNullMS(finished), fromMS(updated)
	return d, nil
}

func getRolloutRow(ctx context.Context, q queryer, id string) (domain.Rollout, error) {
	st, locking := statementsOf(q)
	query := st.RolloutGetRow
	if locking {
		query = st.RolloutGetRowForUpdate
	}
	r, err := scanRollout(q.QueryRowContext(ctx, query, id))
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Rollout{}, fmt.Errorf("rollout %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Rollout{}, fmt.Errorf("get rollout %s: %w", id, err)
	}
	return r, nil
}

// rolloutCounts reads the device counts by status, every status present.
func rolloutCounts(ctx context.Context, q queryer, id string) (map[fsm.RolloutDeviceState]int, error) {
	counts := map[fsm.RolloutDeviceState]int{}
	for _, st := range fsm.RolloutDevice.States() {
		counts[st] = 0
	}
	rows, err := q.QueryContext(ctx, stmts(q).RolloutCounts, id)
	if err != nil {
		return nil, fmt.Errorf("count devices of rollout %s: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var st fsm.RolloutDeviceState
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		counts[st] = n
	}
	return counts, rows.Err()
}

// startsSince counts the committed starts of a rollout after since.
func startsSince(ctx context.Context, q queryer, id string, since time.Time) (int, error) {
	var n int
	err := q.QueryRowContext(ctx, stmts(q).RolloutStartsSince, id, ms(since)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count starts of rollout %s: %w", id, err)
	}
	return n, nil
}

func (t *tx) rolloutHistory(id, principal, action string, from, to fsm.RolloutState, version int, reason string) error {
	_, err := t.Exec(t.s.q.RolloutHistoryInsert, id, ms(t.now), principal, action, from, to, version, reason)
	if err != nil {
		return fmt.Errorf("rollout history: %w", err)
	}
	return nil
}

// SeenDevices lists the ids of every device that was ever seen (a birth),
// in id order: what a rollout's device glob is resolved against.
func (s *DB) SeenDevices(ctx context.Context) ([]string, error) {
	return queryStrings(ctx, s.rq, s.q.DeviceListSeen)
}

// CreateRollout inserts a rollout with its device set, or returns it when
// the same create is replayed (created false); another create with the same
// rollout_id is domain.ErrKeyReused. The creating instance takes the scheduler's
// lease.
func (s *DB) CreateRollout(ctx context.Context, n NewRollout) (domain.Rollout, bool, error) {
	if len(n.Devices) == 0 || len(n.Devices) != len(n.OperationIDs) {
		return domain.Rollout{}, false, fmt.Errorf("rollout %s: %d devices, %d operation ids: %w", n.RolloutID, len(n.Devices), len(n.OperationIDs), domain.ErrIllegalState)
	}
	created := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(n.CreatedBy)
		var hash string
		err := t.QueryRowContext(ctx, s.q.RolloutCreateHash, n.RolloutID).Scan(&hash)
		switch {
		case err == nil:
			if hash != n.CreateHash {
				return domain.ErrKeyReused
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		now := ms(t.now)
		status := fsm.RolloutScheduled
		if n.ApprovalRequired {
			status = fsm.RolloutWaitingApproval
		}
		if _, err := t.Exec(s.q.RolloutInsert,
			n.RolloutID, status, n.Action, string(n.Params), string(n.Selector), string(n.Spec), n.CreateHash,
			n.MaxPerMinute, n.MaxInFlight, n.Retries, nullTime(n.ExecuteAfter), nullTime(n.ExecuteBefore),
			n.ApprovalRequired, len(n.Devices), n.CreatedBy, now, now, n.Owner, ms(t.now.Add(n.LeaseTTL))); err != nil {
			return fmt.Errorf("insert rollout %s: %w", n.RolloutID, err)
		}
		for i, d := range n.Devices {
			if _, err := t.Exec(s.q.RolloutDeviceInsert, n.RolloutID, d, i+1, n.OperationIDs[i], now); err != nil {
				return fmt.Errorf("insert device %s of rollout %s: %w", d, n.RolloutID, err)
			}
		}
		created = true
		t.publish(Fact{Kind: FactRollout, ID: n.RolloutID, Token: 1}) // the creator holds its lease (fencing_token 1)
		if err := t.event("rollout", n.RolloutID, "", string(status), fmt.Sprintf("created with %d devices", len(n.Devices)), 1); err != nil {
			return err
		}
		if err := t.rolloutHistory(n.RolloutID, n.CreatedBy, "create", "", status, 1, fmt.Sprintf("%d devices", len(n.Devices))); err != nil {
			return err
		}
		return t.audit(ActCreate, EntityRollout, n.RolloutID, map[string]any{"action": n.Action, "devices": len(n.Devices),
			"status": status, "approval_required": n.ApprovalRequired})
	})
	if err != nil {
		return domain.Rollout{}, false, err
	}
	r, err := s.GetRollout(ctx, n.RolloutID)
	return r, created, err
}

// GetRollout reads a rollout with its counts, its start counts and its history.
func (s *DB) GetRollout(ctx context.Context, id string) (domain.Rollout, error) {
	r, err := getRolloutRow(ctx, s.rq, id)
	if err != nil {
		return domain.Rollout{}, err
	}
	if err := s.fillRollout(ctx, &r); err != nil {
		return domain.Rollout{}, err
	}
	rows, err := s.rq.QueryContext(ctx, s.q.RolloutHistoryList, id)
	if err != nil {
		return domain.Rollout{}, err
	}
	defer rows.Close()
	r.History = []domain.RolloutEvent{}
	for rows.Next() {
		var e domain.RolloutEvent
		var at int64
		if err := rows.Scan(&at, &e.Principal, &e.Action, &e.From, &e.To, &e.Version, &e.Reason); err != nil {
			return domain.Rollout{}, err
		}
		e.At = fromMS(at)
		r.History = append(r.History, e)
	}
	return r, rows.Err()
}

// fillRollout reads a rollout's counts and recent starts.
func (s *DB) fillRollout(ctx context.Context, r *domain.Rollout) error {
	var err error
	if r.Counts, err = rolloutCounts(ctx, s.rq, r.RolloutID); err != nil {
		return err
	}
	now := s.now()
	if r.StartsLastMinute, err = startsSince(ctx, s.rq, r.RolloutID, now.Add(-time.Minute)); err != nil {
		return err
	}
	r.StartsLast10s, err = startsSince(ctx, s.rq, r.RolloutID, now.Add(-10*time.Second))
	return err
}

// ListRollouts reads one page of rollouts by id, with their counts.
func (s *DB) ListRollouts(ctx context.Context, f RolloutFilter, p Page) (Listed[domain.Rollout], error) {
	k := keyset[domain.Rollout]{table: "rollouts", key: "rollout_id", columns: rolloutColumns, scan: scanRollout,
		id: func(r domain.Rollout) string { return r.RolloutID }}
	if f.Status != "" {
		k.where, k.args = append(k.where, "status = ?"), append(k.args, f.Status)
	}
	out, err := readPage(ctx, s, k, p)
	if err != nil {
		return out, err
	}
	for i := range out.Items {
		if err := s.fillRollout(ctx, &out.Items[i]); err != nil {
			return out, err
		}
	}
	return out, nil
}

// ListRolloutDevices reads one page of a rollout's devices by device id
// (404 for an unknown rollout).
func (s *DB) ListRolloutDevices(ctx context.Context, id string, f RolloutDeviceFilter, p Page) (Listed[domain.RolloutDevice], error) {
	if _, err := getRolloutRow(ctx, s.rq, id); err != nil {
		return Listed[domain.RolloutDevice]{}, err
	}
	k := keyset[domain.RolloutDevice]{table: "rollout_devices", key: "device_id", columns: rolloutDeviceColumns,
		where: []string{"rollout_id = ?"}, args: []any{id}, scan: scanRolloutDevice,
		id: func(d domain.RolloutDevice) string { return d.DeviceID }}
	if f.Status != "" {
		k.where, k.args = append(k.where, "status = ?"), append(k.args, f.Status)
	}
	return readPage(ctx, s, k, p)
}

// RolloutStarts lists a rollout's committed starts in time order: the
// record invariant 8 is checked against.
func (s *DB) RolloutStarts(ctx context.Context, id string) ([]RolloutStart, error) {
	rows, err := s.rq.QueryContext(ctx, s.q.RolloutStartList, id)
	if err != nil {
		return nil, fmt.Errorf("starts of rollout %s: %w", id, err)
	}
	defer rows.Close()
	out := []RolloutStart{}
	for rows.Next() {
		var st RolloutStart
		var at int64
		if err := rows.Scan(&st.DeviceID, &st.Attempt, &at, &st.Instance, &st.FencingToken); err != nil {
			return nil, err
		}
		st.StartedAt = fromMS(at)
		out = append(out, st)
	}
	return out, rows.Err()
}

// ApproveRollout approves the rollout's current version, checked in the
// order of task approvals after the caller's 401/403: 404, an exact replay
// (returned, created false), 409 illegal_state (not waiting for approval),
// 409 stale_version (another version), 403 four_eyes (the approver created
// it, when fourEyes).
func (s *DB) ApproveRollout(ctx context.Context, id string, version int, approver string, fourEyes bool) (domain.Rollout, bool, error) {
	created := false
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(approver)
		r, err := getRolloutRow(ctx, t, id)
		if err != nil {
			return err
		}
		switch approval.Check(approval.Request{Version: version, Approver: approver,
			Prior: &approval.Approved{Version: r.ApprovedVersion, Approver: r.Approver}, Waiting: r.Status == fsm.RolloutWaitingApproval,
			Current: r.Version, Author: r.CreatedBy, FourEyes: fourEyes}) {
		case approval.Replay:
			return nil // an exact replay
		case approval.IllegalState:
			return fmt.Errorf("rollout %s is %s: %w", id, r.Status, domain.ErrIllegalState)
		case approval.StaleVersion:
			return fmt.Errorf("approving v%d, current v%d: %w", version, r.Version, domain.ErrStaleVersion)
		case approval.FourEyes:
			return fmt.Errorf("%s created rollout %s: %w", approver, id, domain.ErrFourEyes)
		}
		to := fsm.RolloutScheduled
		ch := change{machine: "rollout", id: id, from: string(r.Status), to: string(to)}
		if err := t.cas(ctx, ch, nil, s.q.RolloutApprove,
			to, version, approver, ms(t.now), ms(t.now), id, r.Status, version, r.RowVersion); err != nil {
			return err
		}
		created = true
		t.publish(Fact{Kind: FactRollout, ID: id})
		if err := t.event("rollout", id, string(r.Status), string(to), "approved by "+approver, 0); err != nil {
			return err
		}
		if err := t.rolloutHistory(id, approver, "approve", r.Status, to, version, ""); err != nil {
			return err
		}
		return t.audit(ActApprove, EntityRollout, id, map[string]any{"version": version})
	})
	if err != nil {
		return domain.Rollout{}, false, err
	}
	r, err := s.GetRollout(ctx, id)
	return r, created, err
}

// MoveRollout is a person's pause, resume or cancel, from any instance (not
// fenced: decided by the same conditional writes the scheduler's pass
// races). The same change again is a replay; a change the state does not
// allow is domain.ErrIllegalState. A cancel cancels the devices not started and
// the commands not yet published, in the same transaction.
func (s *DB) MoveRollout(ctx context.Context, id string, action RolloutAction, reason, who string) (domain.Rollout, error) {
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(who)
		r, err := getRolloutRow(ctx, t, id)
		if err != nil {
			return err
		}
		var to fsm.RolloutState
		switch action {
		case RolloutPause:
			to = fsm.RolloutPaused
		case RolloutResume:
			to = fsm.RolloutRunning
		case RolloutCancel:
			to = fsm.RolloutCancelled
		default:
			return fmt.Errorf("rollout action %q: %w", action, domain.ErrIllegalState)
		}
		t.publish(Fact{Kind: FactRollout, ID: id}) // a replay too: its scheduler looks again
		if r.Status == to {
			return nil // a replay
		}
		if !fsm.Rollout.Can(r.Status, to) || (action == RolloutResume && r.Status != fsm.RolloutPaused) {
			t.refuse("rollout", id, string(r.Status), string(to), ReasonIllegal, 0)
			return fmt.Errorf("%s rollout %s in state %s: %w", action, id, r.Status, domain.ErrIllegalState)
		}
		if reason == "" {
			reason = string(action) + " by " + who
		}
		cancelled, err := t.moveRollout(ctx, r, to, reason, who, string(action), 0)
		if err != nil {
			return err
		}
		detail := map[string]any{"from": r.Status, "to": to, "reason": reason}
		if to.Terminal() {
			detail["cancelled_operations"] = len(cancelled)
		}
		return t.audit(string(action), EntityRollout, id, detail)
	})
	if err != nil {
		return domain.Rollout{}, err
	}
	return s.GetRollout(ctx, id)
}

// moveRollout is the rollout's conditional transition. A terminal state
// cancels the devices not started and the commands not yet published; it
// returns the operations whose command it cancelled.
func (t *tx) moveRollout(ctx context.Context, r domain.Rollout, to fsm.RolloutState, reason, who, action string, token int64) ([]string, error) {
	if err := fsm.Rollout.Transition(r.Status, to); err != nil {
		return nil, t.refuse("rollout", r.RolloutID, string(r.Status), string(to), ReasonIllegal, token)
	}
	now := ms(t.now)
	var ended any
	if to.Terminal() {
		ended = now
	}
	ch := change{machine: "rollout", id: r.RolloutID, from: string(r.Status), to: string(to), token: token}
	if err := t.cas(ctx, ch, nil, t.s.q.RolloutMove,
		to, reason, now, ended, r.RolloutID, r.Status, r.RowVersion); err != nil {
		return nil, err
	}
	if err := t.event("rollout", r.RolloutID, string(r.Status), string(to), reason, token); err != nil {
		return nil, err
	}
	if err := t.rolloutHistory(r.RolloutID, who, action, r.Status, to, r.Version, reason); err != nil {
		return nil, err
	}
	if !to.Terminal() {
		return nil, nil
	}
	return t.cancelUnstarted(ctx, r.RolloutID, "rollout "+string(to))
}

// cancelUnstarted ends what a rollout that ended leaves unpublished: the
// devices never started (and those waiting for a retry) are cancelled, and
// the started devices whose command was never published have it
// cancelled (its operation fails final, reason cancelled) and are cancelled
// too. A command published before this commits runs to its end.
func (t *tx) cancelUnstarted(ctx context.Context, id, reason string) ([]string, error) {
	now := ms(t.now)
	if _, err := t.Exec(t.s.q.RolloutCancelWaiting, reason, now, now, id); err != nil {
		return nil, fmt.Errorf("cancel devices of rollout %s: %w", id, err)
	}
	rows, err := t.QueryContext(ctx, t.s.q.RolloutUnpublished, id)
	if err != nil {
		return nil, fmt.Errorf("unpublished commands of rollout %s: %w", id, err)
	}
	type unpublished struct{ device, operation, command string }
	var all []unpublished
	for rows.Next() {
		var u unpublished
		if err := rows.Scan(&u.device, &u.operation, &u.command); err != nil {
			rows.Close()
			return nil, err
		}
		all = append(all, u)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var cancelled []string
	for _, u := range all {
		if _, _, err := t.cancel(ctx, u.command, "rollout "+id); err != nil {
			if errors.Is(err, ErrRefused) || errors.Is(err, domain.ErrAlreadyPublished) || errors.Is(err, domain.ErrIllegalState) {
				continue // published after all: it runs to its end
			}
			return nil, err
		}
		cancelled = append(cancelled, u.operation)
		if _, err := t.Exec(t.s.q.RolloutCancelDevice, reason, now, now, id, u.device); err != nil {
			return nil, fmt.Errorf("cancel device %s of rollout %s: %w", u.device, id, err)
		}
	}
	return cancelled, nil
}

// ActiveRollouts lists the rollouts the scheduler has work for: those in
// an active state, and the ended ones with devices still in flight (or
// waiting for a person) whose outcomes are to be settled, or with a device
// whose operation a late final receipt decided (lateDecided), which it
// follows.
func (s *DB) ActiveRollouts(ctx context.Context) ([]RolloutLease, error) {
	rows, err := s.rq.QueryContext(ctx, s.q.RolloutListActive)
	if err != nil {
		return nil, fmt.Errorf("active rollouts: %w", err)
	}
	defer rows.Close()
	var out []RolloutLease
	for rows.Next() {
		var l RolloutLease
		var lease int64
		if err := rows.Scan(&l.RolloutID, &l.Status, &l.Owner, &l.FencingToken, &lease); err != nil {
			return nil, err
		}
		l.LeaseExpiresAt = fromMS(lease)
		out = append(out, l)
	}
	return out, rows.Err()
}

// AcquireRollout takes the scheduler's lease on a rollout for owner, with
// a new fencing token: when its lease has run out (its holder stalled or
// died), or, with reclaim, when owner itself held it before it restarted
// (the caller holds the instance lock, which proves that process dead).
// A lease another live holder keeps is refused (ErrRefused).
func (s *DB) AcquireRollout(ctx context.Context, id, owner string, ttl time.Duration, reclaim bool) (domain.Fence, error) {
	var f domain.Fence
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		r, err := getRolloutRow(ctx, t, id)
		if err != nil {
			return err
		}
		var why string
		f, why, err = t.takeLease(ctx, leased{machine: "rollout", acquire: s.q.RolloutAcquire, id: id,
			owner: r.Owner, token: r.FencingToken, expires: r.LeaseExpiresAt}, owner, ttl, reclaim)
		if err != nil {
			return err
		}
		if err := t.event("lease", id, r.Owner, owner, "rollout scheduler: "+why, f.Token); err != nil {
			return err
		}
		prev := r.Owner
		if prev == "" {
			prev = "nobody"
		}
		return t.rolloutHistory(id, "scheduler:"+owner, "lease", r.Status, r.Status, r.Version,
			fmt.Sprintf("%s from %s, fencing token %d", why, prev, f.Token))
	})
	return f, err
}

// NextRolloutCandidate reads the device the scheduler would start next: one
// waiting for its retry first, else the first pending one in start order.
func (s *DB) NextRolloutCandidate(ctx context.Context, id string) (domain.RolloutDevice, bool, error) {
	for _, st := range []fsm.RolloutDeviceState{fsm.DevRetry, fsm.DevPending} {
		d, err := scanRolloutDevice(s.rq.QueryRowContext(ctx, s.q.RolloutNextCandidate, id, st))
		if err == nil {
			return d, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return domain.RolloutDevice{}, false, fmt.Errorf("next device of rollout %s: %w", id, err)
		}
	}
	return domain.RolloutDevice{}, false, nil
}

// RolloutPass is one decision of the rollout's scheduler, in one
// transaction under its lease: the fence is checked and the lease extended
// (a fenced write: a lost lease refuses the whole pass, recorded as fenced),
// the started devices' outcomes are settled from their operations, the
// committed counts read; decide (the domain's rules) says what to do; the
// rollout's move and the candidate's start are applied as conditional
// writes. A start is conditioned on the rollout running, the fence, and
// the spacing since the last committed start (the rate limit); it records
// its start time and inserts (or retries) the device's operation in the same
// transaction, after the re-checks of the approval and the grant.
func (s *DB) RolloutPass(ctx context.Context, id string, f domain.Fence, ttl time.Duration, cand *RolloutCandidate,
	checks RolloutChecks, decide func(RolloutSnapshot) RolloutDecision) (RolloutPassResult, error) {
	var res RolloutPassResult
	var locks rowLocks
	if cand != nil {
		locks = cand.Operation.locks()
	}
	err := s.writeLocking(ctx, locks, func(ctx context.Context, t *tx) error {
		res = RolloutPassResult{}
		r, err := getRolloutRow(ctx, t, id)
		if err != nil {
			return err
		}
		held := change{machine: "rollout", id: id, from: string(r.Status), to: string(r.Status), token: f.Token,
			explain: func() (string, error) { return ReasonFenced, nil }}
		if err := t.cas(ctx, held, nil, s.q.RolloutRenew, append([]any{ms(t.now.Add(ttl)), id}, fenceArgs(f, t.now)...)...); err != nil {
			return err
		}
		snap := RolloutSnapshot{Now: t.now}
		if snap.Settled, err = t.settleRollout(ctx, r, "scheduler:"+f.Owner); err != nil {
			return err
		}
		if r.Counts, err = rolloutCounts(ctx, t, id); err != nil {
			return err
		}
		if r.StartsLastMinute, err = startsSince(ctx, t, id, t.now.Add(-time.Minute)); err != nil {
			return err
		}
		if r.StartsLast10s, err = startsSince(ctx, t, id, t.now.Add(-10*time.Second)); err != nil {
			return err
		}
		snap.InFlight = r.Counts[fsm.DevStarted]
		if snap.Provisional, snap.ProvisionalSince, err = provisional(ctx, t, id); err != nil {
			return err
		}
		if cand != nil {
			d, err := scanRolloutDevice(t.QueryRowContext(ctx, s.q.RolloutDeviceGet, id, cand.Device.DeviceID))
			if err != nil {
				return fmt.Errorf("read device %s of rollout %s: %w", cand.Device.DeviceID, id, err)
			}
			if (d.Status == fsm.DevPending || d.Status == fsm.DevRetry) && d.Attempts == cand.Device.Attempts {
				snap.Candidate = &d
			}
		}
		snap.Rollout = r
		d := decide(snap)
		res.Snapshot, res.Decision = snap, d
		if d.To != "" && d.To != r.Status {
			cancelled, err := t.moveRollout(ctx, r, d.To, d.Reason, "scheduler:"+f.Owner, "run", f.Token)
			if err != nil {
				return err
			}
			res.Moved, res.Cancelled = true, cancelled
			r.Status = d.To
			r.RowVersion++
		}
		if !d.Start || snap.Candidate == nil || r.Status != fsm.RolloutRunning {
			return nil
		}
		// The re-checks before each start.
		refused, err := t.rolloutStartChecks(ctx, r, snap.Candidate.DeviceID, checks)
		if err != nil {
			return err
		}
		if refused != "" {
			res.StartRefused = refused
			cancelled, err := t.moveRollout(ctx, r, fsm.RolloutAborted, refused+": "+snap.Candidate.DeviceID, "scheduler:"+f.Owner, "run", f.Token)
			if err != nil {
				return err
			}
			res.Moved, res.Cancelled, res.Decision.To = true, cancelled, fsm.RolloutAborted
			return nil
		}
		return t.startRolloutDevice(ctx, r, *snap.Candidate, cand.Operation, f, d, &res)
	})
	return res, err
}

// rolloutStartChecks re-checks, before a start, the rollout's approval and
// the creator's grant for the device; it returns the refusal's reason, or "".
func (t *tx) rolloutStartChecks(ctx context.Context, r domain.Rollout, device string, c RolloutChecks) (string, error) {
	var grants []approval.Grant
	if c.EnforceGrants {
		var err error
		if grants, err = grantsOf(ctx, t, r.CreatedBy); err != nil {
			return "", err
		}
	}
	return approval.CheckStart(approval.Start{ApprovalRequired: r.ApprovalRequired, Version: r.Version,
		ApprovedVersion: r.ApprovedVersion, Approver: r.Approver, Creator: r.CreatedBy, FourEyes: c.FourEyes,
		EnforceGrants: c.EnforceGrants, Grants: grants, Action: r.Action, Device: device}), nil
}

// startRolloutDevice commits one start: the rate condition on the rollout
// row (spacing since the last committed start, under the fence), the
// device's move to started, the start's record, and the device's operation
// (inserted, or retried when it is failed_retryable).
func (t *tx) startRolloutDevice(ctx context.Context, r domain.Rollout, d domain.RolloutDevice, n NewOperation, f domain.Fence, dec RolloutDecision, res *RolloutPassResult) error {
	now := ms(t.now)
	ch := change{machine: "rollout", id: r.RolloutID, from: string(r.Status), to: string(r.Status), token: f.Token}
	err := t.cas(ctx, ch, nil, t.s.q.RolloutCountStart,
		append([]any{now, r.RolloutID, now - dec.Interval.Milliseconds()}, fenceArgs(f, t.now)...)...)
	if errors.Is(err, ErrRefused) {
		res.StartRefused = "spacing"
		return nil // recorded; the next pass tries again
	}
	if err != nil {
		return err
	}
	attempt := d.Attempts + 1
	dch := change{machine: "rollout", id: r.RolloutID + "/" + d.DeviceID, from: string(d.Status), to: string(fsm.DevStarted), token: f.Token}
	if err := t.cas(ctx, dch, nil, t.s.q.RolloutDeviceStart,
		attempt, now, now, r.RolloutID, d.DeviceID, d.Status, d.Attempts); err != nil {
		return err
	}
	if _, err := t.Exec(t.s.q.RolloutStartInsert, r.RolloutID, d.DeviceID, attempt, now, f.Owner, f.Token); err != nil {
		return fmt.Errorf("record start of %s in rollout %s: %w", d.DeviceID, r.RolloutID, err)
	}
	if dec.CommandTTL > 0 && dec.CommandTTL < n.CommandTTL {
		n.CommandTTL = dec.CommandTTL
	}
	// Attributed to the rollout's creator, via rollout, with its approver
	// and approved version when its action needed one: from the row this
	// transaction read (a candidate may be prepared before the approval).
	n.SubmittedBy, n.Via = r.CreatedBy, domain.ViaRollout
	if r.Approver != "" {
		n.ApprovedBy, n.ApprovedVersion = r.Approver, r.ApprovedVersion
	}
	sub, err := t.submit(ctx, n)
	if errors.Is(err, domain.ErrKeyReused) {
		// Nothing of the submit was written (it reads first): the device
		// fails, its start stays on record.
		res.StartRefused = "idempotency_key_reused"
		_, err := t.Exec(t.s.q.RolloutDeviceFailStart, reasonKeyReused+": "+n.OperationID+" exists with other params",
			now, now, r.RolloutID, d.DeviceID)
		return err
	}
	if err != nil {
		return err
	}
	t.submitted(&sub)
	res.Started = &sub
	return nil
}

// reasonKeyReused starts the reason of a device whose start found its
// operation_id taken with other params: that operation is not the
// device's, so the device never follows it.
const reasonKeyReused = "idempotency_key_reused"

// lateDecided is the condition (on rollout_devices d joined with its
// operation o) of a device whose outcome was settled from a
// failed_retryable operation (timeout, rejected, failed, or waiting for
// its retry) that a late final receipt has decided since: it follows the
// operation (docs/rollouts.md). A late success moves any of them; a
// late failure moves the outcomes only a failed_retryable operation gives
// (timeout, retry): a rejected or failed device may have been settled
// from a failed_final operation already, which never changes.
//
// The backends' RolloutSettleList and RolloutListActive write it out (d:
// the device's row, o: its operation's), reasonKeyReused included:
//
//	((o.status = 'succeeded' AND d.status IN ('timeout', 'rejected', 'failed', 'retry')
//		AND d.reason NOT LIKE 'idempotency_key_reused%')
//	OR (o.status = 'failed_final' AND d.status IN ('timeout', 'retry')))

// settleRollout records the outcome of every started device whose
// operation has one (and of needs_attention devices a person resolved),
// and moves every device whose failed_retryable operation a late final
// receipt decided since its outcome was recorded (lateDecided), with a
// line in the rollout's history by who.
func (t *tx) settleRollout(ctx context.Context, r domain.Rollout, who string) ([]domain.RolloutDevice, error) {
	rows, err := t.QueryContext(ctx, t.s.q.RolloutSettleList, r.RolloutID)
	if err != nil {
		return nil, fmt.Errorf("settle rollout %s: %w", r.RolloutID, err)
	}
	type row struct {
		device    string
		status    fsm.RolloutDeviceState
		attempts  int
		op        fsm.OperationState
		opReason  string
		cmd       fsm.CommandState
		cmdReason string
		rejected  bool
	}
	var all []row
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.device, &x.status, &x.attempts, &x.op, &x.opReason, &x.cmd, &x.cmdReason, &x.rejected); err != nil {
			rows.Close()
			return nil, err
		}
		all = append(all, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	retrying := r.Status == fsm.RolloutRunning || r.Status == fsm.RolloutPaused
	var settled []domain.RolloutDevice
	now := ms(t.now)
	for _, x := range all {
		to, ok := fsm.DeviceOutcome(x.op, x.cmd, x.cmdReason, x.rejected, retrying && x.attempts <= r.Retries)
		if !ok || to == x.status || !fsm.RolloutDevice.Can(x.status, to) {
			continue
		}
		reason := x.opReason
		if reason == "" && to != fsm.DevSucceeded {
			reason = x.cmdReason
		}
		late := x.status != fsm.DevStarted && x.status != fsm.DevNeedsAttention
		if late {
			// A late final receipt decided its operation (lateDecided).
			reason = strings.TrimSuffix("late final receipt, was "+string(x.status)+": "+reason, ": ")
		}
		var finished any
		if to != fsm.DevRetry {
			finished = now
		}
		ch := change{machine: "rollout", id: r.RolloutID + "/" + x.device, from: string(x.status), to: string(to)}
		if err := t.cas(ctx, ch, nil, t.s.q.RolloutDeviceSettle,
			to, reason, finished, now, r.RolloutID, x.device, x.status, x.attempts); err != nil {
			return nil, err
		}
		if late {
			if err := t.rolloutHistory(r.RolloutID, who, "late_outcome", r.Status, r.Status, r.Version,
				fmt.Sprintf("%s %s → %s: a late final receipt decided its operation", x.device, x.status, to)); err != nil {
				return nil, err
			}
		}
		settled = append(settled, domain.RolloutDevice{RolloutID: r.RolloutID, DeviceID: x.device, Status: to, Reason: reason, Attempts: x.attempts})
	}
	return settled, nil
}

// provisional counts a rollout's devices whose outcome a late final
// receipt may still change (their operation is failed_retryable), with
// the latest time such an outcome was recorded.
func provisional(ctx context.Context, q queryer, id string) (int, time.Time, error) {
	var n int
	var since sql.NullInt64
	err := q.QueryRowContext(ctx, stmts(q).RolloutProvisional, id).Scan(&n, &since)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("provisional outcomes of rollout %s: %w", id, err)
	}
	if !since.Valid {
		return n, time.Time{}, nil
	}
	return n, fromMS(since.Int64), nil
}
