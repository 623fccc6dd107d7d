package feed

import (
	"sync"
	"sync/atomic"

	"github.com/fleetctl/fleetctl/internal/store"
)

// MaxPending bounds the facts a Feed keeps until its route is set.
const MaxPending = 4096

// Feed passes each published fact to its route, inline. It implements
// store.Feed and is safe for concurrent use.
type Feed struct {
	route atomic.Pointer[func(store.Fact)]

	mu      sync.Mutex // held while the route is not set, and while it is
	pending []store.Fact
	missed  bool // facts were dropped before the route was set
}

// New returns a Feed without a route: it keeps what is published until
// Route is called.
func New() *Feed { return &Feed{} }

var _ store.Feed = (*Feed)(nil)

// Publish passes f to the route, on the caller's goroutine; before the
// route is set, it keeps f for it.
func (fd *Feed) Publish(f store.Fact) {
	if r := fd.route.Load(); r != nil {
		(*r)(f)
		return
	}
	fd.mu.Lock()
	if r := fd.route.Load(); r != nil { // set meanwhile
		fd.mu.Unlock()
		(*r)(f)
		return
	}
	if len(fd.pending) < MaxPending {
		fd.pending = append(fd.pending, f)
	} else {
		fd.missed = true
	}
	fd.mu.Unlock()
}

// Route sets the function every fact goes to, once every consumer it
// calls exists: the facts kept until now go to it first, in the order they
// were published, then a FactReset if some could not be kept. Route is
// called once.
func (fd *Feed) Route(route func(store.Fact)) {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	if fd.route.Load() != nil {
		panic("feed: Route called twice")
	}
	for _, f := range fd.pending {
		route(f)
	}
	if fd.missed {
		route(store.Fact{Kind: store.FactReset})
	}
	fd.pending, fd.missed = nil, false
	fd.route.Store(&route)
}
