package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// envPrefix: every flag --some-flag is also read from DEVICESIM_SOME_FLAG.
const envPrefix = "DEVICESIM_"

// newRootCmd builds the command tree, ready to run (cmdline.Setup done).
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "devicesim",
		Short: "Simulated devices for the fleet controller, with fault injection",
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	run, _ := newRunCmd(stderr)
	root.AddCommand(run, newCredsCmd(stdout), newConformCmd(stdout, stderr))
	cmdline.Setup(root, envPrefix)
	return root
}

// faultFlags are the fault flags, each named after its profile key
// (--drop-receipt is "drop_receipt").
var faultFlags = []struct{ name, usage string }{
	{"drop-command", "lose incoming commands before they are recorded"},
	{"drop-receipt", "do not publish receipts (statuses=received+executing+final+...)"},
	{"duplicate-receipt", "publish receipts twice"},
	{"delay-receipt", "publish receipts later (delay=DURATION, default 1s)"},
	{"reorder-receipt", "hold a receipt back until the next one is out (delay=max hold, default 1s)"},
	{"drop-connection", "cut the TCP connection without DISCONNECT (at=POINT or every=DURATION, for=offline time)"},
	{"crash", "crash and restart the device, durable state kept (at=POINT or every=DURATION, for=down time)"},
	{"slow-execution", "make actions take delay=DURATION"},
	{"fail", "run the action and fail it with error=STRING"},
	{"reject", "reject the command with error=STRING before it is accepted"},
	{"ignore-queries", "leave queries unanswered"},
}

// receiptFaults take a companion flag --<name>-status LIST (comma- or
// plus-separated), the same as statuses= in their SPEC.
var receiptFaults = []string{"drop-receipt", "duplicate-receipt", "delay-receipt", "reorder-receipt"}

type runOptions struct {
	mqtt, idPrefix, stateDir, topicRoot, password, faultsFile, logLevel string
	credentials, mqttCA                                                 string
	devices, compactMiB                                                 int
	seed                                                                int64
	keepAlive, maxReconnect, retention, clockSkew                       time.Duration
	legacy, legacyQuery                                                 bool
	specs                                                               map[string]*string
	statuses                                                            map[string]*string
}

// newRunCmd returns the run command and the options its flags fill.
func newRunCmd(stderr io.Writer) (*cobra.Command, *runOptions) {
	o := &runOptions{specs: map[string]*string{}, statuses: map[string]*string{}}
	cmd := &cobra.Command{
		Use:   "run --mqtt URL --devices N [--id-prefix device-] [--state-dir DIR] [fault flags or --faults FILE] [--credentials FILE] [--mqtt-ca FILE]",
		Short: "Run N simulated devices until SIGINT or SIGTERM",
		Long:  runHelp,
		Example: `  devicesim run --mqtt tcp://127.0.0.1:1883 --devices 5 --state-dir ./run/devices

  # faults from flags, repeatable with --seed
  devicesim run --mqtt tcp://127.0.0.1:1883 --devices 20 --state-dir ./run/devices --seed 7 \
    --drop-receipt 0.1 --drop-receipt-status final --crash 'count=1,at=executed,for=2s'

  # a fault profile with per-device overrides; legacy (dedupe:false) devices
  devicesim run --devices 10 --id-prefix pump- --faults faults.json
  devicesim run --devices 3 --legacy --legacy-query

  # the secure broker profile: each device its own account (devicesim creds), over TLS
  devicesim run --mqtt ssl://127.0.0.1:8883 --devices 5 --credentials ./run/creds/credentials.json \
    --mqtt-ca ./run/tls/ca.pem

  # the same flags from the environment
  DEVICESIM_MQTT=tcp://127.0.0.1:1883 DEVICESIM_DEVICES=50 devicesim run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.Flags(), stderr)
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&o.mqtt, "mqtt", "tcp://127.0.0.1:1883", "broker URL")
	f.IntVar(&o.devices, "devices", 1, "number of devices, numbered from 1")
	f.StringVar(&o.idPrefix, "id-prefix", sim.DefaultIDPrefix, "device id prefix")
	f.StringVar(&o.stateDir, "state-dir", "devicesim-state", "durable device state and witness files")
	f.StringVar(&o.topicRoot, "topic-root", wire.DefaultTopicRoot, "MQTT topic root")
	f.StringVar(&o.password, "password", "", "MQTT password of every device (user name = device id)")
	f.StringVar(&o.credentials, "credentials", "", "credentials.json of devicesim creds: each device logs in with its own password")
	f.StringVar(&o.mqttCA, "mqtt-ca", "", "CA certificate (PEM) the broker's TLS certificate must chain to, for ssl:// URLs")
	f.StringVar(&o.faultsFile, "faults", "", "JSON fault profile file")
	f.Int64Var(&o.seed, "seed", 0, "seed of the fault decisions (0: the profile's seed, else a random one, printed)")
	f.DurationVar(&o.keepAlive, "keepalive", sim.DefaultKeepAlive, "MQTT keepalive (the broker fires a silent device's LWT after 1.5x)")
	f.DurationVar(&o.maxReconnect, "max-reconnect-interval", sim.DefaultMaxReconnectInterval, "cap of the reconnect back-off")
	f.DurationVar(&o.retention, "retention", sim.DefaultRetention, "how long past expires_at a command stays in the dedupe record")
	f.IntVar(&o.compactMiB, "journal-compact-mib", device.DefaultCompactAt>>20, "journal size (MiB) past which it is folded into the devices' snapshot files")
	f.Var(cmdline.NewEnum(&o.logLevel, "info", "debug", "info", "warn", "error"), "log-level", "log level")
	for _, ff := range faultFlags {
		o.specs[ff.name] = f.String(ff.name, "", ff.usage+" (SPEC)")
	}
	for _, name := range receiptFaults {
		o.statuses[name] = f.String(name+"-status", "", "statuses --"+name+" applies to, e.g. received,final (same as statuses= in its SPEC)")
	}
	f.DurationVar(&o.clockSkew, "clock-skew", 0, "offset of every device's clock (expiry checks, at fields)")
	f.BoolVar(&o.legacy, "legacy", false, "legacy devices: capabilities dedupe:false, query:false; every delivery executes")
	f.BoolVar(&o.legacyQuery, "legacy-query", false, "with --legacy: the devices still answer queries (query:true)")
	return cmd, o
}

func (o *runOptions) run(ctx context.Context, fs *pflag.FlagSet, stderr io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return cmdline.Usagef("--log-level: %w", err)
	}
	if o.devices < 1 {
		return cmdline.Usagef("--devices %d: at least 1", o.devices)
	}
	if o.compactMiB < 1 {
		return cmdline.Usagef("--journal-compact-mib %d: at least 1", o.compactMiB)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	profile, err := o.profile(fs)
	if err != nil {
		return err
	}
	seed := o.seed
	if seed == 0 {
		seed = profile.Seed
	}
	if seed == 0 {
		seed = rand.Int64N(1<<31) + 1
	}
	if o.credentials != "" && o.password != "" {
		return cmdline.Usagef("--credentials and --password: give one")
	}
	var passwords map[string]string
	if o.credentials != "" {
		accounts, err := creds.Load(o.credentials)
		if err != nil {
			return fmt.Errorf("--credentials: %w", err)
		}
		passwords = creds.Passwords(accounts)
	}
	var tlsConfig *tls.Config
	if o.mqttCA != "" {
		if tlsConfig, err = mqttx.ClientTLS(o.mqttCA); err != nil {
			return fmt.Errorf("--mqtt-ca: %w", err)
		}
	}
	cfg := sim.Config{
		MQTT:                 o.mqtt,
		Passwords:            passwords,
		TLS:                  tlsConfig,
		Devices:              o.devices,
		IDPrefix:             o.idPrefix,
		StateDir:             o.stateDir,
		TopicRoot:            o.topicRoot,
		Password:             o.password,
		Faults:               profile,
		Seed:                 seed,
		KeepAlive:            o.keepAlive,
		MaxReconnectInterval: o.maxReconnect,
		Retention:            o.retention,
		JournalCompactAt:     int64(o.compactMiB) << 20,
		Logger:               logger,
	}
	// The signal ends the run below, which stops the fleet itself.
	fleet, err := sim.Start(context.WithoutCancel(ctx), cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "devicesim: starting %d devices (%s1..%s%d) on %s, seed %d, state in %s\n",
		o.devices, o.idPrefix, o.idPrefix, o.devices, o.mqtt, seed, o.stateDir)
	go func() {
		if fleet.WaitOnline(ctx) == nil {
			fmt.Fprintf(stderr, "devicesim: %d devices online\n", o.devices)
		}
	}()
	<-ctx.Done()
	fmt.Fprintln(stderr, "devicesim: shutting down")
	fleet.Stop()
	s := fleet.Stats()
	fmt.Fprintf(stderr, "devicesim: stopped: commands seen %d, executions %d, receipts published %d (final %d), duplicates suppressed %d, crashes %d, connection drops %d\n",
		s.CommandsSeen, s.Executions, s.ReceiptsPublished, s.FinalReceiptsPublished, s.DuplicatesSuppressed, s.Crashes, s.ConnectionDrops)
	return nil
}

// profile reads --faults and lays the fault flags over it: a flag replaces
// that fault for every device, overrides included. A fault flag's bad value
// is a usage error; a profile file that cannot be read or parsed is not.
func (o *runOptions) profile(fs *pflag.FlagSet) (sim.Profile, error) {
	var p sim.Profile
	if o.faultsFile != "" {
		var err error
		if p, err = sim.LoadProfile(o.faultsFile); err != nil {
			return sim.Profile{}, err
		}
	}
	patch := map[string]json.RawMessage{}
	for _, name := range receiptFaults {
		if fs.Changed(name+"-status") && !fs.Changed(name) {
			return sim.Profile{}, cmdline.Usagef("--%s-status needs --%s", name, name)
		}
	}
	for _, ff := range faultFlags {
		if !fs.Changed(ff.name) {
			continue
		}
		obj, err := parseSpec(*o.specs[ff.name])
		if err != nil {
			return sim.Profile{}, cmdline.Usagef("--%s: %w", ff.name, err)
		}
		if st, ok := o.statuses[ff.name]; ok && fs.Changed(ff.name+"-status") {
			obj["statuses"] = strings.FieldsFunc(*st, func(r rune) bool { return r == ',' || r == '+' })
		}
		patch[strings.ReplaceAll(ff.name, "-", "_")], _ = json.Marshal(obj)
	}
	if fs.Changed("clock-skew") {
		patch["clock_skew"], _ = json.Marshal(o.clockSkew.String())
	}
	if fs.Changed("legacy") || fs.Changed("legacy-query") {
		patch["legacy"], _ = json.Marshal(sim.Legacy{Enabled: o.legacy, Dedupe: false, Query: o.legacyQuery})
	}
	if len(patch) == 0 {
		return p, nil
	}
	b, _ := json.Marshal(patch)
	var err error
	if p.Defaults, err = p.Defaults.Merge(b); err != nil {
		return sim.Profile{}, cmdline.Usagef("fault flags: %w", err)
	}
	for i := range p.Devices {
		if p.Devices[i].Faults, err = p.Devices[i].Faults.Merge(b); err != nil {
			return sim.Profile{}, cmdline.Usagef("fault flags: %w", err)
		}
	}
	return p, nil
}

// parseSpec turns a fault flag's SPEC into its JSON profile object:
// comma-separated key=value pairs (p, count, skip, statuses, actions, delay,
// at, every, for, error); a bare number is p; lists are joined with "+".
func parseSpec(spec string) (map[string]any, error) {
	obj := map[string]any{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			p, err := strconv.ParseFloat(part, 64)
			if err != nil {
				return nil, fmt.Errorf("%q: want key=value or a probability", part)
			}
			obj["p"] = p
			continue
		}
		switch k {
		case "p":
			p, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("p=%q: %w", v, err)
			}
			obj[k] = p
		case "count", "skip":
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("%s=%q: %w", k, v, err)
			}
			obj[k] = n
		case "statuses", "actions":
			obj[k] = strings.Split(v, "+")
		default:
			obj[k] = v
		}
	}
	return obj, nil
}

const runHelp = `Run N simulated devices, numbered from 1 (--id-prefix device- --devices 3
gives device-1, device-2, device-3), one MQTT connection each whose client id
and user name are the device id. Against the secure broker profile each
device logs in with its own password (--credentials, the credentials.json
that "devicesim creds" writes) over TLS (an ssl:// URL, --mqtt-ca). The devices run until SIGINT or SIGTERM, then
shut down cleanly: each publishes its retained offline presence and
DISCONNECTs (a second signal ends the process at once). Once every device is
connected, "devicesim: N devices online" is written to stderr; on exit, a
summary of the counters.

Every flag is also read from an environment variable DEVICESIM_<FLAG>, dashes
as underscores, named in its help: DEVICESIM_MQTT, DEVICESIM_DEVICES,
DEVICESIM_DROP_RECEIPT... A flag on the command line wins. Exit status: 0
after a signal, 1 for a failed run, 2 for a wrong command line.

A device conforms to the contract: it keeps a durable record per command_id
and operation_id (a repeat, or a later command of an operation that already
ran, gets the latest receipt of the one that ran and never runs again), checks
expiry after that, answers queries, and publishes a retained birth with a
growing session number (and an LWT with the same number). Supported actions:
restart, set-config (params merged into the device's config).

State (--state-dir): every change goes through one journal per process
(devices/<pid>-<nanos>.journal, one fsync for many devices' changes), folded
into devices/<id>.json per device (written atomically) at a clean stop, past
64 MiB, and at the next start after a kill (a killed process's journal still
locked while it exits is waited for, up to 5s; a start fails rather than skip
it); and the witness files
executions.jsonl (one line per real execution) and receipts.jsonl (one line
per final receipt the broker acknowledged). A device acknowledges or reports
nothing before it is durable.

Faults: --faults FILE, a JSON profile, fleet-wide defaults plus per-device
overrides (the first override whose match, an id or a glob, fits the device;
its keys replace those of the defaults):

  {"seed": 7,
   "defaults": {"drop_receipt": {"p": 0.1, "statuses": ["final"]},
                "clock_skew": "-2s"},
   "devices": [{"match": "device-1?", "faults": {"crash": {"count": 1, "at": "executed", "for": "1s"}}},
               {"match": "device-3",  "faults": {"legacy": true}}]}

Fault keys, each a trigger {"p": probability, "count": at most N times,
"skip": first N opportunities not} plus its own parameters:
  drop_command       lose an incoming command before it is recorded
  drop_receipt       do not publish a receipt      statuses: received, executing,
  duplicate_receipt  publish a receipt twice         succeeded, failed, rejected,
  delay_receipt      publish it delay later          unknown, final, query
  reorder_receipt    publish it after the next one   (empty: every receipt)
  drop_connection    cut the TCP connection, no DISCONNECT (the broker fires the
                     LWT); back after for, with a new session
  crash              die (in-memory state lost), boot again after for
                     (both: at one of command, received, executing, executed,
                     final, or every DURATION)
  slow_execution     the action takes delay          actions: limit to these
  fail               the action runs and fails with error
  reject             rejected with error, nothing runs
  ignore_queries     a query goes unanswered
  clock_skew         "DURATION" added to the device's clock
  legacy             true, or {"dedupe": false, "query": true}
With p 0 and a count, the next count opportunities fire. --seed (or the
profile's seed) makes the decisions repeat.

Fault flags set one fault for every device, replacing it in the profile. SPEC
is comma-separated key=value (a bare number is p; lists joined with +):
  --drop-receipt 'p=0.2,statuses=final'   --crash 'count=1,at=executed,for=2s'
  --drop-connection 'p=0.01,every=1s,for=5s'  --slow-execution 'p=1,delay=3s'
  --fail 'count=2,error=disk_full'        --delay-receipt '0.5,delay=2s'
The receipt faults also take --<fault>-status LIST, the same as statuses=:
  --drop-receipt 0.15 --drop-receipt-status succeeded`
