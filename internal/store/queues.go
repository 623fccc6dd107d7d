package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Per-device ordering and supersede.
//
// A serial command (its action's policy says "concurrency": "serial")
// takes its device's next number (commands.serial_seq) in the transaction
// that inserts it: a submit's, or a retry's new command_id. The number
// comes from the device's row in device_queues, which that transaction
// holds until it commits (on PostgreSQL a row lock, taken in device order
// before the batch's changes run; SQLite has one writer), so on a device
// the numbers follow the order the submits committed in.
//
// The head of a device's queue is its open serial command with the lowest
// number. Only the head is published: the fenced pending → sent write
// (CommandClaimSend) also requires that no open serial command of the
// device has a lower number, so a takeover, a restart or a second
// instance can neither publish two at once nor reorder them; the
// database's condition decides, not a lock in memory. A published command
// stays open, so stays the head, until it is terminal: needs_attention
// holds the device until a person resolves it.
//
// When a serial command ends, the transaction that ends it tells every
// instance through the post-commit feed (FactQueue, a NOTIFY on
// PostgreSQL); each reads the device's new head after the commit and its
// lease holder publishes it at once, not at a poll (see released).
// Commands behind the head are postponed by the dispatcher, reason
// "queued"; their ttl still runs.

// ReasonQueued is a serial command's reason while it waits for the
// commands ahead of it on its device.
const ReasonQueued = "queued"

// ReasonSuperseded is the reason of a command cancelled unpublished by a
// newer operation of the same action on its device (supersede); its
// operation's reason is SupersededBy.
const ReasonSuperseded = "superseded"

// SupersededBy is the reason of an operation superseded by newer.
func SupersededBy(newer string) string { return "superseded_by:" + newer }

// enqueueSerial gives a new serial command of device its number, and
// names the open serial command just ahead of it ("" when it is the head).
func (t *tx) enqueueSerial(ctx context.Context, device string) (seq int64, ahead string, err error) {
	if err := t.QueryRowContext(ctx, t.s.q.QueueNext, device).Scan(&seq); err != nil {
		return 0, "", fmt.Errorf("number a serial command of %s: %w", device, err)
	}
	ahead, err = queueAhead(ctx, t, device, seq)
	return seq, ahead, err
}

// queueAhead names the open serial command of device just ahead of number
// seq, "" when there is none.
func queueAhead(ctx context.Context, q queryer, device string, seq int64) (string, error) {
	var ahead string
	err := q.QueryRowContext(ctx, stmts(q).QueueAhead, device, seq).Scan(&ahead)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("queue of %s: %w", device, err)
	}
	return ahead, nil
}

// released runs when a command ended in this transaction: if it was
// serial, its device's queue moves. The new head is read after the
// commit, not here: a submit committing at the same time on another
// instance may queue a command this transaction cannot see yet, and that
// submit, in turn, may not see this end. Each side reads after its own
// commit (the dispatcher a queued command's state, QueueMoved the head),
// so one of the two reads sees both.
func (t *tx) released(c domain.Command) {
	if c.SerialSeq != 0 {
		t.wake(WakeQueue, c.DeviceID)
	}
}

// QueueHead reads the head of a device's serial queue: its open serial
// command with the lowest number, and whether it was never published;
// ok false when the queue is empty.
func (s *DB) QueueHead(ctx context.Context, device string) (head string, unpublished, ok bool, err error) {
	var attempt int
	err = s.rq.QueryRowContext(ctx, s.q.QueueHead, device).Scan(&head, &attempt)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, false, nil
	}
	if err != nil {
		return "", false, false, fmt.Errorf("head of the queue of %s: %w", device, err)
	}
	return head, attempt == 0, true, nil
}

// supersedeOlder cancels, for a new operation of n's action on n's target,
// every older started operation of the same action on that device whose
// command was never published: the command cancelled (reason superseded),
// the operation failed_final (superseded_by:<n's id>). Not fenced, like a
// person's cancel: the same conditional write (attempt = 0) that a
// publisher's claim races decides, so a command published first runs to
// its end.
func (t *tx) supersedeOlder(ctx context.Context, n NewOperation) error {
	ids, err := queryStrings(ctx, t, t.s.q.QueueSupersedable, n.Target, n.Action, n.OperationID)
	if err != nil {
		return fmt.Errorf("operations %s supersedes: %w", n.OperationID, err)
	}
	for _, id := range ids {
		c, err := getCommand(ctx, t, id)
		if err != nil {
			return err
		}
		if c.Attempt > 0 || !fsm.Command.Can(c.Status, fsm.CmdCancelled) {
			continue // published meanwhile: it runs to its end
		}
		ch := change{machine: "command", id: id, from: string(c.Status), to: string(fsm.CmdCancelled)}
		err = t.cas(ctx, ch, nil, t.s.q.CommandSupersede, fsm.CmdCancelled, ReasonSuperseded, ms(t.now), id, c.Status, c.Version)
		if errors.Is(err, ErrRefused) {
			continue
		}
		if err != nil {
			return err
		}
		if err := t.event("command", id, string(c.Status), string(fsm.CmdCancelled), "superseded by "+n.OperationID, 0); err != nil {
			return err
		}
		c.Status = fsm.CmdCancelled
		if err := t.finishOperation(ctx, c, fsm.CmdCancelled, SupersededBy(n.OperationID), nil, false); err != nil {
			return err
		}
	}
	return nil
}

// queueExplainer explains a refused publish claim: queued (ReasonQueued)
// when the fence held and the command is a serial one with another open
// ahead of it on its device, else as base does.
func (t *tx) queueExplainer(ctx context.Context, commandID string, base func() (string, error)) func() (string, error) {
	return func() (string, error) {
		why, err := base()
		if err != nil || why != ReasonStale {
			return why, err
		}
		c, err := getCommand(ctx, t, commandID)
		if err != nil || c.SerialSeq == 0 || c.Attempt > 0 || c.Status.Terminal() {
			return why, err
		}
		if ahead, err := queueAhead(ctx, t, c.DeviceID, c.SerialSeq); err != nil || ahead == "" {
			return why, err
		}
		return ReasonQueued, nil
	}
}

// DeviceQueue is what GET /v1/devices/{id} shows of a device's commands:
// InFlight, its published commands not yet terminal (serial or not;
// needs_attention included), oldest first; Queued, its serial commands not
// yet published, in the order they will go out.
type DeviceQueue struct {
	InFlight []string
	Queued   []string
}

// DeviceQueue reads a device's commands in flight and queued.
func (s *DB) DeviceQueue(ctx context.Context, device string) (DeviceQueue, error) {
	var q DeviceQueue
	var err error
	if q.InFlight, err = queryStrings(ctx, s.rq, s.q.QueueInFlight, device); err != nil {
		return q, fmt.Errorf("commands in flight on %s: %w", device, err)
	}
	if q.Queued, err = queryStrings(ctx, s.rq, s.q.QueueWaiting, device); err != nil {
		return q, fmt.Errorf("commands queued on %s: %w", device, err)
	}
	return q, nil
}

// QueuedBehind names the open serial command just ahead of c on its
// device while c waits unpublished, "" otherwise.
func (s *DB) QueuedBehind(ctx context.Context, c domain.Command) (string, error) {
	if c.SerialSeq == 0 || c.Attempt > 0 || c.Status.Terminal() {
		return "", nil
	}
	return queueAhead(ctx, s.rq, c.DeviceID, c.SerialSeq)
}
