package device

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

var errNotNow = errors.New("device: stopped or stopping")

// connectLoop makes the first connection; paho's auto-reconnect keeps it up
// afterwards (see onReconnecting). Each attempt gets a new client, because a
// client's will (which carries the session number) is fixed when it is made.
func (d *Device) connectLoop() {
	backoff := 50 * time.Millisecond
	for {
		client, err := d.newClient()
		if errors.Is(err, errNotNow) {
			return
		}
		if err != nil {
			d.log.Error("cannot connect", "err", err)
		} else {
			tok := client.Connect()
			select {
			case <-tok.Done():
			case <-d.done:
				go client.Disconnect(0)
				return
			}
			if tok.Error() == nil {
				return
			}
			d.log.Debug("connect failed", "err", tok.Error())
			client.Disconnect(0)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-d.done:
			t.Stop()
			return
		}
		backoff = min(2*backoff, max(d.o.MaxReconnectInterval, 50*time.Millisecond))
	}
}

// newClient saves the next session number and makes a client whose will
// carries it.
func (d *Device) newClient() (mqtt.Client, error) {
	d.mu.Lock()
	if d.killed || d.stopping {
		d.mu.Unlock()
		return nil, errNotNow
	}
	session, ok := d.nextSessionLocked()
	if !ok {
		d.mu.Unlock()
		return nil, errNotNow
	}
	client := mqtt.NewClient(d.options(session))
	d.client = client
	d.mu.Unlock()
	if !d.waitDurable() {
		return nil, errNotNow
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.killed || d.stopping || d.client != client {
		return nil, errNotNow
	}
	d.ready = true
	return client, nil
}

// nextSessionLocked raises the session number and hands it to the journal;
// the attempt that uses it waits until it is durable, and openConn refuses
// until then (d.ready).
func (d *Device) nextSessionLocked() (int64, bool) {
	d.ready = false
	d.st.Session++
	if !d.saveLocked() {
		return 0, false
	}
	d.session = d.st.Session
	return d.st.Session, true
}

func (d *Device) options(session int64) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	o.AddBroker(d.o.Broker)
	o.SetClientID(d.id)
	o.SetUsername(d.o.Username)
	if d.pw != "" {
		o.SetPassword(d.pw)
	}
	o.SetProtocolVersion(4)
	// A persistent session: QoS 1 commands sent while the device is away
	// wait for it at the broker, and an unacknowledged one is redelivered.
	o.SetCleanSession(false)
	o.SetKeepAlive(d.o.KeepAlive)
	o.SetPingTimeout(d.o.KeepAlive)
	o.SetConnectTimeout(d.o.ConnectTimeout)
	o.SetWriteTimeout(d.o.PublishTimeout)
	o.SetAutoReconnect(true)
	o.SetMaxReconnectInterval(d.o.MaxReconnectInterval)
	o.SetConnectRetry(false)
	o.SetResumeSubs(false)
	// A command is acknowledged once the device has recorded it.
	o.SetAutoAckDisabled(true)
	o.SetOrderMatters(true)
	o.SetStore(newCopyStore())
	o.SetBinaryWill(d.topics.presence, lwtPayload(session), 1, true)
	o.SetDefaultPublishHandler(d.onMessage)
	o.SetOnConnectHandler(d.onConnect)
	o.SetReconnectingHandler(d.onReconnecting)
	o.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
		d.log.Debug("connection lost", "err", err)
	})
	o.SetCustomOpenConnectionFn(d.openConn)
	return o
}

func lwtPayload(session int64) []byte {
	b, _ := json.Marshal(wire.Presence{Online: false, Session: session})
	return b
}

// onMessage hands the message to the worker and returns at once.
func (d *Device) onMessage(_ mqtt.Client, m mqtt.Message) { d.inbox.push(m) }

// onReconnecting runs in paho's reconnect goroutine before every attempt:
// it saves a new session number and puts it in the will.
func (d *Device) onReconnecting(c mqtt.Client, o *mqtt.ClientOptions) {
	d.mu.Lock()
	if d.killed || d.stopping || c != d.client {
		d.ready = false
		d.mu.Unlock()
		return
	}
	session, ok := d.nextSessionLocked()
	if !ok {
		d.mu.Unlock()
		return
	}
	o.SetBinaryWill(d.topics.presence, lwtPayload(session), 1, true)
	d.mu.Unlock()
	if !d.waitDurable() {
		return // not ready: openConn refuses this attempt
	}
	d.mu.Lock()
	if !d.killed && !d.stopping && c == d.client {
		d.ready = true
	}
	d.mu.Unlock()
}

// openConn dials the broker for paho, refusing once the device stops or
// without a durable session number for this attempt.
func (d *Device) openConn(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
	if h := d.o.Hooks.Connect; h != nil && !h(d.done) {
		d.mu.Lock()
		d.ready = false
		d.mu.Unlock()
		return nil, errNotNow
	}
	d.mu.Lock()
	ok := !d.killed && !d.stopping && d.ready
	d.ready = false
	d.mu.Unlock()
	if !ok {
		return nil, errNotNow
	}
	dialer := net.Dialer{Timeout: d.o.ConnectTimeout}
	raw, err := dialer.Dial("tcp", uri.Host)
	if err != nil {
		return nil, err
	}
	c := raw
	if d.tls != nil {
		if c, err = d.handshake(raw, uri); err != nil {
			return nil, err
		}
	}
	nc := &netConn{Conn: c, raw: raw, onDown: d.connDown}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.killed || d.stopping {
		raw.Close()
		return nil, errNotNow
	}
	d.conn = nc
	d.gen.Add(1)
	return nc, nil
}

// handshake runs the TLS client handshake on raw within the connect
// timeout (paho's own dialer is replaced by openConn, so TLS is done here).
func (d *Device) handshake(raw net.Conn, uri *url.URL) (net.Conn, error) {
	tc := d.tls.Clone()
	if tc.ServerName == "" {
		tc.ServerName = uri.Hostname()
	}
	c := tls.Client(raw, tc)
	_ = raw.SetDeadline(time.Now().Add(d.o.ConnectTimeout))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, fmt.Errorf("tls handshake with %s: %w", uri.Host, err)
	}
	_ = raw.SetDeadline(time.Time{})
	return c, nil
}

// connDown runs when a connection fails or is closed.
func (d *Device) connDown(nc *netConn) {
	d.gen.Add(1)
	go func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.conn == nc {
			d.setOnlineLocked(false)
		}
	}()
}

// onConnect (its own goroutine, from paho) subscribes, publishes the birth
// and then the receipts that waited for a connection. Subscribing comes
// first so that a controller reacting to the birth finds the device
// listening; paho's reconnects come through here too, so they resubscribe.
func (d *Device) onConnect(c mqtt.Client) {
	d.mu.Lock()
	if d.killed || d.stopping || c != d.client || d.conn == nil {
		d.mu.Unlock()
		return
	}
	nc, gen := d.conn, d.gen.Load()
	now, session, caps := d.now().UTC(), d.st.Session, d.caps
	d.mu.Unlock()

	tok := c.SubscribeMultiple(map[string]byte{d.topics.commands: 1, d.topics.queries: 1}, nil)
	if !d.wait(tok, d.o.PublishTimeout) {
		d.log.Warn("subscribe failed, reconnecting", "err", tok.Error())
		nc.kill()
		return
	}
	birth, _ := json.Marshal(wire.Presence{Online: true, Session: session, Capabilities: &caps, At: &now})
	tok = c.Publish(d.topics.presence, 1, true, birth)
	if !d.wait(tok, d.o.PublishTimeout) {
		d.log.Warn("birth not acknowledged, reconnecting", "err", tok.Error())
		nc.kill()
		return
	}

	d.mu.Lock()
	if d.killed || d.stopping || d.conn != nc || d.gen.Load() != gen {
		d.mu.Unlock()
		return
	}
	d.setOnlineLocked(true)
	d.mu.Unlock()
	d.log.Debug("online", "session", session)
	if h := d.o.Hooks.Online; h != nil {
		h(session)
	}
	d.flushPending()
}

// wait waits for a token up to timeout, or until the device stops or
// dies; true if it completed without error.
func (d *Device) wait(tok mqtt.Token, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error() == nil
	case <-d.done:
		return false
	case <-d.dead:
		return false
	case <-t.C:
		return false
	}
}

// connectedLocked: online on a connection that has not failed.
func (d *Device) connectedLocked() bool { return d.connected && d.conn.up() }

// emit hands a receipt, once durable, to Hooks.Receipt or publishes it.
// Every receipt is the latest of its command in the record (or a query's
// answer), so a lost one is still what a repeat or a query gets.
func (d *Device) emit(r wire.Receipt) {
	if !d.waitDurable() {
		return
	}
	if h := d.o.Hooks.Receipt; h != nil {
		send := d.send
		if send == nil { // Hooks.Receipt set after New
			send = func(r Receipt) { d.publish(fromReceipt(r)) }
		}
		h(toReceipt(r), send)
		return
	}
	d.publish(r)
}

// publish sends a receipt (QoS 1, not retained) if the device is online,
// else keeps it for the next connection. Receipts leave in the order they
// were emitted: a new one queues behind those still waiting, so a final
// receipt emitted while a reconnect's flush is under way never overtakes
// the command's earlier receipts.
func (d *Device) publish(r wire.Receipt) {
	d.mu.Lock()
	if d.killed {
		d.mu.Unlock()
		return
	}
	d.pending = append(d.pending, r)
	d.mu.Unlock()
	d.flushPending()
}

// confirm waits for the broker's acknowledgement. One not acknowledged on
// the connection it was sent on is kept for the next connection.
func (d *Device) confirm(tok mqtt.Token, r wire.Receipt, gen uint64) {
	defer d.publishDone()
	select {
	case <-tok.Done():
	case <-d.dead:
		return
	}
	ok := tok.Error() == nil && d.gen.Load() == gen
	d.mu.Lock()
	if d.killed {
		d.mu.Unlock()
		return
	}
	if !ok {
		d.log.Debug("receipt not confirmed, kept for the next connection", "command_id", r.CommandID, "status", r.Status, "err", tok.Error())
		d.pending = append(d.pending, r)
		if d.connected {
			time.AfterFunc(100*time.Millisecond, d.flushPending)
		}
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	if h := d.o.Hooks.Published; h != nil {
		h(toReceipt(r))
	}
}

func (d *Device) publishDone() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inflight--
	d.wakeIdleLocked()
}

// wakeIdleLocked ends waitIdle's wait once no publish is in flight and no
// flush is under way.
func (d *Device) wakeIdleLocked() {
	if d.inflight == 0 && !d.flushing && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
}

// waitIdle waits until every publish is acknowledged, or the timeout.
func (d *Device) waitIdle(timeout time.Duration) bool {
	d.mu.Lock()
	if d.inflight == 0 && !d.flushing {
		d.mu.Unlock()
		return true
	}
	if d.idle == nil {
		d.idle = make(chan struct{})
	}
	ch := d.idle
	d.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// flushPending publishes, in order, the receipts that wait, while the
// device is online. One flush runs at a time: a receipt queued meanwhile is
// taken by the running flush, after those before it.
func (d *Device) flushPending() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.flushing {
		return
	}
	d.flushing = true
	defer func() {
		d.flushing = false
		d.wakeIdleLocked()
	}()
	for len(d.pending) > 0 && !d.killed && d.connectedLocked() && d.client != nil {
		items, client, gen := d.pending, d.client, d.gen.Load()
		d.pending = nil
		d.inflight += len(items)
		d.mu.Unlock()
		for _, r := range items {
			payload, _ := wire.Encode(r)
			tok := client.Publish(d.topics.receipts, 1, false, payload)
			go d.confirm(tok, r, gen)
		}
		d.mu.Lock()
	}
}

// netConn wraps the TCP connection (or the TLS connection on it) so the
// device can cut it abruptly and learn when it fails.
type netConn struct {
	net.Conn
	raw    net.Conn // the TCP connection under a TLS one (else Conn itself)
	once   sync.Once
	dead   atomic.Bool // killed by the device
	broken atomic.Bool // failed, closed or killed
	onDown func(*netConn)
}

// errConnCut is what a killed connection reports. It must not read "use of
// closed network connection": paho takes that for its own deliberate close
// and would notice the loss only by a missed ping.
var errConnCut = errors.New("device: connection cut")

func (c *netConn) Read(b []byte) (int, error) {
	if c.dead.Load() {
		return 0, errConnCut
	}
	n, err := c.Conn.Read(b)
	if err != nil {
		c.down()
		if c.dead.Load() {
			err = errConnCut
		}
	}
	return n, err
}

func (c *netConn) Write(b []byte) (int, error) {
	if c.dead.Load() {
		return 0, errConnCut
	}
	n, err := c.Conn.Write(b)
	if err != nil {
		c.down()
		if c.dead.Load() {
			err = errConnCut
		}
	}
	return n, err
}

func (c *netConn) Close() error {
	c.down()
	return c.Conn.Close()
}

// kill resets the connection: nothing more is written on it (no TLS
// close_notify either), the broker sees the socket close without DISCONNECT.
func (c *netConn) kill() {
	c.dead.Store(true)
	if tc, ok := c.raw.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.raw.Close()
	c.down()
}

func (c *netConn) down() {
	c.broken.Store(true)
	c.once.Do(func() { c.onDown(c) })
}

// up reports whether the connection has not failed yet.
func (c *netConn) up() bool { return c != nil && !c.broken.Load() }
