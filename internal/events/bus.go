// Package events is the controller's live change feed, the source of the
// dashboard's server-sent event stream (GET /v1/events).
//
// # What is published
//
// The store publishes each change it committed into the controller's post-
// commit feed (package feed: after the commit, in commit order), whose route
// tells the Bus: an operation, a command, a device's presence, a task, a
// rollout. An instance's stream therefore holds what that
// instance committed, plus what other instances' wake-ups tell it (an
// operation that left started, read back for its status) and a reset when
// wake-ups may have been lost. Every event gets the next number of one
// sequence; numbers start at the process's start time in microseconds
// (Config.First), so an id from an earlier run of the process is older than
// anything in the buffer, never mistaken for a newer one.
//
// # Never blocking the controller
//
// Publish never waits: it writes the event into a bounded ring
// (Config.Buffer events, the oldest overwritten) and wakes each subscriber
// without blocking (a signal channel of one). Subscribers read the ring
// from their own cursor, so an event is stored and encoded once however
// many read it. A subscriber that falls Config.ClientBuffer events behind
// (by default the whole ring: the next event would overwrite one it has not
// read) is dropped (Sub.Done closes, Sub.Err says why): a slow reader loses
// its stream, the controller never slows down for it. A reader that
// reconnects with the last id it saw reads on from there while the ring
// still holds the event after it, or gets a reset.
package events

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Kinds of event. KindReset is not a change: it tells a reader that events
// were missed (its last id is older than the buffer, or other instances'
// wake-ups were lost), so whatever it shows must be read again.
const (
	KindOperation = "operation"
	KindCommand   = "command"
	KindDevice    = "device"
	KindTask      = "task"
	KindRollout   = "rollout"
	KindReset     = "reset"
)

// Kinds lists the kinds the stream carries for changes; store machines of
// other names (lease) are not published.
var Kinds = []string{KindOperation, KindCommand, KindDevice, KindTask, KindRollout}

// DefaultBuffer is the ring's size (Config.Buffer).
const DefaultBuffer = 4096

// Errors a subscription ends with.
var (
	// ErrSlow: the subscriber fell too far behind; it was dropped.
	ErrSlow = errors.New("events: the reader fell too far behind and was dropped")
	// ErrClosed: the bus was closed (the server is stopping).
	ErrClosed = errors.New("events: closed")
)

// Event is one change as the stream carries it. Data is its JSON
// ({"kind","id","status","at"}, and "principal" for a person's change),
// encoded once when it is published.
type Event struct {
	Seq       uint64
	Kind      string
	ID        string
	Status    string
	At        time.Time
	Principal string // the person whose change it is; "" for the controller's own
	Data      []byte
}

// Config configures a Bus.
type Config struct {
	// Buffer: the events the ring keeps, for readers that are behind or
	// reconnect; DefaultBuffer.
	Buffer int
	// ClientBuffer: how far behind the newest event a subscriber may be
	// before it is dropped; the ring's size by default, and at most that.
	ClientBuffer int
	// First is the first event's number; 1 when 0.
	First uint64
}

// Bus is the feed: a ring of the last events and the live subscribers.
// It is safe for concurrent use.
type Bus struct {
	cfg     Config
	mu      sync.RWMutex // readers Take under the read lock
	ring    []Event      // ring[seq % len(ring)]
	next    uint64       // the number of the next event
	subs    map[*Sub]struct{}
	floor   uint64 // a resume from before it is a reset: an event was missed there (Missed)
	closed  bool
	dropped atomic.Int64
}

// New builds an empty Bus.
func New(cfg Config) *Bus {
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.ClientBuffer <= 0 || cfg.ClientBuffer > cfg.Buffer {
		cfg.ClientBuffer = cfg.Buffer
	}
	if cfg.First == 0 {
		cfg.First = 1
	}
	return &Bus{cfg: cfg, ring: make([]Event, cfg.Buffer), next: cfg.First, subs: map[*Sub]struct{}{}}
}

// Sub is one subscriber. Ready is signalled when events may wait for it;
// Take reads them. Done closes when it is dropped or the bus closes, Err
// then says why.
type Sub struct {
	bus *Bus
	// Start is the number of the last event published before the
	// subscription began.
	Start  uint64
	cursor atomic.Uint64 // the last event taken
	wake   chan struct{}
	done   chan struct{}
	err    error // set before done closes
}

// Ready is signalled (at most one signal waits) when events were
// published after the last Take.
func (s *Sub) Ready() <-chan struct{} { return s.wake }

// Done closes when the subscription ends (dropped, or the bus closed).
func (s *Sub) Done() <-chan struct{} { return s.done }

// Err is why the subscription ended (ErrSlow, ErrClosed), nil while it runs.
func (s *Sub) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Take appends to buf the events after the last one taken, in order, at
// most max of them, and returns it. When more wait, Ready stays signalled.
// A subscriber that was dropped takes nothing.
func (s *Sub) Take(buf []Event, max int) []Event {
	b := s.bus
	b.mu.RLock()
	defer b.mu.RUnlock()
	if _, ok := b.subs[s]; !ok {
		return buf
	}
	seq := s.cursor.Load() + 1
	for ; seq < b.next && max > 0; seq, max = seq+1, max-1 {
		buf = append(buf, b.ring[seq%uint64(len(b.ring))])
	}
	s.cursor.Store(seq - 1)
	if seq < b.next {
		s.signal()
	}
	return buf
}

func (s *Sub) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Publish adds one event and wakes every subscriber; it never blocks. A
// subscriber the event leaves more than ClientBuffer events behind is
// dropped. It returns the event's number (0 once the bus is closed).
func (b *Bus) Publish(kind, id, status string, at time.Time) uint64 {
	return b.publish(kind, id, status, "", at)
}

// publish is Publish of a change made by principal ("" the controller).
func (b *Bus) publish(kind, id, status, principal string, at time.Time) uint64 {
	data := encode(apiwire.EventData{Kind: kind, ID: id, Status: status, At: at.UTC(), Principal: principal})
	if data == nil {
		return 0 // a time beyond the year 9999 (encode): no change of this controller's
	}
	ev := Event{Kind: kind, ID: id, Status: status, At: at, Principal: principal, Data: data}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0
	}
	ev.Seq = b.next
	b.next++
	b.ring[ev.Seq%uint64(len(b.ring))] = ev
	limit := uint64(b.cfg.ClientBuffer)
	for s := range b.subs {
		if ev.Seq-s.cursor.Load() > limit {
			b.endLocked(s, ErrSlow)
			b.dropped.Add(1)
			continue
		}
		s.signal()
	}
	return ev.Seq
}

// Resume says where a subscription starts.
type Resume struct {
	LastID uint64 // the last event the reader saw
	Given  bool   // false: a new reader, from the next event on
}

// Subscribe starts a subscription. With a last id the subscriber first
// takes the events the ring holds after it, then the ones that follow,
// nothing missed or repeated. When the ring no longer holds the event after
// the last id, or the id is not one this bus gave (a later one, another
// run's), reset is true and the subscriber starts at the next event: the
// reader must read everything again.
func (b *Bus) Subscribe(from Resume) (sub *Sub, reset bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, false, ErrClosed
	}
	sub = &Sub{bus: b, Start: b.next - 1, wake: make(chan struct{}, 1), done: make(chan struct{})}
	cursor := b.next - 1
	if from.Given {
		oldest := b.cfg.First
		if n := uint64(len(b.ring)); b.next-b.cfg.First > n {
			oldest = b.next - n
		}
		if from.LastID+1 < oldest || from.LastID >= b.next || from.LastID < b.floor {
			reset = true
		} else {
			cursor = from.LastID
		}
	}
	sub.cursor.Store(cursor)
	if cursor < b.next-1 {
		sub.signal()
	}
	b.subs[sub] = struct{}{}
	return sub, reset, nil
}

// Missed records that a change was not published here (the controller
// does not read back other instances' wake-ups while no one reads the
// stream, nor when their queue is full): a reader that resumes from an id
// before this point gets a reset, as it would had the ring lost the event.
func (b *Bus) Missed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.floor = b.next
}

// Unsubscribe ends a subscription; it is safe to call more than once.
func (b *Bus) Unsubscribe(s *Sub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.endLocked(s, nil)
}

func (b *Bus) endLocked(s *Sub, err error) {
	if _, ok := b.subs[s]; !ok {
		return
	}
	delete(b.subs, s)
	s.err = err
	close(s.done)
}

// Close ends every subscription with ErrClosed and refuses new ones; later
// Publishes do nothing.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		b.endLocked(s, ErrClosed)
	}
}

// Last is the number of the last event published (First-1 before any).
func (b *Bus) Last() uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.next - 1
}

// Subscribers counts the live subscriptions.
func (b *Bus) Subscribers() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.subs)
}

// Published counts the events published.
func (b *Bus) Published() uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.next - b.cfg.First
}

// Dropped counts the subscribers dropped for falling behind.
func (b *Bus) Dropped() int64 { return b.dropped.Load() }

// Changed is told each committed change (the feed's store.FactChanged): a
// change of a kind the stream carries is published with its new state.
func (b *Bus) Changed(c store.Change) {
	if slices.Contains(Kinds, c.Machine) {
		b.publish(c.Machine, c.ID, c.To, c.Principal, c.At)
	}
}
