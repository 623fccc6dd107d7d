package conformtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// seen is one message the suite got from the device's receipts or
// presence topic, decoded as far as it decodes.
type seen struct {
	at       time.Time
	kind     wire.Kind
	retained bool
	raw      []byte
	receipt  wire.Receipt // kind receipts, when rerr is nil
	rerr     error
	presence presence // kind presence, when perr is nil
	perr     error
}

// presence keeps which members a presence message had.
type presence struct {
	Online       *bool  `json:"online"`
	Session      *int64 `json:"session"`
	Capabilities *struct {
		Dedupe *bool `json:"dedupe"`
		Query  *bool `json:"query"`
	} `json:"capabilities"`
}

func (p presence) birth() bool { return p.Online != nil && *p.Online }

// watcher is the suite's MQTT client: it subscribes to the device's
// receipts and presence and logs every message in arrival order. Its
// handler never blocks (paho's router waits for it).
type watcher struct {
	c       mqtt.Client
	topics  map[wire.Kind]string
	timeout time.Duration

	mu   sync.Mutex
	log  []seen
	more chan struct{} // closed and replaced on every message
	lost error         // the connection was lost
}

func dial(ctx context.Context, o Options, clientID string) (*watcher, error) {
	root := o.TopicRoot
	w := &watcher{
		topics:  map[wire.Kind]string{},
		timeout: o.Timeout,
		more:    make(chan struct{}),
	}
	for _, k := range []wire.Kind{wire.KindCommands, wire.KindQueries, wire.KindReceipts, wire.KindPresence} {
		w.topics[k] = wire.Topic(root, o.Device, k)
	}
	subscribed := make(chan error, 1)
	opts := mqtt.NewClientOptions().
		AddBroker(o.MQTT).
		SetClientID(clientID).
		SetUsername(o.Username).
		SetPassword(o.Password).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetOrderMatters(true).
		SetConnectTimeout(o.Timeout).
		SetKeepAlive(30 * time.Second).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			w.mu.Lock()
			w.lost = err
			w.signalLocked()
			w.mu.Unlock()
		}).
		// paho runs OnConnect in a goroutine of its own: waiting there is fine.
		SetOnConnectHandler(func(c mqtt.Client) {
			tok := c.SubscribeMultiple(map[string]byte{w.topics[wire.KindReceipts]: 1, w.topics[wire.KindPresence]: 1}, w.handle)
			if !tok.WaitTimeout(o.Timeout) {
				subscribed <- errors.New("subscribe: no SUBACK in time")
				return
			}
			subscribed <- tok.Error()
		})
	if o.TLS != nil {
		opts.SetTLSConfig(o.TLS)
	}
	w.c = mqtt.NewClient(opts)
	tok := w.c.Connect()
	if !tok.WaitTimeout(o.Timeout) {
		w.c.Disconnect(0)
		return nil, fmt.Errorf("connect to %s: no CONNACK within %s", o.MQTT, o.Timeout)
	}
	if err := tok.Error(); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", o.MQTT, err)
	}
	select {
	case err := <-subscribed:
		if err != nil {
			w.c.Disconnect(0)
			return nil, fmt.Errorf("subscribe to %s and %s: %w", w.topics[wire.KindReceipts], w.topics[wire.KindPresence], err)
		}
	case <-ctx.Done():
		w.c.Disconnect(0)
		return nil, ctx.Err()
	}
	return w, nil
}

func (w *watcher) close() { w.c.Disconnect(250) }

func (w *watcher) handle(_ mqtt.Client, m mqtt.Message) {
	s := seen{at: time.Now(), retained: m.Retained(), raw: append([]byte(nil), m.Payload()...)}
	switch m.Topic() {
	case w.topics[wire.KindReceipts]:
		s.kind = wire.KindReceipts
		s.rerr = json.Unmarshal(s.raw, &s.receipt)
	case w.topics[wire.KindPresence]:
		s.kind = wire.KindPresence
		s.perr = json.Unmarshal(s.raw, &s.presence)
	default:
		return
	}
	w.mu.Lock()
	w.log = append(w.log, s)
	w.signalLocked()
	w.mu.Unlock()
}

func (w *watcher) signalLocked() {
	close(w.more)
	w.more = make(chan struct{})
}

// mark is the position of the next message.
func (w *watcher) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.log)
}

// since returns the messages from position i on.
func (w *watcher) since(i int) []seen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seen(nil), w.log[i:]...)
}

// lostErr is the connection loss, if any.
func (w *watcher) lostErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

// waitFor waits up to d for cond over the messages since i to hold, and
// reports whether it did. A new message that cond does not accept does
// not extend the wait.
func (w *watcher) waitFor(ctx context.Context, i int, d time.Duration, cond func([]seen) bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		ms, more, lost := append([]seen(nil), w.log[i:]...), w.more, w.lost
		w.mu.Unlock()
		if cond(ms) {
			return true
		}
		if lost != nil {
			return false
		}
		select {
		case <-more:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// pause waits d (or until ctx ends): the settling time after an answer,
// during which later receipts may still show a second run.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// publish sends payload and waits for the broker to take it.
func (w *watcher) publish(kind wire.Kind, qos byte, payload []byte) error {
	tok := w.c.Publish(w.topics[kind], qos, false, payload)
	if !tok.WaitTimeout(w.timeout) {
		return fmt.Errorf("publish on %s: not acknowledged within %s", w.topics[kind], w.timeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("publish on %s: %w", w.topics[kind], err)
	}
	return nil
}

// resubscribe subscribes to the presence topic again, so that the broker
// sends its retained message again (MQTT 3.1.1, 3.8.4).
func (w *watcher) resubscribe() error {
	tok := w.c.Subscribe(w.topics[wire.KindPresence], 1, w.handle)
	if !tok.WaitTimeout(w.timeout) {
		return errors.New("subscribe: no SUBACK in time")
	}
	return tok.Error()
}

// receipts keeps the receipts among ms that keep says.
func receipts(ms []seen, keep func(wire.Receipt) bool) []seen {
	var out []seen
	for _, m := range ms {
		if m.kind == wire.KindReceipts && m.rerr == nil && keep(m.receipt) {
			out = append(out, m)
		}
	}
	return out
}

// presences keeps the presence messages among ms.
func presences(ms []seen) []seen {
	var out []seen
	for _, m := range ms {
		if m.kind == wire.KindPresence {
			out = append(out, m)
		}
	}
	return out
}

// forCommand keeps a command's own receipts, not answers to queries.
func forCommand(ids ...string) func(wire.Receipt) bool {
	return func(r wire.Receipt) bool {
		if r.QueryID != "" {
			return false
		}
		for _, id := range ids {
			if id != "" && r.CommandID == id {
				return true
			}
		}
		return false
	}
}

// forQuery keeps the answers to one query.
func forQuery(id string) func(wire.Receipt) bool {
	return func(r wire.Receipt) bool { return r.QueryID == id }
}

// show lists messages as they came, payloads shortened: what a FAIL line
// says the suite saw.
func show(ms []seen) string {
	if len(ms) == 0 {
		return "nothing"
	}
	const most = 6
	parts := make([]string, 0, most+1)
	for i, m := range ms {
		if i == most {
			parts = append(parts, fmt.Sprintf("and %d more", len(ms)-most))
			break
		}
		parts = append(parts, shorten(string(m.raw), 300))
	}
	return strings.Join(parts, ", ")
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
