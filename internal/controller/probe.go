package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/metrics"
)

// receiptProbe proves, after each broker connect, that the receipt
// subscription delivers: the controller publishes a probe on its own
// receipts topic, {root}/controller-{id}/receipts (no device id starts
// with controller-), and waits for it to come back through the
// subscription. A broker that accepts the subscription and delivers
// nothing (an ACL without read on {root}/+/receipts, a broker that
// silently ignores a filter) is logged as an error and shown in
// controller_receipt_subscription_ok; the controller goes on (its queries
// still find outcomes, slowly), and probes again at the next connect.
type receiptProbe struct {
	topic   string
	met     *metrics.Metrics
	log     *slog.Logger
	connect chan struct{}
	timeout time.Duration

	mu      sync.Mutex
	nonce   string
	arrival chan struct{}
}

// probeTimeout is how long a probe may take to come back.
const probeTimeout = 5 * time.Second

func newReceiptProbe(topic string, met *metrics.Metrics, log *slog.Logger) *receiptProbe {
	return &receiptProbe{topic: topic, met: met, log: log, connect: make(chan struct{}, 1), timeout: probeTimeout}
}

// connected is called after each connect, once the subscriptions are in
// place; it never blocks.
func (p *receiptProbe) connected() {
	select {
	case p.connect <- struct{}{}:
	default:
	}
}

// arrived is the ingestor's callback for a message on the probe topic.
func (p *receiptProbe) arrived(payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.arrival != nil && string(payload) == p.nonce {
		close(p.arrival)
		p.arrival = nil
	}
}

type publisher interface {
	Publish(ctx context.Context, topic string, qos byte, retained bool, payload []byte) error
}

// run probes after each connect until ctx ends.
func (p *receiptProbe) run(ctx context.Context, pub publisher) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.connect:
		}
		p.once(ctx, pub)
	}
}

// once publishes one probe and waits for it.
func (p *receiptProbe) once(ctx context.Context, pub publisher) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	nonce := `{"probe":"` + hex.EncodeToString(b[:]) + `"}`
	arrival := make(chan struct{})
	p.mu.Lock()
	p.nonce, p.arrival = nonce, arrival
	p.mu.Unlock()
	start := time.Now()
	if err := pub.Publish(ctx, p.topic, 1, false, []byte(nonce)); err != nil {
		if ctx.Err() == nil {
			p.log.Warn("receipt subscription probe not published; probing again at the next connect", "topic", p.topic, "err", err)
		}
		return
	}
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-arrival:
		p.met.ReceiptSubscription.Set(1)
		p.log.Info("receipt subscription delivers", "probe_ms", time.Since(start).Milliseconds())
	case <-timer.C:
		p.met.ReceiptSubscription.Set(0)
		p.log.Error("RECEIPT SUBSCRIPTION DELIVERS NOTHING: a probe published on this controller's own receipts topic did not come back; "+
			"receipts are found only by queries, slowly. Check the broker's ACL (read on {root}/+/receipts, write on the probe topic) "+
			"and that the broker delivers plain wildcard subscriptions", "topic", p.topic, "waited", p.timeout)
	}
}
