package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Probe is a raw MQTT client that plays the controller in tests: it
// publishes commands and queries and records every receipt and presence
// message under a topic root, in arrival order.
type Probe struct {
	t      testing.TB
	client mqtt.Client
	root   string

	mu       sync.Mutex
	receipts []ProbeReceipt
	presence []ProbePresence
	changed  chan struct{}
}

// ProbeReceipt is a receipt as the probe saw it.
type ProbeReceipt struct {
	Device string
	wire.Receipt
	ReceivedAt time.Time
}

// ProbePresence is a presence message as the probe saw it.
type ProbePresence struct {
	Device string
	wire.Presence
	Retained   bool
	ReceivedAt time.Time
}

// ProbeWait bounds every wait of a probe unless told otherwise.
const ProbeWait = 10 * time.Second

// NewProbe connects a probe (client id controller-probe-<random>, clean
// session) and subscribes to {root}/+/receipts and {root}/+/presence. It
// disconnects when the test ends.
func NewProbe(t testing.TB, brokerURL, root string) *Probe {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := &Probe{t: t, root: root, changed: make(chan struct{})}
	filters := map[string]byte{wire.Wildcard(root, wire.KindReceipts): 1, wire.Wildcard(root, wire.KindPresence): 1}
	subscribed := make(chan error, 1)
	o := mqtt.NewClientOptions().AddBroker(brokerURL).
		SetClientID("controller-probe-" + hex.EncodeToString(b[:])).
		SetCleanSession(true).SetAutoReconnect(true).SetMaxReconnectInterval(200 * time.Millisecond).
		SetKeepAlive(5 * time.Second).SetConnectTimeout(5 * time.Second).SetOrderMatters(true).
		SetOnConnectHandler(func(c mqtt.Client) {
			// A clean session: subscribe again after every reconnect.
			tok := c.SubscribeMultiple(filters, p.onMessage)
			var err error
			if !tok.WaitTimeout(ProbeWait) {
				err = errors.New("subscribe timed out")
			} else {
				err = tok.Error()
			}
			select {
			case subscribed <- err:
			default:
			}
		})
	p.client = mqtt.NewClient(o)
	if tok := p.client.Connect(); !tok.WaitTimeout(ProbeWait) || tok.Error() != nil {
		t.Fatalf("probe connect to %s: %v", brokerURL, tok.Error())
	}
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatalf("probe subscribe: %v", err)
		}
	case <-time.After(ProbeWait):
		t.Fatal("probe subscribe: no answer")
	}
	t.Cleanup(func() { p.client.Disconnect(100) })
	return p
}

func (p *Probe) onMessage(_ mqtt.Client, m mqtt.Message) {
	device, kind, err := wire.ParseTopic(p.root, m.Topic())
	if err != nil {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch kind {
	case wire.KindReceipts:
		var r wire.Receipt
		if wire.Decode(m.Payload(), &r) == nil {
			p.receipts = append(p.receipts, ProbeReceipt{Device: device, Receipt: r, ReceivedAt: now})
		}
	case wire.KindPresence:
		var pr wire.Presence
		if wire.Decode(m.Payload(), &pr) == nil {
			p.presence = append(p.presence, ProbePresence{Device: device, Presence: pr, Retained: m.Retained(), ReceivedAt: now})
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// Publish sends a JSON payload to {root}/{device}/{kind} and waits for the
// broker to take it.
func (p *Probe) Publish(device string, kind wire.Kind, qos byte, v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatalf("probe marshal: %v", err)
	}
	tok := p.client.Publish(wire.Topic(p.root, device, kind), qos, false, b)
	if !tok.WaitTimeout(ProbeWait) || tok.Error() != nil {
		p.t.Fatalf("probe publish to %s: %v", device, tok.Error())
	}
}

// Command publishes a command at QoS 1.
func (p *Probe) Command(device string, c wire.Command) { p.Publish(device, wire.KindCommands, 1, c) }

// Query publishes a query at QoS 1.
func (p *Probe) Query(device string, q wire.Query) { p.Publish(device, wire.KindQueries, 1, q) }

// Receipts returns the receipts seen so far that match (nil matches all).
func (p *Probe) Receipts(match func(ProbeReceipt) bool) []ProbeReceipt {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ProbeReceipt
	for _, r := range p.receipts {
		if match == nil || match(r) {
			out = append(out, r)
		}
	}
	return out
}

// Presences returns the presence messages seen so far for a device.
func (p *Probe) Presences(device string) []ProbePresence {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ProbePresence
	for _, pr := range p.presence {
		if pr.Device == device {
			out = append(out, pr)
		}
	}
	return out
}

// WaitFor waits until cond (called with nothing locked) holds, re-checking
// on every message; it fails the test after timeout (ProbeWait if 0).
func (p *Probe) WaitFor(timeout time.Duration, what string, cond func() bool) {
	p.t.Helper()
	if timeout == 0 {
		timeout = ProbeWait
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			if cond() {
				return
			}
			p.t.Fatalf("probe: timed out after %v waiting for %s", timeout, what)
		}
	}
}

// WaitReceipts waits until at least n receipts match and returns them.
func (p *Probe) WaitReceipts(n int, match func(ProbeReceipt) bool) []ProbeReceipt {
	p.t.Helper()
	var got []ProbeReceipt
	p.WaitFor(0, "receipts", func() bool { got = p.Receipts(match); return len(got) >= n })
	return got
}

// WaitReceipt waits for the first receipt that matches.
func (p *Probe) WaitReceipt(match func(ProbeReceipt) bool) ProbeReceipt {
	p.t.Helper()
	return p.WaitReceipts(1, match)[0]
}

// WaitPresence waits for a presence message of a device that matches.
func (p *Probe) WaitPresence(device string, match func(ProbePresence) bool) ProbePresence {
	p.t.Helper()
	var got ProbePresence
	p.WaitFor(0, "presence of "+device, func() bool {
		for _, pr := range p.Presences(device) {
			if match(pr) {
				got = pr
				return true
			}
		}
		return false
	})
	return got
}

// ForCommand matches receipts about a command_id.
func ForCommand(id string) func(ProbeReceipt) bool {
	return func(r ProbeReceipt) bool { return r.CommandID == id }
}

// ForQuery matches answers to a query_id.
func ForQuery(id string) func(ProbeReceipt) bool {
	return func(r ProbeReceipt) bool { return r.QueryID == id }
}

// RetainedPresence connects a fresh client, reads the retained presence of
// each device and returns it by device id. It fails the test if one is
// missing after ProbeWait.
func RetainedPresence(t testing.TB, brokerURL, root string, devices ...string) map[string]wire.Presence {
	t.Helper()
	if len(devices) == 0 {
		return map[string]wire.Presence{}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	var mu sync.Mutex
	got := map[string]wire.Presence{}
	all := make(chan struct{})
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID("controller-retained-" + hex.EncodeToString(b[:])).SetCleanSession(true)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(ProbeWait) || tok.Error() != nil {
		t.Fatalf("retained reader connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	want := map[string]bool{}
	for _, d := range devices {
		want[d] = true
	}
	tok := c.Subscribe(wire.Wildcard(root, wire.KindPresence), 1, func(_ mqtt.Client, m mqtt.Message) {
		if !m.Retained() {
			return
		}
		device, _, err := wire.ParseTopic(root, m.Topic())
		var pr wire.Presence
		if err != nil || wire.Decode(m.Payload(), &pr) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		got[device] = pr
		for d := range want {
			if _, ok := got[d]; !ok {
				return
			}
		}
		select {
		case <-all:
		default:
			close(all)
		}
	})
	if !tok.WaitTimeout(ProbeWait) || tok.Error() != nil {
		t.Fatalf("retained reader subscribe: %v", tok.Error())
	}
	select {
	case <-all:
	case <-time.After(ProbeWait):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("retained presence: got %d of %d (%s)", len(got), len(want), strings.Join(devices, ","))
	}
	mu.Lock()
	defer mu.Unlock()
	out := map[string]wire.Presence{}
	for k, v := range got {
		out[k] = v
	}
	return out
}
