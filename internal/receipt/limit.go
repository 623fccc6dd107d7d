package receipt

import (
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/mqttx"
)

// Rate is a token bucket's refill rate and size: PerSecond messages a
// second on average, Burst at once. The zero Rate limits nothing.
type Rate struct {
	PerSecond float64
	Burst     float64
}

// Unlimited reports whether r limits nothing.
func (r Rate) Unlimited() bool { return r.PerSecond <= 0 }

// ReceiptRate is the contract's --receipt-rate: perSecond receipts a second
// per device, a burst of twice that (50/s, burst 100 by default). 0 or less
// limits nothing.
func ReceiptRate(perSecond float64) Rate { return Rate{PerSecond: perSecond, Burst: 2 * perSecond} }

// DefaultPresenceRate bounds each device's presence messages: a device sends
// a birth per connect and an offline (its own or the broker's LWT) per
// disconnect, so 20 at once and 5 a second cover a device that reconnects
// in a tight loop, and a forged stream of presence cannot keep the writer
// busy. It is a bucket of its own: a device throttled for its receipts
// still reports its presence.
var DefaultPresenceRate = Rate{PerSecond: 5, Burst: 20}

// DefaultMaxTracked bounds how many devices' buckets are kept. A bucket idle
// long enough to be full again is forgotten (a new one starts full, the
// same thing), so only devices active in the last Burst/PerSecond seconds
// (2 s by default) are tracked; past the bound an arbitrary one is
// forgotten, which only gives that device a full bucket again. At about
// 150 bytes a device, the bound is about 10 MB.
const DefaultMaxTracked = 65536

// sweepEvery is how often idle buckets are forgotten.
const sweepEvery = time.Second

// limiter holds a receipts and a presence token bucket per device, in a
// map bounded by max and swept of idle buckets, so a spray of fake device
// ids cannot grow it without bound.
type limiter struct {
	receipts, presence Rate
	max                int

	mu        sync.Mutex
	devices   map[string]*buckets
	lastSweep time.Time
}

type buckets struct{ receipts, presence bucket }

type bucket struct {
	tokens float64
	at     time.Time
}

// level is how many tokens b holds at now.
func (b bucket) level(r Rate, now time.Time) float64 {
	return min(r.Burst, b.tokens+r.PerSecond*now.Sub(b.at).Seconds())
}

// take spends one token if b has one at now.
func (b *bucket) take(r Rate, now time.Time) bool {
	if r.Unlimited() {
		return true
	}
	t := b.level(r, now)
	b.at = now
	if t < 1 {
		b.tokens = t
		return false
	}
	b.tokens = t - 1
	return true
}

func newLimiter(receipts, presence Rate, maxTracked int) *limiter {
	if maxTracked <= 0 {
		maxTracked = DefaultMaxTracked
	}
	return &limiter{receipts: receipts, presence: presence, max: maxTracked, devices: map[string]*buckets{}}
}

// allow spends one token of device's receipts (presence false) or presence
// bucket and reports whether it had one.
func (l *limiter) allow(device string, presence bool, now time.Time) bool {
	r := l.receipts
	if presence {
		r = l.presence
	}
	if r.Unlimited() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastSweep) >= sweepEvery {
		l.sweep(now)
	}
	b := l.devices[device]
	if b == nil {
		if len(l.devices) >= l.max {
			for id := range l.devices { // an arbitrary one: it only gets a full bucket again
				delete(l.devices, id)
				break
			}
		}
		b = &buckets{receipts: bucket{tokens: l.receipts.Burst, at: now}, presence: bucket{tokens: l.presence.Burst, at: now}}
		l.devices[device] = b
	}
	if presence {
		return b.presence.take(r, now)
	}
	return b.receipts.take(r, now)
}

// sweep forgets every device whose buckets are both full again.
func (l *limiter) sweep(now time.Time) {
	l.lastSweep = now
	for id, b := range l.devices {
		if (l.receipts.Unlimited() || b.receipts.level(l.receipts, now) >= l.receipts.Burst) &&
			(l.presence.Unlimited() || b.presence.level(l.presence, now) >= l.presence.Burst) {
			delete(l.devices, id)
		}
	}
}

// tracked is how many devices' buckets are held.
func (l *limiter) tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.devices)
}

// heldPresence holds, per device, the highest-ranked presence message its
// presence rate held back, until the rate allows it. It holds at most one
// message a device, and only for devices the limiter tracks as throttled
// (a bucket refills within Burst/PerSecond seconds), so its size is bounded
// like the limiter's.
type heldPresence struct {
	mu      sync.Mutex
	devices map[string]held
}

type held struct {
	device string
	rank   int64
	msg    mqttx.Message
}

func newHeldPresence() *heldPresence { return &heldPresence{devices: map[string]held{}} }

// has reports whether a message of device is held.
func (h *heldPresence) has(device string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.devices[device]
	return ok
}

// hold keeps m for device unless a message of a rank at least as high is
// held already; it reports whether a message was coalesced away (m, or the
// one it replaced).
func (h *heldPresence) hold(device string, rank int64, m mqttx.Message) (coalesced bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, ok := h.devices[device]
	if ok && old.rank >= rank {
		return true
	}
	h.devices[device] = held{device: device, rank: rank, msg: m}
	return ok
}

// due takes out the held messages whose device's presence rate allows one
// more message now, spending that token.
func (h *heldPresence) due(l *limiter, now time.Time) []held {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []held
	for device, m := range h.devices {
		if l.allow(device, true, now) {
			out = append(out, m)
			delete(h.devices, device)
		}
	}
	return out
}
