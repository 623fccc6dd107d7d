// Package receipt ingests what devices report: receipts and presence. These
// are facts, and any controller instance may apply them, each in one
// transaction guarded by the command's receipt rank or the device's
// presence rank (see the store). Applying the same fact twice is harmless,
// so a redelivered message does nothing new.
//
// A message is acknowledged to the broker (PUBACK) only after the
// transaction that applied it committed, or once it is known to change
// nothing (malformed, a duplicate, a refusal): a controller that dies
// before the commit leaves the receipt with the broker, which delivers it
// again. Messages are applied by Workers goroutines, each device's on one of
// them in arrival order, so one device's receipts (and so each command's)
// are applied in the order they came while many devices' share a commit.
// With Config.GroupReceipts, a device's receipts that queued up behind a
// commit are applied as one change, so they share the next commit too.
//
// A receipt whose topic's device or operation_id does not match its command
// is recorded with effect mismatch and changes nothing.
//
// Limits. A message is refused whole, acknowledged and changes nothing when
// it breaks one; each refusal is counted in
// controller_inputs_refused_total{source,reason} (source receipts, presence,
// or mqtt for a topic that is neither; reason as in wire.Reason*) and, but
// for rate_limited, in controller_receipts_total{effect="malformed"}:
//
//   - a topic outside {root}/{d}/{kind} (bad_topic) or a device id outside
//     its charset (bad_id);
//   - a payload over wire.MaxDevicePayload, 64 KiB (too_large);
//   - more than the device's rate: each device has a token bucket for its
//     receipts (Config.ReceiptRate, --receipt-rate: 50/s, burst 100) and
//     one for its presence (DefaultPresenceRate); a message past it is
//     dropped (rate_limited), so a flooding device cannot starve the others.
//     The check comes before any decoding or database work; the buckets are
//     held for active devices only, bounded (DefaultMaxTracked);
//   - invalid JSON, nesting deeper than 32, a member name twice, a number
//     that does not fit, a field of the wrong type, an id outside its
//     charset or length, an unknown status (wire.DecodeDevice and the
//     payloads' Validate). Unknown fields are ignored: a device may speak a
//     later version of the protocol.
//
// Refusals are logged at most once per reason and source every
// refusalLogEvery, with the number left unlogged.
package receipt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

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
	// Workers apply messages concurrently, each device's on one worker
	// (DefaultWorkers).
	Workers int
	// GroupReceipts: a worker applies a device's receipts that queued up
	// behind a commit as one change (store.ApplyReceipts) instead of one
	// commit each: the store's capability (both backends, since the
	// PostgreSQL batch locks its commands in one order).
	GroupReceipts bool
	// Linger, with GroupReceipts: how long a worker whose messages are
	// all progress receipts (received, executing) waits for more before it
	// applies them. A device sends its progress and its final receipt one
	// after the other, and nobody waits on progress; a group that waits
	// for the final receipt commits once instead of twice, so the final
	// receipt, which callers wait on, is not held behind its own device's
	// progress. Anything else arriving (a final receipt, presence, ...)
	// ends the wait at once. Zero: no wait.
	Linger time.Duration
	// ReceiptRate and PresenceRate bound each device's messages (the zero
	// Rate: no limit); MaxTracked bounds the devices whose buckets are held
	// (DefaultMaxTracked).
	ReceiptRate  Rate
	PresenceRate Rate
	MaxTracked   int
	// Now is the limiter's clock (time.Now).
	Now func() time.Time
	// Owns reports whether this instance applies the receipts of a device
	// (peers.Division, when instances share a database); nil: every
	// device's. The others are acknowledged unapplied and counted in
	// controller_receipts_for_peers_total. Presence is always applied.
	Owns func(device string) bool
	// ProbeTopic is a receipts topic no device can own
	// ({root}/controller-{instance}/receipts), on which the controller
	// publishes to itself to prove its receipt subscription delivers;
	// OnProbe is told of each message on it, which is acknowledged and
	// changes nothing.
	ProbeTopic string
	OnProbe    func(payload []byte)
}

// DefaultLinger is Config.Linger's value in the controller.
const DefaultLinger = 5 * time.Millisecond

// DefaultWorkers is enough to fill a batch from the broker's in-flight
// window while commits are under way.
const DefaultWorkers = 32

// Ingestor applies receipts and presence messages, each device's in arrival
// order.
type Ingestor struct {
	cfg   Config
	seed  maphash.Seed
	limit *limiter
	held  *heldPresence

	logMu  sync.Mutex
	logged map[[2]string]*logState // (source, reason) → when last logged
}

type logState struct {
	at         time.Time
	suppressed int
}

// refusalLogEvery spaces the log lines of one kind of refusal.
const refusalLogEvery = 10 * time.Second

// New builds an Ingestor.
func New(cfg Config) *Ingestor {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Owns == nil {
		cfg.Owns = func(string) bool { return true }
	}
	if cfg.OnProbe == nil {
		cfg.OnProbe = func([]byte) {}
	}
	return &Ingestor{cfg: cfg, seed: maphash.MakeSeed(), limit: newLimiter(cfg.ReceiptRate, cfg.PresenceRate, cfg.MaxTracked),
		held: newHeldPresence(), logged: map[[2]string]*logState{}}
}

// Run processes messages until ctx ends or the source closes. A message
// still unapplied when ctx ends stays unacknowledged, for the broker to
// deliver again.
func (in *Ingestor) Run(ctx context.Context) error {
	work := make([]chan mqttx.Message, in.cfg.Workers)
	done := make(chan struct{})
	for i := range work {
		work[i] = make(chan mqttx.Message, workerQueue)
		go func() {
			defer func() { done <- struct{}{} }()
			g := gatherer{in: in, work: work[i]}
			for m := range work[i] {
				group := g.gather(m)
				if ctx.Err() == nil {
					in.handleGroup(ctx, group)
				}
			}
		}()
	}
	defer func() {
		for _, w := range work {
			close(w)
		}
		for range work {
			<-done
		}
	}()
	queue := func(device string, m mqttx.Message) bool {
		select {
		case work[maphash.String(in.seed, device)%uint64(len(work))] <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// Presence held back by its device's rate goes in as soon as the rate
	// allows: the next token comes within 1/PresenceRate seconds.
	release := time.NewTicker(presenceReleaseEvery)
	defer release.Stop()
	msgs := make(chan mqttx.Message)
	go func() {
		defer close(msgs)
		for {
			m, err := in.cfg.Source.Next(ctx)
			if err != nil {
				return // ctx ended, or the transport stopped
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return // unacknowledged: the broker delivers it again
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-release.C:
			for _, h := range in.held.due(in.limit, in.cfg.Now()) {
				if !queue(h.device, h.msg) {
					return nil
				}
			}
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			device, ok := in.admit(&m)
			if !ok {
				m.Ack() // refused, held or another instance's: nothing more to do here
				continue
			}
			if !queue(device, m) {
				return nil
			}
		}
	}
}

// presenceReleaseEvery is how often held presence is looked at.
const presenceReleaseEvery = 50 * time.Millisecond

// admit runs the checks that need no decoding, before a message is queued
// for a worker: its topic, its size, its device's owner and its rate. A
// refused message is counted and logged; the caller acknowledges it. A
// receipt over the size limit whose status can still be read is passed on
// without its result (m is replaced).
func (in *Ingestor) admit(m *mqttx.Message) (device string, ok bool) {
	if in.cfg.ProbeTopic != "" && m.Topic == in.cfg.ProbeTopic {
		in.cfg.OnProbe(m.Payload)
		return "", false
	}
	if in.peerProbe(m.Topic, m.Payload) {
		return "", false // another instance's probe: it proves nothing here
	}
	source := topicSource(m.Topic)
	device, kind, err := wire.ParseTopic(in.cfg.TopicRoot, m.Topic)
	switch {
	case errors.Is(err, wire.ErrInvalidDeviceID):
		in.refuse(*m, source, wire.ReasonBadID, err)
		return "", false
	case err != nil:
		in.refuse(*m, source, wire.ReasonBadTopic, err)
		return "", false
	case kind != wire.KindReceipts && kind != wire.KindPresence:
		// Commands and queries are ours; we are not subscribed to them.
		in.refuse(*m, metrics.SourceMQTT, wire.ReasonBadTopic, errors.New("not a topic the controller reads"))
		return "", false
	case kind == wire.KindReceipts && !in.cfg.Owns(device):
		if in.cfg.Metrics != nil {
			in.cfg.Metrics.ReceiptsForPeers.Inc()
		}
		return "", false
	case len(m.Payload) > wire.MaxDevicePayload && kind == wire.KindReceipts:
		// A device that broke the result limit: its status still counts.
		salvaged, err := wire.SalvageReceipt(m.Payload)
		if err != nil {
			in.refuse(*m, source, wire.ReasonTooLarge, err)
			return "", false
		}
		in.cfg.Metrics.InputRefused(source, wire.ReasonResultTooLarge)
		in.logRefusal(source, wire.ReasonResultTooLarge, m.Topic,
			fmt.Errorf("receipt of %d bytes, over %d: its result is dropped, its status applied", len(m.Payload), wire.MaxDevicePayload))
		*m = mqttx.NewMessage(m.Topic, salvaged, m.Ack)
	case len(m.Payload) > wire.MaxDevicePayload:
		in.refuse(*m, source, wire.ReasonTooLarge, errors.New("payload over 64 KiB"))
		return "", false
	}
	if kind == wire.KindPresence {
		return device, in.admitPresence(*m, device)
	}
	if !in.limit.allow(device, false, in.cfg.Now()) {
		in.refuse(*m, source, wire.ReasonRateLimited, errors.New("over the device's rate; dropped"))
		return "", false
	}
	return device, true
}

// peerProbe reports whether a message is another controller's probe: a
// payload {"probe":"<hex>"} on {root}/controller-{id}/receipts (no device
// id starts with controller-). Anything else on such a topic is refused as
// any message of a device id outside its charset is.
func (in *Ingestor) peerProbe(topic string, payload []byte) bool {
	id, ok := strings.CutPrefix(topic, in.cfg.TopicRoot+"/controller-")
	if !ok {
		return false
	}
	id, ok = strings.CutSuffix(id, "/"+string(wire.KindReceipts))
	return ok && !strings.Contains(id, "/") && probePayload.Match(payload)
}

// probePayload is what a controller publishes as its probe.
var probePayload = regexp.MustCompile(`^\{"probe":"[0-9a-f]{1,64}"\}$`)

// admitPresence passes a presence message on when its device's presence
// rate allows and none of its messages is held; otherwise the message is
// held, keeping only the highest-ranked one per device (the only one whose
// application matters: the store applies a strictly higher rank only), and
// goes in once the rate allows. Presence is never dropped by the limit,
// only coalesced. A held message is acknowledged at once: the broker
// keeps the device's latest presence retained, and delivers it again at
// the next subscribe should this process die before applying it.
func (in *Ingestor) admitPresence(m mqttx.Message, device string) bool {
	now := in.cfg.Now()
	if !in.held.has(device) && in.limit.allow(device, true, now) {
		return true
	}
	var p wire.Presence
	err := wire.DecodeDevice(m.Payload, &p)
	reason := wire.ReasonInvalidJSON
	if err == nil {
		err, reason = p.Validate(), wire.ReasonInvalidValue
	}
	if err != nil {
		in.refuse(m, metrics.SourcePresence, wire.Reason(err, reason), err)
		return false
	}
	// The message passed on later is a copy of what the store reads of it
	// (so a held message costs about 200 bytes, whatever the device sent),
	// acknowledged here.
	payload, err := json.Marshal(p)
	if err != nil {
		in.refuse(m, metrics.SourcePresence, wire.ReasonInvalidValue, err)
		return false
	}
	if in.held.hold(device, p.Rank(), mqttx.NewMessage(m.Topic, payload, nil)) && in.cfg.Metrics != nil {
		in.cfg.Metrics.Presence.WithLabelValues("coalesced").Inc()
	}
	return false
}

// topicSource is the source label of a message: its topic's kind when that
// is receipts or presence, else mqtt.
func topicSource(topic string) string {
	switch topic[strings.LastIndexByte(topic, '/')+1:] {
	case string(wire.KindReceipts):
		return metrics.SourceReceipts
	case string(wire.KindPresence):
		return metrics.SourcePresence
	}
	return metrics.SourceMQTT
}

// Handle applies one message and acknowledges it once its effect is
// committed (or it has none). A store error is retried a few times, then
// the message is acknowledged anyway and logged: the controller's queries
// find any receipt that was not recorded. When ctx ends first, the message
// is left unacknowledged.
func (in *Ingestor) Handle(ctx context.Context, m mqttx.Message) {
	in.retry(ctx, m, func() error { return in.apply(ctx, m) })
}

// retry runs apply until it succeeds, then acknowledges m (Handle).
func (in *Ingestor) retry(ctx context.Context, m mqttx.Message, apply func() error) {
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := apply()
		if err == nil {
			m.Ack()
			return
		}
		if ctx.Err() != nil || errors.Is(err, store.ErrDatabaseLost) {
			return // the instance stops (a lost database); the broker delivers it again
		}
		if attempt == applyAttempts {
			in.cfg.Logger.Error("message not recorded; acknowledged anyway, the queries recover it", "topic", m.Topic, "err", err)
			m.Ack()
			return
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		delay = min(2*delay, time.Second)
	}
}

// workerQueue is what a worker holds while it waits for a commit. It is
// larger than a worker's share of the broker's in-flight window
// (max_inflight_messages, 100 in the shipped configurations): a worker whose
// devices' receipts queue up behind a commit must not hold back the loop
// that feeds every other worker (with 8, that loop stalled at saturation),
// and what queued goes in as one group, in fewer statements. The broker's
// window bounds what all the workers hold together.
const workerQueue = 128

// maxGroup bounds the messages a worker takes at once.
const maxGroup = 32

// handleGroup applies messages that were waiting for one worker: each
// device's in their order, the devices side by side, and a device's
// receipts that follow each other as one change (ApplyReceipts), so that
// they share a commit. Presence, and any receipt after one that failed, go
// one at a time through Handle, with its retries.
func (in *Ingestor) handleGroup(ctx context.Context, group []arrival) {
	if len(group) == 1 || !in.cfg.GroupReceipts {
		for _, a := range group {
			in.handleOne(ctx, a)
		}
		return
	}
	var order []string
	byDevice := map[string][]arrival{}
	for _, a := range group {
		if _, seen := byDevice[a.device]; !seen {
			order = append(order, a.device)
		}
		byDevice[a.device] = append(byDevice[a.device], a)
	}
	var wg sync.WaitGroup
	for _, device := range order {
		wg.Add(1)
		go func(device string, as []arrival) {
			defer wg.Done()
			in.handleDevice(ctx, device, as)
		}(device, byDevice[device])
	}
	wg.Wait()
}

// handleDevice applies one device's messages in their order.
func (in *Ingestor) handleDevice(ctx context.Context, device string, as []arrival) {
	for i := 0; i < len(as); {
		end := i // the receipts that come next: as[i:end]
		for end < len(as) && as[end].ok {
			end++
		}
		if end-i < 2 {
			in.handleOne(ctx, as[i])
			i++
			continue
		}
		rs := make([]wire.Receipt, 0, end-i)
		for _, a := range as[i:end] {
			rs = append(rs, a.r)
		}
		res, err := in.cfg.Store.ApplyReceipts(ctx, device, rs, in.beforeCommit(ctx))
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				in.cfg.Logger.Warn("receipts not recorded; applied one at a time", "device", device, "receipts", end-i, "err", err)
			}
			res = nil // none applied: each goes alone, with its retries
		}
		n := 0
		for k, r := range res {
			if r.Err != nil && !errors.Is(r.Err, store.ErrRefused) {
				in.cfg.Logger.Warn("receipt not recorded", "device", device, "command_id", rs[k].CommandID, "err", r.Err)
				break // it, and what follows it, go alone
			}
			if r.Err == nil {
				in.applied(device, rs[k], r.Out)
			}
			as[i+k].m.Ack()
			n++
		}
		whole := n == end-i
		i += n
		if !whole {
			for ; i < len(as); i++ {
				in.handleOne(ctx, as[i])
			}
			return
		}
	}
}

// handleOne applies one message, with Handle's retries: a receipt as
// decoded on arrival (ok), anything else through Handle.
func (in *Ingestor) handleOne(ctx context.Context, a arrival) {
	if a.ok {
		in.retry(ctx, a.m, func() error { return in.applyReceipt(ctx, a.device, a.r) })
		return
	}
	in.Handle(ctx, a.m)
}

// arrival is a message a worker took, read once when receipts are grouped:
// the device its topic names, and ok when it is a receipt that passed its
// checks (r). Anything else (presence, a receipt apply would refuse, or
// any message when receipts are not grouped) goes through Handle.
type arrival struct {
	m      mqttx.Message
	device string
	r      wire.Receipt
	ok     bool
}

// arrive makes an arrival of m.
func (in *Ingestor) arrive(m mqttx.Message) arrival {
	a := arrival{m: m}
	if !in.cfg.GroupReceipts {
		return a
	}
	device, kind, err := wire.ParseTopic(in.cfg.TopicRoot, m.Topic) // admitted: it parses
	a.device = device
	if err != nil || kind != wire.KindReceipts {
		return a
	}
	r, _, err := decodeReceipt(m)
	a.r, a.ok = r, err == nil
	return a
}

// progress reports whether a is a device's progress on a command that has
// not ended (received, executing): nobody waits on it.
func (a arrival) progress() bool {
	return a.ok && a.r.Status.Progress()
}

// gatherer makes a worker's groups.
type gatherer struct {
	in    *Ingestor
	work  <-chan mqttx.Message
	timer *time.Timer // the linger's, made at its first use
}

// gather returns the group that begins with m: what queued up behind it
// while the last commit was under way, and then, while every message of
// the group is progress, what arrives within Config.Linger, up to the
// first message that is not progress.
func (g *gatherer) gather(m mqttx.Message) []arrival {
	in := g.in
	group := []arrival{in.arrive(m)}
	waiting := in.cfg.Linger > 0 && group[0].progress()
	// take adds a message taken from work, unless work was closed.
	take := func(m mqttx.Message, ok bool) bool {
		if ok {
			a := in.arrive(m)
			group = append(group, a)
			waiting = waiting && a.progress()
		}
		return ok
	}
drain:
	for len(group) < maxGroup {
		select {
		case m, ok := <-g.work:
			if !take(m, ok) {
				return group
			}
		default:
			break drain
		}
	}
	if !waiting {
		return group
	}
	if g.timer == nil {
		g.timer = time.NewTimer(in.cfg.Linger)
	} else {
		g.timer.Reset(in.cfg.Linger)
	}
	defer g.timer.Stop()
	for waiting && len(group) < maxGroup {
		select {
		case m, ok := <-g.work:
			if !take(m, ok) {
				return group
			}
		case <-g.timer.C:
			return group
		}
	}
	return group
}

// decodeReceipt decodes and checks a receipt's payload; an error comes with
// the reason it is refused for.
func decodeReceipt(m mqttx.Message) (wire.Receipt, string, error) {
	var r wire.Receipt
	if err := wire.DecodeDevice(m.Payload, &r); err != nil {
		return r, wire.Reason(err, wire.ReasonInvalidJSON), err
	}
	if err := r.Validate(); err != nil {
		return r, wire.Reason(err, wire.ReasonInvalidValue), err
	}
	return r, "", nil
}

// applyReceipt applies one decoded and checked receipt (apply).
func (in *Ingestor) applyReceipt(ctx context.Context, device string, r wire.Receipt) error {
	out, err := in.cfg.Store.ApplyReceipt(ctx, device, r, in.beforeCommit(ctx))
	if errors.Is(err, store.ErrRefused) {
		return nil // recorded as refused; nothing more to do
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			in.cfg.Logger.Warn("receipt not recorded", "device", device, "command_id", r.CommandID, "err", err)
		}
		return err
	}
	in.applied(device, r, out)
	return nil
}

// beforeCommit is a receipt's hook inside its transaction: the
// before-receipt-commit failpoint.
func (in *Ingestor) beforeCommit(ctx context.Context) func() error {
	return func() error { return in.cfg.Failpoints.HitContext(ctx, failpoint.BeforeReceiptCommit) }
}

// applied logs a receipt the store applied (or found a duplicate, stale,
// late...: its effect). What it changed (an operation that left started, a
// command made due) the store publishes as facts (package feed).
func (in *Ingestor) applied(device string, r wire.Receipt, out store.ReceiptOutcome) {
	in.cfg.Logger.Debug("receipt", "device", device, "command_id", out.CommandID, "status", r.Status, "effect", out.Effect)
}

// applyAttempts bounds the tries of one message against store errors (about
// 3.5 s of waiting, enough to outlast a deadlock between instances' batches,
// which PostgreSQL resolves after its deadlock_timeout of 1 s).
const applyAttempts = 8

// apply applies one message: nil once it is committed or known to change
// nothing, a store error otherwise.
func (in *Ingestor) apply(ctx context.Context, m mqttx.Message) error {
	device, kind, err := wire.ParseTopic(in.cfg.TopicRoot, m.Topic)
	if err != nil {
		in.refuse(m, topicSource(m.Topic), wire.ReasonBadTopic, err)
		return nil
	}
	switch kind {
	case wire.KindReceipts:
		r, reason, err := decodeReceipt(m)
		if err != nil {
			in.refuse(m, metrics.SourceReceipts, reason, err)
			return nil
		}
		return in.applyReceipt(ctx, device, r)
	case wire.KindPresence:
		var p wire.Presence
		if err := wire.DecodeDevice(m.Payload, &p); err != nil {
			in.refuse(m, metrics.SourcePresence, wire.Reason(err, wire.ReasonInvalidJSON), err)
			return nil
		}
		if err := p.Validate(); err != nil {
			in.refuse(m, metrics.SourcePresence, wire.Reason(err, wire.ReasonInvalidValue), err)
			return nil
		}
		out, err := in.cfg.Store.ApplyPresence(ctx, device, p)
		if errors.Is(err, store.ErrRefused) {
			return nil
		}
		if err != nil {
			in.cfg.Logger.Warn("presence not recorded", "device", device, "err", err)
			return err
		}
		effect := "stale"
		if out.Applied {
			effect = "applied"
			in.wakeDevice(ctx, device)
		}
		in.cfg.Metrics.Presence.WithLabelValues(effect).Inc()
	default:
		// Commands and queries are ours; we are not subscribed to them.
	}
	return nil
}

// wakeDevice makes a device's open commands due after its presence changed
// (sent when it is back, parked when it left), before its next message is
// handled; the store publishes each as due (store.FactDue) for the
// dispatcher. A failure leaves them to the sweeper.
func (in *Ingestor) wakeDevice(ctx context.Context, device string) {
	if _, err := in.cfg.Store.Wake(ctx, device); err != nil {
		in.cfg.Logger.Error("wake device commands", "device", device, "err", err)
	}
}

// refuse counts and logs a message refused whole; it changes nothing.
func (in *Ingestor) refuse(m mqttx.Message, source, reason string, err error) {
	in.cfg.Metrics.InputRefused(source, reason)
	if reason != wire.ReasonRateLimited && in.cfg.Metrics != nil {
		in.cfg.Metrics.Receipts.WithLabelValues("malformed").Inc()
	}
	in.logRefusal(source, reason, m.Topic, fmt.Errorf("%w (%d bytes); nothing applied", err, len(m.Payload)))
}

// logRefusal logs a refusal at most once per source and reason every
// refusalLogEvery, with the number left unlogged.
func (in *Ingestor) logRefusal(source, reason, topic string, err error) {
	key := [2]string{source, reason}
	now := time.Now()
	in.logMu.Lock()
	st := in.logged[key]
	if st == nil {
		st = &logState{}
		in.logged[key] = st
	}
	if !st.at.IsZero() && now.Sub(st.at) < refusalLogEvery {
		st.suppressed++
		in.logMu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.at, st.suppressed = now, 0
	in.logMu.Unlock()
	if len(topic) > 200 {
		topic = topic[:200] + "..."
	}
	in.cfg.Logger.Warn("message refused", "source", source, "reason", reason, "topic", topic,
		"err", err, "refused_since_last_line", suppressed)
}
