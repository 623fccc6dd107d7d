package command

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
	"golang.org/x/sync/errgroup"
)

// Publisher sends one MQTT message.
type Publisher interface {
	Publish(ctx context.Context, topic string, qos byte, retained bool, payload []byte) error
}

// Config configures a Dispatcher.
type Config struct {
	Store     store.Store
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
}

// Dispatcher publishes, asks about, re-sends and times out the commands of
// the operations this instance holds.
type Dispatcher struct {
	cfg      Config
	work     chan string
	mu       sync.Mutex
	inFlight map[string]bool
	again    map[string]bool
	// inserted holds new commands as their submit inserted them, for their
	// first step (see Submitted).
	inserted map[string]store.OpenCommand
	wg       sync.WaitGroup
	// connected carries one pending reconcile after a broker (re)connect.
	connected chan struct{}
	// queues carries devices whose serial queue moved (QueueMoved).
	queues chan string
}

// DefaultWorkers is how many commands a dispatcher steps at once: enough
// for their decisions to share the store's commits.
const DefaultWorkers = 32

// New builds a Dispatcher; Run starts it.
func New(cfg Config) *Dispatcher {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
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
	return &Dispatcher{cfg: cfg, work: make(chan string, 4096), inFlight: map[string]bool{}, again: map[string]bool{},
		inserted: map[string]store.OpenCommand{}, connected: make(chan struct{}, 1), queues: make(chan string, 4096)}
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

// Submitted is Kick for a command that needs its first decision. A new
// one comes as its submit inserted it (nil otherwise), and its first step
// decides on that copy without reading it. The copy may be out of date by
// then (a cancel, another kick's step); the decision's conditional write
// refuses it if so, as it would a read one.
func (d *Dispatcher) Submitted(commandID string, inserted *store.OpenCommand) {
	if inserted != nil {
		d.mu.Lock()
		d.inserted[commandID] = *inserted
		d.mu.Unlock()
	}
	d.Kick(commandID)
}

// QueueMoved is told that a serial command of device ended (here or on
// another instance): the head of its queue, read now that the end is
// committed, is kicked if it was never published. It never blocks; a
// dropped one is found by the queued commands' own later checks.
func (d *Dispatcher) QueueMoved(device string) {
	select {
	case d.queues <- device:
	default:
	}
}

// runQueues reads the head of each device whose queue moved and kicks it.
func (d *Dispatcher) runQueues(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case device := <-d.queues:
			head, unpublished, ok, err := d.cfg.Store.QueueHead(ctx, device)
			if err != nil {
				if ctx.Err() == nil {
					d.cfg.Logger.Error("read the head of a queue", "device_id", device, "err", err)
				}
				continue
			}
			if ok && unpublished {
				d.Kick(head) // another holder's is dropped at its step
			}
		}
	}
}

func (d *Dispatcher) done(commandID string) (again bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	again = d.again[commandID]
	delete(d.again, commandID)
	if !again {
		delete(d.inFlight, commandID)
		delete(d.inserted, commandID) // a dropped kick's: the sweeper reads it
	}
	return again
}

// openCommand is the command for a step: as its submit inserted it, the
// first time, else as stored now.
func (d *Dispatcher) openCommand(ctx context.Context, commandID string) (store.OpenCommand, error) {
	d.mu.Lock()
	oc, ok := d.inserted[commandID]
	delete(d.inserted, commandID)
	d.mu.Unlock()
	if ok {
		return oc, nil
	}
	return d.cfg.Store.OpenCommand(ctx, commandID)
}

// Run starts the workers and the sweeper, and reconciles after every
// broker (re)connect (see Connected); it returns when ctx ends and the
// workers have stopped.
func (d *Dispatcher) Run(ctx context.Context) error {
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
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.runQueues(ctx)
	}()
	defer d.wg.Wait()
	t := time.NewTicker(d.cfg.SweepInterval)
	defer t.Stop()
	for {
		d.sweep(ctx, false)
		select {
		case <-ctx.Done():
			return nil
		case <-d.connected:
			d.reconnected(ctx)
		case <-t.C:
		}
	}
}

// Connected is told of every connect and reconnect to the broker. It never
// blocks; several connects before the next reconcile make one.
func (d *Dispatcher) Connected() {
	select {
	case d.connected <- struct{}{}:
	default:
	}
}

// reconnected runs after a (re)connect: the broker may have lost its
// sessions, so presence is a hint until each device speaks again, and a
// final receipt may have been lost while the controller was away.
func (d *Dispatcher) reconnected(ctx context.Context) {
	if err := d.cfg.Store.UnconfirmAll(ctx); err != nil && ctx.Err() == nil {
		d.cfg.Logger.Error("unconfirm devices", "err", err)
	}
	d.reconcile(ctx)
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
	retrying, err := d.cfg.Store.RetryingCommands(ctx, d.cfg.Instance, 1000)
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Logger.Error("sweep: list retrying operations", "err", err)
		}
		return
	}
	for _, id := range retrying {
		d.Kick(id)
	}
}

// step reads a command fresh and makes the one decision it needs now.
func (d *Dispatcher) step(ctx context.Context, commandID string) {
	oc, err := d.openCommand(ctx, commandID)
	if errors.Is(err, domain.ErrNotFound) {
		d.retryStep(ctx, commandID) // terminal: maybe the last command of a retry
		return
	}
	if err != nil {
		d.cfg.Logger.Error("read command", "command_id", commandID, "err", err)
		return
	}
	if oc.Fence.Owner != d.cfg.Instance {
		return // another instance's work
	}
	if oc.Claimed {
		// Its submit committed the publish decision: publish it.
		d.publishClaimed(ctx, store.Decision{Command: oc.Command, LeaseExpiresAt: oc.LeaseExpiresAt}, oc.Fence)
		return
	}
	dev := d.device(ctx, oc.DeviceID)
	pol := d.cfg.Policy(oc.Action)
	switch dec := Decide(oc.Command, dev, pol, d.cfg.Now()); dec.Kind {
	case Send:
		d.send(ctx, oc, dev, pol)
	case Ask:
		d.ask(ctx, oc.Command, oc.Fence, dev, pol, true)
	case Move:
		d.move(ctx, oc, dec.To, dec.Reason, dec.Until)
	case Postpone:
		d.postpone(ctx, oc, dec.Until)
	}
}

// Kind is what the lease holder does about an open command now.
type Kind int

// Decisions.
const (
	Wait     Kind = iota // nothing yet: its next check has not come
	Send                 // publish it (first send or a re-send of the same command_id)
	Ask                  // publish a Query about it
	Move                 // change its state without the device's word
	Postpone             // look again at Until
)

// Decision is the outcome of the decision table.
type Decision struct {
	Kind   Kind
	To     fsm.CommandState // Move
	Reason string           // Move
	Until  time.Time        // Move (next check), Postpone
}

// Decide is the dispatcher's decision table: from a command's state and
// counters, the device's presence and capabilities, the action's policy,
// the device's last answer and the time, the one thing to do now. It is
// pure; the store's conditional writes make the decision stick or refuse it.
func Decide(c domain.Command, dev domain.Device, pol Policy, now time.Time) Decision {
	move := func(to fsm.CommandState, reason string) Decision {
		return Decision{Kind: Move, To: to, Reason: reason, Until: c.ExpiresAt}
	}
	if !now.Before(c.ExpiresAt) {
		switch {
		case c.Status == fsm.CmdNeedsAttention:
			return Decision{Kind: Wait}
		case c.Attempt > 0 && !canResend(dev, pol):
			return move(fsm.CmdNeedsAttention, "expired with the outcome unproven (device cannot deduplicate)")
		default:
			return move(fsm.CmdTimeout, fsm.ReasonTimeout)
		}
	}
	if waitsItsTurn(c) {
		if c.QueuedBehind != "" {
			// Queued: the one ahead's end wakes it (the post-commit feed);
			// the check set here is the fallback, never past its expiry.
			return Decision{Kind: Postpone, Until: earliest(c.ExpiresAt, now.Add(pol.QueuedRecheck()))}
		}
		// Its turn came: decide now, whatever check its wait had set.
	} else if now.Before(c.NextCheckAt) {
		return Decision{Kind: Wait}
	}
	switch c.Status {
	case fsm.CmdPending:
		switch {
		case dev.Online:
			return Decision{Kind: Send}
		case pol.Offline == OfflineFail:
			return move(fsm.CmdFailed, fsm.ReasonDeviceOffline)
		default:
			return move(fsm.CmdWaitingDevice, "device offline")
		}
	case fsm.CmdWaitingDevice:
		switch {
		case !dev.Online:
			return Decision{Kind: Postpone, Until: c.ExpiresAt}
		case c.Attempt == 0:
			return Decision{Kind: Send} // never published: send it
		default:
			return check(c, dev, pol) // published before: ask first
		}
	case fsm.CmdSent, fsm.CmdReceived, fsm.CmdExecuting:
		if !dev.Online && dev.Capabilities.Dedupe {
			return move(fsm.CmdWaitingDevice, "device offline before a final receipt")
		}
		return check(c, dev, pol)
	case fsm.CmdNeedsAttention:
		return Decision{Kind: Postpone, Until: c.ExpiresAt.Add(24 * time.Hour)}
	}
	return Decision{Kind: Wait}
}

// waitsItsTurn: a serial command never published, still waiting for the
// commands ahead of it on its device, or first in line after them.
func waitsItsTurn(c domain.Command) bool {
	return c.SerialSeq > 0 && c.Attempt == 0 && c.Status == fsm.CmdPending &&
		(c.QueuedBehind != "" || c.Reason == store.ReasonQueued)
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// canResend: the device deduplicates, or the caller accepts a duplicate.
func canResend(dev domain.Device, pol Policy) bool {
	return dev.Capabilities.Dedupe || pol.OnUnknown == UnknownResend
}

// device returns what the controller knows of a device; one never seen is
// offline and cannot deduplicate or answer queries.
func (d *Dispatcher) device(ctx context.Context, id string) domain.Device {
	dev, err := d.cfg.Store.GetDevice(ctx, id)
	if err != nil {
		return store.UnseenDevice(id)
	}
	return dev
}

// check is the row of the table for a published command with no final
// receipt after the ack timeout (and each backoff): ask, or re-send the same
// command after an unanswered question, or, for a device that cannot
// deduplicate, park the command for a person once its asks are used up.
func check(c domain.Command, dev domain.Device, pol Policy) Decision {
	unanswered := c.LastQueryID != "" && c.LastAnswer == ""
	unknown := c.LastAnswer == string(wire.ReceiptUnknown)
	resend := canResend(dev, pol) && (c.Status == fsm.CmdSent || c.Status == fsm.CmdWaitingDevice) &&
		c.Attempt < pol.MaxAttempts && (unknown || unanswered || !dev.Capabilities.Query)
	switch {
	case resend:
		return Decision{Kind: Send}
	case dev.Capabilities.Query && (c.Queries < pol.MaxAttempts || c.LastQueryID == ""):
		// Within the budget; or with no question outstanding (a new holder
		// after a takeover or restart forgot it): ask before anything else.
		return Decision{Kind: Ask}
	case dev.Capabilities.Query && canResend(dev, pol) && (c.Status == fsm.CmdReceived || c.Status == fsm.CmdExecuting):
		// The device has it and said so: one lost answer must not hide a
		// finished action, so it is asked again, at the capped back-off,
		// until expires_at.
		return Decision{Kind: Ask}
	case !canResend(dev, pol) && c.Attempt > 0:
		return Decision{Kind: Move, To: fsm.CmdNeedsAttention, Reason: "asks used up, outcome unproven (device cannot deduplicate)", Until: c.ExpiresAt}
	default:
		return Decision{Kind: Postpone, Until: c.ExpiresAt} // sends and asks used up: wait for the expiry
	}
}

func (d *Dispatcher) postpone(ctx context.Context, oc store.OpenCommand, until time.Time) {
	if err := d.cfg.Store.Postpone(ctx, oc.CommandID, oc.Version, oc.Fence, until); err != nil && !errors.Is(err, store.ErrRefused) {
		d.cfg.Logger.Error("postpone", "command_id", oc.CommandID, "err", err)
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

// recheckSoon brings the next check of a decision that was committed but
// not acted on (its lease was outside the trust window) forward to the end
// of that window: by then the heartbeat has renewed the lease, or it has
// expired and a takeover resets the check, instead of the command waiting
// the back-off the decision set. A refusal means the lease is gone already.
func (d *Dispatcher) recheckSoon(ctx context.Context, dec store.Decision, f domain.Fence) {
	c := dec.Command
	at := d.cfg.Now().Add(d.cfg.TrustMargin)
	if err := d.cfg.Store.Postpone(ctx, c.CommandID, c.Version, f, at); err != nil && !errors.Is(err, store.ErrRefused) {
		d.cfg.Logger.Error("recheck soon", "command_id", c.CommandID, "err", err)
	}
}

// send commits a publish decision (pending|waiting_device → sent, or
// attempt n → n+1) and then publishes the command, unchanged but for
// attempt. A device that cannot deduplicate gets it at QoS 0 and only once,
// unless its policy accepts duplicates.
func (d *Dispatcher) send(ctx context.Context, oc store.OpenCommand, dev domain.Device, pol Policy) {
	c := oc.Command
	if c.Attempt > 0 && !canResend(dev, pol) {
		return
	}
	next := d.cfg.Now().Add(pol.Backoff(c.Attempt))
	dec, err := d.cfg.Store.ClaimSend(ctx, c.CommandID, c.Status, c.Attempt, QoS(dev), oc.Fence, next)
	if err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("claim send", "command_id", c.CommandID, "err", err)
		}
		return
	}
	d.publishClaimed(ctx, dec, oc.Fence)
}

// publishClaimed publishes a command whose publish decision dec committed
// (by ClaimSend, or with its submit), unchanged but for attempt, after the
// before-publish failpoint and the trust-window check.
func (d *Dispatcher) publishClaimed(ctx context.Context, dec store.Decision, f domain.Fence) {
	c := dec.Command
	if err := d.cfg.Failpoints.HitContext(ctx, failpoint.BeforePublish); err != nil {
		d.cfg.Logger.Warn("publish skipped by failpoint", "command_id", c.CommandID, "err", err)
		return
	}
	if !d.trusted(dec.LeaseExpiresAt) {
		d.cfg.Logger.Warn("publish dropped: lease outside its trust window", "command_id", c.CommandID)
		d.recheckSoon(ctx, dec, f)
		return
	}
	msg := wire.Command{CommandID: c.CommandID, OperationID: c.OperationID, Action: c.Action,
		Params: json.RawMessage(c.Params), IssuedAt: c.IssuedAt, ExpiresAt: c.ExpiresAt, Attempt: c.Attempt}
	payload, err := wire.Encode(msg)
	if err != nil {
		d.cfg.Logger.Error("encode command", "command_id", c.CommandID, "err", err)
		return
	}
	d.publish(ctx, "command", wire.Topic(d.cfg.TopicRoot, c.DeviceID, wire.KindCommands), byte(c.QoS), payload, c.CommandID)
}

// ask commits a query decision about c and publishes the Query; counted
// says whether it uses the command's budget of asks.
func (d *Dispatcher) ask(ctx context.Context, c domain.Command, f domain.Fence, dev domain.Device, pol Policy, counted bool) {
	if !dev.Capabilities.Query {
		return
	}
	qid := NewQueryID(d.cfg.Now())
	next := d.cfg.Now().Add(pol.Backoff(c.Queries))
	dec, err := d.cfg.Store.ClaimQuery(ctx, c.CommandID, qid, c.Status, c.Queries, counted, f, next)
	if err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("claim query", "command_id", c.CommandID, "err", err)
		}
		return
	}
	if !d.trusted(dec.LeaseExpiresAt) {
		d.recheckSoon(ctx, dec, f)
		return
	}
	payload, _ := wire.Encode(wire.Query{QueryID: qid, CommandID: c.CommandID, OperationID: c.OperationID})
	d.publish(ctx, "query", wire.Topic(d.cfg.TopicRoot, c.DeviceID, wire.KindQueries), 1, payload, c.CommandID)
}

// reconcile asks about every open command this instance holds, whatever its
// state: after a broker (re)connect a final receipt may have been lost.
func (d *Dispatcher) reconcile(ctx context.Context) {
	open, err := d.cfg.Store.DueCommands(ctx, d.cfg.Instance, d.cfg.Now(), true, 1<<30)
	// Counted once the pass knows which commands it asks about: a command
	// submitted after the count went up is not one of them.
	d.cfg.Metrics.Reconciles.Inc()
	if err != nil {
		d.cfg.Logger.Error("reconcile: list open commands", "err", err)
		return
	}
	d.cfg.Logger.Info("reconcile: asking about open commands", "count", len(open))
	// Several at once, so their decisions share commits; bounded, so
	// thousands of asks go out at the pace the broker acknowledges them.
	var g errgroup.Group
	g.SetLimit(reconcileParallel)
	for _, oc := range open {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			d.reconcileOne(ctx, oc)
			return nil
		})
	}
	_ = g.Wait()
}

// reconcileParallel bounds the commands a reconcile handles at once.
const reconcileParallel = 32

func (d *Dispatcher) reconcileOne(ctx context.Context, oc store.OpenCommand) {
	dev := d.device(ctx, oc.DeviceID)
	switch {
	case oc.Status == fsm.CmdPending || (oc.Status == fsm.CmdWaitingDevice && dev.Online):
		d.Kick(oc.CommandID)
	case oc.Status == fsm.CmdWaitingDevice:
	case dev.Capabilities.Query:
		d.ask(ctx, oc.Command, oc.Fence, dev, d.cfg.Policy(oc.Action), false) // not counted: a reconnect is not the device's fault
	default:
		d.Kick(oc.CommandID)
	}
}

// retryStep drives a retry of a failed_retryable operation: ask about its
// last command (bounded by the ttl); succeeded or executing → adopt it (its
// final receipt decides the operation); unknown or rejected, or never
// published → a new command_id; no answer in time → back to failed_retryable.
func (d *Dispatcher) retryStep(ctx context.Context, commandID string) {
	r, err := d.cfg.Store.RetryingOf(ctx, commandID, d.cfg.Instance)
	if err != nil {
		return
	}
	op, last := r.Operation, r.Last
	f := domain.Fence{Owner: op.Owner, Token: op.FencingToken}
	now := d.cfg.Now()
	dev := d.device(ctx, last.DeviceID)
	pol := d.cfg.Policy(op.Action)
	nothingRan := last.Attempt == 0 || (last.Status == fsm.CmdFailed && last.Reason == fsm.ReasonExpired)
	answer := wire.ReceiptStatus(last.LastAnswer)
	switch {
	case nothingRan || answer == wire.ReceiptUnknown || answer == wire.ReceiptRejected:
		d.mint(ctx, r, f, dev, pol)
	case !now.Before(r.RetryUntil):
		if err := d.cfg.Store.AbandonRetry(ctx, r, f, "retry: no answer about "+last.CommandID+" within the ttl"); err != nil && !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("abandon retry", "operation_id", op.OperationID, "err", err)
		}
	case !dev.Capabilities.Query:
		if dev.Capabilities.Dedupe {
			d.mint(ctx, r, f, dev, pol) // its operation_id rule keeps a late copy of the old one harmless
		} else {
			_ = d.cfg.Store.AbandonRetry(ctx, r, f, "retry: cannot ask a device without query about "+last.CommandID) // a failure: the next sweep
		}
	case now.Before(last.NextCheckAt):
	default:
		d.ask(ctx, last, f, dev, pol, true) // received/executing answers: adopt it, ask again later
	}
}

func (d *Dispatcher) mint(ctx context.Context, r store.Retrying, f domain.Fence, dev domain.Device, pol Policy) {
	id := NewCommandID(d.cfg.Now())
	if err := d.cfg.Store.MintCommand(ctx, r, f, id, pol.TTL, QoS(dev), pol.Serial()); err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("mint command", "operation_id", r.Operation.OperationID, "err", err)
		}
		return
	}
	d.Kick(id)
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

// move commits a decision that changes a command's state without the device's word.
func (d *Dispatcher) move(ctx context.Context, oc store.OpenCommand, to fsm.CommandState, reason string, next time.Time) {
	c := oc.Command
	if _, err := d.cfg.Store.Move(ctx, c.CommandID, c.Status, c.Version, to, reason, oc.Fence, next); err != nil {
		if !errors.Is(err, store.ErrRefused) {
			d.cfg.Logger.Error("move command", "command_id", c.CommandID, "to", to, "err", err)
		}
	}
}
