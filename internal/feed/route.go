package feed

import (
	"log/slog"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Consumers are the services the controller's facts go to. Each method is
// called inline on the publisher's goroutine and returns at once.
type Consumers struct {
	// Waiters are the ?wait= callers of operations (api.Server): told of
	// an operation committed started here, then of its end, with the
	// operation as committed when the fact carries it, else nil (they read
	// it again); Reset when facts were lost.
	Waiters interface {
		Started(operationID string)
		Changed(operationID string, committed *domain.Operation)
		Reset()
	}
	// Dispatcher decides about the commands this instance holds
	// (command.Dispatcher).
	Dispatcher interface {
		Submitted(commandID string, inserted *store.OpenCommand)
		Kick(commandID string)
		QueueMoved(device string)
	}
	// Scheduler drives rollouts (rollout.Scheduler).
	Scheduler interface {
		Adopt(rolloutID string, token int64)
		Wake(rolloutID string)
	}
	// Tasks drives approved tasks (task.Runner).
	Tasks interface{ Wake(taskID string) }
	// Stream is the dashboard's event stream (events.Bus).
	Stream interface {
		Changed(store.Change)
		Publish(kind, id, status string, at time.Time) uint64
	}
	// Remote hands an operation another instance finished to whoever reads
	// it back for the stream (its wake-up names it, not its status); it
	// must not block either.
	Remote func(operationID string)
	Logger *slog.Logger
}

// Route sends one fact to the consumers that act on it:
//
//	changed operation, left started  → Waiters (with the row as committed, or a read again)
//	changed operation, now started   → Waiters.Started (its waiters need not read it first)
//	changed task, or its step's op   → Tasks (the runner looks at the task)
//	changed, any machine             → Stream (the kinds it carries)
//	remote operation                 → Waiters, Remote (read back for the Stream), Tasks (a step's)
//	due command, new (as inserted)   → Dispatcher.Submitted (its first step reads nothing)
//	due command, other (remote too)  → Dispatcher.Kick (another holder's is dropped there)
//	queue moved (remote too)         → Dispatcher.QueueMoved (its head, read after the commit)
//	rollout, created here (Token)    → Scheduler.Adopt
//	rollout, a person's action       → Scheduler.Wake
//	reset                            → Stream (a reset event), Waiters.Reset, logged
func (c *Consumers) Route(f store.Fact) {
	switch f.Kind {
	case store.FactChanged:
		ch := f.Change
		if ch.Machine == "operation" {
			if task, ok := domain.TaskOf(ch.ID); ok && (f.Remote || ch.To != string(fsm.OpStarted)) {
				c.Tasks.Wake(task) // a step's operation ended: the task goes on
			}
			if f.Remote {
				c.Waiters.Changed(f.ID, nil)
				c.Remote(f.ID)
				return
			}
			if ch.To != string(fsm.OpStarted) {
				c.Waiters.Changed(ch.ID, ch.Operation)
			} else {
				c.Waiters.Started(ch.ID)
			}
		}
		if ch.Machine == "task" {
			c.Tasks.Wake(ch.ID) // an approval, a rejection, the runner's own move
		}
		c.Stream.Changed(ch)
	case store.FactDue:
		if f.Inserted != nil {
			c.Dispatcher.Submitted(f.ID, f.Inserted)
		} else {
			c.Dispatcher.Kick(f.ID)
		}
	case store.FactQueue:
		c.Dispatcher.QueueMoved(f.ID)
	case store.FactRollout:
		if f.Token > 0 {
			c.Scheduler.Adopt(f.ID, f.Token)
		} else {
			c.Scheduler.Wake(f.ID)
		}
	case store.FactReset:
		c.Waiters.Reset()
		if f.Remote {
			c.Logger.Info("wake-ups from other instances may have been missed; the sweeps' polling covers them")
		} else {
			c.Logger.Info("facts from before the controller was built were dropped; the sweeps' polling covers them")
		}
		c.Stream.Publish(events.KindReset, "", "", time.Now())
	}
}
