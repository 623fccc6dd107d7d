package device

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Device is one device speaking the protocol. Make it with New and run it
// with Run, once. Its methods are safe for concurrent use.
type Device struct {
	o       Options
	id      string
	caps    wire.Capabilities
	log     *slog.Logger
	now     func() time.Time
	j       *Journal
	ownJ    bool
	tls     *tls.Config
	pw      string
	topics  topics
	started atomic.Bool

	// done is closed when the device stops handling messages (Kill, or
	// the start of a clean stop); dead when it is gone (Kill, or the end
	// of a clean stop).
	done chan struct{}
	dead chan struct{}
	// gen changes with every connection opened or lost; a publish is
	// confirmed only if its PUBACK came on the connection it was sent on
	// (paho completes the tokens of stored messages when it resends them
	// after a reconnect, before any PUBACK).
	gen atomic.Uint64

	// inbox feeds the worker (commands and queries, in arrival order), jobs
	// the executor (actions, one at a time); each runs in a goroutine only
	// while it has work.
	inbox *serial[mqtt.Message]
	jobs  *serial[string]
	loops sync.WaitGroup
	// runCtx is the handlers' context, cancelled at a clean stop.
	runCtx    context.Context
	cancelRun context.CancelFunc

	mu        sync.Mutex
	st        *durableState
	killed    bool
	stopping  bool
	fatal     error // why the device killed itself
	client    mqtt.Client
	conn      *netConn
	ready     bool // a session number is saved and the will set for the next attempt
	connected bool // subscribed and birth published on the current connection
	onlineCh  chan struct{}
	session   int64
	pending   []wire.Receipt
	flushing  bool // flushPending is publishing pending receipts
	inflight  int
	idle      chan struct{}
	// last is the journal batch holding the device's latest record; once
	// it is done, every change before it is durable too.
	last *batch
	// running is the record of the command whose handler runs (nil
	// between handlers), runs counts the handlers' runs: a Command's
	// Progress is for the run it was made for only.
	running *record
	runs    uint64
	// onDead, set by Start, runs (in its own goroutine) when the device
	// dies.
	onDead func()
	// send publishes a receipt for Hooks.Receipt (made once, not per
	// receipt).
	send func(Receipt)
}

type topics struct{ commands, queries, receipts, presence string }

// New checks the options and makes a Device. It connects to nothing and
// reads no state: Run does.
func New(o Options) (*Device, error) {
	if !wire.ValidDeviceID(o.ID) {
		return nil, fmt.Errorf("device: id %q: %w", o.ID, wire.ErrInvalidDeviceID)
	}
	if o.Broker == "" {
		return nil, errors.New("device: no Broker URL")
	}
	u, err := url.Parse(o.Broker)
	if err != nil {
		return nil, fmt.Errorf("device: Broker: %w", err)
	}
	if err := wire.CheckScheme(u.Scheme); err != nil {
		return nil, fmt.Errorf("device: Broker %q: %w", o.Broker, err)
	}
	if o.StateDir == "" && o.Journal == nil {
		return nil, errors.New("device: neither StateDir nor Journal")
	}
	if len(o.Actions) == 0 {
		return nil, errors.New("device: no Actions")
	}
	for name, h := range o.Actions {
		if h == nil {
			return nil, fmt.Errorf("device: action %q has no handler", name)
		}
	}
	d := &Device{o: o, id: o.ID, j: o.Journal, onlineCh: make(chan struct{})}
	if o.Password != "" && o.PasswordFile != "" {
		return nil, errors.New("device: both Password and PasswordFile")
	}
	d.pw = o.Password
	if o.PasswordFile != "" {
		b, err := os.ReadFile(o.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("device: PasswordFile: %w", err)
		}
		d.pw = strings.TrimRight(string(b), "\r\n")
	}
	if wire.TLSScheme(u.Scheme) {
		d.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		switch {
		case o.TLSConfig != nil:
			d.tls = o.TLSConfig.Clone()
		case o.CAFile != "":
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("device: CAFile: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("device: CAFile %s: no certificate", o.CAFile)
			}
			d.tls.RootCAs = pool
		}
	}
	if d.o.Username == "" {
		d.o.Username = o.ID
	}
	if d.o.TopicRoot == "" {
		d.o.TopicRoot = wire.DefaultTopicRoot
	}
	d.caps = wire.Capabilities{Dedupe: true, Query: true}
	if o.Capabilities != nil {
		d.caps = wire.Capabilities(*o.Capabilities)
	}
	d.o.Retention = or(o.Retention, 24*time.Hour)
	d.o.KeepAlive = or(o.KeepAlive, 30*time.Second)
	d.o.ConnectTimeout = or(o.ConnectTimeout, 10*time.Second)
	d.o.PublishTimeout = or(o.PublishTimeout, 10*time.Second)
	d.o.MaxReconnectInterval = or(o.MaxReconnectInterval, 10*time.Second)
	d.now = o.Clock
	if d.now == nil {
		d.now = time.Now
	}
	d.log = o.Logger
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	d.log = d.log.With("device", o.ID)
	if d.o.Hooks == nil {
		d.o.Hooks = &Hooks{}
	}
	root := d.o.TopicRoot
	d.topics = topics{
		commands: wire.Topic(root, o.ID, wire.KindCommands),
		queries:  wire.Topic(root, o.ID, wire.KindQueries),
		receipts: wire.Topic(root, o.ID, wire.KindReceipts),
		presence: wire.Topic(root, o.ID, wire.KindPresence),
	}
	d.done, d.dead = make(chan struct{}), make(chan struct{})
	d.inbox = newSerial(d.done, &d.loops, d.handleMessage)
	d.jobs = newSerial(d.done, &d.loops, d.execute)
	if d.o.Hooks.Receipt != nil {
		d.send = func(r Receipt) { d.publish(fromReceipt(r)) }
	}
	return d, nil
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// ID is the device id.
func (d *Device) ID() string { return d.id }

// Online reports whether the device is connected with its birth published.
func (d *Device) Online() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.connectedLocked()
}

// WaitOnline waits until the device is connected with its birth published.
func (d *Device) WaitOnline(ctx context.Context) error {
	for {
		d.mu.Lock()
		ch, ok := d.onlineCh, d.connectedLocked()
		d.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-d.dead:
			return errors.New("device: ended")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Session is the session number of the device's latest connection attempt.
func (d *Device) Session() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.session
}

// Latest returns the latest receipt for a command_id, as a repeat of the
// command would get it (false if the device does not know the command or
// does not run).
func (d *Device) Latest(commandID string) (Receipt, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st == nil {
		return Receipt{}, false
	}
	rec := d.st.Commands[commandID]
	if rec == nil {
		return Receipt{}, false
	}
	return toReceipt(rec.Latest), true
}

// Run boots the device from its durable record, connects, and handles
// commands and queries until ctx is done; then it stops cleanly (the
// running handler gets a cancelled context and is waited for, receipts are
// flushed, a retained offline presence published, DISCONNECT) and returns
// nil. It returns ErrKilled after Kill, an ErrNotDurable error when the
// device could not make its record durable, or an error from the boot.
// Run may be called once (Run or Start).
func (d *Device) Run(ctx context.Context) error {
	if err := d.start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return d.end(true)
	case <-d.dead:
		return d.end(false)
	}
}

// Start is Run without a goroutine waiting for its end, for a process
// running many devices: it boots the device and returns the boot's error
// (nil once the device runs, connecting in the background). The device
// then runs as under Run until ctx is done or it dies, and end, called once
// from a goroutine of its own, gets what Run would have returned. end is
// not called when Start returns an error.
func (d *Device) Start(ctx context.Context, end func(error)) error {
	if err := d.start(ctx); err != nil {
		return err
	}
	var (
		once sync.Once
		mu   sync.Mutex // stop is set after AfterFunc, which may already run finish
		stop func() bool
	)
	finish := func(stopped bool) {
		once.Do(func() {
			mu.Lock()
			s := stop
			mu.Unlock()
			if s != nil { // nil only when ctx was done already: nothing to stop
				s()
			}
			end(d.end(stopped))
		})
	}
	mu.Lock()
	stop = context.AfterFunc(ctx, func() { finish(true) })
	mu.Unlock()
	d.mu.Lock()
	dead := d.killed
	if !dead {
		d.onDead = func() { finish(false) }
	}
	d.mu.Unlock()
	if dead {
		go finish(false)
	}
	return nil
}

// start is Run up to its wait: the boot, then the connection in the
// background.
func (d *Device) start(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return errors.New("device: Run called twice")
	}
	if d.j == nil {
		j, err := OpenJournal(d.o.StateDir, &JournalOptions{Logger: d.log})
		if err != nil {
			return err
		}
		d.j, d.ownJ = j, true
	}
	if err := d.j.register(d.id); err != nil {
		if d.ownJ {
			d.j.Close()
		}
		return err
	}
	d.runCtx, d.cancelRun = context.WithCancel(context.WithoutCancel(ctx))
	recovered, err := d.boot(ctx)
	if err != nil {
		d.cancelRun()
		d.j.unregister(d.id)
		if d.ownJ {
			d.j.Close()
		}
		return err
	}
	for _, r := range recovered {
		d.emit(r) // kept for the first connection, in order
	}
	d.loops.Add(1)
	go func() { defer d.loops.Done(); d.connectLoop() }()
	return nil
}

// end is Run after its wait: a clean stop once ctx is done (stopped), or
// the end of a device that died.
func (d *Device) end(stopped bool) error {
	defer d.cancelRun()
	if stopped {
		d.shutdown()
		d.j.unregister(d.id)
		if d.ownJ {
			return d.j.Close()
		}
		return nil
	}
	d.j.unregister(d.id)
	if d.ownJ {
		d.j.abandon()
	}
	d.mu.Lock()
	err := d.fatal
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return ErrKilled
}

// boot loads the durable record and resolves what a crash left in
// progress: a command found "executing" is resolved (Options.Resolve, else
// failed "interrupted"), one found "received" is handed to the executor
// again (its expiry checked first). The resolved outcomes are recorded
// durably before the device connects, and returned to be published.
func (d *Device) boot(ctx context.Context) ([]wire.Receipt, error) {
	// What an earlier run of this id in this process left is committed
	// first, so the record read is all there is.
	if err := d.j.Sync(); err != nil {
		return nil, err
	}
	st, err := d.j.load(d.id)
	if err != nil {
		return nil, err
	}
	if d.o.Hooks.LoadApp != nil {
		d.o.Hooks.LoadApp(st.App)
	}
	recs := make([]*record, 0, len(st.Commands))
	for _, rec := range st.Commands {
		recs = append(recs, rec)
	}
	slices.SortFunc(recs, func(a, b *record) int { return a.SeenAt.Compare(b.SeenAt) })
	var (
		recovered []wire.Receipt
		jobs      []string
	)
	for _, rec := range recs {
		switch rec.Latest.Status {
		case wire.ReceiptExecuting:
			rec.Latest = d.resolve(ctx, st, rec)
			recovered = append(recovered, rec.Latest)
		case wire.ReceiptReceived:
			jobs = append(jobs, rec.Command.CommandID)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st, d.session = st, st.Session
	if len(recovered) > 0 {
		// What a Resolver did to the application's state is durable with
		// the outcomes it decided.
		if d.o.Hooks.SaveApp != nil {
			st.App = d.o.Hooks.SaveApp()
		}
		b, err := d.j.state(journalEntry{Device: d.id, Full: st})
		if err != nil {
			return nil, err
		}
		d.last = b
	}
	for _, id := range jobs {
		d.jobs.push(id)
	}
	d.log.Debug("device booted", "session", st.Session, "recovered", len(recovered), "resumed", len(jobs))
	return recovered, nil
}

// resolve is the final receipt of a command found executing at boot.
func (d *Device) resolve(ctx context.Context, st *durableState, rec *record) wire.Receipt {
	cmd, seq, now := rec.Command, rec.Latest.Seq+1, d.now()
	if d.o.Resolve == nil {
		d.log.Warn("command interrupted by a crash", "command_id", cmd.CommandID)
		return newReceipt(cmd, wire.ReceiptFailed, seq, now, nil, ErrorInterrupted)
	}
	ran, result, err := safeResolve(ctx, d.o.Resolve, toCommand(cmd))
	if !ran {
		releaseOp(st, cmd)
		return newReceipt(cmd, wire.ReceiptFailed, seq, now, nil, ErrorInterrupted)
	}
	return d.outcome(cmd, seq, now, result, err)
}

func safeResolve(ctx context.Context, r Resolver, c Command) (ran bool, result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			ran, result, err = true, nil, ErrInterrupted
		}
	}()
	return r(ctx, c)
}

// Kill ends the device as a crash does (kill -9), for simulators and
// tests: the TCP connection is reset without DISCONNECT (the broker
// publishes the last will), nothing more is published or recorded, the
// running handler's work is discarded, and Run returns ErrKilled. What was
// durable stays: a new Device of the same id (on the same Journal, or the
// same StateDir) boots from it.
func (d *Device) Kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.killLocked(nil)
}

// SetCapabilities changes the capabilities the device keeps from the next
// message it handles, for simulators that turn a device into legacy
// hardware at run time; the next birth announces them (DropConnection to
// make one now).
func (d *Device) SetCapabilities(c Capabilities) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.caps = wire.Capabilities(c)
}

// DropConnection resets the device's TCP connection abruptly, for
// simulators and tests: the broker publishes the last will, and the device
// reconnects at once with a new session number. Receipts wait for the new
// connection.
func (d *Device) DropConnection() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if nc := d.conn; nc != nil {
		nc.kill()
	}
}

func (d *Device) killLocked(fatal error) {
	if d.killed {
		return
	}
	d.killed, d.fatal = true, fatal
	if !d.stopping {
		close(d.done)
	}
	close(d.dead)
	if d.onDead != nil {
		go d.onDead() // Start's end
	}
	if d.cancelRun != nil {
		d.cancelRun()
	}
	if d.conn != nil {
		d.conn.kill()
	}
	if c := d.client; c != nil {
		go c.Disconnect(0) // its writes fail on the killed connection
	}
	d.setOnlineLocked(false)
}

// notDurable: a change could not be made durable; the device dies rather
// than act on it.
func (d *Device) notDurable(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log.Error("record not durable; stopping as a crash", "err", err)
	d.killLocked(fmt.Errorf("%w: %w", ErrNotDurable, err))
}

// saveLocked hands a change of the record to the journal: the session, the
// application state, the records given with their operation claims, and
// what pruning forgets. It does not wait: whoever acts on the change
// (acknowledges, publishes, connects) first waits for d.last.
func (d *Device) saveLocked(recs ...*record) bool {
	st := d.st
	cmds, ops := st.prune(d.now(), d.o.Retention)
	var file string
	var line []byte
	if d.o.Hooks.SaveLine != nil {
		file, line = d.o.Hooks.SaveLine()
	}
	if d.o.Hooks.SaveApp != nil {
		st.App = d.o.Hooks.SaveApp()
	}
	dl := &delta{Session: st.Session, App: st.App}
	if len(recs)+len(cmds) > 0 {
		dl.Commands = make(map[string]*record, len(recs)+len(cmds))
	}
	for _, id := range cmds {
		dl.Commands[id] = nil
	}
	for _, r := range recs {
		id := r.Command.CommandID
		dl.Commands[id] = st.Commands[id] // nil if pruned
		if op := r.Command.OperationID; op != "" {
			ops = append(ops, op)
		}
	}
	if len(ops) > 0 {
		dl.Operations = make(map[string]string, len(ops))
		for _, op := range ops {
			dl.Operations[op] = st.Operations[op] // "" if released
		}
	}
	b, err := d.j.stateWithLine(journalEntry{Device: d.id, Delta: dl}, file, line)
	if err != nil {
		d.log.Error("cannot save the record; stopping as a crash", "err", err)
		d.killLocked(fmt.Errorf("%w: %w", ErrNotDurable, err))
		return false
	}
	d.last = b
	return true
}

// waitDurable waits until the device's latest record is durable; false if
// it is not (the device then dies) or the device died meanwhile.
func (d *Device) waitDurable() bool {
	d.mu.Lock()
	t := d.last
	d.mu.Unlock()
	if err := t.wait(); err != nil {
		d.notDurable(err)
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.killed
}

func (d *Device) setOnlineLocked(v bool) {
	was := d.connected
	d.connected = v
	if v && !was {
		close(d.onlineCh)
	} else if !v && was {
		d.onlineCh = make(chan struct{})
	}
}

// point runs Hooks.Point; false if the device was killed meanwhile.
func (d *Device) point(p Point, cmd wire.Command) bool {
	if h := d.o.Hooks.Point; h != nil {
		h(p, toCommand(cmd))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.killed
}

// shutdown is the clean end: let the worker and the executor finish,
// publish what is pending, wait for the acknowledgements, publish the
// retained offline presence, DISCONNECT.
func (d *Device) shutdown() {
	d.mu.Lock()
	if d.killed {
		d.mu.Unlock()
		return
	}
	d.stopping = true
	close(d.done)
	d.mu.Unlock()
	d.cancelRun()
	d.inbox.stop()
	d.jobs.stop()
	d.loops.Wait()
	if !d.waitDurable() {
		return
	}
	d.flushPending()
	if !d.waitIdle(d.o.PublishTimeout) {
		d.log.Warn("shutdown: receipts not acknowledged in time")
	}
	d.mu.Lock()
	if d.killed {
		d.mu.Unlock()
		return
	}
	client, nc, connected := d.client, d.conn, d.connectedLocked()
	now := d.now().UTC()
	offline, _ := json.Marshal(wire.Presence{Online: false, Session: d.st.Session, At: &now})
	d.mu.Unlock()
	switch {
	case connected:
		tok := client.Publish(d.topics.presence, 1, true, offline)
		if !tok.WaitTimeout(d.o.PublishTimeout) || tok.Error() != nil {
			d.log.Warn("shutdown: offline presence not acknowledged", "err", tok.Error())
		}
		client.Disconnect(250)
	case client != nil:
		// Not connected (or not yet born): nothing to say; the broker has
		// or will have the last will.
		if nc != nil {
			nc.kill()
		}
		client.Disconnect(0)
	}
	d.mu.Lock()
	d.killed = true
	close(d.dead)
	d.setOnlineLocked(false)
	d.mu.Unlock()
}
