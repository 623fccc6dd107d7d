// Package peers divides the devices' receipts among the controller
// instances that share a database, by a rule the controllers own.
//
// Every instance subscribes to every device's receipts (a plain
// subscription, no broker-side shared group) and applies the receipts of
// the devices it owns; it acknowledges the others unapplied. The owner of a
// device is chosen by rendezvous hashing over the live instances (the
// instances table: an instance is live while its last heartbeat is within
// its lease ttl), so each instance computes the same owner from the same
// membership, and a change of membership moves only the devices of the
// instance that came or went.
//
// Why not the broker's $share groups: the broker chooses the member, and a
// device account may join any group (Mosquitto's acl_file is not consulted
// at SUBSCRIBE), after which the broker hands it its share of every
// receipt and drops each one it may not read; a broker whose MQTT listener
// accepts $share and delivers nothing (NATS) loses every receipt. With the
// division here, no other client can take anything away from the
// controllers, and a subscription that delivers nothing is noticed by the
// controller's own probe (see receipt.Config.Probe).
//
// Safety does not depend on the division: receipts are facts, applied
// under the command's rank, so a receipt applied by two instances changes
// the state once (the second is recorded as a duplicate). A receipt
// applied by none (its owner just died, or two instances briefly disagree
// on the membership) is found again by the query path, as one lost with a
// dying instance always was. To make the second case rare, an instance
// keeps applying the devices it owned under a membership it held within
// Grace, so that an instance which sees a change first and one which sees
// it last overlap instead of leaving a gap; an instance with no view yet
// applies everything.
package peers

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
)

// Lister lists the instances sharing the database (store.Store does).
type Lister interface {
	ListInstances(ctx context.Context) ([]domain.InstanceInfo, error)
}

// Config configures a Division.
type Config struct {
	Self  string // this instance's id, always a member
	Store Lister
	// Refresh is how often the membership is read (DefaultRefresh).
	Refresh time.Duration
	// Grace is how long a membership that was replaced still counts for
	// the devices this instance owned under it (DefaultGrace).
	Grace  time.Duration
	Now    func() time.Time
	Logger *slog.Logger
}

const (
	// DefaultRefresh: a membership change is seen within a second.
	DefaultRefresh = time.Second
	// DefaultGrace covers two refreshes and a second of clock skew
	// between instances (liveness is judged on each reader's clock).
	DefaultGrace = 3 * time.Second
)

// Division decides which devices' receipts this instance applies.
type Division struct {
	cfg Config

	mu      sync.RWMutex
	current []string // sorted; nil until the first read
	former  []former // replaced memberships, newest first, within Grace
}

type former struct {
	members []string
	until   time.Time
}

// New builds a Division; Run keeps it current.
func New(cfg Config) *Division {
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Division{cfg: cfg}
}

// Run reads the membership every Refresh until ctx ends. A failed read
// keeps the last membership.
func (d *Division) Run(ctx context.Context) error {
	t := time.NewTicker(d.cfg.Refresh)
	defer t.Stop()
	for {
		if err := d.Refresh(ctx); err != nil && ctx.Err() == nil {
			d.cfg.Logger.Warn("read the live instances; keeping the last membership", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Refresh reads the live instances once.
func (d *Division) Refresh(ctx context.Context) error {
	ins, err := d.cfg.Store.ListInstances(ctx)
	if err != nil {
		return err
	}
	members := []string{d.cfg.Self}
	for _, in := range ins {
		if in.Live && in.InstanceID != d.cfg.Self {
			members = append(members, in.InstanceID)
		}
	}
	d.Set(members)
	return nil
}

// Set makes members (this instance is added if missing) the current
// membership; the one it replaces counts for Grace more.
func (d *Division) Set(members []string) {
	members = slices.Clone(members)
	if !slices.Contains(members, d.cfg.Self) {
		members = append(members, d.cfg.Self)
	}
	slices.Sort(members)
	members = slices.Compact(members)
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if slices.Equal(members, d.current) {
		return
	}
	if d.current != nil {
		d.cfg.Logger.Info("receipts divided among new membership", "instances", members, "was", d.current)
		d.former = append([]former{{members: d.current, until: now.Add(d.cfg.Grace)}}, d.former...)
	}
	d.current = members
	d.former = slices.DeleteFunc(d.former, func(f former) bool { return !now.Before(f.until) })
}

// Owns reports whether this instance applies device's receipts: it owns
// the device under the current membership or under one replaced within
// Grace, or it has no membership yet.
func (d *Division) Owns(device string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if len(d.current) <= 1 || Owner(d.current, device) == d.cfg.Self {
		return true
	}
	now := d.cfg.Now()
	for _, f := range d.former {
		if now.Before(f.until) && Owner(f.members, device) == d.cfg.Self {
			return true
		}
	}
	return false
}

// Alone reports that this instance is the only live one, and has been for
// Grace: no other instance's batches can meet its own. Before the first
// read it is not.
func (d *Division) Alone() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if len(d.current) != 1 {
		return false
	}
	now := d.cfg.Now()
	for _, f := range d.former {
		if now.Before(f.until) {
			return false
		}
	}
	return true
}

// Overlapping counts the replaced memberships still within Grace: while
// it is above zero this instance applies, beside its own devices, those it
// owned under them.
func (d *Division) Overlapping() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	now, n := d.cfg.Now(), 0
	for _, f := range d.former {
		if now.Before(f.until) {
			n++
		}
	}
	return n
}

// Members is the current membership, sorted.
func (d *Division) Members() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return slices.Clone(d.current)
}

// Owner is the member that owns device: the one with the highest score of
// (member, device), a hash every instance computes alike (rendezvous
// hashing). Members must not be empty.
func Owner(members []string, device string) string {
	best, bestScore := "", uint64(0)
	for _, m := range members {
		if s := score(m, device); best == "" || s > bestScore || s == bestScore && m < best {
			best, bestScore = m, s
		}
	}
	return best
}

// score is FNV-1a of member, a zero byte and device, mixed by the
// splitmix64 finalizer so that near-equal inputs spread.
func score(member, device string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(member))
	h.Write([]byte{0})
	h.Write([]byte(device))
	var b [8]byte
	x := binary.BigEndian.Uint64(h.Sum(b[:0]))
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
