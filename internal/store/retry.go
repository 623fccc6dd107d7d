package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// startRetry turns a failed_retryable operation back to started under the
// retrying instance's lease (a new token), with retry_until bounding the
// question about its last command.
func (t *tx) startRetry(ctx context.Context, op domain.Operation, owner string, leaseTTL, retryFor time.Duration) error {
	now := ms(t.now)
	ch := change{machine: "operation", id: op.OperationID, from: string(op.Status), to: string(fsm.OpStarted), token: op.FencingToken}
	// A new token: the row is locked as a takeover locks it (tokenLock),
	// after any decision whose fence holds it (see fencedCommand).
	if err := t.cas(ctx, ch, nil, t.s.q.OperationStartRetry,
		fsm.OpStarted, owner, ms(t.now.Add(leaseTTL)), ms(t.now.Add(retryFor)), now, op.OperationID, fsm.OpFailedRetryable, op.Version); err != nil {
		return err
	}
	// The retry asks afresh: what the device said before does not count.
	if _, err := t.Exec(t.s.q.CommandRetryAsk,
		now, op.CommandID); err != nil {
		return fmt.Errorf("retry operation %s: %w", op.OperationID, err)
	}
	return t.event("operation", op.OperationID, string(fsm.OpFailedRetryable), string(fsm.OpStarted),
		"retry: asking about "+op.CommandID, op.FencingToken+1)
}

// operationDecision is the change of a fenced decision about an operation.
func (t *tx) operationDecision(ctx context.Context, op domain.Operation, to fsm.OperationState, f domain.Fence) change {
	return change{machine: "operation", id: op.OperationID, from: string(op.Status), to: string(to), token: f.Token,
		explain: t.fenceExplainer(ctx, t.s.q.OperationFenceHeld, op.OperationID, f)}
}

// Retrying is an operation whose retry is asking about its last command.
type Retrying struct {
	Operation  domain.Operation
	RetryUntil time.Time
	Last       domain.Command
}

// RetryingOf returns the retrying operation whose current command is
// commandID, owned by owner; domain.ErrNotFound if there is none.
func (s *DB) RetryingOf(ctx context.Context, commandID, owner string) (Retrying, error) {
	var opID string
	var until int64
	err := s.rq.QueryRowContext(ctx, s.q.OperationRetrying, commandID, owner).Scan(&opID, &until)
	if errors.Is(err, sql.ErrNoRows) {
		return Retrying{}, fmt.Errorf("retrying operation of %s: %w", commandID, domain.ErrNotFound)
	}
	if err != nil {
		return Retrying{}, fmt.Errorf("retrying operation of %s: %w", commandID, err)
	}
	op, err := getOperation(ctx, s.rq, opID)
	if err != nil {
		return Retrying{}, err
	}
	last, err := getCommand(ctx, s.rq, commandID)
	if err != nil {
		return Retrying{}, err
	}
	return Retrying{Operation: op, RetryUntil: fromMS(until), Last: last}, nil
}

// RetryingCommands lists the current command ids of owner's retrying operations.
func (s *DB) RetryingCommands(ctx context.Context, owner string, limit int) ([]string, error) {
	return queryStrings(ctx, s.rq, s.q.OperationRetryingCommands, owner, limit)
}

// MintCommand gives a retrying operation a new command_id (the last one is
// known not to run: the device answered unknown or rejected, or it was never
// published). Fenced like every decision. A serial one goes to the back of
// its device's queue: a retry is a new submit of an old intent.
func (s *DB) MintCommand(ctx context.Context, r Retrying, f domain.Fence, commandID string, ttl time.Duration, qos int, serial bool) error {
	var locks rowLocks
	if serial {
		locks.queues = []string{r.Operation.Target}
	}
	return s.writeLocking(ctx, locks, func(ctx context.Context, t *tx) error {
		op := r.Operation
		if err := t.cas(ctx, t.operationDecision(ctx, op, fsm.OpStarted, f), nil,
			s.q.OperationMintCommand,
			append([]any{commandID, ms(t.now), op.OperationID, fsm.OpStarted, op.Version}, fenceArgs(f, t.now)...)...); err != nil {
			return err
		}
		if err := t.event("operation", op.OperationID, string(fsm.OpStarted), string(fsm.OpStarted),
			fmt.Sprintf("retry: new command %s (last %s answered %q)", commandID, r.Last.CommandID, r.Last.LastAnswer), f.Token); err != nil {
			return err
		}
		_, err := insertCommand(ctx, t, commandID, op.OperationID, op.Target, op.Action, op.Params, ttl, qos, serial, nil, time.Time{}, nil)
		return err
	})
}

// AbandonRetry puts a retrying operation back to failed_retryable (no
// answer about its last command within the retry window). Fenced.
func (s *DB) AbandonRetry(ctx context.Context, r Retrying, f domain.Fence, reason string) error {
	return s.write(ctx, func(ctx context.Context, t *tx) error {
		op := r.Operation
		if err := t.cas(ctx, t.operationDecision(ctx, op, fsm.OpFailedRetryable, f), nil,
			s.q.OperationAbandonRetry,
			append([]any{fsm.OpFailedRetryable, reason, ms(t.now), op.OperationID, fsm.OpStarted, op.Version}, fenceArgs(f, t.now)...)...); err != nil {
			return err
		}
		return t.event("operation", op.OperationID, string(fsm.OpStarted), string(fsm.OpFailedRetryable), reason, f.Token)
	})
}

// Cancel cancels a command that was never published (pending or
// waiting_device with attempt 0); its operation fails final. A command ever
// published gets domain.ErrAlreadyPublished; a cancel of a cancelled command is a
// replay (no error). Not fenced: an operator's decision from any instance,
// decided by the same conditional write the publisher's claim races.
func (s *DB) Cancel(ctx context.Context, commandID, who string) (domain.Command, error) {
	var out domain.Command
	err := s.writeLocking(ctx, lockCommands(commandID), func(ctx context.Context, t *tx) error {
		t.by(who)
		var from fsm.CommandState
		var err error
		if out, from, err = t.cancel(ctx, commandID, who); err != nil || from == "" {
			return err
		}
		return t.audit(ActCancel, EntityCommand, commandID, map[string]any{"operation_id": out.OperationID, "from": from})
	})
	return out, err
}

// cancel is Cancel inside a transaction (a rollout's end cancels its
// unpublished commands together with its own change). from is the state
// it cancelled the command from, "" when it was cancelled already.
func (t *tx) cancel(ctx context.Context, commandID, who string) (out domain.Command, from fsm.CommandState, err error) {
	c, err := getCommand(ctx, t, commandID)
	if err != nil {
		return out, "", err
	}
	switch {
	case c.Status == fsm.CmdCancelled:
		return c, "", nil
	case c.Attempt > 0:
		t.refuse("command", commandID, string(c.Status), string(fsm.CmdCancelled), "already_published", 0)
		return out, "", fmt.Errorf("cancel %s (%s, %d publishes): %w", commandID, c.Status, c.Attempt, domain.ErrAlreadyPublished)
	case !fsm.Command.Can(c.Status, fsm.CmdCancelled):
		t.refuse("command", commandID, string(c.Status), string(fsm.CmdCancelled), ReasonIllegal, 0)
		return out, "", fmt.Errorf("cancel %s in state %s: %w", commandID, c.Status, domain.ErrIllegalState)
	}
	ch := change{machine: "command", id: commandID, from: string(c.Status), to: string(fsm.CmdCancelled)}
	if err := t.cas(ctx, ch, scanInto(&out), t.s.q.CommandCancel,
		fsm.CmdCancelled, fsm.ReasonCancelled, ms(t.now), commandID, c.Status, c.Version); err != nil {
		return out, "", err
	}
	if err := t.event("command", commandID, string(c.Status), string(fsm.CmdCancelled), "cancelled by "+who, 0); err != nil {
		return out, "", err
	}
	return out, c.Status, t.finishOperation(ctx, out, fsm.CmdCancelled, fsm.ReasonCancelled, nil, false)
}

// ResolveOutcome says what a resolve did.
type ResolveOutcome struct {
	Command domain.Command
	Replay  bool // the same resolve again
	Lost    bool // a final receipt settled it first: kept as its late outcome
}

// Resolve records a person's resolution of a needs_attention command
// (succeeded or failed, with a note), which finishes the operation. A resolve
// that races a final receipt: the first wins; a resolve that lost is kept as
// the late outcome, with late_conflict when the two disagree.
func (s *DB) Resolve(ctx context.Context, commandID string, outcome fsm.CommandState, note, who string) (ResolveOutcome, error) {
	var out ResolveOutcome
	if outcome != fsm.CmdSucceeded && outcome != fsm.CmdFailed {
		return out, fmt.Errorf("resolve outcome %q: want succeeded or failed: %w", outcome, domain.ErrIllegalState)
	}
	err := s.writeLocking(ctx, lockCommands(commandID), func(ctx context.Context, t *tx) error {
		t.by(who)
		c, err := getCommand(ctx, t, commandID)
		if err != nil {
			return err
		}
		switch {
		case c.ResolvedBy != "" && c.Status == outcome:
			out = ResolveOutcome{Command: c, Replay: true}
			return nil
		case (c.Status == fsm.CmdSucceeded || c.Status == fsm.CmdFailed) && c.ResolvedBy == "" && c.LateOutcome == "":
			// The device's final receipt won the race.
			if _, err := t.Exec(s.q.CommandLateResolve,
				"resolved "+string(outcome), outcome != c.Status, ms(t.now), commandID); err != nil {
				return fmt.Errorf("record lost resolve of %s: %w", commandID, err)
			}
			if err := t.event("command", commandID, string(c.Status), string(c.Status), "late resolve "+string(outcome)+" by "+who, 0); err != nil {
				return err
			}
			out.Lost = true
			if out.Command, err = getCommand(ctx, t, commandID); err != nil {
				return err
			}
			return t.audit(ActResolve, EntityCommand, commandID, map[string]any{"operation_id": c.OperationID,
				"outcome": outcome, "note": note, "late": true, "status": c.Status})
		case c.Status != fsm.CmdNeedsAttention:
			t.refuse("command", commandID, string(c.Status), string(outcome), ReasonIllegal, 0)
			return fmt.Errorf("resolve %s in state %s: %w", commandID, c.Status, domain.ErrIllegalState)
		}
		ch := change{machine: "command", id: commandID, from: string(c.Status), to: string(outcome)}
		if err := t.cas(ctx, ch, scanInto(&out.Command), s.q.CommandResolve,
			outcome, note, who, ms(t.now), commandID, fsm.CmdNeedsAttention, c.Version); err != nil {
			return err
		}
		if err := t.event("command", commandID, string(c.Status), string(outcome), "resolved by "+who+": "+note, 0); err != nil {
			return err
		}
		var result json.RawMessage
		if outcome == fsm.CmdSucceeded {
			result, _ = json.Marshal(map[string]string{"resolved_by": who, "note": note})
		}
		reason := ""
		if outcome == fsm.CmdFailed {
			reason = "resolved: " + note
		}
		if err := t.audit(ActResolve, EntityCommand, commandID, map[string]any{"operation_id": c.OperationID,
			"outcome": outcome, "note": note}); err != nil {
			return err
		}
		return t.finishOperation(ctx, out.Command, outcome, reason, result, false)
	})
	return out, err
}
