package conformtest_test

import (
	"encoding/json"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// flaws are the deliberate bugs of the reference device, each breaking one
// rule of the protocol.
type flaws struct {
	birthNotRetained      bool // publishes its birth without the retain flag
	seqFromZero           bool // counts seq from 0 (received 0, executing 1, final 2)
	rerunCommandID        bool // no lookup by command_id: a repeat runs again
	noOperationCheck      bool // a new command_id of an operation that ran runs too
	expiryBeforeDedupe    bool // checks expires_at before the record
	noExpiryCheck         bool // runs expired commands
	staleQueryKnown       bool // answers a query about a known command with its first receipt
	queryIgnoresOperation bool // answers unknown about an unseen command_id of an operation that ran
	unknownWithSeq1       bool // answers unknown with seq 1
	crashOnMalformed      bool // a payload it cannot parse kills it
	sameSession           bool // does not grow its session across restarts
	volatileRecord        bool // keeps the record in memory only: a restart forgets it
	legacy                bool // declares dedupe:false, query:false and runs every delivery
}

// record is one command in the device's record.
type record struct {
	first, latest wire.Receipt
}

// disk is what survives a crash of the reference device.
type disk struct {
	session  int64
	boots    int
	commands map[string]*record
	ops      map[string]string // operation_id → the command_id that took it
}

// refDevice is a small, independent device written from docs/protocol.md:
// one MQTT connection, a record on its "disk" (memory shared across its
// restarts), one message at a time. It shares no code with the simulator
// or the device library, so that the suite is proven against something
// else than what it will check.
type refDevice struct {
	t          *testing.T
	id, broker string
	root       string
	fl         flaws

	mu     sync.Mutex
	disk   disk
	client mqtt.Client
	conn   net.Conn
	queue  []mqtt.Message
	signal chan struct{}
	dead   chan struct{} // closed when the current incarnation dies
}

func startRefDevice(t *testing.T, broker, id string, fl flaws) *refDevice {
	d := &refDevice{t: t, id: id, broker: broker, root: wire.DefaultTopicRoot, fl: fl,
		disk: disk{commands: map[string]*record{}, ops: map[string]string{}}}
	d.boot()
	t.Cleanup(d.stop)
	return d
}

func (d *refDevice) topic(k wire.Kind) string { return wire.Topic(d.root, d.id, k) }

// boot starts an incarnation from the disk and waits for its birth.
func (d *refDevice) boot() {
	d.mu.Lock()
	if d.fl.volatileRecord {
		d.disk.commands, d.disk.ops = map[string]*record{}, map[string]string{}
	}
	if !d.fl.sameSession || d.disk.session == 0 {
		d.disk.session++
	}
	d.disk.boots++
	session := d.disk.session
	d.queue, d.signal, d.dead = nil, make(chan struct{}, 1), make(chan struct{})
	dead := d.dead
	d.mu.Unlock()

	will, _ := json.Marshal(wire.Presence{Online: false, Session: session})
	born := make(chan struct{})
	opts := mqtt.NewClientOptions().AddBroker(d.broker).SetClientID(d.id).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		SetBinaryWill(d.topic(wire.KindPresence), will, 1, true).
		SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			c, err := net.Dial("tcp", u.Host)
			if err == nil {
				d.mu.Lock()
				d.conn = c
				d.mu.Unlock()
			}
			return c, err
		}).
		SetOnConnectHandler(func(c mqtt.Client) {
			tok := c.SubscribeMultiple(map[string]byte{d.topic(wire.KindCommands): 1, d.topic(wire.KindQueries): 1}, d.enqueue)
			tok.WaitTimeout(5 * time.Second)
			caps := &wire.Capabilities{Dedupe: !d.fl.legacy, Query: !d.fl.legacy}
			now := time.Now().UTC()
			b, _ := json.Marshal(wire.Presence{Online: true, Session: session, Capabilities: caps, At: &now})
			c.Publish(d.topic(wire.KindPresence), 1, !d.fl.birthNotRetained, b).WaitTimeout(5 * time.Second)
			close(born)
		})
	client := mqtt.NewClient(opts)
	d.mu.Lock()
	d.client = client
	d.mu.Unlock()
	if tok := client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		d.t.Errorf("reference device %s: connect: %v", d.id, tok.Error())
		return
	}
	select {
	case <-born:
	case <-time.After(10 * time.Second):
		d.t.Errorf("reference device %s: no birth", d.id)
	}
	go d.work(client, dead)
}

// enqueue is paho's handler: it never blocks.
func (d *refDevice) enqueue(_ mqtt.Client, m mqtt.Message) {
	d.mu.Lock()
	d.queue = append(d.queue, m)
	sig := d.signal
	d.mu.Unlock()
	select {
	case sig <- struct{}{}:
	default:
	}
}

func (d *refDevice) work(c mqtt.Client, dead chan struct{}) {
	for {
		d.mu.Lock()
		var m mqtt.Message
		if len(d.queue) > 0 {
			m, d.queue = d.queue[0], d.queue[1:]
		}
		sig := d.signal
		d.mu.Unlock()
		if m == nil {
			select {
			case <-sig:
				continue
			case <-dead:
				return
			}
		}
		select {
		case <-dead:
			return
		default:
		}
		switch m.Topic() {
		case d.topic(wire.KindCommands):
			d.command(c, m.Payload())
		case d.topic(wire.KindQueries):
			d.query(c, m.Payload())
		}
	}
}

// crash kills the incarnation abruptly: the TCP connection closes without
// DISCONNECT, so the broker publishes the last will.
func (d *refDevice) crash() {
	d.mu.Lock()
	conn, client, dead := d.conn, d.client, d.dead
	d.mu.Unlock()
	select {
	case <-dead:
		return
	default:
	}
	close(dead)
	if conn != nil {
		_ = conn.Close()
	}
	if client != nil {
		client.Disconnect(0) // the socket is closed: nothing reaches the broker
	}
}

// restart is the suite's Restart: crash, then boot from the disk.
func (d *refDevice) restart() {
	d.crash()
	d.boot()
}

// stop is a clean shutdown: its own offline presence, then DISCONNECT.
func (d *refDevice) stop() {
	d.mu.Lock()
	client, dead, session := d.client, d.dead, d.disk.session
	d.mu.Unlock()
	select {
	case <-dead:
		return
	default:
	}
	close(dead)
	now := time.Now().UTC()
	b, _ := json.Marshal(wire.Presence{Online: false, Session: session, At: &now})
	client.Publish(d.topic(wire.KindPresence), 1, true, b).WaitTimeout(5 * time.Second)
	client.Disconnect(250)
}

func (d *refDevice) publish(c mqtt.Client, r wire.Receipt) {
	b, _ := wire.Encode(r)
	c.Publish(d.topic(wire.KindReceipts), 1, false, b).WaitTimeout(5 * time.Second)
}

func (d *refDevice) seq(n int) int {
	if d.fl.seqFromZero {
		return n - 1
	}
	return n
}

func (d *refDevice) command(c mqtt.Client, payload []byte) {
	var cmd wire.Command
	if err := wire.Decode(payload, &cmd); err != nil || cmd.CommandID == "" {
		if d.fl.crashOnMalformed {
			d.crash()
		}
		return
	}
	now := time.Now()
	expired := now.After(cmd.ExpiresAt)
	rejectExpired := func() {
		r := wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID, Status: wire.ReceiptRejected, Seq: 1, At: time.Now().UTC(), Error: "expired"}
		d.mu.Lock()
		d.disk.commands[cmd.CommandID] = &record{first: r, latest: r}
		d.mu.Unlock()
		d.publish(c, r)
	}
	if d.fl.expiryBeforeDedupe && expired {
		rejectExpired()
		return
	}
	if !d.fl.legacy {
		d.mu.Lock()
		rec := d.disk.commands[cmd.CommandID]
		if d.fl.rerunCommandID {
			rec = nil
		}
		if owner := d.disk.ops[cmd.OperationID]; rec == nil && !d.fl.noOperationCheck && owner != "" && owner != cmd.CommandID {
			rec = d.disk.commands[owner]
		}
		d.mu.Unlock()
		if rec != nil {
			d.publish(c, rec.latest)
			return
		}
	}
	if expired && !d.fl.noExpiryCheck {
		rejectExpired()
		return
	}
	r := wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID}
	rec := &record{}
	step := func(status wire.ReceiptStatus, n int, result json.RawMessage) {
		r.Status, r.Seq, r.Result, r.At = status, d.seq(n), result, time.Now().UTC()
		d.mu.Lock()
		if n == 1 {
			rec.first = r
		}
		rec.latest = r
		d.disk.commands[cmd.CommandID] = rec
		if d.disk.ops[cmd.OperationID] == "" {
			d.disk.ops[cmd.OperationID] = cmd.CommandID
		}
		d.mu.Unlock()
		d.publish(c, r)
	}
	step(wire.ReceiptReceived, 1, nil)
	step(wire.ReceiptExecuting, 2, nil)
	d.mu.Lock()
	d.disk.boots++
	result, _ := json.Marshal(map[string]any{"restarted": true, "boots": d.disk.boots})
	d.mu.Unlock()
	step(wire.ReceiptSucceeded, 3, result)
}

func (d *refDevice) query(c mqtt.Client, payload []byte) {
	var q wire.Query
	if err := wire.Decode(payload, &q); err != nil || q.QueryID == "" {
		if d.fl.crashOnMalformed {
			d.crash()
		}
		return
	}
	if d.fl.legacy {
		return
	}
	d.mu.Lock()
	var r wire.Receipt
	if rec := d.disk.commands[q.CommandID]; rec != nil {
		r = rec.latest
		if d.fl.staleQueryKnown {
			r = rec.first
		}
	} else if owner := d.disk.ops[q.OperationID]; owner != "" && !d.fl.queryIgnoresOperation {
		r = d.disk.commands[owner].latest
	} else {
		r = wire.Receipt{CommandID: q.CommandID, OperationID: q.OperationID, Status: wire.ReceiptUnknown, At: time.Now().UTC()}
		if d.fl.unknownWithSeq1 {
			r.Seq = 1
		}
	}
	d.mu.Unlock()
	r.QueryID = q.QueryID
	d.publish(c, r)
}
