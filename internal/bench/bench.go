// Package bench is `make bench`: in one run, on one broker and one
// simulated fleet, the controller beside the pass-through (passthrough.go:
// the same job with no database, the physical baseline), both through the
// same HTTP load client.
//
// Phases, in this order (each a warm-up, then the measured window of
// Config.Window, then a drain of what is still in flight):
//
//  1. ceiling (a reference, the MQTT-only ceiling of earlier versions): a
//     plain MQTT client (benchwire.Commander) sends commands (QoS 1) to an
//     in-memory fleet (benchwire.MemoryFleet), C in flight, each timed
//     from publish to the succeeded receipt: ceiling_per_s.
//  2. fleet_ceiling (a reference): `devicesim run` starts the same N
//     device ids, the fleet of every phase that follows; the plain
//     client's closed loop on it.
//  3. passthrough: `bench passthrough` (its own process), C callers each
//     POST /v1/operations and long-poll GET /v1/operations/{id}?wait=
//     until the final state: passthrough_per_s.
//  4. controller: `controller serve` on a fresh database, the same load
//     client: controller_per_s and the latencies. A 503 is honoured
//     (Retry-After) and the same request sent again, counted.
//  5. controller_half_load: an open loop at R = controller_per_s / 2
//     (arrivals at a fixed rate, latency from each arrival's due time):
//     half_load_p99_ms.
//  6. passthrough_half_load: the pass-through at the same R.
//  7. controller_serial: the controller on another fresh database with
//     every action serial (--policy {"defaults":{"concurrency":"serial"}}),
//     closed loop: serial_per_s.
//
// Only one target is connected at a time (each is stopped, and a
// controller's broker session discarded, before the next starts). The
// bench process (the load client), the broker, devicesim and the target
// share this host's cores; each phase's CPU time per process is read from
// /proc around its window.
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/jackc/pgx/v5"

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

// instanceID is the --instance-id of the bench's i-th controller (from 1).
func instanceID(i int) string { return fmt.Sprintf("bench-%d", i) }

// Config configures a run.
type Config struct {
	// Bin holds the controller and devicesim binaries.
	Bin string
	// Profile: the first controller serves Go's profiler (--pprof) and a
	// CPU profile of each controller phase is written to OutDir
	// (controller-cpu.pprof, controller-half-cpu.pprof at R,
	// controller-serial-cpu.pprof). The profiler
	// costs a few per cent: figures of a profiled run are not compared
	// with others.
	Profile bool
	// Self is the program that runs the pass-through as its own process
	// (Self passthrough --mqtt ...: PassthroughMain); default this one.
	Self string
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
	// FleetDir holds devicesim's devices' durable files, in a directory
	// made for the run and removed at its end. "" picks /dev/shm when it is
	// a tmpfs this process can write, else the run's directory: real
	// devices each write their own storage, so the fleet's fsyncs and
	// journal folds must not queue ahead of the controller's commits on
	// this host's disk, a cost no deployment has and the pass-through,
	// which writes nothing, never meets.
	FleetDir string
	// DB is the controller's --db: an SQLite file (kept), a postgres://
	// URL (passed through), or "" for a file in the run's directory.
	DB        string
	TopicRoot string
	// Instances is how many controller processes the controller phases
	// start (bench-1..bench-N, each its own HTTP port, one --db, one
	// broker); operation k goes to instance k%N and is waited for there.
	// More than one needs a postgres:// DB.
	Instances int
	// OutDir receives latest.json and latest.html; "" writes nothing.
	OutDir string
	// Doc, if set, is a Markdown page of the docs the run's figures are
	// written to (Result.Markdown).
	Doc string
	// Name, if set, also writes NAME.json and NAME.html in OutDir (a run
	// kept beside the next one's latest.*).
	Name string
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
	if c.Instances == 0 {
		c.Instances = 1
	}
	if c.Self == "" {
		c.Self, _ = os.Executable()
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
	case c.Name != "" && (c.Name == "latest" || !namePattern.MatchString(c.Name)):
		return fmt.Errorf("name %q: use [A-Za-z0-9._-], not latest", c.Name)
	case c.Instances < 1:
		return fmt.Errorf("instances %d: at least 1", c.Instances)
	case c.Instances > 1 && Backend(c.DB) != "postgres":
		// SQLite instances share one file on one host, and each applies
		// every receipt from a persistent subscription of its own: the
		// bench of several instances is for PostgreSQL.
		return fmt.Errorf("%d instances need a postgres:// database (BENCH_DB); several instances on one SQLite file are not benchmarked", c.Instances)
	}
	for _, name := range []string{"controller", "devicesim"} {
		if _, err := os.Stat(filepath.Join(c.Bin, name)); err != nil {
			return fmt.Errorf("%s binary: %w (run 'make build')", name, err)
		}
	}
	return nil
}

// makeFleetDir makes the run's directory for the fleet's files in parent,
// or by default (parent "") in memory (shm in the bench) when it is a
// tmpfs this process can write, else in fallback.
func makeFleetDir(parent, memory, fallback string) (string, error) {
	if parent != "" {
		return os.MkdirTemp(parent, "fleetctl-bench-fleet-")
	}
	if Storage(memory) == "tmpfs" {
		if d, err := os.MkdirTemp(memory, "fleetctl-bench-fleet-"); err == nil {
			return d, nil
		}
	}
	return os.MkdirTemp(fallback, "fleet-")
}

// shm is where Linux mounts its shared-memory tmpfs.
const shm = "/dev/shm"

// Storage names what holds dir: "tmpfs" (memory) or "disk".
func Storage(dir string) string {
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil && st.Type == tmpfsMagic {
		return "tmpfs"
	}
	return "disk"
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

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
	fleetDir, err := makeFleetDir(cfg.FleetDir, shm, dir)
	if err != nil {
		return nil, fmt.Errorf("bench: the fleet's directory: %w", err)
	}
	defer os.RemoveAll(fleetDir)
	r := &run{cfg: cfg, dir: dir, fleetDir: fleetDir, runID: newRunID(), procs: map[string]int{"bench": os.Getpid()},
		trees: map[string]int{}}
	defer r.close()
	res, err = r.run(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if cfg.OutDir != "" {
		var names []string
		if cfg.Name != "" {
			names = append(names, cfg.Name)
		}
		if err := res.write(cfg.OutDir, names...); err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
	}
	if cfg.Doc != "" {
		if err := writeAtomic(cfg.Doc, []byte(res.Markdown())); err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
	}
	res.table(cfg.Out)
	return res, nil
}

// run is one run's state; close stops what it started, in order.
type run struct {
	cfg      Config
	dir      string
	fleetDir string // devicesim's --state-dir (Config.FleetDir)
	runID    string
	broker   *process
	url      string
	fleet    *benchwire.MemoryFleet
	cm       *benchwire.Commander
	ctls     []*process
	sim      *process
	procs    map[string]int
	trees    map[string]int
	res      *Result
	pprof    string // the first controller's --pprof address (Config.Profile)
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "bench: "+format+"\n", args...)
}

func (r *run) close() {
	r.stopControllers()
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
	return loadOpts{warmup: r.cfg.Warmup, window: r.cfg.Window, drain: r.cfg.Drain, procs: r.procs, trees: r.trees}
}

func (r *run) run(ctx context.Context) (*Result, error) {
	cfg := r.cfg
	res := newResult(cfg)
	res.FleetStorage = Storage(r.fleetDir)
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

	// 1. The reference ceiling: the plain client and the in-memory fleet.
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
	ceiling := &Phase{Name: "ceiling", Target: "ceiling"}
	r.logf("phase ceiling: closed loop, %d in flight, %s", cfg.Concurrency, cfg.Window)
	closedLoop(ctx, ceiling, cfg.Concurrency, r.opts(), ceilingOp(r.cm, r.runID, "ceil", cfg.Devices))
	res.add(ceiling)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cs := r.cm.Stats()
	r.cm.Close()
	r.cm = nil
	r.fleet.Stop()
	fs := r.fleet.Stats()
	res.MemoryFleet = &fs
	r.fleet = nil

	// 2. devicesim's devices, the fleet of every phase that follows; the
	// plain client's closed loop on them first (a reference too). The
	// plain client then leaves: on the broker it would be a second
	// subscriber to every receipt the targets get.
	if err := r.startFleet(ctx); err != nil {
		return nil, err
	}
	fleetPhase := &Phase{Name: "fleet_ceiling", Target: "fleet"}
	r.logf("phase fleet_ceiling: closed loop, %d in flight, %s", cfg.Concurrency, cfg.Window)
	closedLoop(ctx, fleetPhase, cfg.Concurrency, r.opts(), ceilingOp(r.cm, r.runID, "fleet", cfg.Devices))
	res.add(fleetPhase)
	if err := r.alive(ctx, r.sim); err != nil {
		return nil, err
	}
	cs2 := r.cm.Stats()
	cs.Receipts, cs.Unmatched, cs.Malformed = cs.Receipts+cs2.Receipts, cs.Unmatched+cs2.Unmatched, cs.Malformed+cs2.Malformed
	res.Commander = &cs
	r.cm.Close()
	r.cm = nil

	// 3. The pass-through saturated.
	pt, err := r.passthroughPhase(ctx, "passthrough", 0, false)
	if err != nil {
		return nil, err
	}
	res.add(pt)

	// 4 and 5. The controller saturated, then at half its rate R.
	sat, half, err := r.controllerPhases(ctx)
	if err != nil {
		return nil, err
	}
	res.add(sat)
	res.add(half)

	// 6. The pass-through at the same R.
	ptHalf, err := r.passthroughPhase(ctx, "passthrough_half_load", half.TargetRate, false)
	if err != nil {
		return nil, err
	}
	res.add(ptHalf)

	// 7. The durable floor (reference) at the same R: the pass-through
	// with a sync before each of its two answers.
	floor, err := r.passthroughPhase(ctx, "durable_floor_half_load", half.TargetRate, true)
	if err != nil {
		return nil, err
	}
	res.add(floor)

	// 8. The controller with every action serial, on a fresh database.
	serial, err := r.serialPhase(ctx)
	if err != nil {
		return nil, err
	}
	res.add(serial)

	r.logf("stopping devicesim")
	delete(r.procs, "devicesim")
	r.sim.stop(60 * time.Second)
	r.sim = nil
	res.finish()
	return res, nil
}

// passthroughPhase starts the pass-through (the durable floor when
// floor: its log in the run's directory, on the disk as the controller's
// default database), runs the load client against it (closed loop, or open
// at rate when rate > 0) and stops it: it is not subscribed while another
// target runs.
func (r *run) passthroughPhase(ctx context.Context, name string, rate float64, floor bool) (*Phase, error) {
	cfg := r.cfg
	listening := make(chan string, 1)
	target := "passthrough"
	args := []string{cfg.Self, "passthrough", "--mqtt", r.url, "--http", "127.0.0.1:0", "--topic-root", cfg.TopicRoot,
		"--client-id", "bench-passthrough-" + r.runID}
	if floor {
		target = "durable_floor"
		args = append(args, "--log", filepath.Join(r.dir, name+".floor"))
	}
	p, err := startProcess(target, filepath.Join(r.dir, name+".log"), args, func(line string) {
		if addr, ok := strings.CutPrefix(line, "passthrough: listening on "); ok {
			select {
			case listening <- addr:
			default:
			}
		}
	})
	if err != nil {
		return nil, err
	}
	defer p.stop(10 * time.Second)
	var base string
	select {
	case addr := <-listening:
		base = "http://" + addr
	case <-p.done:
		return nil, p.failure()
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("the pass-through did not listen in 30s:\n%s", tail(p.log, 20))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.procs[target] = p.pid()
	defer delete(r.procs, target)
	load := newControllerLoad([]string{base}, r.runID, cfg.Devices, cfg.Concurrency)
	defer load.http.CloseIdleConnections()
	ph := &Phase{Name: name, Target: target}
	if rate > 0 {
		r.logf("phase %s: open loop at %.1f/s, %s", name, rate, cfg.Window)
		openLoop(ctx, ph, rate, cfg.MaxOutstanding, r.opts(), load.op(name))
	} else {
		r.logf("phase %s: closed loop, %d in flight, %s", name, cfg.Concurrency, cfg.Window)
		closedLoop(ctx, ph, cfg.Concurrency, r.opts(), load.op(name))
	}
	ph.Overloaded = load.overloaded.Swap(0)
	if err := r.alive(ctx, p); err != nil {
		return nil, err
	}
	if err := r.alive(ctx, r.sim); err != nil {
		return nil, err
	}
	return ph, nil
}

// controllerPhases starts Config.Instances controllers on a fresh
// database, runs the saturation and half-load phases, reads their peak RSS
// and stops them.
func (r *run) controllerPhases(ctx context.Context) (*Phase, *Phase, error) {
	cfg := r.cfg
	db := cfg.DB
	if db == "" {
		db = filepath.Join(r.dir, "controller.db")
	}
	load, err := r.startControllers(ctx, db, "")
	if err != nil {
		return nil, nil, err
	}
	sat := &Phase{Name: "controller", Target: "controller"}
	r.logf("phase controller: closed loop, %d in flight over %d instance(s), %s", cfg.Concurrency, cfg.Instances, cfg.Window)
	if err := r.saturate(ctx, load, sat, "sat", "controller-cpu.pprof"); err != nil {
		return nil, nil, err
	}
	rate := max(1, sat.PerS/2)
	half := &Phase{Name: "controller_half_load", Target: "controller"}
	r.logf("phase controller_half_load: open loop at %.1f/s, %s", rate, cfg.Window)
	before := r.readStore(ctx, load)
	profiled := r.profile(ctx, "controller-half-cpu.pprof")
	openLoop(ctx, half, rate, cfg.MaxOutstanding, r.opts(), load.op("half"))
	profiled()
	r.countStore(ctx, load, half, before)
	half.Overloaded = load.overloaded.Swap(0)
	if err := r.controllersAlive(ctx); err != nil {
		return nil, nil, err
	}
	for _, p := range r.ctls {
		if rss, err := peakRSS(p.pid()); err == nil {
			r.res.ControllerPeakRSSMB = max(r.res.ControllerPeakRSSMB, round(rss, 1))
			r.res.ControllerPeakRSSMBEach = append(r.res.ControllerPeakRSSMBEach, round(rss, 1))
		}
	}
	if err := r.endControllers(ctx, load); err != nil {
		return nil, nil, err
	}
	return sat, half, nil
}

// saturate runs a controller phase's closed loop (operation ids tagged
// tag), with its statements per operation, its 503s and, with
// Config.Profile, a CPU profile written to OutDir/profile; the controllers
// must still be alive after it.
func (r *run) saturate(ctx context.Context, load *controllerLoad, p *Phase, tag, profile string) error {
	before := r.readStore(ctx, load)
	profiled := r.profile(ctx, profile)
	closedLoop(ctx, p, r.cfg.Concurrency, r.opts(), load.op(tag))
	profiled()
	r.countStore(ctx, load, p, before)
	p.Overloaded = load.overloaded.Swap(0)
	return r.controllersAlive(ctx)
}

// profile, with Config.Profile, takes a CPU profile of the first
// controller over the measured window of the phase about to start (after
// its warm-up) and writes it to OutDir/name; the function it returns waits
// for it. Without Config.Profile it does nothing. A failed profile is
// logged, never fatal: it is not a figure of the run.
func (r *run) profile(ctx context.Context, name string) (wait func()) {
	if !r.cfg.Profile || r.pprof == "" || r.cfg.OutDir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Warmup):
		}
		secs := max(1, int(r.cfg.Window/time.Second))
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", r.pprof, secs)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			r.logf("profile %s: %v", name, err)
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			r.logf("profile %s: %v", name, err)
			return
		}
		defer resp.Body.Close()
		path := filepath.Join(r.cfg.OutDir, name)
		err = os.MkdirAll(r.cfg.OutDir, 0o755)
		var f *os.File
		if err == nil {
			f, err = os.Create(path)
		}
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil || resp.StatusCode != http.StatusOK {
			r.logf("profile %s: status %d, %v", name, resp.StatusCode, err)
			return
		}
		r.logf("CPU profile of the controller over %ds: %s (go tool pprof -top bin/controller %s)", secs, path, path)
	}()
	return func() { <-done }
}

// serialPolicy makes every action serial (one command in flight per
// device, in submit order).
const serialPolicy = `{"defaults":{"concurrency":"serial"}}`

// serialPhase starts the controllers on a fresh database with every action
// serial and runs the saturated closed loop across the same devices.
func (r *run) serialPhase(ctx context.Context) (*Phase, error) {
	cfg := r.cfg
	db, drop, err := r.freshSerialDB(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	policy := filepath.Join(r.dir, "serial-policy.json")
	if err := os.WriteFile(policy, []byte(serialPolicy), 0o644); err != nil {
		return nil, err
	}
	load, err := r.startControllers(ctx, db, policy)
	if err != nil {
		return nil, err
	}
	p := &Phase{Name: "controller_serial", Target: "controller"}
	r.logf("phase controller_serial: every action serial, closed loop, %d in flight, %s", cfg.Concurrency, cfg.Window)
	if err := r.saturate(ctx, load, p, "serial", "controller-serial-cpu.pprof"); err != nil {
		return nil, err
	}
	if err := r.endControllers(ctx, load); err != nil {
		return nil, err
	}
	return p, nil
}

// startControllers starts Config.Instances controllers on db (with the
// policy file, if set), waits until each serves and sees every device
// online, and counts their CPU (and a local PostgreSQL server's) from
// then on; endControllers stops them.
func (r *run) startControllers(ctx context.Context, db, policy string) (*controllerLoad, error) {
	cfg := r.cfg
	bin := filepath.Join(cfg.Bin, "controller")
	// A controller with a per-device receipt limit gets one that the
	// bench's traffic never reaches.
	help, _ := exec.CommandContext(ctx, bin, "serve", "--help").CombinedOutput()
	receiptRate := strings.Contains(string(help), "--receipt-rate")
	var bases []string
	for i := 1; i <= cfg.Instances; i++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := []string{"serve", "--db", db, "--mqtt", r.url, "--http", fmt.Sprintf("127.0.0.1:%d", port),
			"--instance-id", instanceID(i), "--topic-root", cfg.TopicRoot}
		if receiptRate {
			args = append(args, "--receipt-rate", "1000000")
		}
		if policy != "" {
			args = append(args, "--policy", policy)
		}
		if r.cfg.Profile && i == 1 {
			pport, err := freePort()
			if err != nil {
				return nil, err
			}
			r.pprof = fmt.Sprintf("127.0.0.1:%d", pport)
			args = append(args, "--pprof", r.pprof)
		}
		if i == 1 && policy == "" {
			r.res.ControllerArgs = redactArgs(args[1:])
		}
		name := r.controllerName(i)
		r.logf("starting %s (--instance-id %s, %s backend, http 127.0.0.1:%d%s)", name, instanceID(i), Backend(db), port,
			map[bool]string{true: ", every action serial", false: ""}[policy != ""])
		logName := name
		if policy != "" {
			logName += "-serial"
		}
		p, err := startProcess(name, filepath.Join(r.dir, logName+".log"), append([]string{bin}, args...), nil)
		if err != nil {
			return nil, err
		}
		r.ctls = append(r.ctls, p)
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	load := newControllerLoad(bases, r.runID, cfg.Devices, cfg.Concurrency)
	for i, p := range r.ctls {
		base := bases[i]
		err := waitUntil(ctx, p, 30*time.Second, p.name+"'s /healthz", func() bool {
			resp, err := load.http.Get(base + "/healthz")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
		if err != nil {
			return nil, err
		}
	}
	// The births are retained: each controller reads them all at subscribe.
	t0 := time.Now()
	for i, p := range r.ctls {
		last, lastLog := 0, time.Now()
		err := waitUntil(ctx, p, 60*time.Second+time.Duration(cfg.Devices)*20*time.Millisecond,
			fmt.Sprintf("%s to see %d devices online", p.name, cfg.Devices), func() bool {
				n, err := load.onlineDevices(ctx, i)
				if err == nil {
					last = n
				}
				if time.Since(lastLog) > 5*time.Second {
					r.logf("%s sees %d of %d devices online", p.name, last, cfg.Devices)
					lastLog = time.Now()
				}
				return last >= cfg.Devices
			})
		if err != nil {
			return nil, fmt.Errorf("%w (it saw %d)", err, last)
		}
	}
	if policy == "" {
		r.res.ControllerDevicesOnlineSeconds = time.Since(t0).Seconds()
	}
	r.logf("the controller%s see%s all %d devices online after %s", plural(len(r.ctls), "s", ""), plural(len(r.ctls), "", "s"),
		cfg.Devices, time.Since(t0).Round(time.Millisecond))
	for i, p := range r.ctls {
		r.procs[r.controllerName(i+1)] = p.pid()
	}
	// A PostgreSQL server on this host does part of the controller's work:
	// its CPU (the postmaster and every backend) is taken too.
	if pid, err := localPostgres(db); err != nil {
		r.logf("the PostgreSQL server's CPU is not counted: %v", err)
	} else if pid > 0 {
		r.logf("counting the CPU of the PostgreSQL server on this host (postmaster pid %d) as \"postgres\"", pid)
		r.trees["postgres"] = pid
	}
	return load, nil
}

// endControllers stops the controllers and discards their broker
// sessions: a persistent one (SQLite's) would queue the next target's
// receipts for a controller that is gone.
func (r *run) endControllers(ctx context.Context, load *controllerLoad) error {
	for i := range r.ctls {
		delete(r.procs, r.controllerName(i+1))
	}
	delete(r.trees, "postgres")
	r.stopControllers()
	load.http.CloseIdleConnections()
	for i := 1; i <= r.cfg.Instances; i++ {
		if err := discardSession(ctx, r.url, "controller-"+instanceID(i)); err != nil {
			return err
		}
	}
	return nil
}

// freshSerialDB returns a fresh database for the serial phase and what
// removes it at the end. Without BENCH_DB: a file in the run's directory.
// An SQLite BENCH_DB: a file beside it, -serial before its extension (an
// old one removed first; kept, as BENCH_DB is). A postgres:// BENCH_DB: a
// database of its own on the same server, <name>_serial, created here
// (dropped first if a run left it) and dropped at the end.
func (r *run) freshSerialDB(ctx context.Context) (string, func(), error) {
	db := r.cfg.DB
	if db == "" {
		return filepath.Join(r.dir, "controller-serial.db"), func() {}, nil
	}
	if Backend(db) != "postgres" {
		ext := filepath.Ext(db)
		path := strings.TrimSuffix(db, ext) + "-serial" + ext
		for _, suffix := range []string{"", "-wal", "-shm"} {
			if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", nil, err
			}
		}
		return path, func() {}, nil
	}
	u, err := url.Parse(db)
	if err != nil {
		return "", nil, fmt.Errorf("BENCH_DB: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		name = "postgres"
	}
	ident := pgx.Identifier{name + "_serial"}.Sanitize()
	exec := func(ctx context.Context, stmts ...string) error {
		conn, err := pgx.Connect(ctx, db)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		for _, s := range stmts {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
	if err := exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)", "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("the serial phase's database: %w", err)
	}
	su := *u
	su.Path = "/" + name + "_serial"
	su.RawPath = ""
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			r.logf("could not drop the serial phase's database: %v", err)
		}
	}
	return su.String(), drop, nil
}

// controllerName is the i-th controller's name among the processes (its
// CPU row and log): "controller" when there is one.
func (r *run) controllerName(i int) string {
	if r.cfg.Instances == 1 {
		return "controller"
	}
	return fmt.Sprintf("controller-%d", i)
}

// controllersAlive fails if ctx ended or a controller exited.
func (r *run) controllersAlive(ctx context.Context) error {
	for _, p := range r.ctls {
		if err := r.alive(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// stopControllers stops every controller, keeping the warnings and errors
// of their logs in the result (the logs go with the run's directory).
func (r *run) stopControllers() {
	for _, p := range r.ctls {
		p.stop(15 * time.Second)
	}
	for _, p := range r.ctls {
		n, lines := logProblems(p.log, maxLogProblems)
		if n == 0 {
			continue
		}
		r.logf("%s logged %d warning or error line(s); the first:\n  %s", p.name, n, strings.Join(lines, "\n  "))
		if r.res != nil {
			if r.res.ControllerLogProblems == nil {
				r.res.ControllerLogProblems = map[string]int{}
			}
			r.res.ControllerLogProblems[p.name] = n
			for _, l := range lines {
				r.res.ControllerLogSamples = append(r.res.ControllerLogSamples, p.name+": "+l)
			}
		}
	}
	r.ctls = nil
}

// storeReading is every instance's storeSample at one moment.
type storeReading struct {
	at      time.Time
	samples []storeSample
}

// readStore reads every instance's storeSample; nil if one could not be
// read (the figures are then left out).
func (r *run) readStore(ctx context.Context, load *controllerLoad) *storeReading {
	out := &storeReading{at: time.Now()}
	for i := range load.bases {
		s, err := load.readStoreSample(ctx, i)
		if err != nil {
			r.logf("no database round trips or commits: %v", err)
			return nil
		}
		out.samples = append(out.samples, s)
	}
	return out
}

// countStore sets p's database round trips and commits, every instance's
// series after the phase less before it, over the operations the phase
// completed (warm-up and drain included, as the series span them); the
// share of the phase's time the writers spent applying and committing
// batches (their mean over the instances); and the mean and p99 of the
// two waits for the store (storeWaits).
func (r *run) countStore(ctx context.Context, load *controllerLoad, p *Phase, before *storeReading) {
	if before == nil {
		return
	}
	after := r.readStore(ctx, load)
	if after == nil {
		return
	}
	var sum storeSample
	for i := range before.samples {
		sum = sum.add(after.samples[i], 1).add(before.samples[i], -1)
	}
	commits, busy := sum.batch.count(), sum.batch.sum
	p.DBRoundTrips, p.Commits = int64(sum.trips), int64(commits)
	if submits, receipts := sum.waits[0], sum.waits[1]; submits.count() > 0 && receipts.count() > 0 {
		p.SubmitCommitMS, p.ReceiptCommitMS = round(submits.sum/submits.count()*1000, 2), round(receipts.sum/receipts.count()*1000, 2)
		p.SubmitCommitP99MS, p.ReceiptCommitP99MS = round(submits.quantile(0.99)*1000, 2), round(receipts.quantile(0.99)*1000, 2)
	}
	if p.Completed > 0 {
		p.DBRoundTripsPerOp = round(sum.trips/float64(p.Completed), 2)
		p.CommitsPerOp = round(commits/float64(p.Completed), 3)
	}
	if span := after.at.Sub(before.at).Seconds() * float64(len(before.samples)); span > 0 {
		p.WriterBusy = round(busy/span, 3)
	}
}

func plural(n int, many, one string) string {
	if n == 1 {
		return one
	}
	return many
}

// fleetJournalMiB is devicesim's --journal-compact-mib in a run: a fold
// rewrites every device's snapshot file, all the records of the run so
// far, and took 2.7 to 4 s every 64 MiB (the default), about every 20 s at
// R by the journal's growth (derived); one that fell in a target's half-load
// phase raised its latency for those seconds, the controller's (which
// needs more CPU and its disk) by up to 12 times. A default run wrote
// 575 MiB of journal (7 Dec), so it folds only at the end, when devicesim
// stops, with room for a host twice as fast.
const fleetJournalMiB = 2048

// startFleet starts devicesim with the same N device ids and the plain
// client, and returns once every device is online.
func (r *run) startFleet(ctx context.Context) error {
	cfg := r.cfg
	online := make(chan struct{})
	var once sync.Once
	want := fmt.Sprintf("devicesim: %d devices online", cfg.Devices)
	args := []string{filepath.Join(cfg.Bin, "devicesim"), "run", "--mqtt", r.url, "--devices", fmt.Sprint(cfg.Devices),
		"--state-dir", r.fleetDir, "--journal-compact-mib", fmt.Sprint(fleetJournalMiB), "--topic-root", cfg.TopicRoot,
		"--log-level", "warn"}
	r.logf("starting devicesim with %d devices, their files in %s (%s)", cfg.Devices, r.fleetDir, Storage(r.fleetDir))
	t0 := time.Now()
	var err error
	r.sim, err = startProcess("devicesim", filepath.Join(r.dir, "devicesim.log"), args, func(line string) {
		if strings.Contains(line, want) {
			once.Do(func() { close(online) })
		}
	})
	if err != nil {
		return err
	}
	timeout := time.NewTimer(60*time.Second + time.Duration(cfg.Devices)*20*time.Millisecond)
	defer timeout.Stop()
	select {
	case <-online:
	case <-r.sim.done:
		return r.sim.failure()
	case <-timeout.C:
		return fmt.Errorf("devicesim: not all %d devices online in time:\n%s", cfg.Devices, tail(r.sim.log, 20))
	case <-ctx.Done():
		return ctx.Err()
	}
	r.logf("devicesim: %d devices online after %s", cfg.Devices, time.Since(t0).Round(time.Millisecond))
	r.procs["devicesim"] = r.sim.pid()
	r.cm, err = benchwire.DialCommander(ctx, r.url, cfg.TopicRoot, "bench-"+r.runID)
	return err
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

// buildInfo is the Go version and the commit the bench was built from:
// the build's VCS stamp, or, when it has none (GOFLAGS=-buildvcs=false),
// the work tree's it runs in (gitCommit). A tree with changes to tracked
// files is "+dirty".
func buildInfo() (goVersion, commit string) {
	goVersion = runtime.Version()
	modified := false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if commit == "" {
		commit, modified = gitCommit()
	}
	if commit != "" && modified {
		commit += "+dirty"
	}
	return goVersion, commit
}

// gitCommit is HEAD of the git work tree the bench runs in (its
// repository's root, by its usage) and whether tracked files differ from
// it; "" when git or the tree is missing.
func gitCommit() (commit string, modified bool) {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", false
	}
	status, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), err == nil && len(bytes.TrimSpace(status)) > 0
}
