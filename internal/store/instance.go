package store

import (
	"context"
	"strings"
	"sync"

	"github.com/fleetctl/fleetctl/internal/store/driver"
)

// ErrInstanceRunning: another live process holds this instance id.
var ErrInstanceRunning = driver.ErrInstanceRunning

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
	// WakeQueue: a serial command of the device ended: its queue's new
	// head, read after the commit, is due (queues.go).
	WakeQueue = "queue"
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
	case WakeQueue:
		i.feed.Publish(Fact{Kind: FactQueue, ID: w.ID, Remote: true})
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
// returns ErrInstanceRunning while another live process holds it. A file
// the hold keeps (SQLite's lock beside the database) is guarded with the
// database's files (guard.go): Lost fires when any of them left its path.
func (s *DB) LockInstance(ctx context.Context, id string) (*Instance, error) {
	var feed Feed
	if s.caps.Notifications {
		feed = s.feed
	}
	inst := newInstance(id, feed, nil)
	h, err := s.d.LockInstance(ctx, s.dsn, id, driver.HoldEvents{
		Notification: func(payload string) {
			if w, ok := parseWake(payload, id); ok {
				inst.deliver(w)
			}
		},
		Missed: func() { inst.deliver(Wake{Kind: WakeAll}) }, // what was sent meanwhile is lost
		Lost:   inst.fail,
	})
	if err != nil {
		return nil, err
	}
	var added []string
	for _, f := range h.Files {
		if err := s.files.add(f.What, f.Path, f.Open); err != nil {
			for _, p := range added {
				s.files.remove(p)
			}
			h.Release()
			return nil, err
		}
		added = append(added, f.Path)
	}
	if len(added) == 0 {
		inst.close = h.Release
		return inst, nil
	}
	stop, done := make(chan struct{}), make(chan struct{})
	inst.close = func() {
		close(stop)
		<-done
		for _, p := range added {
			s.files.remove(p)
		}
		h.Release()
	}
	go func() {
		defer close(done)
		select {
		case <-s.files.lostC():
			inst.fail(s.files.failed())
		case <-stop:
		}
	}()
	return inst, nil
}

// wakePayload is one notification's payload: "instance kind id" (ids have
// no spaces).
func wakePayload(instance, kind, id string) string { return instance + " " + kind + " " + id }

// parseWake reads a payload, skipping the instance's own.
func parseWake(payload, self string) (Wake, bool) {
	parts := strings.SplitN(payload, " ", 3)
	if len(parts) != 3 || parts[0] == self {
		return Wake{}, false
	}
	return Wake{Kind: parts[1], ID: parts[2]}, true
}
