// Package demo runs `make demo`: a broker, a controller and a simulated
// fleet on free loopback ports, a batch of operations through faults, and a
// summary a person can read. The broker runs the secure profile
// (mosquitto/secure.conf.tmpl): every device and the controller log in with
// an account of their own (package creds, as `devicesim creds` writes
// them), over TLS with a CA and certificate made for the run (package
// tlsgen). It drives the system through the binaries and
// the HTTP API, and reads the outcome from the devices' witness files and
// the controller's database (read-only, through store.Audit).
//
// Everything a run creates (the broker's, the controller's and the devices'
// files and logs) lives in one directory, under $TMPDIR unless the caller
// names one; a directory Run made itself is removed when Run returns, after
// it stopped every process it started, on success, failure and cancellation
// alike (cmd/demo cancels on SIGINT, SIGTERM and SIGHUP), and also when its
// output stops taking writes (`make demo | tee demo.log` whose tee is gone).
// No process of the run outlives the demo's process, however that ends:
// the controller and the devices get SIGKILL when it dies (Pdeathsig), and
// a watchdog stops the broker (which mosquitto/broker.sh leaves without a
// parent) and removes the run's directory once the demo is gone, even
// after a SIGKILL (see startWatchdog).
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/tlsgen"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// Config configures a demo run.
type Config struct {
	Bin string // directory with controller and devicesim
	// Dir is the directory for the run's files, created if missing and kept
	// (Run prints where it is). "" makes a fresh directory under $TMPDIR that
	// Run removes when it returns.
	Dir        string
	Devices    int
	Operations int
	Out        io.Writer
	// Linger keeps everything running after the walkthrough, the dashboard
	// live, until ctx is done (Ctrl-C), which then ends the run cleanly.
	Linger bool
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// ownGroup puts a child in a process group of its own, so that a Ctrl-C at
// the terminal reaches only the demo, which then stops its children in
// order (the controller and the devices before the broker they need to shut
// down cleanly). In the demo's group, Mosquitto would die first and the
// others would wait for it until their stop times out. The child gets
// SIGKILL when the demo dies without stopping it (Pdeathsig: kill -9 of
// the demo); the demo starts no goroutine locked to a thread, whose end
// would count as the parent's.
func ownGroup(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// watchdogScript waits for EOF on its stdin, a pipe only the demo holds
// open: when the demo closes it or dies, however (SIGKILL too). Then it
// stops the broker of the run's directory $2 (mosquitto/broker.sh $1 stop:
// the broker is no child of the demo's, so Pdeathsig cannot reach it) and,
// unless $3 is "keep", removes the directory. Once the demo has cleaned up
// it finds nothing to do. It ignores the signals a terminal sends, as its
// work is to outlive the demo.
const watchdogScript = `trap '' INT TERM HUP PIPE
read -r _
[ -f "$2/broker/mosquitto.pid" ] && "$1" stop "$2/broker"
[ "$3" = keep ] && exit 0
rm -rf "$2" 2>/dev/null || { sleep 1; rm -rf "$2"; }`

// watchdog is the shell running watchdogScript.
type watchdog struct {
	cmd  *exec.Cmd
	pipe *os.File // the write end of its stdin
}

// startWatchdog starts the watchdog of dir, in a process group of its own
// (a Ctrl-C or a kill of the demo's group does not end it) and without
// Pdeathsig. After a SIGKILL of the demo it outlives the demo by as long as
// stopping the broker and removing dir take (at most about 6 s).
func startWatchdog(dir string, keep bool) (*watchdog, error) {
	// Absolute paths: the watchdog runs in / (a relative --dir or TMPDIR
	// would mean another place there).
	broker, err := filepath.Abs(brokerScript)
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	mode := "remove"
	if keep {
		mode = "keep"
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog pipe: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "demo-watchdog", broker, dir, mode)
	cmd.Stdin, cmd.Dir = r, "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("start the watchdog: %w", err)
	}
	return &watchdog{cmd: cmd, pipe: w}, nil
}

// close lets the watchdog do its work and waits for it to end.
func (wd *watchdog) close() error {
	wd.pipe.Close()
	if err := wd.cmd.Wait(); err != nil {
		return fmt.Errorf("watchdog: %w", err)
	}
	return nil
}

// brokerScript starts and stops Mosquitto (relative to the repository's
// root, where the demo runs).
const brokerScript = "mosquitto/broker.sh"

// output passes the run's output on until a write fails (a closed pipe:
// the demo's stdout is `| tee` and tee is gone); then it ends the run
// (cancel) and drops whatever else the run prints. The demo's callers
// see no error from it: the run stops at its next wait instead.
type output struct {
	w      io.Writer
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	err    error
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		if _, err := o.w.Write(p); err != nil {
			o.err = fmt.Errorf("write the output: %w", err)
			o.cancel(o.err)
		}
	}
	return len(p), nil
}

func (o *output) failed() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

func start(name, logFile string, args []string, env ...string) (*proc, error) {
	log, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := ownGroup(exec.Command(args[0], args[1:]...))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	return p, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitFor polls cond until it holds, the deadline passes or ctx is done.
func waitFor(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
	}
	return nil
}

// sleep waits d, or less if ctx is done first (then it returns ctx's error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func fileContains(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

// Run runs the demo and returns an error if any invariant it checks fails,
// or ctx's error if ctx is done first, or the error of a write to cfg.Out
// if that stopped the run (the run stops at the first failed write). Before it returns it stops every
// process it started and, unless cfg.Dir names the directory to keep,
// removes every file it made.
func Run(ctx context.Context, cfg Config) (err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	outw := &output{w: cfg.Out, cancel: cancel}
	out := io.Writer(outw)
	// When a failed output is why the run stopped, the error says so, in
	// place of the cancellation it caused; not when the run was stopping
	// anyway (Ctrl-C while it lingers, and tee gone with it).
	defer func() {
		if werr := outw.failed(); werr != nil && context.Cause(ctx) == werr {
			if err == nil || errors.Is(err, context.Canceled) {
				err = werr
			} else {
				err = errors.Join(err, werr)
			}
		}
	}()
	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	keep := cfg.Dir != ""
	if keep {
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return err
		}
	} else if cfg.Dir, err = os.MkdirTemp("", "fleetctl-demo-"); err != nil {
		return err
	}
	wd, err := startWatchdog(cfg.Dir, keep)
	if err != nil {
		if !keep {
			os.RemoveAll(cfg.Dir)
		}
		return err
	}
	// Deferred first, so it runs last: after the directory is removed.
	defer func() {
		if werr := wd.close(); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	if !keep {
		// Deferred before the processes start, so it runs after every
		// one is stopped.
		defer func() {
			if rerr := os.RemoveAll(cfg.Dir); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove the run's files: %w", rerr))
			}
		}()
	}
	// where names a file's place only when the run's files are kept.
	where := func(format string, args ...any) string {
		if !keep {
			return ""
		}
		return fmt.Sprintf(format, args...)
	}
	brokerPort, err := freePort()
	if err != nil {
		return err
	}
	httpPort, err := freePort()
	if err != nil {
		return err
	}
	mqttURL := fmt.Sprintf("ssl://127.0.0.1:%d", brokerPort)
	apiURL := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	stateDir := filepath.Join(cfg.Dir, "devices")
	db := filepath.Join(cfg.Dir, "controller.db")

	// The fleet's accounts, as `devicesim creds --devices N --controllers
	// demo-1` and `devicesim creds --devices 1 --id-prefix device-100`
	// would write them, and a CA and broker certificate for this run.
	credsDir, tlsDir := filepath.Join(cfg.Dir, "creds"), filepath.Join(cfg.Dir, "tls")
	ids := []string{"device-1001"}
	for i := 1; i <= cfg.Devices; i++ {
		ids = append(ids, fmt.Sprintf("device-%d", i))
	}
	if _, err := creds.Write(creds.Options{Dir: credsDir, Devices: ids, Controllers: []string{demoInstance}}); err != nil {
		return fmt.Errorf("broker accounts: %w", err)
	}
	ca, err := tlsgen.Write(tlsDir, time.Hour)
	if err != nil {
		return fmt.Errorf("broker certificate: %w", err)
	}
	step("broker accounts for %d devices and the controller %s (devicesim creds), a CA and a certificate for 127.0.0.1 made for this run%s",
		len(ids), creds.ControllerUser(demoInstance), where(" (in %s and %s)", credsDir, tlsDir))

	step("starting Mosquitto on 127.0.0.1:%d, secure profile: TLS, one account per client, an ACL per device%s",
		brokerPort, where(" (files in %s)", cfg.Dir))
	brokerDir := filepath.Join(cfg.Dir, "broker")
	// Stopped even when the start fails half way (the broker may be up
	// without its port); stop is a no-op when nothing started.
	defer ownGroup(exec.Command(brokerScript, "stop", brokerDir)).Run()
	if b, err := ownGroup(exec.Command(brokerScript, "start-secure", fmt.Sprint(brokerPort), brokerDir, credsDir, tlsDir)).CombinedOutput(); err != nil {
		return fmt.Errorf("start broker: %v\n%s", err, b)
	}
	login := []string{"--credentials", filepath.Join(credsDir, creds.CredentialsFile), "--mqtt-ca", ca.CA}

	step("starting %d simulated devices (faults: 15%% of final receipts dropped, 10%% of receipts duplicated, 5%% of commands dropped)", cfg.Devices)
	simLog := filepath.Join(cfg.Dir, "devicesim.log")
	fleet, err := start("devicesim", simLog, append([]string{filepath.Join(cfg.Bin, "devicesim"), "run",
		"--mqtt", mqttURL, "--devices", fmt.Sprint(cfg.Devices), "--state-dir", stateDir, "--seed", "7",
		"--drop-receipt", "0.15", "--drop-receipt-status", "succeeded",
		"--duplicate-receipt", "0.10", "--drop-command", "0.05"}, login...))
	if err != nil {
		return err
	}
	defer fleet.stop()
	if err := waitFor(ctx, "devices online", 30*time.Second, func() bool { return fileContains(simLog, "devices online") }); err != nil {
		return err
	}

	// device-1001 of the walkthrough: "device-100" and the number 1.
	sim1001, err := start("devicesim-1001", filepath.Join(cfg.Dir, "devicesim-1001.log"), append([]string{filepath.Join(cfg.Bin, "devicesim"), "run",
		"--mqtt", mqttURL, "--devices", "1", "--id-prefix", "device-100", "--state-dir", filepath.Join(cfg.Dir, "devices-1001")}, login...))
	if err != nil {
		return err
	}
	defer sim1001.stop()

	step("starting the controller (API %s%s, tokens for agent, alice and admin)", apiURL, where(", database %s", db))
	tokens := filepath.Join(cfg.Dir, "tokens.json")
	if err := os.WriteFile(tokens, []byte(demoTokens), 0o600); err != nil {
		return err
	}
	ctlLog := filepath.Join(cfg.Dir, "controller.log")
	ctl, err := start("controller", ctlLog, []string{filepath.Join(cfg.Bin, "controller"), "serve",
		"--db", db, "--mqtt", mqttURL, "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--tokens", tokens,
		"--instance-id", demoInstance, "--ack-timeout", "1s", "--sweep-interval", "200ms",
		"--mqtt-password-file", creds.PasswordFile(credsDir, demoInstance), "--mqtt-ca", ca.CA})
	if err != nil {
		return err
	}
	defer ctl.stop()
	if err := waitFor(ctx, "controller healthy", 20*time.Second, func() bool {
		resp, err := http.Get(apiURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}); err != nil {
		return err
	}
	if err := grantAgent(ctx, apiURL); err != nil {
		return err
	}
	step("dashboard: %s/ui/ (sign in with the token demo-alice, who approves; demo-agent and demo-admin work too)", apiURL)
	c := client.New(apiURL, "demo-agent")

	res, err := runBatch(ctx, c, cfg, out)
	if err != nil {
		return err
	}
	if err := summary(ctx, c, cfg, db, stateDir, res, out); err != nil {
		return err
	}
	if err := waitFor(ctx, "device-1001 online", 30*time.Second, func() bool {
		d, err := c.Device(ctx, "device-1001")
		return err == nil && d.Online
	}); err != nil {
		return err
	}
	if err := walkthrough(ctx, apiURL, out); err != nil {
		return fmt.Errorf("walkthrough: %w", err)
	}
	if cfg.Linger {
		fmt.Fprintf(out, "\n==> the broker, the fleet and the controller stay up: the dashboard is live at %s/ui/ (token demo-alice)\n", apiURL)
		fmt.Fprintf(out, "    try: %s op submit --server %s --token demo-agent --task try-1 --step s --target device-3 --business-version v1 --action set-config --params '{\"k\":1}' --wait 30s\n",
			filepath.Join(cfg.Bin, "controller"), apiURL)
		fmt.Fprintln(out, "    press Ctrl-C to stop (DEMO_EXIT=1 ends the demo here, for scripts)")
		<-ctx.Done()
		fmt.Fprintln(out)
	}
	if keep {
		fmt.Fprintf(out, "\n==> done; logs and the database are in %s\n", cfg.Dir)
	} else {
		fmt.Fprintln(out, "\n==> done; stopping everything and removing the run's files")
	}
	return nil
}

// demoInstance is the controller's instance id (its broker account is
// controller-demo-1).
const demoInstance = "demo-1"

type batchResult struct {
	ids              []string
	created, retried int64
	reused           int64
	elapsed          time.Duration
}

// runBatch submits the operations with 8 callers, each retrying its
// submission once (as a caller that lost the response would), and a few
// submissions that reuse a key with other params.
func runBatch(ctx context.Context, c *client.Client, cfg Config, out io.Writer) (batchResult, error) {
	fmt.Fprintf(out, "==> submitting %d operations (each POSTed twice, as a caller retrying after a lost response)\n", cfg.Operations)
	var res batchResult
	res.ids = make([]string, cfg.Operations)
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r := apiwire.SubmitRequest{TaskID: fmt.Sprintf("demo-%03d", i), Step: "restart", Target: fmt.Sprintf("device-%d", i%cfg.Devices+1),
					BusinessVersion: "v1", Action: "restart", Params: []byte(`{"reason":"demo"}`)}
				if i%4 == 1 {
					r.Step, r.Action, r.Params = "set-config", "set-config", []byte(fmt.Sprintf(`{"interval_s":%d}`, 10+i))
				}
				op, status, err := c.Submit(ctx, r, "")
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				if status == 201 {
					atomic.AddInt64(&res.created, 1)
				}
				res.ids[i] = op.OperationID
				if _, status, err := c.Submit(ctx, r, ""); err == nil && status == 200 {
					atomic.AddInt64(&res.retried, 1)
				}
				if i%20 == 0 { // the same key, other params: refused, changes nothing
					r.Params = []byte(`{"reason":"something else"}`)
					if _, _, err := c.Submit(ctx, r, ""); client.Code(err) == "idempotency_key_reused" {
						atomic.AddInt64(&res.reused, 1)
					}
				}
			}
		}()
	}
	for i := 0; i < cfg.Operations; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok && err != nil {
		return res, fmt.Errorf("submit: %w", err)
	}

	// Progress until every operation is final.
	lastFinal := -1
	deadline := time.Now().Add(3 * time.Minute)
	for {
		final := 0
		for _, id := range res.ids {
			op, err := c.Operation(ctx, id, 0)
			if err == nil && op.Status != "started" {
				final++
			}
		}
		if final != lastFinal {
			bar(out, final, len(res.ids))
			lastFinal = final
		}
		if final == len(res.ids) {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(out)
			return res, fmt.Errorf("%d operations still started after 3 minutes", len(res.ids)-final)
		}
		if err := sleep(ctx, 300*time.Millisecond); err != nil {
			fmt.Fprintln(out)
			return res, err
		}
	}
	fmt.Fprintln(out)
	res.elapsed = time.Since(start)
	return res, nil
}

func bar(out io.Writer, done, total int) {
	const width = 40
	filled := done * width / max(total, 1)
	fmt.Fprintf(out, "\r    [%s%s] %d/%d final", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total)
}

func summary(ctx context.Context, c *client.Client, cfg Config, db, stateDir string, res batchResult, out io.Writer) error {
	a, err := backend.OpenAudit(ctx, db)
	if err != nil {
		return err
	}
	defer a.Close()
	ops, err := countMap(a.OperationsByStatus(ctx))
	if err != nil {
		return err
	}
	cmds, err := countMap(a.CommandsByStatus(ctx))
	if err != nil {
		return err
	}
	effects, err := countMap(a.ReceiptsByEffect(ctx))
	if err != nil {
		return err
	}
	commands, err := a.Commands(ctx)
	if err != nil {
		return err
	}
	var publishes, queries, resent int
	for _, cmd := range commands {
		publishes += cmd.Attempt
		queries += cmd.Queries
		if cmd.Attempt > 1 {
			resent++
		}
	}
	execs, err := witness.ReadExecutions(stateDir)
	if err != nil {
		return err
	}
	perOp := map[string]int{}
	for _, e := range execs {
		perOp[e.OperationID]++
	}
	dupExec := 0
	for _, n := range perOp {
		if n > 1 {
			dupExec++
		}
	}
	fmt.Fprintf(out, "\n==> summary (%d operations over %d devices in %s)\n", len(res.ids), cfg.Devices, res.elapsed.Round(time.Millisecond))
	fmt.Fprintf(out, "    operations by state:  %s\n", fmtCounts(ops))
	fmt.Fprintf(out, "    commands by state:    %s\n", fmtCounts(cmds))
	fmt.Fprintf(out, "    receipts by effect:   %s\n", fmtCounts(effects))
	fmt.Fprintf(out, "    publishes:            %d commands (%d commands re-sent with the same command_id), %d queries\n",
		publishes, resent, queries)
	fmt.Fprintf(out, "    executions on devices: %d for %d operations; operations executed twice: %d\n", len(execs), len(perOp), dupExec)
	fmt.Fprintf(out, "    duplicates prevented: %d retried POSTs answered 200 with the stored record, %d key reuses refused (422),\n",
		res.retried, res.reused)
	fmt.Fprintf(out, "                          %d duplicate receipts ignored, %d re-sends of a command_id (after a lost command or receipt)\n",
		effects[store.EffectDuplicate], max(publishes-len(res.ids), 0))
	var problems []string
	if n := ops[string(fsm.OpStarted)]; n > 0 {
		problems = append(problems, fmt.Sprintf("%d operations not final", n))
	}
	if dupExec > 0 {
		problems = append(problems, fmt.Sprintf("%d operations executed twice", dupExec))
	}
	if int(res.created) != len(res.ids) {
		problems = append(problems, fmt.Sprintf("%d created of %d", res.created, len(res.ids)))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Fprintln(out, "    verdict: every operation final, none executed twice")
	return nil
}

func countMap(counts []store.AuditCount, err error) (map[string]int, error) {
	if err != nil {
		return nil, err
	}
	m := make(map[string]int, len(counts))
	for _, c := range counts {
		m[c.Name] = c.N
	}
	return m, nil
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
