package benchwire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Actions a memory device runs; anything else is rejected
// "unsupported_action", as a simulated device does.
const (
	ActionRestart   = "restart"
	ActionSetConfig = "set-config"
)

// ConnectParallelism bounds how many devices of a MemoryFleet connect at
// once: a fleet of 10,000 comes up in batches instead of a storm of
// connects that the broker answers slower than their timeout.
const ConnectParallelism = 64

// Timeouts of a memory device's MQTT waits.
const (
	connectTimeout = 30 * time.Second
	publishTimeout = 30 * time.Second
	keepAlive      = 30 * time.Second
)

// maxUnconfirmed bounds the receipts one device has published and not yet
// seen acknowledged; past it the device waits for the oldest.
const maxUnconfirmed = 256

// memoryPerDevice is how many commands a memory device remembers.
const memoryPerDevice = 1024

// DeviceID is the id of the i-th device (from 1), as devicesim numbers
// them with its default prefix: device-1, device-2, ...
func DeviceID(i int) string { return fmt.Sprintf("device-%d", i) }

// FleetStats counts what a MemoryFleet did.
type FleetStats struct {
	Commands   int64 `json:"commands"`   // commands received
	Duplicates int64 `json:"duplicates"` // answered from memory, not run again
	Rejected   int64 `json:"rejected"`   // expired, unsupported action, bad params
	Queries    int64 `json:"queries"`
	Receipts   int64 `json:"receipts"` // receipts acknowledged by the broker
	// PublishErrors counts receipts whose publish failed or timed out.
	PublishErrors int64 `json:"publish_errors"`
	Reconnects    int64 `json:"reconnects"`
}

type fleetCounters struct {
	commands, duplicates, rejected, queries, receipts, publishErrors, reconnects atomic.Int64
}

// MemoryFleet is a set of in-memory devices on one broker.
type MemoryFleet struct {
	url, root string
	devices   []*memDevice
	session   atomic.Int64
	stats     fleetCounters
	stopOnce  sync.Once
}

// StartMemoryFleet connects n devices (DeviceID(1) .. DeviceID(n)) under
// topic root, ConnectParallelism at a time, and returns once every one is
// subscribed and its birth acknowledged by the broker. On error, or if ctx
// ends first, the devices already connected are stopped.
func StartMemoryFleet(ctx context.Context, brokerURL, root string, n int) (*MemoryFleet, error) {
	if n < 1 {
		return nil, fmt.Errorf("benchwire: %d devices: at least 1", n)
	}
	f := &MemoryFleet{url: brokerURL, root: root}
	f.session.Store(time.Now().UnixMicro())
	for i := 1; i <= n; i++ {
		f.devices = append(f.devices, newMemDevice(f, DeviceID(i)))
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, ConnectParallelism)
	)
	for _, d := range f.devices {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := d.start(ctx); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("benchwire: %s: %w", d.id, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	if first != nil {
		f.Stop()
		return nil, first
	}
	return f, nil
}

// IDs returns the devices' ids in order.
func (f *MemoryFleet) IDs() []string {
	out := make([]string, len(f.devices))
	for i, d := range f.devices {
		out[i] = d.id
	}
	return out
}

// Len is the number of devices.
func (f *MemoryFleet) Len() int { return len(f.devices) }

// Stats returns the fleet's counters.
func (f *MemoryFleet) Stats() FleetStats {
	s := &f.stats
	return FleetStats{Commands: s.commands.Load(), Duplicates: s.duplicates.Load(), Rejected: s.rejected.Load(),
		Queries: s.queries.Load(), Receipts: s.receipts.Load(), PublishErrors: s.publishErrors.Load(),
		Reconnects: s.reconnects.Load()}
}

// Stop shuts every device down cleanly, ConnectParallelism*4 at a time:
// its unacknowledged receipts waited for, its retained offline presence
// published, then DISCONNECT. It is idempotent.
func (f *MemoryFleet) Stop() {
	f.stopOnce.Do(func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, ConnectParallelism*4)
		for _, d := range f.devices {
			sem <- struct{}{}
			wg.Add(1)
			go func() { defer func() { <-sem; wg.Done() }(); d.stop() }()
		}
		wg.Wait()
	})
}

func (f *MemoryFleet) nextSession() int64 { return f.session.Add(1) }

// memDevice is one in-memory device.
type memDevice struct {
	f                                     *MemoryFleet
	id                                    string
	commands, queries, receipts, presence string
	client                                mqtt.Client
	online                                chan struct{} // closed at the first birth
	onlineOnce                            sync.Once
	done                                  chan struct{} // closed by stop
	worker                                sync.WaitGroup

	mu      sync.Mutex
	session int64
	inbox   []mqtt.Message
	signal  chan struct{}
	started bool
	stopped bool

	// Owned by the worker goroutine.
	seen        map[string]*wire.Receipt // command_id → latest receipt
	ops         map[string]string        // operation_id → the command that ran
	order       []string                 // command_ids remembered, a ring
	next        int                      // the oldest in order, once it is full
	boots       int
	config      map[string]json.RawMessage
	unconfirmed []mqtt.Token
}

func newMemDevice(f *MemoryFleet, id string) *memDevice {
	return &memDevice{
		f: f, id: id,
		commands: wire.Topic(f.root, id, wire.KindCommands),
		queries:  wire.Topic(f.root, id, wire.KindQueries),
		receipts: wire.Topic(f.root, id, wire.KindReceipts),
		presence: wire.Topic(f.root, id, wire.KindPresence),
		online:   make(chan struct{}),
		done:     make(chan struct{}),
		signal:   make(chan struct{}, 1),
		seen:     map[string]*wire.Receipt{},
		ops:      map[string]string{},
		config:   map[string]json.RawMessage{},
	}
}

func lwt(session int64) []byte {
	b, _ := json.Marshal(wire.Presence{Online: false, Session: session})
	return b
}

func (d *memDevice) start(ctx context.Context) error {
	d.mu.Lock()
	d.session = d.f.nextSession()
	session := d.session
	d.started = true
	d.mu.Unlock()
	o := mqtt.NewClientOptions().
		AddBroker(d.f.url).
		SetClientID(d.id).
		SetUsername(d.id).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetKeepAlive(keepAlive).
		SetPingTimeout(keepAlive).
		SetConnectTimeout(connectTimeout).
		SetWriteTimeout(publishTimeout).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(time.Second).
		SetConnectRetry(false).
		SetResumeSubs(false).
		// A command is acknowledged once it is recorded (in memory).
		SetAutoAckDisabled(true).
		SetOrderMatters(true).
		SetStore(copyStore{mqtt.NewMemoryStore()}).
		SetBinaryWill(d.presence, lwt(session), 1, true).
		SetDefaultPublishHandler(d.onMessage).
		SetOnConnectHandler(d.onConnect).
		SetReconnectingHandler(func(_ mqtt.Client, o *mqtt.ClientOptions) {
			d.mu.Lock()
			d.session = d.f.nextSession()
			o.SetBinaryWill(d.presence, lwt(d.session), 1, true)
			d.mu.Unlock()
			d.f.stats.reconnects.Add(1)
		})
	d.client = mqtt.NewClient(o)
	d.worker.Add(1)
	go func() { defer d.worker.Done(); d.work() }()
	tok := d.client.Connect()
	if err := waitToken(ctx, tok, connectTimeout); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	select {
	case <-d.online:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * publishTimeout):
		return errors.New("subscribe and birth not acknowledged in time")
	}
}

// onConnect (its own goroutine, from paho) subscribes, then publishes the
// birth: a controller reacting to the birth finds the device listening.
// Reconnects come through here too, so they resubscribe.
func (d *memDevice) onConnect(c mqtt.Client) {
	tok := c.SubscribeMultiple(map[string]byte{d.commands: 1, d.queries: 1}, nil)
	if err := waitToken(context.Background(), tok, publishTimeout); err != nil {
		return // paho reconnects if the connection is gone; else the start times out
	}
	d.mu.Lock()
	session := d.session
	d.mu.Unlock()
	now := time.Now().UTC()
	birth, _ := json.Marshal(wire.Presence{Online: true, Session: session,
		Capabilities: &wire.Capabilities{Dedupe: true, Query: true}, At: &now})
	if waitToken(context.Background(), c.Publish(d.presence, 1, true, birth), publishTimeout) == nil {
		d.onlineOnce.Do(func() { close(d.online) })
	}
}

// onMessage hands the message to the worker and returns at once.
func (d *memDevice) onMessage(_ mqtt.Client, m mqtt.Message) {
	d.mu.Lock()
	d.inbox = append(d.inbox, m)
	d.mu.Unlock()
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

// work handles commands and queries one at a time, in arrival order.
func (d *memDevice) work() {
	for {
		d.mu.Lock()
		items := d.inbox
		d.inbox = nil
		d.mu.Unlock()
		for _, m := range items {
			switch m.Topic() {
			case d.commands:
				d.handleCommand(m)
			case d.queries:
				d.handleQuery(m)
			}
			m.Ack()
		}
		if len(items) > 0 {
			continue
		}
		select {
		case <-d.signal:
		case <-d.done:
			return
		}
	}
}

func (d *memDevice) handleCommand(m mqtt.Message) {
	var cmd wire.Command
	if err := wire.Decode(m.Payload(), &cmd); err != nil || cmd.CommandID == "" {
		return
	}
	st := &d.f.stats
	st.commands.Add(1)
	if r := d.latest(cmd.CommandID, cmd.OperationID); r != nil {
		st.duplicates.Add(1)
		d.publish(*r)
		return
	}
	now := time.Now().UTC()
	rec := &wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID}
	d.remember(cmd.CommandID, rec)
	reject := func(e string) {
		*rec = newReceipt(cmd, wire.ReceiptRejected, 1, now, nil, e)
		st.rejected.Add(1)
		d.publish(*rec)
	}
	switch {
	case !cmd.ExpiresAt.IsZero() && now.After(cmd.ExpiresAt):
		reject("expired")
		return
	case cmd.Action != ActionRestart && cmd.Action != ActionSetConfig:
		reject("unsupported_action")
		return
	}
	var patch map[string]json.RawMessage
	if cmd.Action == ActionSetConfig {
		if t := bytes.TrimSpace(cmd.Params); len(t) > 0 && string(t) != "null" {
			if t[0] != '{' || json.Unmarshal(t, &patch) != nil {
				reject("invalid_params")
				return
			}
		}
	}
	if cmd.OperationID != "" {
		d.ops[cmd.OperationID] = cmd.CommandID
	}
	*rec = newReceipt(cmd, wire.ReceiptReceived, 1, now, nil, "")
	d.publish(*rec)
	*rec = newReceipt(cmd, wire.ReceiptExecuting, 2, time.Now().UTC(), nil, "")
	d.publish(*rec)
	var result []byte
	if cmd.Action == ActionRestart {
		d.boots++
		result, _ = json.Marshal(map[string]any{"restarted": true, "boots": d.boots})
	} else {
		prev := copyConfig(d.config)
		for k, v := range patch {
			if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				delete(d.config, k)
			} else {
				d.config[k] = v
			}
		}
		result, _ = json.Marshal(map[string]any{"config": d.config, "previous": prev})
	}
	*rec = newReceipt(cmd, wire.ReceiptSucceeded, 3, time.Now().UTC(), result, "")
	d.publish(*rec)
}

// remember records a new command, forgetting the oldest past
// memoryPerDevice: a bench keeps its memory bounded, and a command that old
// is long final.
func (d *memDevice) remember(id string, rec *wire.Receipt) {
	if len(d.order) < memoryPerDevice {
		d.order = append(d.order, id)
	} else {
		old := d.order[d.next]
		if r := d.seen[old]; r != nil && d.ops[r.OperationID] == old {
			delete(d.ops, r.OperationID)
		}
		delete(d.seen, old)
		d.order[d.next] = id
		d.next = (d.next + 1) % memoryPerDevice
	}
	d.seen[id] = rec
}

// latest is the latest receipt for a command_id, or else for the command
// that took the operation_id; nil if the device saw neither.
func (d *memDevice) latest(commandID, operationID string) *wire.Receipt {
	if r := d.seen[commandID]; commandID != "" && r != nil {
		return r
	}
	if other := d.ops[operationID]; operationID != "" && other != "" {
		return d.seen[other]
	}
	return nil
}

func (d *memDevice) handleQuery(m mqtt.Message) {
	var q wire.Query
	if err := wire.Decode(m.Payload(), &q); err != nil || q.QueryID == "" {
		return
	}
	d.f.stats.queries.Add(1)
	r := wire.Receipt{CommandID: q.CommandID, OperationID: q.OperationID, Status: wire.ReceiptUnknown, At: time.Now().UTC()}
	if latest := d.latest(q.CommandID, q.OperationID); latest != nil {
		r = *latest
	}
	r.QueryID = q.QueryID
	d.publish(r)
}

// publish sends a receipt (QoS 1, not retained) without waiting for its
// acknowledgement, as a simulated device does; acknowledgements are
// counted as they complete, and a device with maxUnconfirmed receipts
// outstanding waits for the oldest.
func (d *memDevice) publish(r wire.Receipt) {
	payload, _ := wire.Encode(r)
	d.confirm(false)
	d.unconfirmed = append(d.unconfirmed, d.client.Publish(d.receipts, 1, false, payload))
}

// confirm counts the acknowledged receipts at the head of the list; with
// all, it waits for every one (a clean stop).
func (d *memDevice) confirm(all bool) {
	st := &d.f.stats
	i := 0
	for ; i < len(d.unconfirmed); i++ {
		tok := d.unconfirmed[i]
		wait := all || len(d.unconfirmed)-i >= maxUnconfirmed
		if !wait {
			select {
			case <-tok.Done():
			default:
				goto out
			}
		}
		if waitToken(context.Background(), tok, publishTimeout) != nil {
			st.publishErrors.Add(1)
		} else {
			st.receipts.Add(1)
		}
	}
out:
	d.unconfirmed = append(d.unconfirmed[:0], d.unconfirmed[i:]...)
}

// stop ends the worker, waits for the receipts' acknowledgements, publishes
// the retained offline presence and disconnects.
func (d *memDevice) stop() {
	d.mu.Lock()
	if d.stopped || !d.started {
		d.stopped = true
		d.mu.Unlock()
		return
	}
	d.stopped = true
	session := d.session
	d.mu.Unlock()
	close(d.done)
	d.worker.Wait()
	d.confirm(true)
	if d.client.IsConnectionOpen() {
		now := time.Now().UTC()
		off, _ := json.Marshal(wire.Presence{Online: false, Session: session, At: &now})
		_ = waitToken(context.Background(), d.client.Publish(d.presence, 1, true, off), publishTimeout)
	}
	d.client.Disconnect(100)
}

func newReceipt(cmd wire.Command, s wire.ReceiptStatus, seq int, at time.Time, result json.RawMessage, errStr string) wire.Receipt {
	return wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID, Status: s, Seq: seq, At: at,
		Result: result, Error: errStr}
}

func copyConfig(m map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// errTimeout: the broker did not answer in time.
var errTimeout = errors.New("timed out waiting for the broker")

// waitToken waits for a paho token, at most timeout or until ctx ends.
func waitToken(ctx context.Context, tok mqtt.Token, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-t.C:
		return errTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// copyStore is paho's memory store keeping its own copy of every publish
// packet, as internal/sim's: paho 1.5.1 resends stored packets at connect
// while its writer may still be sending the same objects (a birth from
// OnConnect), a data race that a copy taken in Put avoids.
type copyStore struct{ *mqtt.MemoryStore }

func (s copyStore) Put(key string, m packets.ControlPacket) {
	if p, ok := m.(*packets.PublishPacket); ok {
		cp := *p
		m = &cp
	}
	s.MemoryStore.Put(key, m)
}
