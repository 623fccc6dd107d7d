package sim

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Device is one simulated device. Its methods are safe for concurrent use.
//
// A device runs as a sequence of incarnations, each a device.Device of the
// library on the fleet's journal: each boot (Start, Restart, a crash's
// restart) is a new one, booting from the durable record; a crash kills the
// running one (device.Device.Kill) without a DISCONNECT.
type Device struct {
	id   string
	f    *Fleet
	log  *slog.Logger
	skew atomic.Int64 // clock_skew, read by the clock without a lock

	// mu guards the fields below. It is never held while calling into the
	// running device.Device (whose hooks take it).
	mu        sync.Mutex
	inc       *incarnation  // the running one; nil while down
	latest    *incarnation  // the last one started (the running one, or the one ending)
	incCh     chan struct{} // closed (and replaced) when inc changes
	faults    *Faults       // shared with the devices of the same profile entry; replaced, never changed
	trig      map[string]*trigState
	rng       *rand.Rand
	offUntil  time.Time     // abruptly offline until then
	offHold   bool          // abruptly offline until Reconnect
	wake      chan struct{} // closed (and replaced) when the offline window changes
	stopped   bool
	stopNow   bool // a clean stop publishes held receipts at once
	session   int64
	bootTimer *time.Timer
	tickStop  chan struct{}
	stats     Stats
	repeats   map[repeatKey]int
	held      *heldReceipt
	delayed   map[*time.Timer]outgoing

	// appMu guards the app state; it is taken last (under mu, or alone).
	appMu    sync.Mutex
	app      appState
	appDirty bool            // app changed since saved was encoded
	saved    json.RawMessage // the app state last handed to the journal
}

// incarnation is one boot of a device: a device.Device and its Run.
type incarnation struct {
	dev    *device.Device
	ended  chan struct{} // Run returned
	loaded chan struct{} // the record is loaded (or Run returned)
	once   sync.Once
	err    error // Run's, once ended
	// executed is an execution whose witness line and effect wait for the
	// next save of the record (guarded by Device.appMu).
	executed *execution
}

func (inc *incarnation) markLoaded() { inc.once.Do(func() { close(inc.loaded) }) }

// ID is the device id (also its MQTT client id and user name).
func (d *Device) ID() string { return d.id }

func (d *Device) current() *incarnation {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inc
}

// Online reports whether the device is connected with its birth published.
func (d *Device) Online() bool {
	inc := d.current()
	return inc != nil && inc.dev.Online()
}

// Running reports whether the device is up (not crashed and not stopped).
func (d *Device) Running() bool { return d.current() != nil }

// Session is the session number of the device's latest connection attempt.
func (d *Device) Session() int64 {
	d.mu.Lock()
	inc, s := d.latest, d.session
	d.mu.Unlock()
	if inc != nil {
		s = max(s, inc.dev.Session())
	}
	return s
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
	return *d.faults
}

// SetFaults replaces the device's faults at run time and starts their
// counters again. A change of capabilities (legacy) makes the device
// reconnect at once, so that its new birth announces them.
func (d *Device) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	old := d.capsLocked()
	d.faults = &f
	d.skew.Store(int64(f.ClockSkew.D()))
	d.trig = nil
	d.restartTickersLocked()
	caps := d.capsLocked()
	inc := d.inc
	d.mu.Unlock()
	if caps != old && inc != nil {
		inc.dev.SetCapabilities(device.Capabilities(caps))
		d.dropFor(0)
	}
	return nil
}

// Stats returns the device's counters.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// app returns the app state: the running incarnation's, or what was last
// handed to the journal while down.
func (d *Device) appState() appState {
	running := d.Running()
	d.appMu.Lock()
	defer d.appMu.Unlock()
	if running {
		return d.app
	}
	return decodeApp(d.saved)
}

// Boots is the device's durable boot counter (starts and restart actions).
func (d *Device) Boots() int { return d.appState().Boots }

// Config returns a copy of the device's durable config.
func (d *Device) Config() map[string]json.RawMessage { return copyConfig(d.appState().Config) }

// LatestReceipt returns the device's latest receipt for a command_id, as a
// repeat of the command would get it (false while the device is down).
func (d *Device) LatestReceipt(commandID string) (wire.Receipt, bool) {
	inc := d.current()
	if inc == nil {
		return wire.Receipt{}, false
	}
	r, ok := inc.dev.Latest(commandID)
	if !ok {
		return wire.Receipt{}, false
	}
	return wire.Receipt{CommandID: r.CommandID, OperationID: r.OperationID, Status: wire.ReceiptStatus(r.Status), Seq: r.Seq,
		At: r.At, Result: r.Result, Error: r.Error, QueryID: r.QueryID}, true
}

// WaitOnline waits until the device is online, across crashes and
// restarts.
func (d *Device) WaitOnline(ctx context.Context) error {
	for {
		d.mu.Lock()
		inc, ch := d.inc, d.incCh
		d.mu.Unlock()
		if inc != nil {
			wctx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-inc.ended:
					cancel()
				case <-wctx.Done():
				}
			}()
			err := inc.dev.WaitOnline(wctx)
			cancel()
			if err == nil {
				return nil
			}
		}
		// Down, or that incarnation ended: wait for the next one.
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
	if dur > 0 {
		d.offUntil, d.offHold = time.Now().Add(dur), false
	} else {
		d.offHold = true
	}
	d.wakeLocked()
	inc := d.dropLocked()
	d.mu.Unlock()
	if inc != nil {
		inc.dev.DropConnection()
	}
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
func (d *Device) Crash() { d.crash(d.current(), 0, false) }

// CrashFor crashes the device and boots it again after down.
func (d *Device) CrashFor(down time.Duration) { d.crash(d.current(), down, true) }

// Restart boots the device from its durable state; a running device is
// crashed first (crash-and-restart).
func (d *Device) Restart() error {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return ErrStopped
	}
	inc := d.inc
	d.mu.Unlock()
	if inc != nil {
		d.crash(inc, 0, false)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bootTimer != nil {
		d.bootTimer.Stop()
		d.bootTimer = nil
	}
	if d.inc != nil || d.stopped {
		return nil
	}
	_, err := d.bootLocked()
	return err
}

// crash kills inc if it is the running incarnation; with restart it boots
// again after down.
func (d *Device) crash(inc *incarnation, down time.Duration, restart bool) {
	d.mu.Lock()
	if inc == nil || d.inc != inc {
		d.mu.Unlock()
		return
	}
	d.stats.Crashes++
	d.log.Debug("device crashed", "restart", restart, "down", down)
	d.setIncLocked(nil)
	d.takeHeldLocked() // discarded with the incarnation's memory
	clear(d.repeats)
	if restart && !d.stopped {
		if d.bootTimer != nil {
			d.bootTimer.Stop()
		}
		d.bootTimer = time.AfterFunc(down, d.bootIfDown)
	}
	d.mu.Unlock()
	inc.dev.Kill()
}

func (d *Device) bootIfDown() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.inc != nil {
		return
	}
	if _, err := d.bootLocked(); err != nil {
		d.log.Error("boot failed, retrying in 1s", "err", err)
		d.bootTimer = time.AfterFunc(time.Second, d.bootIfDown)
	}
}

// bootLocked starts a new incarnation: a device.Device on the fleet's
// journal, run once the previous incarnation's Run has returned (its
// batches are committed by then, so the record it boots from is all there
// is).
func (d *Device) bootLocked() (*incarnation, error) {
	inc := &incarnation{ended: make(chan struct{}), loaded: make(chan struct{})}
	caps := device.Capabilities(d.capsLocked())
	cfg := d.f.cfg
	dev, err := device.New(device.Options{
		ID:        d.id,
		Broker:    cfg.MQTT,
		Username:  d.id,
		Password:  cfg.password(d.id),
		TLSConfig: cfg.TLS,
		TopicRoot: cfg.TopicRoot,
		Journal:   d.f.j,

		Capabilities: &caps,
		Actions:      map[string]device.Handler{ActionRestart: d.handler(inc), ActionSetConfig: d.handler(inc)},
		Accept:       d.accept,
		Resolve:      d.resolve,
		Retention:    cfg.Retention,
		Clock:        d.now,
		Logger:       cfg.Logger,

		KeepAlive:            cfg.KeepAlive,
		ConnectTimeout:       cfg.ConnectTimeout,
		PublishTimeout:       cfg.PublishTimeout,
		MaxReconnectInterval: cfg.MaxReconnectInterval,
		Hooks:                d.hooks(inc),
	})
	if err != nil {
		return nil, err
	}
	inc.dev = dev
	ctx := d.f.runCtx
	prev := d.latest
	d.latest = inc
	d.setIncLocked(inc)
	end := func(err error) {
		inc.err = err
		inc.markLoaded()
		close(inc.ended)
		d.ended(inc, err)
	}
	// This goroutine ends once the device runs: no goroutine per device
	// waits for its end (device.Device.Start calls end).
	go func() {
		if prev != nil {
			<-prev.ended
			d.mu.Lock()
			d.session = max(d.session, prev.dev.Session())
			d.mu.Unlock()
		}
		if err := dev.Start(ctx, end); err != nil {
			end(err)
		}
	}()
	return inc, nil
}

// ended: an incarnation's Run returned. One that died on its own (its
// record could not be made durable, or its boot failed) crashes and boots
// again a second later from what is durable.
func (d *Device) ended(inc *incarnation, err error) {
	if err == nil || errors.Is(err, device.ErrKilled) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inc != inc {
		return
	}
	d.log.Error("device died; booting again in 1s", "err", err)
	d.stats.Crashes++
	d.setIncLocked(nil)
	d.takeHeldLocked()
	clear(d.repeats)
	if !d.stopped {
		d.bootTimer = time.AfterFunc(time.Second, d.bootIfDown)
	}
}

// start is the first boot, from Fleet.Start; it returns once the device's
// record is loaded, with the error of a boot that failed.
func (d *Device) start() error {
	d.mu.Lock()
	d.restartTickersLocked()
	inc, err := d.bootLocked()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	<-inc.loaded
	select {
	case <-inc.ended:
		if inc.err != nil && !errors.Is(inc.err, device.ErrKilled) {
			return inc.err
		}
	default:
	}
	return nil
}

// stopping is the start of a clean stop (Fleet.Stop): no more boots,
// crashes or drops, and the receipts the delay and reorder faults hold are
// published at once. Fleet.Stop then cancels every incarnation's Run (a
// clean stop of the device.Device) and waits for them (waitEnded).
func (d *Device) stopping() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped, d.stopNow = true, true
	if d.bootTimer != nil {
		d.bootTimer.Stop()
	}
	if d.tickStop != nil {
		close(d.tickStop)
		d.tickStop = nil
	}
	d.wakeLocked()
	outs := d.takeHeldLocked()
	d.mu.Unlock()
	for _, o := range outs {
		o.publish()
	}
}

// waitEnded waits until every incarnation's Run has returned (each waits
// for the one before it).
func (d *Device) waitEnded() {
	d.mu.Lock()
	latest := d.latest
	d.mu.Unlock()
	if latest != nil {
		<-latest.ended
	}
	d.mu.Lock()
	d.setIncLocked(nil)
	d.mu.Unlock()
}

func (d *Device) setIncLocked(inc *incarnation) {
	if d.inc == inc {
		return
	}
	d.inc = inc
	close(d.incCh)
	d.incCh = make(chan struct{})
}

// dropLocked counts an abrupt disconnect and returns the incarnation whose
// connection to reset (outside the lock).
func (d *Device) dropLocked() *incarnation {
	if d.inc == nil {
		return nil
	}
	d.stats.ConnectionDrops++
	return d.inc
}

// dropFor is the drop_connection fault: offline for dur (0: back at once),
// unless a longer offline period is already set.
func (d *Device) dropFor(dur time.Duration) {
	d.mu.Lock()
	if until := time.Now().Add(dur); until.After(d.offUntil) {
		d.offUntil = until
	}
	d.wakeLocked()
	inc := d.dropLocked()
	d.mu.Unlock()
	if inc != nil {
		inc.dev.DropConnection()
	}
}

func (d *Device) offlineLocked() bool { return d.offHold || time.Now().Before(d.offUntil) }

func (d *Device) wakeLocked() {
	close(d.wake)
	d.wake = make(chan struct{})
}

func (d *Device) capsLocked() wire.Capabilities {
	if l := d.faults.Legacy; l.Enabled {
		return wire.Capabilities{Dedupe: l.Dedupe, Query: l.Query}
	}
	return wire.Capabilities{Dedupe: true, Query: true}
}

// now is the device's own clock: the fleet's clock plus its skew.
func (d *Device) now() time.Time {
	return d.f.now().Add(time.Duration(d.skew.Load())).UTC()
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
		inc := d.current()
		// A drop is an opportunity only while connected; a crash while up.
		if inc == nil || (name != "crash" && !inc.dev.Online()) {
			continue
		}
		d.mu.Lock()
		fire := d.fireLocked(name, f.Trigger)
		d.mu.Unlock()
		switch {
		case !fire:
		case name == "crash":
			d.crash(inc, f.For.D(), true)
		default:
			d.dropFor(f.For.D())
		}
	}
}
