// Package mqttx is the controller's MQTT transport over paho.mqtt.golang.
//
// The rules it keeps: a stable client id (controller-{instance}); a
// persistent session (CleanSession false) so the broker queues receipts while
// the controller is away, though correctness never depends on it (instances
// sharing a PostgreSQL store use clean sessions and a shared subscription);
// subscriptions made in the OnConnect handler, so every reconnect
// resubscribes; a message handler that never blocks: it appends the message
// to an in-memory queue and returns. Acknowledgement is manual (paho's
// SetAutoAckDisabled): the PUBACK of a QoS 1 message goes out only when its
// consumer calls Message.Ack, after the transaction that recorded it
// committed. Until then the broker keeps the message and redelivers it to
// the session after a reconnect, so a receipt is never acknowledged and then
// lost with a crashed process. The queue is bounded by the broker: it sends
// at most max_inflight_messages unacknowledged QoS 1 messages per client
// (the shipped config sets it), and holds the rest. An Ack after the
// connection it came on was lost is dropped by paho; the broker redelivers.
// Every token is waited on with WaitTimeout.
//
// Against the secure profile (mosquitto/secure.conf.tmpl) the client logs in
// with Username and Password, over TLS (an ssl:// URL) trusting the CA of
// ClientTLS. A connection the broker closes while it is up, whose first
// reconnect attempt the broker then takes at once, is reported as a session
// taken over (LossTakenOver): in MQTT 3.1.1 that is what a broker does to
// the older of two connections with one client id, and a broker that went
// away would have refused the attempt.
package mqttx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Message is one message received on a subscribed topic.
type Message struct {
	Topic   string
	Payload []byte
	At      time.Time
	ack     func()
}

// Ack sends the message's PUBACK (QoS 1); call it once the message's effect
// is durable, or once it is known to have none. Safe to call more than once,
// and on a Message that did not come from the broker.
func (m Message) Ack() {
	if m.ack != nil {
		m.ack()
	}
}

// NewMessage builds a message as the broker would deliver it, with ack
// called by Ack (for tests and in-process sources).
func NewMessage(topic string, payload []byte, ack func()) Message {
	return Message{Topic: topic, Payload: payload, At: time.Now(), ack: ack}
}

// Config configures a Client.
type Config struct {
	URL      string
	ClientID string
	// Subscriptions: topic filter → QoS, made on every connect.
	Subscriptions map[string]byte
	// Timeout bounds every connect, subscribe and publish wait.
	Timeout      time.Duration
	KeepAlive    time.Duration
	Logger       *slog.Logger
	CleanSession bool
	// Username and Password log in (the secure profile); empty: anonymous.
	Username, Password string
	// TLS configures ssl:// URLs (ClientTLS); nil: the system's roots.
	// tcp:// URLs are plain whatever it says.
	TLS *tls.Config
	// OnLoss, if set, is told why each lost connection was lost, once the
	// next connection is up (see Loss).
	OnLoss func(Loss)
}

// Loss is why a connection was lost, as far as the client can tell.
type Loss string

const (
	// LossTakenOver: the broker closed the connection while it was up, and
	// took the first reconnect attempt at once. Another client connected
	// with this client id (or the broker dropped this client for a missed
	// keepalive, after a stall of this process).
	LossTakenOver Loss = "session_taken_over"
	// LossClosed: the broker closed the connection and was not there for
	// the first reconnect attempt (a broker stop or restart).
	LossClosed Loss = "closed_by_broker"
	// LossError: anything else (a ping timeout, a reset, a write error).
	LossError Loss = "error"
)

// ClientTLS returns a TLS configuration for ssl:// URLs that trusts only
// the CA certificates in the PEM file caFile, TLS 1.2 at least; the broker's
// certificate must name the URL's host (an IP SAN for 127.0.0.1).
func ClientTLS(caFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("mqtt CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("mqtt CA %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// lossWatch classifies lost connections (see Loss). paho calls the
// connection-lost handler in a goroutine of its own, concurrently with the
// reconnect, so a loss and the reconnect that follows it may be seen in
// either order: whichever comes second classifies the pair.
type lossWatch struct {
	mu       sync.Mutex
	connects int    // connections made
	attempts int    // reconnect attempts since the last connect
	lossSeen bool   // a loss seen whose reconnect is not yet
	closed   bool   // ... and the broker closed that connection (EOF)
	connSeen bool   // a reconnect seen whose loss is not yet
	tries    int    // ... after that many attempts
	lastFail string // the last connect failure said, until a connect succeeds
}

// failed reports whether a connect failure with this reason is new.
func (w *lossWatch) failed(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	msg := fmt.Sprint(err)
	if msg == w.lastFail {
		return false
	}
	w.lastFail = msg
	return true
}

// lost records a lost connection; it returns its cause if its reconnect
// was seen already.
func (w *lossWatch) lost(err error) (Loss, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if w.connSeen {
		w.connSeen = false
		return classify(closed, w.tries), true
	}
	w.lossSeen, w.closed = true, closed
	return "", false
}

func (w *lossWatch) attempt() {
	w.mu.Lock()
	w.attempts++
	w.mu.Unlock()
}

// connected records a connection; after a reconnect it returns the cause
// of the loss before it, if that loss was seen already.
func (w *lossWatch) connected() (Loss, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastFail = ""
	w.connects++
	tries := w.attempts
	w.attempts = 0
	switch {
	case w.connects == 1: // the first connection: nothing was lost
		return "", false
	case w.lossSeen:
		w.lossSeen = false
		return classify(w.closed, tries), true
	default:
		w.connSeen, w.tries = true, tries
		return "", false
	}
}

// classify: see Loss. A broker that went away refuses the first attempt; one
// that closed a live connection (a session taken over) takes it.
func classify(closed bool, attempts int) Loss {
	switch {
	case !closed:
		return LossError
	case attempts <= 1:
		return LossTakenOver
	default:
		return LossClosed
	}
}

// Client is a connected MQTT client with an inbound queue.
type Client struct {
	cfg   Config
	c     mqtt.Client
	inbox *queue
	log   *slog.Logger
	ready chan struct{} // closed at the first connect
	loss  lossWatch

	connects chan struct{} // signalled after every connect (Connects)
}

// ErrTimeout is returned when the broker does not answer within the timeout.
var ErrTimeout = errors.New("mqtt: timed out waiting for the broker")

// New builds a client; Start connects it.
func New(cfg Config) *Client {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cl := &Client{cfg: cfg, inbox: newQueue(), log: cfg.Logger, ready: make(chan struct{}), connects: make(chan struct{}, 1)}
	opts := mqtt.NewClientOptions().
		AddBroker(cfg.URL).
		SetClientID(cfg.ClientID).
		SetCleanSession(cfg.CleanSession).
		SetKeepAlive(cfg.KeepAlive).
		SetPingTimeout(cfg.Timeout).
		SetConnectTimeout(cfg.Timeout).
		SetWriteTimeout(cfg.Timeout).
		SetAutoAckDisabled(true).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(500 * time.Millisecond).
		SetMaxReconnectInterval(2 * time.Second).
		SetCustomOpenConnectionFn(openConn).
		SetDefaultPublishHandler(cl.handle).
		SetOnConnectHandler(cl.onConnect).
		SetReconnectingHandler(func(mqtt.Client, *mqtt.ClientOptions) { cl.loss.attempt() }).
		SetConnectionNotificationHandler(func(_ mqtt.Client, n mqtt.ConnectionNotification) {
			if f, ok := n.(mqtt.ConnectionNotificationFailed); ok && cl.loss.failed(f.Reason) {
				// Once per distinct reason until a connect succeeds: a
				// wrong password or CA is said once, not every retry.
				cl.log.Warn("mqtt connect failed; retrying", "url", cfg.URL, "client_id", cfg.ClientID, "err", f.Reason)
			}
		}).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			cl.log.Warn("mqtt connection lost", "err", err)
			if loss, ok := cl.loss.lost(err); ok {
				cl.lossFound(loss)
			}
		})
	if cfg.Username != "" {
		opts.SetUsername(cfg.Username)
	}
	if cfg.Password != "" {
		opts.SetPassword(cfg.Password)
	}
	if cfg.TLS != nil {
		opts.SetTLSConfig(cfg.TLS)
	}
	cl.c = mqtt.NewClient(opts)
	return cl
}

// Start connects, waiting at most until ctx ends; with connect-retry on,
// paho keeps trying in the background until it reaches the broker.
func (cl *Client) Start(ctx context.Context) error {
	tok := cl.c.Connect()
	for {
		if tok.WaitTimeout(200 * time.Millisecond) {
			if err := tok.Error(); err != nil {
				return err
			}
			close(cl.ready)
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("mqtt connect %s: %w", cl.cfg.URL, err)
		}
	}
}

// handle never blocks: it queues the message, unacknowledged, and returns.
func (cl *Client) handle(_ mqtt.Client, m mqtt.Message) {
	cl.inbox.push(Message{Topic: m.Topic(), Payload: append([]byte(nil), m.Payload()...), At: time.Now(), ack: m.Ack})
}

func (cl *Client) onConnect(c mqtt.Client) {
	cl.log.Info("mqtt connected", "client_id", cl.cfg.ClientID)
	if loss, ok := cl.loss.connected(); ok {
		cl.lossFound(loss)
	}
	// Subscribing waits on the broker; paho calls this handler in its own
	// goroutine, but the wait must still be bounded.
	go func() {
		if len(cl.cfg.Subscriptions) > 0 {
			tok := c.SubscribeMultiple(cl.cfg.Subscriptions, cl.handle)
			if !tok.WaitTimeout(cl.cfg.Timeout) {
				cl.log.Error("mqtt subscribe timed out; dropping the connection to retry")
				c.Disconnect(0)
				return
			}
			if err := tok.Error(); err != nil {
				cl.log.Error("mqtt subscribe failed", "err", err)
				return
			}
		}
		select {
		case cl.connects <- struct{}{}:
		default: // one pending signal stands for several connects
		}
	}()
}

// lossFound reports a lost connection's cause.
func (cl *Client) lossFound(loss Loss) {
	if loss == LossTakenOver {
		cl.log.Warn("mqtt session taken over: the broker closed the connection while it was up and took the reconnect at once; "+
			"another client connected with this client id (or this process stalled past its keepalive)",
			"client_id", cl.cfg.ClientID)
	}
	if cl.cfg.OnLoss != nil {
		cl.cfg.OnLoss(loss)
	}
}

// Publish sends one message and waits for the broker's acknowledgement
// (QoS 1) or the write (QoS 0), at most the configured timeout.
func (cl *Client) Publish(ctx context.Context, topic string, qos byte, retained bool, payload []byte) error {
	tok := cl.c.Publish(topic, qos, retained, payload)
	timeout := cl.cfg.Timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	if !tok.WaitTimeout(timeout) {
		return fmt.Errorf("publish %s: %w", topic, ErrTimeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}

// Next returns the next received message, blocking until one arrives or ctx ends.
func (cl *Client) Next(ctx context.Context) (Message, error) { return cl.inbox.pop(ctx) }

// Backlog is how many received messages wait to be processed.
func (cl *Client) Backlog() int { return cl.inbox.len() }

// Connected reports whether the client is connected now.
func (cl *Client) Connected() bool { return cl.c.IsConnectionOpen() }

// Ready is closed once the client first connected.
func (cl *Client) Ready() <-chan struct{} { return cl.ready }

// Connects receives after every connect and reconnect, once the
// subscriptions are in place; several connects before it is read make one.
func (cl *Client) Connects() <-chan struct{} { return cl.connects }

// Run connects (see Start), stays connected until ctx ends, then stops.
func (cl *Client) Run(ctx context.Context) error {
	if err := cl.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	<-ctx.Done()
	cl.Stop()
	return nil
}

// Stop disconnects cleanly, waiting up to 250 ms for in-flight work.
func (cl *Client) Stop() {
	cl.c.Disconnect(250)
	cl.inbox.close()
}

// queue is a FIFO the MQTT handler never waits on. Its length is bounded by
// the broker's in-flight window, since nothing in it is acknowledged yet.
type queue struct {
	mu     sync.Mutex
	items  []Message
	signal chan struct{}
	closed bool
}

func newQueue() *queue { return &queue{signal: make(chan struct{}, 1)} }

func (q *queue) push(m Message) {
	q.mu.Lock()
	q.items = append(q.items, m)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *queue) pop(ctx context.Context) (Message, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			m := q.items[0]
			q.items[0] = Message{}
			q.items = q.items[1:]
			if len(q.items) > 0 {
				select {
				case q.signal <- struct{}{}:
				default:
				}
			}
			q.mu.Unlock()
			return m, nil
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return Message{}, errors.New("mqtt: client stopped")
		}
		select {
		case <-q.signal:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}
