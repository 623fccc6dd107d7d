package store

import (
	"context"
	"errors"
	"sync"
)

// ErrInstanceRunning: another live process holds this instance id.
var ErrInstanceRunning = errors.New("an instance with this id is already running")

// Kinds of wake-up one instance sends the others when its commit changes
// what they wait on.
const (
	// WakeOperation: an operation left started (its ?wait= callers, wherever
	// they wait, can answer).
	WakeOperation = "op"
	// WakeCommand: a command became due (a receipt asked for a decision, or
	// its device came back): its lease holder decides.
	WakeCommand = "cmd"
	// WakeAll: wake-ups may have been missed (the channel was down): look
	// at everything.
	WakeAll = "all"
)

// Wake is one wake-up from another instance.
type Wake struct {
	Kind string
	ID   string
}

// Instance is this process's exclusive hold on its instance id (an flock
// with SQLite, a session advisory lock with PostgreSQL); while it holds,
// the wake-ups other instances send it go into the store's feed (Config.Feed)
// as remote facts. Close releases both.
type Instance struct {
	ID    string
	feed  Feed // nil: wake-ups are dropped
	lost  chan error
	once  sync.Once
	close func()
}

func newInstance(id string, feed Feed, closeFn func()) *Instance {
	return &Instance{ID: id, feed: feed, lost: make(chan error, 1), close: closeFn}
}

// deliver publishes another instance's wake-up as a remote fact; never with
// SQLite, where instances poll. The feed never blocks; what its consumers
// drop, the sweeps' polling finds.
func (i *Instance) deliver(w Wake) {
	if i.feed == nil {
		return
	}
	switch w.Kind {
	case WakeOperation:
		i.feed.Publish(Fact{Kind: FactChanged, ID: w.ID, Change: Change{Machine: "operation", ID: w.ID}, Remote: true})
	case WakeCommand:
		i.feed.Publish(Fact{Kind: FactDue, ID: w.ID, Remote: true})
	case WakeAll:
		i.feed.Publish(Fact{Kind: FactReset, Remote: true})
	}
}

// Lost receives an error if the hold on the id was lost and could not be
// taken back (another process holds it now), or, with SQLite, once a file
// of the database or the lock left its path (ErrDatabaseLost, guard.go):
// the instance must stop.
func (i *Instance) Lost() <-chan error { return i.lost }

// Close releases the hold.
func (i *Instance) Close() { i.once.Do(i.close) }

func (i *Instance) fail(err error) {
	select {
	case i.lost <- err:
	default:
	}
}

// LockInstance holds the instance id exclusively for this process, or
// returns ErrInstanceRunning while another live process holds it.
func (s *DB) LockInstance(ctx context.Context, id string) (*Instance, error) {
	return s.b.lockInstance(ctx, s, id)
}
