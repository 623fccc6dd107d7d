package command

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Publisher sends one MQTT message.
type Publisher interface {
	Publish(ctx context.Context, topic string, qos byte, retained bool, payload []byte) error
}

// Config configures a Dispatcher.
type Config struct {
	Store     *store.Store
	Publisher Publisher
	Instance  string
	TopicRoot string
	// Policy returns the policy of an action.
	Policy func(action string) Policy
	// TrustMargin is subtracted from a lease's expiry for the check made
	// right before acting.
	TrustMargin   time.Duration
	SweepInterval time.Duration
	Workers       int
	Failpoints    *failpoint.Set
	Metrics       *metrics.Metrics
	Logger        *slog.Logger
	Now           func() time.Time
	// Changed is told of every operation whose state this dispatcher changed.
	Changed func(operationID string)
}

// Dispatcher publishes, asks about, re-sends and times out the commands of
// the operations this instance holds.
type Dispatcher struct {
	cfg      Config
	work     chan string
	mu       sync.Mutex
	inFlight map[string]bool
	again    map[string]bool
	wg       sync.WaitGroup
}

// New validates cfg and builds a Dispatcher; Run starts it.
func New(cfg Config) *Dispatcher {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Changed == nil {
		cfg.Changed = func(string) {}
	}
	return &Dispatcher{cfg: cfg, work: make(chan string, 4096), inFlight: map[string]bool{}, again: map[string]bool{}}
}

// Kick asks for a command to be looked at soon (a new submit, an answer that
// calls for a decision). It never blocks; a dropped kick is picked up by the
// sweeper, since every open command has a next check time.
func (d *Dispatcher) Kick(commandID string) {
	d.mu.Lock()
	if d.inFlight[commandID] {
		d.again[commandID] = true
		d.mu.Unlock()
		return
	}
	d.inFlight[commandID] = true
	d.mu.Unlock()
	select {
	case d.work <- commandID:
	default:
		d.done(commandID)
	}
}

func (d *Dispatcher) done(commandID string) (again bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	again = d.again[commandID]
	delete(d.again, commandID)
	if !again {
		delete(d.inFlight, commandID)
	}
	return again
}

// Run starts the workers and the sweeper; it returns when ctx ends and the
// workers have stopped.
func (d *Dispatcher) Run(ctx context.Context) {
	for i := 0; i < d.cfg.Workers; i++ {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-d.work:
					for {
						d.step(ctx, id)
						if !d.done(id) || ctx.Err() != nil {
							break
						}
					}
				}
			}
		}()
	}
	t := time.NewTicker(d.cfg.SweepInterval)
	defer t.Stop()
	for {
		d.sweep(ctx, false)
		select {
		case <-ctx.Done():
			d.wg.Wait()
			return
		case <-t.C:
		}
	}
}

// Reconcile asks about every open command this instance holds, whatever its
// state: after a broker (re)connect a final receipt may have been lost.
func (d *Dispatcher) Reconcile(ctx context.Context) {
	d.cfg.Metrics.Reconciles.Inc()
	open, err := d.cfg.Store.DueCommands(ctx, d.cfg.Instance, d.cfg.Now(), true, 1<<30)
	if err != nil {
		d.cfg.Logger.Error("reconcile: list open commands", "err", err)
		return
	}
	d.cfg.Logger.Info("reconcile: asking about open commands", "count", len(open))
	for _, oc := range open {
		if ctx.Err() != nil {
			return
		}
		d.ask(ctx, oc, true)
	}
}

func (d *Dispatcher) sweep(ctx context.Context, all bool) {
	due, err := d.cfg.Store.DueCommands(ctx, d.cfg.Instance, d.cfg.Now(), all, 1000)
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Logger.Error("sweep: list due commands", "err", err)
		}
		return
	}
	for _, oc := range due {
		d.Kick(oc.CommandID)
	}
}

// step reads a command fresh and makes the one decision it needs now.
func (d *Dispatcher) step(ctx context.Context, commandID string) {
	oc, err := d.cfg.Store.OpenCommand(ctx, commandID)
	if errors.Is(err, store.ErrNotFound) {
		return // terminal, or its operation is no longer started
	}
	if err != nil {
		d.cfg.Logger.Error("read command", "command_id", commandID, "err", err)
		return
	}
	if oc.Fence.Owner != d.cfg.Instance {
		return // another instance's work
	}
	now := d.cfg.Now()
	c := oc.Command
	if !now.Before(c.ExpiresAt) && c.Status != fsm.CmdNeedsAttention {
		d.finish(ctx, oc, fsm.CmdTimeout, fsm.ReasonTimeout)
		return
	}
	if now.Before(c.NextCheckAt) {
		return
	}
	switch c.Status {
	case fsm.CmdPending:
		d.send(ctx, oc)
	case fsm.CmdSent, fsm.CmdReceived, fsm.CmdExecuting:
		d.check(ctx, oc)
	}
}

// device returns what the controller knows of a device; one never seen
// cannot deduplicate or answer queries.
func (d *Dispatcher) device(ctx context.Context, id string) store.Device {
	dev, err := d.cfg.Store.GetDevice(ctx, id)
	if err != nil {
		return store.UnseenDevice(id)
	}
	return dev
}

// check runs after the ack timeout (and each backoff) with no final receipt.
func (d *Dispatcher) check(ctx context.Context, oc store.OpenCommand) {
	c := oc.Command
	dev := d.device(ctx, c.DeviceID)
	pol := d.cfg.Policy(c.Action)
	unanswered := c.LastQueryID != "" && c.LastAnswer == ""
	resend := dev.Capabilities.Dedupe && c.Status == fsm.CmdSent && c.Attempt < pol.MaxAttempts &&
		(c.LastAnswer == string(wire.ReceiptUnknown) || unanswered || !dev.Capabilities.Query)
	switch {
	case resend:
		d.send(ctx, oc)
	case dev.Capabilities.Query && c.Queries < pol.MaxAttempts:
		d.ask(ctx, oc, false)
	default:
		// Asks and sends used up: wait for the expiry.
		if err := d.cfg.Store.Postpone(ctx, c.CommandID, c.Version, oc.Fence, c.ExpiresAt); err != nil && !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("postpone", "command_id", c.CommandID, "err", err)
		}
	}
}

// trusted is the check made right before acting on a committed decision.
func (d *Dispatcher) trusted(lease time.Time) bool {
	if d.cfg.Now().Before(lease.Add(-d.cfg.TrustMargin)) {
		return true
	}
	d.cfg.Metrics.FencingRefused.Inc()
	return false
}

// send commits a publish decision (pending → sent, or attempt n → n+1) and
// then publishes the command, unchanged but for attempt.
func (d *Dispatcher) send(ctx context.Context, oc store.OpenCommand) {
	c := oc.Command
	pol := d.cfg.Policy(c.Action)
	next := d.cfg.Now().Add(pol.Backoff(c.Attempt))
	dec, err := d.cfg.Store.ClaimSend(ctx, c.CommandID, c.Status, c.Attempt, oc.Fence, next)
	if err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("claim send", "command_id", c.CommandID, "err", err)
		}
		return
	}
	if err := d.cfg.Failpoints.HitContext(ctx, failpoint.BeforePublish); err != nil {
		d.cfg.Logger.Warn("publish skipped by failpoint", "command_id", c.CommandID, "err", err)
		return
	}
	if !d.trusted(dec.LeaseExpiresAt) {
		d.cfg.Logger.Warn("publish dropped: lease outside its trust window", "command_id", c.CommandID)
		return
	}
	c = dec.Command
	msg := wire.Command{CommandID: c.CommandID, OperationID: c.OperationID, Action: c.Action,
		Params: json.RawMessage(c.Params), IssuedAt: c.IssuedAt, ExpiresAt: c.ExpiresAt, Attempt: c.Attempt}
	payload, _ := json.Marshal(msg)
	d.publish(ctx, "command", wire.Topic(d.cfg.TopicRoot, c.DeviceID, wire.KindCommands), byte(c.QoS), payload, c.CommandID)
}

// ask commits a query decision and publishes the Query.
func (d *Dispatcher) ask(ctx context.Context, oc store.OpenCommand, reconcile bool) {
	c := oc.Command
	if c.Status == fsm.CmdPending {
		d.Kick(c.CommandID) // never published: send it
		return
	}
	dev := d.device(ctx, c.DeviceID)
	if !dev.Capabilities.Query {
		if reconcile {
			d.Kick(c.CommandID)
		}
		return
	}
	pol := d.cfg.Policy(c.Action)
	qid := NewQueryID(d.cfg.Now())
	next := d.cfg.Now().Add(pol.Backoff(c.Queries))
	dec, err := d.cfg.Store.ClaimQuery(ctx, c.CommandID, qid, c.Status, c.Queries, oc.Fence, next)
	if err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("claim query", "command_id", c.CommandID, "err", err)
		}
		return
	}
	if !d.trusted(dec.LeaseExpiresAt) {
		return
	}
	payload, _ := json.Marshal(wire.Query{QueryID: qid, CommandID: c.CommandID, OperationID: c.OperationID})
	d.publish(ctx, "query", wire.Topic(d.cfg.TopicRoot, c.DeviceID, wire.KindQueries), 1, payload, c.CommandID)
}

func (d *Dispatcher) publish(ctx context.Context, kind, topic string, qos byte, payload []byte, commandID string) {
	err := d.cfg.Publisher.Publish(ctx, topic, qos, false, payload)
	if err == nil {
		err = d.cfg.Failpoints.HitContext(ctx, failpoint.AfterPublish)
	}
	if err != nil {
		// Unconfirmed: the sweeper asks again at the next check.
		d.cfg.Metrics.PublishFailures.WithLabelValues(kind).Inc()
		d.cfg.Logger.Warn("publish unconfirmed", "kind", kind, "command_id", commandID, "err", err)
		return
	}
	d.cfg.Metrics.Publishes.WithLabelValues(kind).Inc()
}

// finish commits a decision that ends a command without the device's word.
func (d *Dispatcher) finish(ctx context.Context, oc store.OpenCommand, to fsm.CommandState, reason string) {
	c := oc.Command
	if _, err := d.cfg.Store.Finish(ctx, c.CommandID, c.Status, c.Version, to, reason, oc.Fence); err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("finish command", "command_id", c.CommandID, "to", to, "err", err)
		}
		return
	}
	d.cfg.Changed(c.OperationID)
}
