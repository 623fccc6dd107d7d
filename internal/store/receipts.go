package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Receipt effects, as recorded in the receipt log and counted in
// controller_receipts_total{effect}.
const (
	EffectApplied        = "applied"
	EffectDuplicate      = "duplicate"
	EffectStale          = "stale"
	EffectLate           = "late"
	EffectMismatch       = "mismatch"
	EffectUnknownCommand = "unknown_command"
)

// ReceiptOutcome says what one receipt did.
type ReceiptOutcome struct {
	Effect      string
	CommandID   string // the command it was applied to ("" if unknown)
	OperationID string
	From, To    fsm.CommandState // equal when the state did not change
	// Unknown: the device answered a query with "unknown" (it never saw the
	// command); the lease holder may re-send or mint anew.
	Unknown  bool
	Terminal bool // the command is terminal after this receipt
	// Due: the receipt made the command due for the lease holder's
	// decision now: the device never saw it (Unknown), or it had been
	// parked until its expiry (sends and asks used up) and the device now
	// says it has it (an ask, so a lost final receipt is found).
	Due bool
}

// OperationMayChange reports whether the receipt may have changed its
// operation's state: it ended the command, or it was a late outcome (which
// can decide a failed_retryable operation). Progress receipts (received,
// executing) leave the operation as it was.
func (o ReceiptOutcome) OperationMayChange() bool {
	switch o.Effect {
	case EffectApplied:
		return o.Terminal && o.From != o.To
	case EffectLate:
		return true
	}
	return false
}

// ApplyReceipt applies a fact reported by a device, in one transaction
// guarded by the receipt's rank: a receipt moves a command forward only
// (jumps allowed); an equal or lower rank is a duplicate or stale receipt; a
// final receipt after a terminal state is kept as the late outcome. Any
// instance may apply it. device is the device id from the topic.
// beforeCommit runs last inside the transaction (the before-receipt-commit
// failpoint); an error from it records nothing.
func (s *DB) ApplyReceipt(ctx context.Context, device string, r wire.Receipt, beforeCommit func() error) (ReceiptOutcome, error) {
	var out ReceiptOutcome
	err := s.enqueue(ctx, ChangeReceipts, lockCommands(r.CommandID), func(ctx context.Context, t *tx) error {
		var err error
		out, err = t.countedReceipt(ctx, device, r, true, beforeCommit)
		return err
	}, false)
	return out, err
}

// countedReceipt is receipt, counted by its effect among the commit's
// notes ahead of the facts it published: whoever a fact wakes (a ?wait=
// caller) finds the receipt already counted.
func (t *tx) countedReceipt(ctx context.Context, device string, r wire.Receipt, touch bool, beforeCommit func() error) (ReceiptOutcome, error) {
	mark := len(t.notes)
	out, err := t.receipt(ctx, device, r, touch, beforeCommit)
	if err != nil {
		return out, err
	}
	count := func(o Observer) { o.Receipt(out.Effect) }
	t.notes = append(t.notes[:mark], append([]func(Observer){count}, t.notes[mark:]...)...)
	return out, nil
}

// ReceiptResult is one receipt's part in ApplyReceipts: its outcome, and
// nil or the error it alone met (a refusal, or a failure that stopped the
// receipts after it).
type ReceiptResult struct {
	Out ReceiptOutcome
	Err error
}

// ApplyReceipts applies receipts of one device, in their order, as one
// change of the writer's batch: receipts that arrived together share a
// commit instead of waiting for one each. Each is applied as ApplyReceipt
// would: first all in one run (receiptsTogether); when one of them fails,
// the change runs again (errRunCarefully) with a savepoint for each
// (receiptsOneByOne), so a refused or failing receipt is rolled back alone. A refused receipt is recorded and
// the next one applied; any other failure stops there (the results end with
// it), so that a command's receipts are never applied out of their order:
// the caller tries that one and the rest again. An error (the batch failed,
// or ctx ended) means none of them was applied.
func (s *DB) ApplyReceipts(ctx context.Context, device string, rs []wire.Receipt, beforeCommit func() error) ([]ReceiptResult, error) {
	if len(rs) == 1 {
		out, err := s.ApplyReceipt(ctx, device, rs[0], beforeCommit)
		if err != nil && !errors.Is(err, ErrRefused) {
			return nil, err
		}
		return []ReceiptResult{{Out: out, Err: err}}, nil
	}
	var res []ReceiptResult
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.CommandID
	}
	err := s.enqueue(ctx, ChangeReceipts, lockCommands(ids...), func(ctx context.Context, t *tx) error {
		var err error
		if t.careful {
			res, err = t.receiptsOneByOne(ctx, device, rs, beforeCommit)
		} else {
			res, err = t.receiptsTogether(ctx, device, rs, beforeCommit)
		}
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Err == nil {
				return t.touchDevice(device) // once for the group: they share the time
			}
		}
		return nil
	}, false)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// receiptsTogether applies a device's group in one run, without
// savepoints; a run of one command's receipts that each move it forward is
// one write (advanceRun). A receipt that fails makes the change run again
// one by one (errRunCarefully).
func (t *tx) receiptsTogether(ctx context.Context, device string, rs []wire.Receipt, beforeCommit func() error) ([]ReceiptResult, error) {
	res := make([]ReceiptResult, 0, len(rs))
	for len(rs) > 0 {
		n := 1
		for n < len(rs) && rs[n].CommandID == rs[0].CommandID && rs[n].QueryID == "" && rs[0].QueryID == "" {
			n++
		}
		var outs []ReceiptOutcome
		var err error
		if n > 1 {
			outs, err = t.advanceRun(ctx, device, rs[:n], beforeCommit)
		}
		if err == nil && outs == nil { // not such a run: the first alone
			var out ReceiptOutcome
			out, err = t.countedReceipt(ctx, device, rs[0], false, beforeCommit)
			outs = []ReceiptOutcome{out}
		}
		if err != nil {
			if t.s.d.EndsTransaction(err) || t.s.d.Conflict(err) {
				return nil, err
			}
			return nil, errRunCarefully
		}
		for _, out := range outs {
			res = append(res, ReceiptResult{Out: out})
		}
		rs = rs[len(outs):]
	}
	return res, nil
}

// receiptsOneByOne applies a device's group with a savepoint for each
// receipt: a refused one is recorded and the next applied; any other
// failure stops there.
func (t *tx) receiptsOneByOne(ctx context.Context, device string, rs []wire.Receipt, beforeCommit func() error) ([]ReceiptResult, error) {
	res := make([]ReceiptResult, 0, len(rs))
	for _, r := range rs {
		var out ReceiptOutcome
		rerr, err := t.savepoint(ctx, "receipt", func() error {
			var err error
			out, err = t.countedReceipt(ctx, device, r, false, beforeCommit)
			return err
		}, nil)
		if err != nil {
			return nil, err
		}
		res = append(res, ReceiptResult{Out: out, Err: rerr})
		if rerr != nil && !errors.Is(rerr, ErrRefused) {
			break
		}
	}
	return res, nil
}

// advanceRun applies receipts of one command that arrived together, each
// of a higher rank than the one before and each a legal move, as they
// would be one after the other, but with one write of the command (and no
// read, when it is in the state expected before the first:
// advanceExpected): no one outside the transaction could see the states
// between. Each receipt keeps its event, its line in the receipt log, its
// count and its hook; the last state is written under the state and rank
// read. It returns nil (and writes nothing) for receipts that are not such
// a run.
func (t *tx) advanceRun(ctx context.Context, device string, rs []wire.Receipt, beforeCommit func() error) ([]ReceiptOutcome, error) {
	c, outs, f, err := t.advanceExpected(ctx, device, rs)
	if err != nil {
		return nil, err
	}
	if outs == nil {
		if c, err = getCommand(ctx, t, rs[0].CommandID); errors.Is(err, domain.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if c.DeviceID != device {
			return nil, nil
		}
		if outs = runMoves(c.Status, c.StatusRank, rs); outs == nil {
			return nil, nil
		}
		for _, r := range rs {
			if r.OperationID != "" && r.OperationID != c.OperationID {
				return nil, nil
			}
		}
		last := rs[len(rs)-1]
		final := outs[len(outs)-1].To
		reason, result := outcomeOf(final, last)
		err = t.cas(ctx, change{machine: "command", id: c.CommandID, from: string(c.Status), to: string(final)}, nil,
			t.s.q.CommandAdvance, final, fsm.ReceiptRank(last.Status), last.Seq, reason, result, c.ExecutedAs, ms(t.now),
			c.CommandID, c.Status, fsm.ReceiptRank(last.Status))
		if err != nil {
			return nil, err // refused too: the change runs again one by one
		}
	}
	for k := range outs {
		outs[k].CommandID, outs[k].OperationID = c.CommandID, c.OperationID
	}
	from := outs[len(outs)-1].To
	last := rs[len(rs)-1]
	reason, _ := outcomeOf(from, last)
	mark := len(t.notes)
	for k, r := range rs {
		if err := t.event("command", c.CommandID, string(outs[k].From), string(outs[k].To), "receipt "+string(r.Status), 0); err != nil {
			return nil, err
		}
	}
	if from.Terminal() {
		c.Status = from
		if err := t.finishOperationAfter(ctx, c, from, reason, last.Result, false, f); err != nil {
			return nil, err
		}
	} else if parked(c) {
		out := &outs[len(outs)-1]
		if out.Due, err = t.unpark(c.CommandID); err != nil {
			return nil, err
		}
		if out.Due {
			t.wake(WakeCommand, c.CommandID)
		}
	}
	counts := make([]func(Observer), len(rs))
	for k, r := range rs {
		if err := t.logReceipt(c.CommandID, "", device, r, EffectApplied); err != nil {
			return nil, err
		}
		counts[k] = func(o Observer) { o.Receipt(EffectApplied) }
	}
	// Counted ahead of the facts the run published, as countedReceipt does.
	t.notes = append(t.notes[:mark], append(counts, t.notes[mark:]...)...)
	if beforeCommit != nil {
		for range rs {
			if err := t.hook(beforeCommit); err != nil {
				return nil, err
			}
		}
	}
	return outs, nil
}

// expectedBefore is the state a command is in when a receipt of status st
// arrives on the common path: the publish was committed before the device
// could answer, and a device reports received, executing and its outcome
// in that order.
func expectedBefore(st wire.ReceiptStatus) (fsm.CommandState, bool) {
	switch st {
	case wire.ReceiptReceived:
		return fsm.CmdSent, true
	case wire.ReceiptExecuting:
		return fsm.CmdReceived, true
	case wire.ReceiptSucceeded, wire.ReceiptFailed:
		return fsm.CmdExecuting, true
	}
	return "", false
}

// runMoves is the outcome of each of rs applied one after the other to a
// command in state from at rank: each of a higher rank than the one before
// and a legal move from the state before it. Nil when they are not such a
// run. The outcomes lack the command's ids.
func runMoves(from fsm.CommandState, rank int, rs []wire.Receipt) []ReceiptOutcome {
	outs := make([]ReceiptOutcome, len(rs))
	for k, r := range rs {
		to, ok := fsm.CommandStateForReceipt(r.Status)
		next := fsm.ReceiptRank(r.Status)
		if !ok || r.QueryID != "" || from.Terminal() || next <= rank || !fsm.Command.Can(from, to) {
			return nil
		}
		outs[k] = ReceiptOutcome{Effect: EffectApplied, From: from, To: to, Terminal: to.Terminal()}
		from, rank = to, next
	}
	return outs
}

// advanceExpected applies rs, receipts of one command on device, in one
// statement (CommandAdvanceFrom) when the command is in the state expected
// before the first of them: it skips the read that applyReceipt and
// advanceRun decide from. The statement's conditions are what they would
// check on that row (the state, a lower rank, the device, the operation),
// so the outcome is theirs. When the run ends the command and the backend
// writes two tables in one statement, the same statement ends the
// operation in finishOperation's common case (CommandAdvanceFinish), one
// round trip instead of two on PostgreSQL. It returns the command as it is
// after the change, each receipt's outcome (without the command's ids) and
// what the statement did to the operation; no outcomes when the command
// was not in that state, or rs are not a run that moves it forward, and
// then nothing was written.
func (t *tx) advanceExpected(ctx context.Context, device string, rs []wire.Receipt) (domain.Command, []ReceiptOutcome, finishTry, error) {
	from, ok := expectedBefore(rs[0].Status)
	if !ok {
		return domain.Command{}, nil, finishTry{}, nil
	}
	outs := runMoves(from, fsm.RankNone-1, rs) // the first's rank is the statement's
	if outs == nil {
		return domain.Command{}, nil, finishTry{}, nil
	}
	op := ""
	for _, r := range rs {
		if r.OperationID != "" && op != "" && r.OperationID != op {
			return domain.Command{}, nil, finishTry{}, nil
		}
		if r.OperationID != "" {
			op = r.OperationID
		}
	}
	last := rs[len(rs)-1]
	to := outs[len(outs)-1].To
	reason, result := outcomeOf(to, last)
	args := []any{to, fsm.ReceiptRank(last.Status), last.Seq, reason, result, ms(t.now),
		rs[0].CommandID, from, fsm.ReceiptRank(rs[0].Status), device, op}
	var cr commandRow
	var f finishTry
	var err error
	if opTo, ok := fsm.OperationOutcome(to, reason); ok && t.s.caps.WritesTogether && fsm.Operation.Can(fsm.OpStarted, opTo) {
		// The command's end and its operation's in one statement.
		var or operationRow
		err = t.QueryRowContext(ctx, t.s.q.CommandAdvanceFinish, append(args, opTo, operationResult(last.Result))...).
			Scan(append(append(cr.dests(), &f.ended), or.wholeDests()...)...)
		f.tried = true
		if f.ended {
			f.op = or.wholeOperation()
		}
	} else {
		err = t.QueryRowContext(ctx, t.s.q.CommandAdvanceFrom, args...).Scan(cr.dests()...)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Command{}, nil, finishTry{}, nil
	}
	if err != nil {
		return domain.Command{}, nil, finishTry{}, fmt.Errorf("command %s %s → %s: %w", rs[0].CommandID, from, to, err)
	}
	return cr.command(), outs, f, nil
}

// receipt is the change of one receipt: applied, its wake-up noted, its
// device touched unless the caller does (once for a device's group), then
// beforeCommit.
func (t *tx) receipt(ctx context.Context, device string, r wire.Receipt, touch bool, beforeCommit func() error) (ReceiptOutcome, error) {
	out, err := t.applyReceipt(ctx, device, r)
	if err != nil {
		return out, err
	}
	if out.Due {
		t.wake(WakeCommand, out.CommandID) // its holder may be another instance
	}
	if touch {
		if err := t.touchDevice(device); err != nil {
			return out, err
		}
	}
	if beforeCommit != nil {
		return out, t.hook(beforeCommit)
	}
	return out, nil
}

func (t *tx) applyReceipt(ctx context.Context, device string, r wire.Receipt) (ReceiptOutcome, error) {
	// A query's answer applies to the command that was asked about, which
	// may differ from the command that ran (executed_as).
	target := r.CommandID
	if r.QueryID != "" {
		var asked string
		err := t.QueryRowContext(ctx, t.s.q.QueryCommand, r.QueryID).Scan(&asked)
		switch {
		case err == nil:
			target = asked
			if _, err := t.Exec(t.s.q.QueryAnswer,
				ms(t.now), r.Status, r.QueryID); err != nil {
				return ReceiptOutcome{}, fmt.Errorf("answer query %s: %w", r.QueryID, err)
			}
		case !errors.Is(err, sql.ErrNoRows):
			return ReceiptOutcome{}, fmt.Errorf("read query %s: %w", r.QueryID, err)
		}
	}
	if r.QueryID == "" {
		if out, ok, err := t.receiptExpected(ctx, device, r); ok || err != nil {
			return out, err
		}
	}
	out := ReceiptOutcome{CommandID: target, OperationID: r.OperationID}
	c, err := getCommand(ctx, t, target)
	if errors.Is(err, domain.ErrNotFound) {
		out.Effect, out.CommandID = EffectUnknownCommand, ""
		return out, t.logReceipt(target, "", device, r, out.Effect)
	}
	if err != nil {
		return out, err
	}
	out.OperationID, out.From, out.To, out.Terminal = c.OperationID, c.Status, c.Status, c.Status.Terminal()
	sentAs := ""
	if r.CommandID != target {
		sentAs = r.CommandID
	}
	if c.DeviceID != device || (r.OperationID != "" && r.OperationID != c.OperationID) ||
		(sentAs != "" && r.OperationID != c.OperationID) {
		out.Effect = EffectMismatch
		return out, t.logReceipt(target, sentAs, device, r, out.Effect)
	}
	if r.QueryID != "" && r.QueryID == c.LastQueryID {
		if _, err := t.Exec(t.s.q.CommandLastAnswer, r.Status, target); err != nil {
			return out, fmt.Errorf("record answer of %s: %w", target, err)
		}
	}

	rank := fsm.ReceiptRank(r.Status)
	switch {
	case r.Status == wire.ReceiptUnknown:
		// The device never saw the command (nor another of its operation):
		// information for the lease holder, not a state change. It also
		// answers a retry's question about a terminal command.
		out.Effect, out.Unknown = EffectApplied, true
		if c.StatusRank > fsm.RankNone {
			// The device said more than "unknown" before: an old or stray answer.
			out.Effect, out.Unknown = EffectStale, false
		} else if _, err := t.Exec(t.s.q.CommandDueNow, ms(t.now), target); err != nil {
			return out, fmt.Errorf("wake %s: %w", target, err)
		} else {
			out.Due = true
		}
	case c.Status.Terminal():
		out.Effect, err = t.lateReceipt(ctx, c, r)
		if err != nil {
			return out, err
		}
	case rank <= c.StatusRank:
		out.Effect = EffectStale
		if rank == c.StatusRank {
			out.Effect = EffectDuplicate
		}
	default:
		out.Effect, out.To, err = t.advance(ctx, c, r, rank, sentAs)
		if err != nil {
			return out, err
		}
		out.Terminal = out.To.Terminal()
		// Only a parked command (its next check at its expiry, as read
		// in this transaction) has anything to unpark.
		if out.Effect == EffectApplied && !out.Terminal && parked(c) {
			if out.Due, err = t.unpark(target); err != nil {
				return out, err
			}
		}
	}
	return out, t.logReceipt(target, sentAs, device, r, out.Effect)
}

// receiptExpected is applyReceipt in one write when the receipt's command
// is in the state expected before it (advanceExpected); ok false: it was
// not, nothing was written, and applyReceipt reads the command and decides.
func (t *tx) receiptExpected(ctx context.Context, device string, r wire.Receipt) (out ReceiptOutcome, ok bool, err error) {
	c, outs, f, err := t.advanceExpected(ctx, device, []wire.Receipt{r})
	if err != nil || outs == nil {
		return ReceiptOutcome{}, false, err
	}
	out = outs[0]
	out.CommandID, out.OperationID = c.CommandID, c.OperationID
	reason, _ := outcomeOf(out.To, r)
	c.Status = out.From // as it was before
	if err := t.advanced(ctx, c, out.To, r, reason, f); err != nil {
		return out, true, err
	}
	if !out.Terminal && parked(c) {
		if out.Due, err = t.unpark(c.CommandID); err != nil {
			return out, true, err
		}
	}
	return out, true, t.logReceipt(c.CommandID, "", device, r, out.Effect)
}

// parked reports whether c, as read in this transaction, was parked until
// its expiry (sends and asks used up): a receipt that moves it on makes it
// due (unpark).
func parked(c domain.Command) bool { return !c.NextCheckAt.Before(c.ExpiresAt) }

// unpark makes a command parked until its expiry due now: the device's
// progress changes what the lease holder would decide.
func (t *tx) unpark(commandID string) (bool, error) {
	r, err := t.Exec(t.s.q.CommandUnpark, ms(t.now), commandID)
	if err != nil {
		return false, fmt.Errorf("unpark %s: %w", commandID, err)
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

// advance moves a non-terminal command forward to the receipt's state,
// guarded by rank, and ends the operation when the command ends.
func (t *tx) advance(ctx context.Context, c domain.Command, r wire.Receipt, rank int, sentAs string) (string, fsm.CommandState, error) {
	to, _ := fsm.CommandStateForReceipt(r.Status)
	if !fsm.Command.Can(c.Status, to) {
		// needs_attention learns of progress but only a final receipt moves it.
		to = c.Status
	}
	reason, result := outcomeOf(to, r)
	executedAs := c.ExecutedAs
	if sentAs != "" {
		executedAs = sentAs
	}
	ch := change{machine: "command", id: c.CommandID, from: string(c.Status), to: string(to)}
	err := t.cas(ctx, ch, nil, t.s.q.CommandAdvance,
		to, rank, r.Seq, reason, result, executedAs, ms(t.now), c.CommandID, c.Status, rank)
	if errors.Is(err, ErrRefused) {
		return EffectStale, c.Status, nil
	}
	if err != nil {
		return "", "", err
	}
	if err := t.advanced(ctx, c, to, r, reason, finishTry{}); err != nil {
		return "", "", err
	}
	return EffectApplied, to, nil
}

// advanced records a receipt that moved command c (as it was before) to
// state to, and ends its operation when the command ended (after f, what
// the statement that moved it did to the operation).
func (t *tx) advanced(ctx context.Context, c domain.Command, to fsm.CommandState, r wire.Receipt, reason string, f finishTry) error {
	why := "receipt " + string(r.Status)
	if r.QueryID != "" {
		why += " (query " + r.QueryID + ")"
	}
	if err := t.event("command", c.CommandID, string(c.Status), string(to), why, 0); err != nil {
		return err
	}
	if !to.Terminal() {
		return nil
	}
	c.Status = to
	return t.finishOperationAfter(ctx, c, to, reason, r.Result, false, f)
}

// lateReceipt keeps a receipt that arrives after a terminal state: a final
// one becomes the late outcome (once; the terminal state is never
// rewritten), and decides a failed_retryable operation. A final receipt
// that repeats what is known (the device's own final receipt, or the late
// outcome) is a duplicate; one that contradicts it (another status, another
// result or error) sets late_conflict and is kept, never filed as a duplicate.
func (t *tx) lateReceipt(ctx context.Context, c domain.Command, r wire.Receipt) (string, error) {
	if !r.Status.Final() {
		return EffectStale, nil
	}
	deviceState, _ := fsm.CommandStateForReceipt(r.Status)
	fromDevice := (c.Status == fsm.CmdSucceeded || c.Status == fsm.CmdFailed) && c.ResolvedBy == "" && c.StatusRank == fsm.RankFinal
	var known bool // something final is on record to compare with
	var conflict bool
	switch {
	case fromDevice: // compared with the device's own final receipt
		known = true
		conflict = deviceState != c.Status ||
			(deviceState == fsm.CmdSucceeded && !sameJSON(c.Result, r.Result)) ||
			(deviceState == fsm.CmdFailed && c.Reason != failureReason(r))
	case c.LateOutcome != "": // compared with the first late outcome
		known = true
		conflict = c.LateOutcome != string(r.Status) || !sameJSON(c.LateResult, r.Result)
	default:
		conflict = c.ResolvedBy != "" && deviceState != c.Status
	}
	if known && !conflict {
		return EffectDuplicate, nil
	}
	var result any
	if len(r.Result) > 0 {
		result = string(r.Result)
	}
	if known {
		// A contradiction: flagged, and kept in the receipt log; the first
		// late outcome stays as it was.
		if _, err := t.Exec(t.s.q.CommandLateConflict, ms(t.now), c.CommandID); err != nil {
			return "", fmt.Errorf("flag late conflict of %s: %w", c.CommandID, err)
		}
		return EffectLate, t.event("command", c.CommandID, string(c.Status), string(c.Status), "late conflict "+string(r.Status), 0)
	}
	if _, err := t.Exec(t.s.q.CommandLateOutcome,
		r.Status, result, conflict, fsm.RankFinal, ms(t.now), c.CommandID); err != nil {
		return "", fmt.Errorf("record late outcome of %s: %w", c.CommandID, err)
	}
	if err := t.event("command", c.CommandID, string(c.Status), string(c.Status), "late "+string(r.Status), 0); err != nil {
		return "", err
	}
	reason := ""
	if deviceState == fsm.CmdFailed {
		reason = r.Error
	}
	if err := t.finishOperation(ctx, c, deviceState, reason, r.Result, true); err != nil {
		return "", err
	}
	return EffectLate, nil
}

// outcomeOf is what a receipt that moves a command to "to" writes besides
// the state: a failure's reason, a final receipt's result (nil: none).
func outcomeOf(to fsm.CommandState, r wire.Receipt) (reason string, result any) {
	if to == fsm.CmdFailed {
		reason = failureReason(r)
	}
	if r.Status.Final() && len(r.Result) > 0 {
		result = string(r.Result)
	}
	return reason, result
}

// failureReason is the reason a failed or rejected receipt gives a command.
func failureReason(r wire.Receipt) string {
	if r.Error != "" {
		return r.Error
	}
	return string(r.Status)
}

// sameJSON reports whether two results are the same JSON value (absent and
// null count as the same).
func sameJSON(a, b json.RawMessage) bool {
	ca, errA := canonicalResult(a)
	cb, errB := canonicalResult(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

func canonicalResult(v json.RawMessage) ([]byte, error) {
	if t := bytes.TrimSpace(v); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, nil
	}
	return jcs.Canonicalize(v)
}

func (t *tx) logReceipt(commandID, sentAs, device string, r wire.Receipt, effect string) error {
	var result any
	if len(r.Result) > 0 {
		result = string(r.Result)
	}
	at := ""
	if !r.At.IsZero() {
		at = r.At.UTC().Format(time.RFC3339Nano)
	}
	// Written with the batch's other receipt rows (insertReceipts), if the
	// change stands: nothing in a change reads the log.
	t.receipts = append(t.receipts, []any{
		commandID, sentAs, device, r.OperationID, r.Status, r.Seq, at, ms(t.now), r.QueryID, effect, r.Error, result, t.instance})
	return nil
}
