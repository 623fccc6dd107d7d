// Package cli is the `controller` command tree: `serve` (the daemon), the
// client subcommands that talk to a running daemon's HTTP API, so an
// operator never needs curl, and `verify` and `report`, which read a run's
// database. Every flag also reads an environment variable, CONTROLLER_ and
// the flag's name in upper case with '-' as '_' (--ack-timeout ←
// CONTROLLER_ACK_TIMEOUT), and its help names it; errors and exit statuses
// follow package cmdline (2 for a usage error, 1 for any other).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/controller"
	"github.com/fleetctl/fleetctl/internal/report"
	"github.com/fleetctl/fleetctl/internal/verify"
)

// EnvPrefix starts the variable of every flag: --ack-timeout ←
// CONTROLLER_ACK_TIMEOUT.
const EnvPrefix = "CONTROLLER_"

// NewRoot builds the command tree, ready to run (cmdline.Setup done).
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "controller",
		Short: "Device-command controller: idempotent operations on a fleet over MQTT",
		Long: `Device-command controller: idempotent operations on a fleet over MQTT.

"controller serve" runs the daemon; op, cmd, device, task, grant and rollout are its
API client (--server, --token, --json); "controller mcp" serves its tools to
an AI agent host over stdio; verify and report read a run's database. Every flag also reads an environment variable, named in its help
(--ack-timeout ← CONTROLLER_ACK_TIMEOUT). Exit status: 0 done, 1 failed,
2 the command line was wrong (nothing ran).`,
	}
	root.AddCommand(serveCmd(), opCmd(), cmdCmd(), deviceCmd(), taskCmd(), grantCmd(), rolloutCmd(), mcpCmd(), verifyCmd(), reportCmd())
	cmdline.Setup(root, EnvPrefix)
	return root
}

// Main runs the tree with args and returns the process exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	return cmdline.Exit(stderr, explain(cmdline.Execute(context.Background(), NewRoot(), args, stdout, stderr)))
}

// explain adds the advice a person needs to errors that carry none.
func explain(err error) error {
	var unreachable *client.UnreachableError
	if errors.As(err, &unreachable) {
		return cmdline.WithHint(err, "Check --server (env "+cmdline.EnvName(EnvPrefix, "server")+
			"), or start the daemon there: controller serve --db FILE --mqtt URL --http ADDR")
	}
	return err
}

// serveGCPercent is the daemon's GOGC unless the environment sets one. Its
// live heap is small (about 6 MB at saturation in make bench, beside
// SQLite's page cache, which Go's collector does not see) and it allocates
// fast (tens of KB per operation), so at Go's default of 100 it collected
// 10 to 20 times a second; at 200 the heap may grow to three times the live
// one and the collector runs half as often. 400 (a quarter as often, about
// 6 % less CPU per operation in make bench) let the garbage of hostile
// requests (bodies up to 1 MiB each) grow the RSS beyond
// TestHostileInputsChangeNothing's 50 MB in two runs of five (68.8 MB in
// one; 30.6 to 39.5 MB in the three that passed); at 200 it grew by 6 to
// 16 MB in twelve runs, at 100 by 6.5 to 8.5 MB in four.
const serveGCPercent = 200

// tuneGC sets serveGCPercent unless the environment (getenv) names a GOGC.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(serveGCPercent)
	}
}

func serveCmd() *cobra.Command {
	cfg := controller.DefaultConfig()
	var logLevel string
	var pprofAddr loopbackAddr
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the controller daemon (HTTP API, MQTT dispatcher, receipt ingestion, sweeper)",
		Example: `  # a local daemon on the loopback broker, the API on loopback
  controller serve --db ./run/controller.db --mqtt tcp://127.0.0.1:1883 --http 127.0.0.1:8080 --instance-id c1

  # with API tokens (required off loopback), per-action policies and a slower device link
  controller serve --db /var/lib/fleet/controller.db --mqtt tcp://127.0.0.1:1883 --http 0.0.0.0:8080 \
    --tokens tokens.json --policy policy.json --ack-timeout 10s --command-ttl 30m --offline fail

  # the secure broker profile: an account, TLS (devicesim creds --controllers c1 --out ./run/creds)
  controller serve --db ./run/controller.db --mqtt ssl://127.0.0.1:8883 --http 127.0.0.1:8080 --instance-id c1 \
    --mqtt-password-file ./run/creds/controller-c1.password --mqtt-ca ./run/tls/ca.pem

  # the same flags from the environment
  CONTROLLER_DB=./run/controller.db CONTROLLER_ACK_TIMEOUT=2s controller serve`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.InstanceID == "" {
				host, _ := os.Hostname()
				cfg.InstanceID = sanitize(host)
			}
			// The flags' values, checked before anything is opened: a
			// wrong one is a usage error.
			if err := cfg.Validate(); err != nil {
				return cmdline.Usage(err)
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return cmdline.Usagef("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			if pprofAddr != "" {
				_, stopPprof, err := startPprof(string(pprofAddr), log)
				if err != nil {
					return err
				}
				defer stopPprof()
			}
			tuneGC(os.Getenv)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			c, err := controller.New(ctx, cfg, log, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return c.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DB, "db", cfg.DB, "SQLite database file (WAL)")
	f.StringVar(&cfg.MQTT, "mqtt", cfg.MQTT, "MQTT broker URL")
	f.StringVar(&cfg.HTTP, "http", cfg.HTTP, "HTTP API listen address (off loopback only with --tokens)")
	f.StringVar(&cfg.TopicRoot, "topic-root", cfg.TopicRoot, "MQTT topic root")
	f.DurationVar(&cfg.AckTimeout, "ack-timeout", cfg.AckTimeout, "ask the device after this long with no final receipt")
	f.DurationVar(&cfg.CommandTTL, "command-ttl", cfg.CommandTTL, "a command's expires_at is its issue time plus this")
	f.IntVar(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts, "publishes (and queries) of one command at most")
	f.Var(cmdline.NewEnum(&cfg.Offline, cfg.Offline, "wait", "fail"), "offline", "offline policy: wait for the device until expires_at, or fail at once")
	f.StringVar(&cfg.PolicyFile, "policy", cfg.PolicyFile, "per-action policy file (JSON)")
	f.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "operation lease time to live (at least 1s)")
	f.StringVar(&cfg.InstanceID, "instance-id", cfg.InstanceID, "this instance's id (default: the host name)")
	f.StringVar(&cfg.Tokens, "tokens", cfg.Tokens, "API tokens file (JSON); without it every caller is anonymous with every role")
	f.BoolVar(&cfg.FourEyes, "four-eyes", cfg.FourEyes, "nobody approves a plan version they wrote")
	f.IntVar(&cfg.MaxCommandBytes, "max-command-bytes", cfg.MaxCommandBytes, "refuse (413) a submit whose encoded command would be larger")
	f.DurationVar(&cfg.SweepInterval, "sweep-interval", cfg.SweepInterval, "how often the sweeper looks for due commands")
	f.StringVar(&cfg.MQTTUser, "mqtt-user", cfg.MQTTUser, "MQTT user name (default with --mqtt-password-file: controller-{instance-id})")
	f.StringVar(&cfg.MQTTPasswordFile, "mqtt-password-file", cfg.MQTTPasswordFile, "file holding the MQTT password (devicesim creds writes controller-ID.password)")
	f.StringVar(&cfg.MQTTCA, "mqtt-ca", cfg.MQTTCA, "CA certificate (PEM) the broker's TLS certificate must chain to, for ssl:// URLs")
	f.Float64Var(&cfg.ReceiptRate, "receipt-rate", cfg.ReceiptRate, "receipts a second per device (burst twice that); the excess is dropped and counted; 0: no limit")
	f.StringSliceVar(&cfg.HTTPHosts, "http-host", cfg.HTTPHosts, "more names the API answers to besides its listen address (repeat or comma-separate; name: any port, name:port: that one)")
	f.Var(cmdline.NewEnum(&logLevel, "info", "debug", "info", "warn", "error"), "log-level", "log level")
	f.Var(&pprofAddr, "pprof", "serve Go's profiler (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6061 (default: off)")
	return cmd
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "controller"
	}
	return b.String()
}

func verifyCmd() *cobra.Command {
	var cfg verify.Config
	cmd := &cobra.Command{
		Use:   "verify --db FILE [--state-dir DIR]",
		Short: "Check the contract's invariants on a run (the eighth with rollouts, the tenth always): the database and the devices' witness files",
		Long: `Reads the controller's database (read-only) and, with --state-dir, the simulator's
executions.jsonl and receipts.jsonl, and prints one verdict line per invariant
with its numbers. Exits 1 if any invariant fails.`,
		Example: `  controller verify --db ./run/controller.db --state-dir ./run/devices`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := verify.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if !verify.Print(cmd.OutOrStdout(), vs) {
				return fmt.Errorf("invariants violated")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.DB, "db", "controller.db", "the controller's SQLite database")
	cmd.Flags().StringVar(&cfg.StateDir, "state-dir", "", "the simulator's state directory (the witnesses)")
	cmd.Flags().DurationVar(&cfg.Slack, "slack", time.Minute, "sweep interval + lease ttl allowed past expires_at")
	return cmd
}

func reportCmd() *cobra.Command {
	var cfg report.Config
	var out string
	cmd := &cobra.Command{
		Use:     "report --db FILE [--state-dir DIR] --out report.html",
		Short:   "Write one self-contained HTML report of a run: verdicts, counts, a timeline per command of interest",
		Example: `  controller report --db ./run/controller.db --state-dir ./run/devices --out report.html --title "game day 3"`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			if err := report.Write(cmd.Context(), f, cfg); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
	}
	cmd.Flags().StringVar(&cfg.DB, "db", "controller.db", "the controller's SQLite database")
	cmd.Flags().StringVar(&cfg.StateDir, "state-dir", "", "the simulator's state directory (the witnesses)")
	cmd.Flags().StringVar(&cfg.Title, "title", "", "the report's title")
	cmd.Flags().IntVar(&cfg.Max, "commands", 12, "how many commands to draw, most eventful first")
	cmd.Flags().StringVar(&out, "out", "report.html", "the HTML file to write")
	return cmd
}
