package sim

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// Device is one simulated device. Its methods are safe for concurrent use.
//
// A device runs as a sequence of incarnations: each boot (Start, Restart, a
// crash's restart) loads the durable state from disk and gets fresh
// in-memory state and a fresh MQTT client; a crash throws the incarnation
// away without a DISCONNECT.
type Device struct {
	id     string
	f      *Fleet
	log    *slog.Logger
	topics topics

	mu        sync.Mutex
	st        *durableState // the running incarnation's state; nil while down
	inc       *incarnation  // nil while down
	faults    Faults
	trig      map[string]*trigState
	rng       *rand.Rand
	offUntil  time.Time     // abruptly offline until then
	offHold   bool          // abruptly offline until Reconnect
	wake      chan struct{} // closed (and replaced) when the offline window changes
	online    bool
	onlineCh  chan struct{} // closed while online
	session   int64         // last session number used
	stopped   bool
	bootTimer *time.Timer
	tickStop  chan struct{}
	stats     Stats
	// last is the journal batch holding the device's latest state record
	// or execution line; once it is done, every change before it is
	// durable too.
	last *batch
}

type topics struct{ commands, queries, receipts, presence string }

// ID is the device id (also its MQTT client id and user name).
func (d *Device) ID() string { return d.id }

// Online reports whether the device is connected with its birth published.
func (d *Device) Online() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.online && d.inc != nil && d.inc.conn.up()
}

// Running reports whether the device is up (not crashed and not stopped).
func (d *Device) Running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inc != nil
}

// Session is the session number of the device's latest connection attempt.
func (d *Device) Session() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.session
}

// Capabilities are what the device announces in its births.
func (d *Device) Capabilities() wire.Capabilities {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.capsLocked()
}

// Faults returns the device's current faults.
func (d *Device) Faults() Faults {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.faults
}

// SetFaults replaces the device's faults at run time and starts their
// counters again. A change of capabilities (legacy) makes the device
// reconnect at once, so that its new birth announces them.
func (d *Device) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.capsLocked()
	d.faults = f
	d.trig = map[string]*trigState{}
	d.restartTickersLocked()
	if d.capsLocked() != old {
		d.dropForLocked(0)
	}
	return nil
}

// Stats returns the device's counters.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// Boots is the device's durable boot counter (starts and restart actions).
func (d *Device) Boots() int {
	st, err := d.state()
	if err != nil {
		return 0
	}
	return st.Boots
}

// Config returns a copy of the device's durable config.
func (d *Device) Config() map[string]json.RawMessage {
	st, err := d.state()
	if err != nil {
		return nil
	}
	return copyConfig(st.Config)
}

// LatestReceipt returns the device's latest receipt for a command_id, as a
// repeat of the command would get it.
func (d *Device) LatestReceipt(commandID string) (wire.Receipt, bool) {
	st, err := d.state()
	if err != nil {
		return wire.Receipt{}, false
	}
	rec, ok := st.Commands[commandID]
	if !ok {
		return wire.Receipt{}, false
	}
	return rec.Latest, true
}

// state returns the running state, or the one on disk while down. The
// returned value is a copy for the caller to read.
func (d *Device) state() (*durableState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st == nil {
		_ = d.last.wait()
		return d.f.j.load(d.id)
	}
	b, err := json.Marshal(d.st)
	if err != nil {
		return nil, err
	}
	st := newState(d.id)
	return st, json.Unmarshal(b, st)
}

// WaitOnline waits until the device is online.
func (d *Device) WaitOnline(ctx context.Context) error {
	for {
		d.mu.Lock()
		if d.online {
			d.mu.Unlock()
			return nil
		}
		ch := d.onlineCh
		d.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-d.f.done:
			return ErrStopped
		}
	}
}

// DropConnection closes the device's TCP connection without DISCONNECT, so
// the broker publishes its LWT. The device goes on working offline (its
// receipts wait for the connection). It reconnects, with a new session,
// after dur, or when dur <= 0 only after Reconnect.
func (d *Device) DropConnection(dur time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dur > 0 {
		d.offUntil, d.offHold = time.Now().Add(dur), false
	} else {
		d.offHold = true
	}
	d.wakeLocked()
	d.dropLocked()
}

// Reconnect ends an offline period of DropConnection (or of the
// drop_connection fault) at once.
func (d *Device) Reconnect() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.offHold, d.offUntil = false, time.Time{}
	d.wakeLocked()
}

// Crash kills the device as kill -9 would: no DISCONNECT (the broker
// publishes the LWT), in-memory state lost, durable state kept. It stays
// down until Restart.
func (d *Device) Crash() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.crashLocked(0, false)
}

// CrashFor crashes the device and boots it again after down.
func (d *Device) CrashFor(down time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.crashLocked(down, true)
}

// Restart boots the device from its durable state; a running device is
// crashed first (crash-and-restart).
func (d *Device) Restart() error {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return ErrStopped
	}
	if d.inc != nil {
		d.stats.Crashes++
		d.inc.killLocked()
	}
	if d.bootTimer != nil {
		d.bootTimer.Stop()
		d.bootTimer = nil
	}
	inc, recovered, err := d.bootLocked()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	for _, r := range recovered {
		inc.emit(r)
	}
	return nil
}

// start is the first boot, from Fleet.Start.
func (d *Device) start() error {
	d.mu.Lock()
	d.restartTickersLocked()
	inc, recovered, err := d.bootLocked()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	for _, r := range recovered {
		inc.emit(r)
	}
	return nil
}

// bootLocked starts a new incarnation from the durable state. What an
// earlier incarnation enqueued is committed (or failed) first, so the state
// read is all there is.
func (d *Device) bootLocked() (*incarnation, []wire.Receipt, error) {
	_ = d.last.wait()
	st, err := d.f.j.load(d.id)
	if err != nil {
		return nil, nil, err
	}
	st.Boots++
	d.stats.Boots++
	if st.Session > d.session {
		d.session = st.Session
	}
	inc := newIncarnation(d)
	recovered, jobs, err := d.recoverLocked(st)
	if err != nil {
		return nil, nil, err
	}
	// The boot counter is saved with the first session number, before the
	// first connection; recovered outcomes are saved now (emit waits until
	// they are durable before publishing them).
	if len(recovered) > 0 {
		b, err := d.f.j.state(journalEntry{Device: d.id, Full: st})
		if err != nil {
			return nil, nil, err
		}
		d.last = b
	}
	d.st, d.inc = st, inc
	for _, j := range jobs {
		inc.jobs.push(j)
	}
	inc.run()
	d.log.Debug("device booted", "boots", st.Boots, "session", st.Session, "recovered", len(recovered), "resumed", len(jobs))
	return inc, recovered, nil
}

// recoverLocked resolves what a crash left in progress. A command found in
// "executing" ran if executions.jsonl holds more executions of it than the
// state counted: its planned outcome is applied; otherwise it is failed with
// error "interrupted" (it never ran). A command found in "received" is
// handed to the executor again (checked for expiry there first).
func (d *Device) recoverLocked(st *durableState) ([]wire.Receipt, []job, error) {
	recs := make([]*record, 0, len(st.Commands))
	for _, rec := range st.Commands {
		recs = append(recs, rec)
	}
	slices.SortFunc(recs, func(a, b *record) int { return a.SeenAt.Compare(b.SeenAt) })
	var (
		counts    map[string]int
		recovered []wire.Receipt
		jobs      []job
	)
	legacy := !d.capsLocked().Dedupe
	for _, rec := range recs {
		switch rec.Latest.Status {
		case wire.ReceiptExecuting:
			if counts == nil {
				execs, err := witness.ReadExecutions(d.f.cfg.StateDir)
				if err != nil {
					return nil, nil, err
				}
				counts = map[string]int{}
				for _, e := range execs {
					if e.DeviceID == d.id {
						counts[e.CommandID]++
					}
				}
			}
			now := d.nowLocked()
			if rec.Plan != nil && counts[rec.Command.CommandID] > rec.Executions {
				rec.Executions++
				d.applyLocked(st, rec, rec.Plan, now)
			} else {
				rec.Latest = newReceipt(rec.Command, wire.ReceiptFailed, rec.Latest.Seq+1, now, nil, "interrupted")
				rec.Plan = nil
				releaseOp(st, rec.Command)
				d.stats.Failed++
			}
			d.stats.Recovered++
			recovered = append(recovered, rec.Latest)
		case wire.ReceiptReceived:
			jobs = append(jobs, job{id: rec.Command.CommandID, legacy: legacy})
		}
	}
	return recovered, jobs, nil
}

// stop shuts the device down cleanly (Fleet.Stop).
func (d *Device) stop() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped = true
	if d.bootTimer != nil {
		d.bootTimer.Stop()
	}
	if d.tickStop != nil {
		close(d.tickStop)
		d.tickStop = nil
	}
	inc := d.inc
	if inc == nil {
		d.mu.Unlock()
		return
	}
	inc.stopping = true
	close(inc.done)
	d.wakeLocked()
	d.mu.Unlock()
	inc.shutdown()
}

// crashLocked kills the running incarnation; with restart it boots again
// after down.
func (d *Device) crashLocked(down time.Duration, restart bool) {
	if d.inc == nil {
		return
	}
	d.stats.Crashes++
	d.log.Debug("device crashed", "restart", restart, "down", down)
	d.inc.killLocked()
	if restart && !d.stopped {
		if d.bootTimer != nil {
			d.bootTimer.Stop()
		}
		d.bootTimer = time.AfterFunc(down, d.bootIfDown)
	}
}

func (d *Device) bootIfDown() {
	d.mu.Lock()
	if d.stopped || d.inc != nil {
		d.mu.Unlock()
		return
	}
	inc, recovered, err := d.bootLocked()
	if err != nil {
		d.log.Error("boot failed, retrying in 1s", "err", err)
		d.bootTimer = time.AfterFunc(time.Second, d.bootIfDown)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	for _, r := range recovered {
		inc.emit(r)
	}
}

// dropLocked closes the current connection abruptly.
func (d *Device) dropLocked() {
	if d.inc == nil {
		return
	}
	d.stats.ConnectionDrops++
	if nc := d.inc.conn; nc != nil {
		nc.kill()
	}
}

// dropForLocked is the drop_connection fault: offline for dur (0: back at
// once), unless a longer offline period is already set.
func (d *Device) dropForLocked(dur time.Duration) {
	if until := time.Now().Add(dur); until.After(d.offUntil) {
		d.offUntil = until
	}
	d.wakeLocked()
	d.dropLocked()
}

func (d *Device) offlineLocked() bool { return d.offHold || time.Now().Before(d.offUntil) }

func (d *Device) wakeLocked() {
	close(d.wake)
	d.wake = make(chan struct{})
}

func (d *Device) setOnlineLocked(v bool) {
	if v == d.online {
		return
	}
	d.online = v
	if v {
		close(d.onlineCh)
	} else {
		d.onlineCh = make(chan struct{})
	}
}

func (d *Device) capsLocked() wire.Capabilities {
	if l := d.faults.Legacy; l.Enabled {
		return wire.Capabilities{Dedupe: l.Dedupe, Query: l.Query}
	}
	return wire.Capabilities{Dedupe: true, Query: true}
}

// nowLocked is the device's own clock: the fleet's clock plus its skew.
func (d *Device) nowLocked() time.Time {
	return d.f.now().Add(d.faults.ClockSkew.D()).UTC()
}

// restartTickersLocked runs the time-based outage faults (every: ...).
func (d *Device) restartTickersLocked() {
	if d.tickStop != nil {
		close(d.tickStop)
		d.tickStop = nil
	}
	if d.stopped {
		return
	}
	type tick struct {
		name string
		f    OutageFault
	}
	var ticks []tick
	if f := d.faults.DropConnection; f.Every > 0 && f.Enabled() {
		ticks = append(ticks, tick{"drop_connection", f})
	}
	if f := d.faults.Crash; f.Every > 0 && f.Enabled() {
		ticks = append(ticks, tick{"crash", f})
	}
	if len(ticks) == 0 {
		return
	}
	stop := make(chan struct{})
	d.tickStop = stop
	for _, t := range ticks {
		go d.tick(stop, t.name, t.f)
	}
}

func (d *Device) tick(stop <-chan struct{}, name string, f OutageFault) {
	t := time.NewTicker(f.Every.D())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		d.mu.Lock()
		// A drop is an opportunity only while connected; a crash while up.
		if d.inc != nil && (name == "crash" || d.inc.connectedLocked()) && d.fireLocked(name, f.Trigger) {
			if name == "crash" {
				d.crashLocked(f.For.D(), true)
			} else {
				d.dropForLocked(f.For.D())
			}
		}
		d.mu.Unlock()
	}
}
