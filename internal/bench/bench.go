// Package bench is `make bench`: it measures the controller against the
// wire protocol's own ceiling, in one run on one broker.
//
// Phases, in this order (each a warm-up, then the measured window of
// Config.Window, then a drain of what is still in flight):
//
//  1. ceiling: a plain MQTT client (benchwire.Commander: no database, no
//     controller logic) sends commands (QoS 1) to an in-memory fleet
//     (benchwire.MemoryFleet), C in flight, each timed from publish to the
//     succeeded receipt: ceiling_per_s.
//  2. controller: `controller serve` on a fresh database, with the same
//     in-memory fleet as its devices (so the ratio compares like with
//     like), loaded only through the HTTP API: C callers each POST
//     /v1/operations and long-poll GET /v1/operations/{id}?wait= until the
//     final state: controller_per_s and the latencies. A 503 is honoured
//     (Retry-After) and the same request sent again, counted.
//  3. controller half load: an open loop at R = controller_per_s / 2
//     (arrivals at a fixed rate, latency from each arrival's due time):
//     half_load_p99_ms. The controller is then stopped and its broker
//     session discarded, so it adds no load to what follows.
//  4. ceiling half load: the plain client's open loop at the same R:
//     ceiling_half_load_p99_ms. It runs after phase 2 because R is only
//     known then.
//  5. fleet ceiling: the in-memory fleet is stopped and `devicesim run`
//     starts the same N device ids (durable state on disk, as devices
//     keep it); the plain client's closed loop again: fleet_ceiling_per_s.
//
// Everything runs on this host: the bench process (its in-memory devices
// and its callers), the broker, and the controller or devicesim share the
// same cores, and each phase's CPU time per process is reported with it.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/benchwire"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Defaults of Config.
const (
	DefaultDevices     = 100
	DefaultWindow      = 10 * time.Second
	DefaultConcurrency = 256
	DefaultMosquitto   = "/usr/sbin/mosquitto"
	// DefaultMaxOutstanding bounds an open loop's operations in flight.
	DefaultMaxOutstanding = 20000
)

// instanceID is the bench controller's --instance-id.
const instanceID = "bench"

// Config configures a run.
type Config struct {
	// Bin holds the controller and devicesim binaries.
	Bin string
	// Mosquitto is the broker binary; BrokerTemplate its config template
	// (mosquitto/anonymous-loopback.conf.tmpl).
	Mosquitto      string
	BrokerTemplate string
	// BrokerURL, if set, is a broker already running (the tests'); the
	// bench then starts none.
	BrokerURL string
	Devices   int
	// Window is the length of each measured phase; Warmup precedes it
	// (default: a fifth of it, at most 1 s), Drain bounds the wait for the
	// operations still running after it (default 30 s).
	Window, Warmup, Drain time.Duration
	// Concurrency is C, the callers of the closed loops.
	Concurrency int
	// MaxOutstanding bounds an open loop's operations in flight.
	MaxOutstanding int64
	// DB is the controller's --db: an SQLite file (kept), a postgres://
	// URL (passed through), or "" for a file in the run's directory.
	DB        string
	TopicRoot string
	// OutDir receives latest.json and latest.html; "" writes nothing.
	OutDir string
	// Out receives the table; Log the progress lines (nil: discarded).
	Out, Log io.Writer
}

func (c Config) withDefaults() Config {
	if c.Mosquitto == "" {
		c.Mosquitto = DefaultMosquitto
	}
	if c.BrokerTemplate == "" {
		c.BrokerTemplate = filepath.Join("mosquitto", "anonymous-loopback.conf.tmpl")
	}
	if c.Devices == 0 {
		c.Devices = DefaultDevices
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Warmup == 0 {
		c.Warmup = min(time.Second, c.Window/5)
	}
	if c.Drain == 0 {
		c.Drain = 30 * time.Second
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxOutstanding == 0 {
		c.MaxOutstanding = DefaultMaxOutstanding
	}
	if c.TopicRoot == "" {
		c.TopicRoot = wire.DefaultTopicRoot
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Devices < 1:
		return fmt.Errorf("devices %d: at least 1", c.Devices)
	case c.Window < 100*time.Millisecond:
		return fmt.Errorf("phase length %s: at least 100ms", c.Window)
	case c.Concurrency < 1:
		return fmt.Errorf("concurrency %d: at least 1", c.Concurrency)
	case c.Bin == "":
		return errors.New("the directory of the controller and devicesim binaries is required")
	}
	for _, name := range []string{"controller", "devicesim"} {
		if _, err := os.Stat(filepath.Join(c.Bin, name)); err != nil {
			return fmt.Errorf("%s binary: %w (run 'make build')", name, err)
		}
	}
	return nil
}

// Backend names the controller's store for a --db value.
func Backend(db string) string {
	if strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") {
		return "postgres"
	}
	return "sqlite"
}

// Run runs every phase and returns the result, also written to OutDir.
// Before it returns it stops every process it started and removes its
// directory, however it ends.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	dir, err := os.MkdirTemp("", "fleetctl-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &run{cfg: cfg, dir: dir, runID: newRunID(), procs: map[string]int{"bench": os.Getpid()}}
	defer r.close()
	res, err = r.run(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if cfg.OutDir != "" {
		if err := res.write(cfg.OutDir); err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
	}
	res.table(cfg.Out)
	return res, nil
}

// run is one run's state; close stops what it started, in order.
type run struct {
	cfg    Config
	dir    string
	runID  string
	broker *process
	url    string
	fleet  *benchwire.MemoryFleet
	cm     *benchwire.Commander
	ctl    *process
	sim    *process
	procs  map[string]int
	res    *Result
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "bench: "+format+"\n", args...)
}

func (r *run) close() {
	r.ctl.stop(15 * time.Second)
	r.sim.stop(60 * time.Second)
	if r.cm != nil {
		r.cm.Close()
	}
	if r.fleet != nil {
		r.fleet.Stop()
	}
	r.broker.stop(10 * time.Second)
}

func (r *run) opts() loadOpts {
	return loadOpts{warmup: r.cfg.Warmup, window: r.cfg.Window, drain: r.cfg.Drain, procs: r.procs}
}

func (r *run) run(ctx context.Context) (*Result, error) {
	cfg := r.cfg
	res := newResult(cfg)
	r.res = res
	if cfg.BrokerURL != "" {
		r.url = cfg.BrokerURL
	} else {
		var err error
		if r.broker, r.url, err = startBroker(ctx, cfg.Mosquitto, cfg.BrokerTemplate, filepath.Join(r.dir, "broker")); err != nil {
			return nil, err
		}
		r.procs["mosquitto"] = r.broker.pid()
	}
	r.logf("broker %s; connecting %d in-memory devices", r.url, cfg.Devices)
	t0 := time.Now()
	var err error
	if r.fleet, err = benchwire.StartMemoryFleet(ctx, r.url, cfg.TopicRoot, cfg.Devices); err != nil {
		return nil, err
	}
	r.logf("%d in-memory devices online in %s", cfg.Devices, time.Since(t0).Round(time.Millisecond))
	if r.cm, err = benchwire.DialCommander(ctx, r.url, cfg.TopicRoot, "bench-"+r.runID); err != nil {
		return nil, err
	}

	// 1. The ceiling: the plain client and the in-memory fleet.
	ceiling := &Phase{Name: "ceiling", Target: "ceiling"}
	r.logf("phase ceiling: closed loop, %d in flight, %s", cfg.Concurrency, cfg.Window)
	closedLoop(ctx, ceiling, cfg.Concurrency, r.opts(), ceilingOp(r.cm, r.runID, "ceil", cfg.Devices))
	res.add(ceiling)
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// 2 and 3. The controller, through its HTTP API. The plain client
	// leaves meanwhile: on the broker it would be a second subscriber to
	// every receipt the controller gets.
	cs := r.cm.Stats()
	r.cm.Close()
	r.cm = nil
	sat, half, err := r.controllerPhases(ctx)
	if err != nil {
		return nil, err
	}
	res.add(sat)
	res.add(half)
	if r.cm, err = benchwire.DialCommander(ctx, r.url, cfg.TopicRoot, "bench-"+r.runID); err != nil {
		return nil, err
	}

	// 4. The ceiling at the controller's half-load rate.
	ceilHalf := &Phase{Name: "ceiling_half_load", Target: "ceiling"}
	r.logf("phase ceiling_half_load: open loop at %.1f/s, %s", half.TargetRate, cfg.Window)
	openLoop(ctx, ceilHalf, half.TargetRate, cfg.MaxOutstanding, r.opts(), ceilingOp(r.cm, r.runID, "ceilhalf", cfg.Devices))
	res.add(ceilHalf)
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// 5. The fleet ceiling: devicesim's own devices.
	r.fleet.Stop()
	fs := r.fleet.Stats()
	res.MemoryFleet = &fs
	r.fleet = nil
	fleetPhase, err := r.fleetPhase(ctx)
	if err != nil {
		return nil, err
	}
	res.add(fleetPhase)
	cs2 := r.cm.Stats()
	cs.Receipts, cs.Unmatched, cs.Malformed = cs.Receipts+cs2.Receipts, cs.Unmatched+cs2.Unmatched, cs.Malformed+cs2.Malformed
	res.Commander = &cs
	res.finish()
	return res, nil
}

// controllerPhases starts the controller on the in-memory fleet, runs the
// saturation and half-load phases, reads its peak RSS and stops it.
func (r *run) controllerPhases(ctx context.Context) (*Phase, *Phase, error) {
	cfg := r.cfg
	db := cfg.DB
	if db == "" {
		db = filepath.Join(r.dir, "controller.db")
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	bin := filepath.Join(cfg.Bin, "controller")
	args := []string{"serve", "--db", db, "--mqtt", r.url, "--http", fmt.Sprintf("127.0.0.1:%d", port),
		"--instance-id", instanceID, "--topic-root", cfg.TopicRoot}
	// The ceiling throttles nobody; a controller with a per-device receipt
	// limit gets one that the bench's traffic never reaches.
	if help, _ := exec.CommandContext(ctx, bin, "serve", "--help").CombinedOutput(); strings.Contains(string(help), "--receipt-rate") {
		args = append(args, "--receipt-rate", "1000000")
	}
	r.res.ControllerArgs = redactArgs(args[1:])
	r.logf("starting the controller (%s backend)", Backend(db))
	if r.ctl, err = startProcess("controller", filepath.Join(r.dir, "controller.log"), append([]string{bin}, args...), nil); err != nil {
		return nil, nil, err
	}
	load := newControllerLoad(fmt.Sprintf("http://127.0.0.1:%d", port), r.runID, cfg.Devices, cfg.Concurrency)
	err = waitUntil(ctx, r.ctl, 30*time.Second, "the controller's /healthz", func() bool {
		resp, err := load.http.Get(load.base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	if err != nil {
		return nil, nil, err
	}
	// The births are retained: the controller reads them all at subscribe.
	t0, last, lastLog := time.Now(), 0, time.Now()
	err = waitUntil(ctx, r.ctl, 60*time.Second+time.Duration(cfg.Devices)*20*time.Millisecond,
		fmt.Sprintf("the controller to see %d devices online", cfg.Devices), func() bool {
			n, err := load.onlineDevices(ctx)
			if err == nil {
				last = n
			}
			if time.Since(lastLog) > 5*time.Second {
				r.logf("the controller sees %d of %d devices online", last, cfg.Devices)
				lastLog = time.Now()
			}
			return last >= cfg.Devices
		})
	if err != nil {
		return nil, nil, fmt.Errorf("%w (it saw %d)", err, last)
	}
	r.res.ControllerDevicesOnlineSeconds = time.Since(t0).Seconds()
	r.logf("the controller sees all %d devices online after %s", cfg.Devices, time.Since(t0).Round(time.Millisecond))
	r.procs["controller"] = r.ctl.pid()
	defer delete(r.procs, "controller")

	sat := &Phase{Name: "controller", Target: "controller"}
	r.logf("phase controller: closed loop, %d in flight, %s", cfg.Concurrency, cfg.Window)
	closedLoop(ctx, sat, cfg.Concurrency, r.opts(), load.op("sat"))
	sat.Overloaded = load.overloaded.Swap(0)
	if err := r.alive(ctx, r.ctl); err != nil {
		return nil, nil, err
	}
	rate := max(1, sat.PerS/2)
	half := &Phase{Name: "controller_half_load", Target: "controller"}
	r.logf("phase controller_half_load: open loop at %.1f/s, %s", rate, cfg.Window)
	openLoop(ctx, half, rate, cfg.MaxOutstanding, r.opts(), load.op("half"))
	half.Overloaded = load.overloaded.Swap(0)
	if err := r.alive(ctx, r.ctl); err != nil {
		return nil, nil, err
	}
	if rss, err := peakRSS(r.ctl.pid()); err == nil {
		r.res.ControllerPeakRSSMB = round(rss, 1)
	}
	r.ctl.stop(15 * time.Second)
	r.ctl = nil
	load.http.CloseIdleConnections()
	// Its persistent session would queue the ceiling's receipts for a
	// controller that is gone: a clean-session connect discards it.
	if err := discardSession(ctx, r.url, "controller-"+instanceID); err != nil {
		return nil, nil, err
	}
	return sat, half, nil
}

// fleetPhase starts devicesim with the same N device ids, runs the plain
// client's closed loop against it, and stops it.
func (r *run) fleetPhase(ctx context.Context) (*Phase, error) {
	cfg := r.cfg
	online := make(chan struct{})
	var once sync.Once
	want := fmt.Sprintf("devicesim: %d devices online", cfg.Devices)
	args := []string{filepath.Join(cfg.Bin, "devicesim"), "run", "--mqtt", r.url, "--devices", fmt.Sprint(cfg.Devices),
		"--state-dir", filepath.Join(r.dir, "devicesim"), "--topic-root", cfg.TopicRoot, "--log-level", "warn"}
	r.logf("starting devicesim with %d devices", cfg.Devices)
	t0 := time.Now()
	var err error
	r.sim, err = startProcess("devicesim", filepath.Join(r.dir, "devicesim.log"), args, func(line string) {
		if strings.Contains(line, want) {
			once.Do(func() { close(online) })
		}
	})
	if err != nil {
		return nil, err
	}
	timeout := time.NewTimer(60*time.Second + time.Duration(cfg.Devices)*20*time.Millisecond)
	defer timeout.Stop()
	select {
	case <-online:
	case <-r.sim.done:
		return nil, r.sim.failure()
	case <-timeout.C:
		return nil, fmt.Errorf("devicesim: not all %d devices online in time:\n%s", cfg.Devices, tail(r.sim.log, 20))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.logf("devicesim: %d devices online after %s", cfg.Devices, time.Since(t0).Round(time.Millisecond))
	r.procs["devicesim"] = r.sim.pid()
	defer delete(r.procs, "devicesim")
	p := &Phase{Name: "fleet_ceiling", Target: "fleet"}
	r.logf("phase fleet_ceiling: closed loop, %d in flight, %s", cfg.Concurrency, cfg.Window)
	closedLoop(ctx, p, cfg.Concurrency, r.opts(), ceilingOp(r.cm, r.runID, "fleet", cfg.Devices))
	if err := r.alive(ctx, r.sim); err != nil {
		return nil, err
	}
	r.logf("stopping devicesim")
	r.sim.stop(60 * time.Second)
	r.sim = nil
	return p, nil
}

// alive fails if ctx ended or p exited during a phase.
func (r *run) alive(ctx context.Context, p *process) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.failure()
	default:
		return nil
	}
}

// discardSession connects clientID with a clean session and disconnects,
// which makes the broker drop that client's persistent session.
func discardSession(ctx context.Context, brokerURL, clientID string) error {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(clientID).SetCleanSession(true).
		SetConnectTimeout(10 * time.Second))
	tok := c.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("discard the session of %s: %w", clientID, err)
	}
	c.Disconnect(100)
	return nil
}

func newRunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return "b" + time.Now().UTC().Format("0102150405") + hex.EncodeToString(b[:])
}

// redactArgs hides a password in a postgres:// URL among the arguments.
func redactArgs(args []string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		out[i] = redactURL(a)
	}
	return out
}

func redactURL(s string) string {
	if Backend(s) != "postgres" {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "postgres://(unparsable)"
	}
	return u.Redacted()
}

func buildInfo() (goVersion, commit string) {
	goVersion = runtime.Version()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return goVersion, ""
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if commit != "" && modified {
		commit += "+dirty"
	}
	return goVersion, commit
}
