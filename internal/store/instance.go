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
// with SQLite, a session advisory lock with PostgreSQL) and the wake-ups
// other instances send it. Close releases both.
type Instance struct {
	ID    string
	wakes chan Wake
	lost  chan error
	once  sync.Once
	close func()
}

func newInstance(id string, wakes chan Wake, closeFn func()) *Instance {
	return &Instance{ID: id, wakes: wakes, lost: make(chan error, 1), close: closeFn}
}

// Wakes delivers other instances' wake-ups; never with SQLite, where
// instances poll. A wake-up that finds the channel full is dropped: the
// sweeps' polling is the fallback.
func (i *Instance) Wakes() <-chan Wake { return i.wakes }

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
