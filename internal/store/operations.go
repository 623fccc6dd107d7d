package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// NewOperation is a first submission: the operation and its first command,
// inserted together before anything is published (the outbox).
type NewOperation struct {
	OperationID     string
	Action          string
	Target          string
	Params          json.RawMessage // canonical JSON object
	RequestHash     string
	TaskID          string
	Step            string
	BusinessVersion string
	Compensates     string
	CommandID       string // minted by the caller, used only if the operation is new
	CommandTTL      time.Duration
	QoS             int
	Owner           string
	LeaseTTL        time.Duration
	// Attribution (domain.Operation's): who submitted it, through which
	// channel (domain.Via*), and for a task step or a rollout device the
	// approver and the approved version (0: none).
	SubmittedBy     string
	Via             string
	ApprovedBy      string
	ApprovedVersion int
	// FromDevice: the device's row, as the submit's transaction reads it,
	// decides instead of the caller. When the device is online the
	// command's first publish decision (pending → sent, attempt 1, under
	// this operation's new lease and token) commits in the submit's own
	// transaction, unless the device's queue holds it back; the publish
	// follows the commit (OpenCommand.Claimed), and FirstCheck is when the
	// sweeper looks again if no final receipt came. The command has QoS 1
	// when the device deduplicates (command.QoS), whatever QoS says.
	// Without it the command is inserted pending, at QoS.
	FromDevice bool
	FirstCheck time.Time
	// QueuedCheck is the next check of a serial command inserted behind
	// another (capped at its expiry): the fallback, since the end of the
	// one ahead wakes its queue through the feed.
	QueuedCheck time.Time
	// Serial and Supersede are the action's ordering policy (queues.go):
	// its command takes its place in the device's queue; older unpublished
	// operations of the same action on the device are superseded.
	Serial, Supersede bool
	// CompensationReason is the reason a person gave for a compensation
	// (Via domain.ViaCompensation, SubmittedBy the person): a new
	// compensation (or its retry) is audited and its events carry the
	// principal (auditlog.go).
	CompensationReason string
}

// compensator is the person who asked for a compensation, "" for any
// other operation.
func (n NewOperation) compensator() string {
	if n.Via != domain.ViaCompensation {
		return ""
	}
	return n.SubmittedBy
}

// SubmitResult says what Submit found or made.
type SubmitResult struct {
	Operation domain.Operation
	Created   bool // a new operation and command were inserted
	Retried   bool // a failed_retryable operation was started again (its retry)
	// Inserted is the new command as inserted, with its fence (Created
	// only): what OpenCommand would read, so its first decision needs no read.
	Inserted OpenCommand
}

// Submit inserts the operation and its first command in one transaction, or
// returns the stored record when the operation_id exists with the same
// request_hash (domain.ErrKeyReused with another). beforeCommit runs inside the
// transaction, last (the submit-before-commit failpoint); an error from it
// rolls everything back.
func (s *DB) Submit(ctx context.Context, n NewOperation, beforeCommit func() error) (SubmitResult, error) {
	var res SubmitResult
	err := s.enqueue(ctx, ChangeSubmit, n.locks(), func(ctx context.Context, t *tx) error {
		if n.compensator() != "" {
			t.by(n.compensator())
		}
		var err error
		if res, err = t.submit(ctx, n); err != nil {
			return err
		}
		t.submitted(&res)
		if n.compensator() != "" && (res.Created || res.Retried) {
			if err := t.audit(ActCompensate, EntityOperation, n.OperationID, map[string]any{"compensates": n.Compensates,
				"action": n.Action, "target": n.Target, "reason": n.CompensationReason, "retry": res.Retried}); err != nil {
				return err
			}
		}
		if !res.Created {
			return nil
		}
		if beforeCommit != nil {
			return t.hook(beforeCommit)
		}
		return nil
	}, true)
	return res, err
}

// locks are the rows a submit of n locks besides its own: its device's
// queue (serial) and the device's open commands (supersede).
func (n NewOperation) locks() rowLocks {
	var l rowLocks
	if n.Serial {
		l.queues = []string{n.Target}
	}
	if n.Supersede {
		l.devices = []string{n.Target}
	}
	return l
}

// submit is Submit inside a transaction (the task runner's step insert uses
// it together with its checks).
func (t *tx) submit(ctx context.Context, n NewOperation) (SubmitResult, error) {
	// Most submissions are new: the INSERT comes first, and only one that
	// meets the UNIQUE key reads what holds it.
	now := ms(t.now)
	opArgs := []any{n.OperationID, n.Action, n.Target, string(n.Params), n.RequestHash, n.CommandID,
		n.Owner, ms(t.now.Add(n.LeaseTTL)), n.TaskID, n.Step, n.BusinessVersion, n.Compensates, now, now,
		n.SubmittedBy, n.Via, n.ApprovedBy, n.ApprovedVersion}
	// Where the backend can, and nothing comes between the two inserts (a
	// serial queue's place, a supersede), insertCommand inserts the
	// operation with its command, in one statement.
	if !t.s.caps.WritesTogether || !n.FromDevice || n.Serial || n.Supersede {
		r, err := t.Exec(t.s.q.OperationInsert, opArgs...)
		if err != nil {
			return SubmitResult{}, fmt.Errorf("insert operation %s: %w", n.OperationID, err)
		}
		if rows, _ := r.RowsAffected(); rows == 0 {
			return t.resubmit(ctx, n)
		}
		opArgs = nil // inserted: the command goes in alone
	}
	if n.Supersede {
		if err := t.supersedeOlder(ctx, n); err != nil {
			return SubmitResult{}, err
		}
	}
	var claim *time.Time
	if n.FromDevice {
		claim = &n.FirstCheck
	}
	c, err := insertCommand(ctx, t, n.CommandID, n.OperationID, n.Target, n.Action, n.Params, n.CommandTTL, n.QoS, n.Serial, claim, n.QueuedCheck, opArgs)
	if errors.Is(err, errOperationTaken) {
		return t.resubmit(ctx, n)
	}
	if err != nil {
		return SubmitResult{}, err
	}
	if err := t.event("operation", n.OperationID, "", string(fsm.OpStarted), "submitted", 1); err != nil {
		return SubmitResult{}, err
	}
	op := n.inserted(now, ms(t.now.Add(n.LeaseTTL)))
	res := SubmitResult{Operation: op, Created: true,
		Inserted: OpenCommand{Command: c, Fence: domain.Fence{Owner: op.Owner, Token: op.FencingToken}, LeaseExpiresAt: op.LeaseExpiresAt,
			Claimed: c.Status == fsm.CmdSent}}
	return res, nil
}

// inserted is the operation as submit inserted it, as getOperation would
// read it back: one command, no compensations yet (only a final operation
// is compensated, so a new one has none).
func (n NewOperation) inserted(now, leaseExpires int64) domain.Operation {
	return domain.Operation{
		OperationID: n.OperationID, Action: n.Action, Target: n.Target,
		Params: json.RawMessage(string(n.Params)), RequestHash: n.RequestHash,
		Status: fsm.OpStarted, Attempt: 1, CommandID: n.CommandID, CommandIDs: []string{n.CommandID},
		Version: 1, Owner: n.Owner, LeaseExpiresAt: fromMS(leaseExpires), FencingToken: 1,
		TaskID: n.TaskID, Step: n.Step, BusinessVersion: n.BusinessVersion, Compensates: n.Compensates,
		Compensations: []string{}, StartedAt: fromMS(now), UpdatedAt: fromMS(now),
		SubmittedBy: n.SubmittedBy, Via: n.Via, ApprovedBy: n.ApprovedBy, ApprovedVersion: n.ApprovedVersion,
	}
}

// resubmit answers a submission whose operation_id exists: the stored
// record for the same request_hash (a failed_retryable one started again),
// domain.ErrKeyReused for another.
func (t *tx) resubmit(ctx context.Context, n NewOperation) (SubmitResult, error) {
	existing, err := getOperation(ctx, t, n.OperationID)
	if err != nil {
		return SubmitResult{}, err
	}
	if existing.RequestHash != n.RequestHash {
		return SubmitResult{}, domain.ErrKeyReused
	}
	res := SubmitResult{Operation: existing}
	if existing.Status == fsm.OpFailedRetryable {
		if err := t.startRetry(ctx, existing, n.Owner, n.LeaseTTL, n.CommandTTL); err != nil {
			return SubmitResult{}, err
		}
		res.Retried = true
		if res.Operation, err = getOperation(ctx, t, n.OperationID); err != nil {
			return SubmitResult{}, err
		}
	}
	return res, nil
}

// errOperationTaken: insertCommand, inserting the operation too, found its
// operation_id taken, and inserted nothing.
var errOperationTaken = errors.New("operation_id taken")

// insertCommand inserts a new command and returns it as a read would find
// it. A serial one takes its place in its device's queue: with a command
// ahead of it, its reason is queued. Without claim it is inserted pending,
// at qos. With claim the device's row, as the statement reads it
// (CommandInsertForDevice), decides the QoS and whether it is inserted as
// its first publish decision leaves it (ClaimSend's pending → sent, its
// next check at *claim): a submit's own claim, made in its transaction
// under the lease and token it just took, so every condition of
// ClaimSend's write holds by construction (a new row, the submit's own
// fence, a device online; a serial one only as the head of its device's
// queue, else it stays pending). Both moves are in the events log, as if
// made one after the other. The publish follows the commit; from then on a
// cancel gets already_published, as for any command published. A queued
// one's next check is queuedCheck (capped at its expiry; zero: now). With
// opArgs, OperationInsert's arguments, the operation goes in by the same
// statement (OperationCommandInsert), or errOperationTaken.
func insertCommand(ctx context.Context, t *tx, commandID, operationID, device, action string, params json.RawMessage, ttl time.Duration, qos int, serial bool, claim *time.Time, queuedCheck time.Time, opArgs []any) (domain.Command, error) {
	now, expires := ms(t.now), ms(t.now.Add(ttl))
	var (
		seq    sql.NullInt64
		ahead  string
		reason string
	)
	if serial {
		var err error
		if seq.Int64, ahead, err = t.enqueueSerial(ctx, device); err != nil {
			return domain.Command{}, err
		}
		seq.Valid = true
		if ahead != "" {
			reason = ReasonQueued
		}
	}
	c := domain.Command{CommandID: commandID, OperationID: operationID, DeviceID: device, Action: action,
		Params: json.RawMessage(string(params)), IssuedAt: fromMS(now), ExpiresAt: fromMS(expires),
		Status: fsm.CmdPending, QoS: qos, Version: 1, Reason: reason, NextCheckAt: fromMS(now),
		CreatedAt: fromMS(now), UpdatedAt: fromMS(now), SerialSeq: seq.Int64, QueuedBehind: ahead}
	if ahead != "" && !queuedCheck.IsZero() {
		c.NextCheckAt = fromMS(min(ms(queuedCheck), expires))
	}
	if claim == nil {
		_, err := t.Exec(t.s.q.CommandInsert,
			commandID, operationID, device, action, string(params), now, expires, c.Status, c.Attempt, qos, c.Version,
			ms(c.NextCheckAt), nullTime(c.LastSentAt), now, now, seq, reason)
		if err != nil {
			return domain.Command{}, fmt.Errorf("insert command %s: %w", commandID, err)
		}
	} else {
		mayClaim := 0
		if ahead == "" {
			mayClaim = 1
		}
		query, args := t.s.q.CommandInsertForDevice, []any{commandID, operationID, device, action, string(params), now, expires,
			ms(*claim), ms(c.NextCheckAt), now, now, now, seq, reason, mayClaim}
		if opArgs != nil { // the operation too, in one statement (OperationCommandInsert)
			query, args = t.s.q.OperationCommandInsert, append(opArgs, now, expires, ms(*claim), ms(c.NextCheckAt), mayClaim)
		}
		var status string
		err := t.QueryRowContext(ctx, query, args...).Scan(&status, &c.QoS)
		if opArgs != nil && errors.Is(err, sql.ErrNoRows) {
			return domain.Command{}, errOperationTaken
		}
		if err != nil {
			return domain.Command{}, fmt.Errorf("insert command %s: %w", commandID, err)
		}
		if status == string(fsm.CmdSent) {
			sent := fromMS(now)
			c.Status, c.Attempt, c.Version, c.NextCheckAt, c.LastSentAt = fsm.CmdSent, 1, 2, fromMS(ms(*claim)), &sent
		}
	}
	why := "submitted"
	if ahead != "" {
		why = "submitted, queued behind " + ahead
	}
	if err := t.event("command", commandID, "", string(fsm.CmdPending), why, 0); err != nil {
		return domain.Command{}, err
	}
	if c.Status == fsm.CmdSent {
		return c, t.event("command", commandID, string(fsm.CmdPending), string(fsm.CmdSent), "publish attempt 1", 1)
	}
	return c, nil
}

// getOperationRow reads an operation's own row, without the lists of its
// commands and compensations (a write that decides by its state needs no
// more).
func getOperationRow(ctx context.Context, q queryer, id string) (domain.Operation, error) {
	st, locking := statementsOf(q)
	query := st.OperationGetRow
	if locking {
		query = st.OperationGetRowForUpdate
	}
	op, err := scanOperation(q.QueryRowContext(ctx, query, id))
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Operation{}, fmt.Errorf("operation %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Operation{}, fmt.Errorf("get operation %s: %w", id, err)
	}
	return op, nil
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// The columns the backends' operation statements read (OperationGet,
// OperationGetRow), in scanOperation's order:
//
//	operation_id, action, target, params, request_hash, status, result, reason, attempt,
//	command_id, version, owner, lease_expires_at, fencing_token, task_id, step, business_version,
//	COALESCE(compensates, ''), started_at, updated_at,
//	submitted_by, via, approved_by, COALESCE(approved_version, 0)

// scanOperation scans operationColumns.
func scanOperation(row interface{ Scan(...any) error }) (domain.Operation, error) {
	var r operationRow
	if err := row.Scan(r.dests()...); err != nil {
		return domain.Operation{}, err
	}
	return r.operation(), nil
}

// operationRow holds scanOperation's columns while they are scanned, and
// the lists of scanWholeOperation's: for a row that holds more than an
// operation's (CommandAdvanceFinish).
type operationRow struct {
	op             domain.Operation
	params, result sql.NullString
	lease, st, up  int64
	cmds, comps    string
}

// dests are operationColumns' destinations.
func (r *operationRow) dests() []any {
	op := &r.op
	return []any{&op.OperationID, &op.Action, &op.Target, &r.params, &op.RequestHash, &op.Status, &r.result,
		&op.Reason, &op.Attempt, &op.CommandID, &op.Version, &op.Owner, &r.lease, &op.FencingToken,
		&op.TaskID, &op.Step, &op.BusinessVersion, &op.Compensates, &r.st, &r.up,
		&op.SubmittedBy, &op.Via, &op.ApprovedBy, &op.ApprovedVersion}
}

// wholeDests are OperationGet's: operationColumns and the two lists.
func (r *operationRow) wholeDests() []any { return append(r.dests(), &r.cmds, &r.comps) }

// operation is the operation scanned (without its lists).
func (r *operationRow) operation() domain.Operation {
	op := r.op
	op.Params = json.RawMessage(r.params.String)
	if r.result.Valid {
		op.Result = json.RawMessage(r.result.String)
	}
	op.LeaseExpiresAt, op.StartedAt, op.UpdatedAt = fromMS(r.lease), fromMS(r.st), fromMS(r.up)
	return op
}

// wholeOperation is the operation scanned with its lists.
func (r *operationRow) wholeOperation() domain.Operation {
	op := r.operation()
	op.CommandIDs, op.Compensations = splitIDs(r.cmds), splitIDs(r.comps)
	return op
}

// getOperation reads an operation with the ids of its commands (by
// creation) and of its compensations (by start, then id) in one round
// trip: the lists come as comma-joined aggregates, which ids never contain
// (their charset is [A-Za-z0-9._:-]).
func getOperation(ctx context.Context, q queryer, id string) (domain.Operation, error) {
	st, locking := statementsOf(q)
	query := st.OperationGet
	if locking {
		query = st.OperationGetForUpdate
	}
	op, err := scanWholeOperation(q.QueryRowContext(ctx, query, id))
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Operation{}, fmt.Errorf("operation %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Operation{}, fmt.Errorf("get operation %s: %w", id, err)
	}
	return op, nil
}

// scanWholeOperation scans an operation with its command and compensation
// ids (OperationGet's columns).
func scanWholeOperation(row interface{ Scan(...any) error }) (domain.Operation, error) {
	var r operationRow
	if err := row.Scan(r.wholeDests()...); err != nil {
		return domain.Operation{}, err
	}
	return r.wholeOperation(), nil
}

// splitIDs splits a comma-joined list of ids; an empty one is no id.
func splitIDs(s string) []string {
	if s == "" {
		return []string{}
	}
	return strings.Split(s, ",")
}

func queryStrings(ctx context.Context, q queryer, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// GetOperation reads one operation with its command ids and links.
func (s *DB) GetOperation(ctx context.Context, id string) (domain.Operation, error) {
	return getOperation(ctx, s.rq, id)
}

// Ended returns those of ids whose operation is no longer started, in one
// read: the ?wait= callers' poll for changes no wake-up announced.
func (s *DB) Ended(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	ended, err := queryStrings(ctx, s.rq, s.q.OperationsEnded, string(list))
	if err != nil {
		return nil, fmt.Errorf("operations ended: %w", err)
	}
	return ended, nil
}

// finishOperation applies a command's terminal outcome to its operation, if
// the command is the operation's current one (or the operation is
// failed_retryable, where a late final receipt of any of its commands
// decides it). The update names the state and version it read; in the
// common case (a started operation, ended by its current command) it reads
// nothing first and names the state and the command.
//
// late marks an outcome learned after the command was already terminal (a
// late receipt): it decides the operation only if it is final (succeeded or
// a device failure), never to make it retryable again.
func (t *tx) finishOperation(ctx context.Context, cmd domain.Command, state fsm.CommandState, reason string, result json.RawMessage, late bool) error {
	return t.finishOperationAfter(ctx, cmd, state, reason, result, late, finishTry{})
}

// finishTry is the common case of finishOperation (a started operation
// ended by its current command) tried in the statement that ended the
// command (CommandAdvanceFinish): tried, and then whether the operation
// ended, as op.
type finishTry struct {
	tried, ended bool
	op           domain.Operation
}

// finishOperationAfter is finishOperation after f: an operation that ended
// with its command is recorded as such; one that did not is decided from
// its row, as read.
func (t *tx) finishOperationAfter(ctx context.Context, cmd domain.Command, state fsm.CommandState, reason string, result json.RawMessage, late bool, f finishTry) error {
	if !late && state.Terminal() {
		t.released(cmd)
	}
	to, ok := fsm.OperationOutcome(state, reason)
	if !ok || (late && to == fsm.OpFailedRetryable) {
		return nil
	}
	if f.ended {
		t.ended(f.op, fsm.OpStarted, cmd, state)
		return nil
	}
	res := operationResult(result)
	if !f.tried && !late && fsm.Operation.Can(fsm.OpStarted, to) {
		// The common case first, in one statement: the operation is started
		// and cmd is its current command. Anything else is decided below
		// from the row as read.
		ended, err := scanWholeOperation(t.QueryRowContext(ctx, t.s.q.OperationFinishCurrent,
			to, res, reason, ms(t.now), cmd.OperationID, cmd.CommandID))
		switch {
		case err == nil:
			t.ended(ended, fsm.OpStarted, cmd, state)
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("operation %s %s → %s: %w", cmd.OperationID, fsm.OpStarted, to, err)
		}
	}
	op, err := getOperationRow(ctx, t, cmd.OperationID)
	if err != nil {
		return err
	}
	deviceFinal := (state == fsm.CmdSucceeded || state == fsm.CmdFailed) && to != fsm.OpFailedRetryable
	superseded := "" // a newer command of the operation that the late outcome makes moot
	switch {
	case op.Status == fsm.OpStarted && op.CommandID == cmd.CommandID:
	case op.Status == fsm.OpFailedRetryable && deviceFinal:
	case op.Status == fsm.OpStarted && late && deviceFinal:
		// A late final receipt of an earlier command: the device did act on
		// this operation, so it decides it, whatever the newer command does.
		superseded = op.CommandID
	default:
		return nil
	}
	if err := fsm.Operation.Transition(op.Status, to); err != nil {
		t.refuse("operation", op.OperationID, string(op.Status), string(to), ReasonIllegal, op.FencingToken)
		return nil
	}
	ch := change{machine: "operation", id: op.OperationID, from: string(op.Status), to: string(to), token: op.FencingToken}
	var ended domain.Operation
	err = t.cas(ctx, ch, func(row rowScanner) (err error) {
		ended, err = scanWholeOperation(row)
		return err
	}, t.s.q.OperationFinish, to, res, reason, ms(t.now), op.OperationID, op.Status, op.Version)
	if errors.Is(err, ErrRefused) {
		return nil // recorded; the operation moved on under us
	}
	if err != nil {
		return err
	}
	t.ended(ended, op.Status, cmd, state)
	if superseded == "" {
		return nil
	}
	return t.supersede(ctx, superseded, cmd.CommandID)
}

// operationResult is the result an operation ends with: its command's
// final one, or none.
func operationResult(result json.RawMessage) any {
	if result == nil {
		return nil
	}
	return string(result)
}

// ended records an operation that finishOperation moved from state from to
// its end: its event, and its fact with the operation as committed (its
// ?wait= callers are answered with it), and wakes whoever waits for it on
// other instances.
func (t *tx) ended(op domain.Operation, from fsm.OperationState, cmd domain.Command, state fsm.CommandState) {
	t.logEvent("operation", op.OperationID, string(from), string(op.Status), "command "+cmd.CommandID+" "+string(state), op.FencingToken)
	t.publish(Fact{Kind: FactChanged, Change: Change{Machine: "operation", ID: op.OperationID, From: string(from),
		To: string(op.Status), At: t.now, Principal: t.principal, Operation: &op}})
	t.wake(WakeOperation, op.OperationID)
}

// supersede cancels an operation's newer command after an earlier one was
// found to have run, if it was never published. A published one is left
// to the device's operation_id rule: it will not run it, and answers with
// the receipt of the one that ran.
func (t *tx) supersede(ctx context.Context, newer, ran string) error {
	c, err := getCommand(ctx, t, newer)
	if err != nil {
		return err
	}
	if c.Attempt > 0 || !fsm.Command.Can(c.Status, fsm.CmdCancelled) {
		return nil // published (or already over): it stays, and its answers change nothing
	}
	ch := change{machine: "command", id: newer, from: string(c.Status), to: string(fsm.CmdCancelled)}
	if err := t.cas(ctx, ch, nil, t.s.q.CommandSupersede,
		fsm.CmdCancelled, fsm.ReasonCancelled, ms(t.now), newer, c.Status, c.Version); err != nil {
		return err
	}
	if err := t.event("command", newer, string(c.Status), string(fsm.CmdCancelled), "superseded: "+ran+" ran", 0); err != nil {
		return err
	}
	t.released(c)
	return nil
}
