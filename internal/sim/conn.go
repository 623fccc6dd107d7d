package sim

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

// incarnation is one boot of a device: its MQTT client, its goroutines and
// everything it holds only in memory. A crash discards it whole.
type incarnation struct {
	d *Device
	// done is closed when the incarnation stops handling messages (a crash,
	// or the start of a clean stop).
	done chan struct{}
	// dead is closed when it is gone (a crash, or the end of a clean stop).
	dead chan struct{}
	// gen changes with every connection opened or lost; a publish is
	// confirmed only if its PUBACK came on the connection it was sent on
	// (paho completes the tokens of stored messages when it resends them
	// after a reconnect, before any PUBACK).
	gen atomic.Uint64

	// inbox feeds the worker (commands and queries, in arrival order) and
	// jobs the executor (actions, one at a time); each runs in a goroutine
	// only while it has work.
	inbox *serial[mqtt.Message]
	jobs  *serial[job]
	loops sync.WaitGroup

	// Guarded by d.mu.
	killed    bool
	stopping  bool
	client    mqtt.Client
	conn      *netConn
	ready     bool // a session number is saved and the will set for the next attempt
	connected bool // subscribed and birth published on the current connection
	pending   []wire.Receipt
	held      *heldReceipt
	timers    map[*time.Timer]outgoing
	inflight  int
	idle      chan struct{}
}

var errNotNow = errors.New("device is offline, crashed or stopping")

func newIncarnation(d *Device) *incarnation {
	inc := &incarnation{
		d:      d,
		done:   make(chan struct{}),
		dead:   make(chan struct{}),
		timers: map[*time.Timer]outgoing{},
	}
	inc.inbox = newSerial(inc.done, &inc.loops, inc.handleMessage)
	inc.jobs = newSerial(inc.done, &inc.loops, inc.execute)
	return inc
}

// run starts the first connection.
func (inc *incarnation) run() {
	inc.loops.Add(1)
	go func() { defer inc.loops.Done(); inc.connectLoop() }()
}

// connectLoop makes the first connection; paho's auto-reconnect keeps it up
// afterwards (see onReconnecting). Each attempt gets a new client, because a
// client's will (which carries the session number) is fixed when it is made.
func (inc *incarnation) connectLoop() {
	d := inc.d
	backoff := 50 * time.Millisecond
	for {
		if !inc.waitOnlineWindow() {
			return
		}
		client, err := inc.newClient()
		if err != nil {
			d.log.Error("cannot connect", "err", err)
		} else {
			tok := client.Connect()
			select {
			case <-tok.Done():
			case <-inc.done:
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
		case <-inc.done:
			t.Stop()
			return
		}
		backoff = min(2*backoff, max(d.f.cfg.MaxReconnectInterval, 50*time.Millisecond))
	}
}

// newClient saves the next session number and makes a client whose will
// carries it.
func (inc *incarnation) newClient() (mqtt.Client, error) {
	d := inc.d
	d.mu.Lock()
	if inc.killed || inc.stopping {
		d.mu.Unlock()
		return nil, errNotNow
	}
	session, t, err := inc.nextSessionLocked()
	if err != nil {
		d.mu.Unlock()
		return nil, err
	}
	client := mqtt.NewClient(inc.options(session))
	inc.client = client
	d.mu.Unlock()
	if err := t.wait(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if inc.killed || inc.stopping || inc.client != client {
		return nil, errNotNow
	}
	inc.ready = true
	return client, nil
}

// nextSessionLocked raises the session number and hands it to the journal;
// the attempt that uses it waits for the returned batch, and openConn
// refuses until then (inc.ready).
func (inc *incarnation) nextSessionLocked() (int64, *batch, error) {
	d := inc.d
	inc.ready = false
	d.st.Session++
	if !inc.saveLocked() {
		return 0, nil, errors.New("cannot save the session number")
	}
	d.session = d.st.Session
	return d.st.Session, d.last, nil
}

func (inc *incarnation) options(session int64) *mqtt.ClientOptions {
	d := inc.d
	cfg := d.f.cfg
	o := mqtt.NewClientOptions()
	o.AddBroker(cfg.MQTT)
	o.SetClientID(d.id)
	o.SetUsername(d.id)
	if pw := cfg.password(d.id); pw != "" {
		o.SetPassword(pw)
	}
	o.SetProtocolVersion(4)
	// A persistent session: QoS 1 commands sent while the device is away
	// wait for it at the broker, and an unacknowledged one is redelivered.
	o.SetCleanSession(false)
	o.SetKeepAlive(cfg.KeepAlive)
	o.SetPingTimeout(cfg.KeepAlive)
	o.SetConnectTimeout(cfg.ConnectTimeout)
	o.SetWriteTimeout(cfg.PublishTimeout)
	o.SetAutoReconnect(true)
	o.SetMaxReconnectInterval(cfg.MaxReconnectInterval)
	o.SetConnectRetry(false)
	o.SetResumeSubs(false)
	// A command is acknowledged once the device has recorded it.
	o.SetAutoAckDisabled(true)
	o.SetOrderMatters(true)
	o.SetStore(newCopyStore())
	o.SetBinaryWill(d.topics.presence, lwtPayload(session), 1, true)
	o.SetDefaultPublishHandler(inc.onMessage)
	o.SetOnConnectHandler(inc.onConnect)
	o.SetReconnectingHandler(inc.onReconnecting)
	o.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
		d.log.Debug("connection lost", "err", err)
	})
	o.SetCustomOpenConnectionFn(inc.openConn)
	return o
}

func lwtPayload(session int64) []byte {
	b, _ := json.Marshal(wire.Presence{Online: false, Session: session})
	return b
}

// onMessage hands the message to the worker and returns at once.
func (inc *incarnation) onMessage(_ mqtt.Client, m mqtt.Message) { inc.inbox.push(m) }

// onReconnecting runs in paho's reconnect goroutine before every attempt:
// it holds the attempt back while the device is meant to be offline, then
// saves a new session number and puts it in the will.
func (inc *incarnation) onReconnecting(c mqtt.Client, o *mqtt.ClientOptions) {
	if !inc.waitOnlineWindow() {
		return
	}
	d := inc.d
	d.mu.Lock()
	if inc.killed || inc.stopping || c != inc.client {
		inc.ready = false
		d.mu.Unlock()
		return
	}
	session, t, err := inc.nextSessionLocked()
	if err != nil {
		d.mu.Unlock()
		d.log.Error("cannot save session", "err", err)
		return
	}
	o.SetBinaryWill(d.topics.presence, lwtPayload(session), 1, true)
	d.mu.Unlock()
	if err := t.wait(); err != nil {
		d.log.Error("cannot save session", "err", err)
		return // not ready: openConn refuses this attempt
	}
	d.mu.Lock()
	if !inc.killed && !inc.stopping && c == inc.client {
		inc.ready = true
	}
	d.mu.Unlock()
}

// waitOnlineWindow waits while the device is meant to be offline; false
// when the incarnation ends meanwhile.
func (inc *incarnation) waitOnlineWindow() bool {
	d := inc.d
	for {
		d.mu.Lock()
		if inc.killed || inc.stopping {
			d.mu.Unlock()
			return false
		}
		if !d.offlineLocked() {
			d.mu.Unlock()
			return true
		}
		wake := d.wake
		var tc <-chan time.Time
		var t *time.Timer
		if !d.offHold {
			t = time.NewTimer(time.Until(d.offUntil))
			tc = t.C
		}
		d.mu.Unlock()
		select {
		case <-wake:
		case <-tc:
		case <-inc.done:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// openConn dials the broker for paho, refusing while the device is offline,
// dead, or without a saved session number for this attempt.
func (inc *incarnation) openConn(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
	d := inc.d
	d.mu.Lock()
	ok := !inc.killed && !inc.stopping && inc.ready && !d.offlineLocked()
	inc.ready = false
	d.mu.Unlock()
	if !ok {
		return nil, errNotNow
	}
	dialer := net.Dialer{Timeout: d.f.cfg.ConnectTimeout}
	raw, err := dialer.Dial("tcp", uri.Host)
	if err != nil {
		return nil, err
	}
	c := raw
	if tlsScheme(uri.Scheme) {
		if c, err = handshake(raw, uri, d.f.cfg); err != nil {
			return nil, err
		}
	}
	nc := &netConn{Conn: c, raw: raw, onDown: inc.connDown}
	d.mu.Lock()
	defer d.mu.Unlock()
	if inc.killed || inc.stopping {
		raw.Close()
		return nil, errNotNow
	}
	inc.conn = nc
	inc.gen.Add(1)
	return nc, nil
}

// handshake runs the TLS client handshake on raw within the connect
// timeout (paho's own dialer is replaced by openConn, so TLS is done here).
func handshake(raw net.Conn, uri *url.URL, cfg Config) (net.Conn, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLS != nil {
		tc = cfg.TLS.Clone()
	}
	if tc.ServerName == "" {
		tc.ServerName = uri.Hostname()
	}
	c := tls.Client(raw, tc)
	_ = raw.SetDeadline(time.Now().Add(cfg.ConnectTimeout))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, fmt.Errorf("tls handshake with %s: %w", uri.Host, err)
	}
	_ = raw.SetDeadline(time.Time{})
	return c, nil
}

// connDown runs when a connection fails or is closed.
func (inc *incarnation) connDown(nc *netConn) {
	inc.gen.Add(1)
	go func() {
		d := inc.d
		d.mu.Lock()
		defer d.mu.Unlock()
		if inc.conn == nc && inc.connected {
			inc.connected = false
			if d.inc == inc {
				d.setOnlineLocked(false)
			}
		}
	}()
}

// onConnect (its own goroutine, from paho) subscribes, publishes the birth
// and then the receipts that waited for a connection. Subscribing comes
// first so that a controller reacting to the birth finds the device
// listening; paho's reconnects come through here too, so they resubscribe.
func (inc *incarnation) onConnect(c mqtt.Client) {
	d := inc.d
	cfg := d.f.cfg
	d.mu.Lock()
	if inc.killed || inc.stopping || c != inc.client || inc.conn == nil {
		d.mu.Unlock()
		return
	}
	nc, gen := inc.conn, inc.gen.Load()
	caps, now, session := d.capsLocked(), d.nowLocked(), d.st.Session
	d.mu.Unlock()

	tok := c.SubscribeMultiple(map[string]byte{d.topics.commands: 1, d.topics.queries: 1}, nil)
	if !inc.wait(tok, cfg.PublishTimeout) {
		d.log.Warn("subscribe failed, reconnecting", "err", tok.Error())
		nc.kill()
		return
	}
	birth, _ := json.Marshal(wire.Presence{Online: true, Session: session, Capabilities: &caps, At: &now})
	tok = c.Publish(d.topics.presence, 1, true, birth)
	if !inc.wait(tok, cfg.PublishTimeout) {
		d.log.Warn("birth not acknowledged, reconnecting", "err", tok.Error())
		nc.kill()
		return
	}

	d.mu.Lock()
	if inc.killed || inc.stopping || inc.conn != nc || inc.gen.Load() != gen {
		d.mu.Unlock()
		return
	}
	inc.connected = true
	d.stats.Connects++
	d.setOnlineLocked(true)
	d.mu.Unlock()
	d.log.Debug("online", "session", session)
	inc.flushPending()
}

// wait waits for a token up to timeout, or until the incarnation stops or
// dies; true if it completed without error.
func (inc *incarnation) wait(tok mqtt.Token, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error() == nil
	case <-inc.done:
		return false
	case <-inc.dead:
		return false
	case <-t.C:
		return false
	}
}

// connectedLocked: online on a connection that has not failed.
func (inc *incarnation) connectedLocked() bool { return inc.connected && inc.conn.up() }

// killLocked ends the incarnation as a crash does: the TCP connection is
// reset (no DISCONNECT, so the broker publishes the LWT) and nothing of it
// writes anything afterwards.
func (inc *incarnation) killLocked() {
	if inc.killed {
		return
	}
	d := inc.d
	inc.killed = true
	if !inc.stopping {
		close(inc.done)
	}
	close(inc.dead)
	for t := range inc.timers {
		t.Stop()
	}
	if inc.held != nil {
		inc.held.timer.Stop()
	}
	if inc.conn != nil {
		inc.conn.kill()
	}
	if c := inc.client; c != nil {
		go c.Disconnect(0) // its writes fail on the killed connection
	}
	if d.inc == inc {
		d.inc, d.st = nil, nil
		d.setOnlineLocked(false)
	}
}

// shutdown is the clean end (after stopping was set and done closed): let
// the worker and the executor finish, publish what is pending, wait for the
// acknowledgements, publish the retained offline presence, DISCONNECT.
func (inc *incarnation) shutdown() {
	d := inc.d
	cfg := d.f.cfg
	inc.inbox.stop()
	inc.jobs.stop()
	inc.loops.Wait()
	inc.flushDelayed()
	inc.flushPending()
	if !inc.waitIdle(cfg.PublishTimeout) {
		d.log.Warn("shutdown: receipts not acknowledged in time")
	}
	d.mu.Lock()
	if inc.killed {
		d.mu.Unlock()
		return
	}
	client, nc, connected := inc.client, inc.conn, inc.connected
	var offline []byte
	if d.st != nil {
		now := d.nowLocked()
		offline, _ = json.Marshal(wire.Presence{Online: false, Session: d.st.Session, At: &now})
	}
	d.mu.Unlock()
	switch {
	case connected && offline != nil:
		tok := client.Publish(d.topics.presence, 1, true, offline)
		if !tok.WaitTimeout(cfg.PublishTimeout) || tok.Error() != nil {
			d.log.Warn("shutdown: offline presence not acknowledged", "err", tok.Error())
		}
		client.Disconnect(250)
	case client != nil:
		// Not connected (or not yet born): nothing to say; the broker has
		// or will have the LWT.
		if nc != nil {
			nc.kill()
		}
		client.Disconnect(0)
	}
	d.mu.Lock()
	inc.killed = true
	close(inc.dead)
	if d.inc == inc {
		d.inc, d.st = nil, nil
		d.setOnlineLocked(false)
	}
	d.mu.Unlock()
}

// netConn wraps the TCP connection (or the TLS connection on it) so the
// simulator can cut it abruptly and learn when it fails.
type netConn struct {
	net.Conn
	raw    net.Conn // the TCP connection under a TLS one (else Conn itself)
	once   sync.Once
	dead   atomic.Bool // killed by the simulator
	broken atomic.Bool // failed, closed or killed
	onDown func(*netConn)
}

// errConnCut is what a killed connection reports. It must not read "use of
// closed network connection": paho takes that for its own deliberate close
// and would notice the loss only by a missed ping.
var errConnCut = errors.New("sim: connection cut")

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
