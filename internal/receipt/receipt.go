// Package receipt ingests what devices report: receipts and presence. These
// are facts, and any controller instance may apply them, each in one
// transaction guarded by the command's receipt rank or the device's
// presence rank (see the store). Applying the same fact twice is harmless,
// which is what makes the MQTT layer's early PUBACK safe.
//
// A receipt whose topic's device or operation_id does not match its command
// is recorded with effect mismatch and changes nothing; malformed payloads
// are logged and counted (controller_receipts_total{effect="malformed"}) and
// change nothing.
package receipt

import (
	"context"
	"errors"
	"log/slog"

	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Source yields received messages.
type Source interface {
	Next(ctx context.Context) (mqttx.Message, error)
}

// Config configures an Ingestor.
type Config struct {
	Store      store.Store
	Source     Source
	TopicRoot  string
	Failpoints *failpoint.Set
	Metrics    *metrics.Metrics
	Logger     *slog.Logger
	// OnReceipt is told what each applied receipt did (to wake waiters and
	// let the lease holder decide what follows).
	OnReceipt func(store.ReceiptOutcome)
	// OnPresence is told of each applied presence change, before the next
	// message is handled.
	OnPresence func(context.Context, store.PresenceOutcome)
}

// Ingestor applies receipts and presence messages in arrival order.
type Ingestor struct{ cfg Config }

// New builds an Ingestor.
func New(cfg Config) *Ingestor {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnReceipt == nil {
		cfg.OnReceipt = func(store.ReceiptOutcome) {}
	}
	if cfg.OnPresence == nil {
		cfg.OnPresence = func(context.Context, store.PresenceOutcome) {}
	}
	return &Ingestor{cfg: cfg}
}

// Run processes messages until ctx ends or the source closes.
func (in *Ingestor) Run(ctx context.Context) error {
	for {
		m, err := in.cfg.Source.Next(ctx)
		if err != nil {
			return nil // ctx ended, or the transport stopped
		}
		in.Handle(ctx, m)
	}
}

// Handle applies one message.
func (in *Ingestor) Handle(ctx context.Context, m mqttx.Message) {
	device, kind, err := wire.ParseTopic(in.cfg.TopicRoot, m.Topic)
	if err != nil {
		in.malformed(m, err)
		return
	}
	switch kind {
	case wire.KindReceipts:
		var r wire.Receipt
		if err := wire.Decode(m.Payload, &r); err != nil {
			in.malformed(m, err)
			return
		}
		if err := r.Validate(); err != nil {
			in.malformed(m, err)
			return
		}
		out, err := in.cfg.Store.ApplyReceipt(ctx, device, r, func() error {
			return in.cfg.Failpoints.HitContext(ctx, failpoint.BeforeReceiptCommit)
		})
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				in.cfg.Logger.Error("receipt not recorded", "device", device, "command_id", r.CommandID, "err", err)
			}
			return
		}
		in.cfg.Logger.Debug("receipt", "device", device, "command_id", out.CommandID, "status", r.Status, "effect", out.Effect)
		in.cfg.OnReceipt(out)
	case wire.KindPresence:
		var p wire.Presence
		if err := wire.Decode(m.Payload, &p); err != nil {
			in.malformed(m, err)
			return
		}
		out, err := in.cfg.Store.ApplyPresence(ctx, device, p)
		if err != nil {
			in.cfg.Logger.Error("presence not recorded", "device", device, "err", err)
			return
		}
		effect := "stale"
		if out.Applied {
			effect = "applied"
			in.cfg.OnPresence(ctx, out)
		}
		in.cfg.Metrics.Presence.WithLabelValues(effect).Inc()
	default:
		// Commands and queries are ours; we are not subscribed to them.
	}
}

func (in *Ingestor) malformed(m mqttx.Message, err error) {
	in.cfg.Metrics.Receipts.WithLabelValues("malformed").Inc()
	in.cfg.Logger.Warn("malformed message ignored", "topic", m.Topic, "bytes", len(m.Payload), "err", err)
}
