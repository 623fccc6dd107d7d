// Package cli is the `controller` command tree: `serve` (the daemon) and the
// client subcommands that talk to a running daemon's HTTP API, so an
// operator never needs curl. Every flag also reads an environment variable:
// CONTROLLER_ and the flag's name in upper case with '-' as '_'
// (--ack-timeout ← CONTROLLER_ACK_TIMEOUT).
package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/controller"
	"github.com/fleetctl/fleetctl/internal/report"
	"github.com/fleetctl/fleetctl/internal/verify"
)

// clientFlags are shared by the client subcommands.
type clientFlags struct {
	server string
	token  string
	json   bool
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "controller",
		Short:         "Device-command controller: idempotent operations on a fleet over MQTT",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cf := &clientFlags{}
	root.PersistentFlags().StringVar(&cf.server, "server", "http://127.0.0.1:8080", "controller API URL (client subcommands)")
	root.PersistentFlags().StringVar(&cf.token, "token", "", "bearer token (client subcommands)")
	root.PersistentFlags().BoolVar(&cf.json, "json", false, "print JSON instead of text")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) }
	root.AddCommand(serveCmd(), opCmd(cf), cmdCmd(cf), deviceCmd(cf), taskCmd(cf), grantCmd(cf), verifyCmd(), reportCmd())
	return root
}

// Main runs the tree and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(stderr, "controller:", err)
		return 1
	}
	return 0
}

// bindEnv fills every flag not given on the command line from its
// CONTROLLER_* variable.
func bindEnv(cmd *cobra.Command) error {
	var err error
	visit := func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := "CONTROLLER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return err
}

func serveCmd() *cobra.Command {
	cfg := controller.DefaultConfig()
	var logLevel string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the controller daemon (HTTP API, MQTT dispatcher, receipt ingestion, sweeper)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.InstanceID == "" {
				host, _ := os.Hostname()
				cfg.InstanceID = sanitize(host)
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
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
	f.StringVar(&cfg.HTTP, "http", cfg.HTTP, "HTTP API listen address")
	f.StringVar(&cfg.TopicRoot, "topic-root", cfg.TopicRoot, "MQTT topic root")
	f.DurationVar(&cfg.AckTimeout, "ack-timeout", cfg.AckTimeout, "ask the device after this long with no final receipt")
	f.DurationVar(&cfg.CommandTTL, "command-ttl", cfg.CommandTTL, "a command's expires_at is its issue time plus this")
	f.IntVar(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts, "publishes (and queries) of one command at most")
	f.StringVar(&cfg.Offline, "offline", cfg.Offline, "offline policy: wait or fail")
	f.StringVar(&cfg.PolicyFile, "policy", cfg.PolicyFile, "per-action policy file (JSON)")
	f.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "operation lease time to live")
	f.StringVar(&cfg.InstanceID, "instance-id", cfg.InstanceID, "this instance's id (default: the host name)")
	f.StringVar(&cfg.Tokens, "tokens", cfg.Tokens, "API tokens file (JSON)")
	f.BoolVar(&cfg.FourEyes, "four-eyes", cfg.FourEyes, "nobody approves a plan version they wrote")
	f.DurationVar(&cfg.SweepInterval, "sweep-interval", cfg.SweepInterval, "how often the sweeper looks for due commands")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
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

func opCmd(cf *clientFlags) *cobra.Command {
	op := &cobra.Command{Use: "op", Short: "Submit and read operations"}
	var req api.SubmitRequest
	var params, key string
	var wait time.Duration
	submit := &cobra.Command{
		Use:   "submit",
		Short: "Submit an operation (idempotent: the same operation_id and params again return the stored record)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if params != "" {
				req.Params = json.RawMessage(params)
			}
			c := client.New(cf.server, cf.token)
			op, status, err := c.Submit(cmd.Context(), req, key)
			if err != nil {
				return err
			}
			if wait > 0 {
				if op, err = c.Operation(cmd.Context(), op.OperationID, wait); err != nil {
					return err
				}
			}
			return printOperation(cmd.OutOrStdout(), cf.json, op, status)
		},
	}
	sf := submit.Flags()
	sf.StringVar(&req.OperationID, "operation-id", "", "the whole operation id (else derived from the parts)")
	sf.StringVar(&req.TaskID, "task", "", "task id part")
	sf.StringVar(&req.Step, "step", "", "step part")
	sf.StringVar(&req.Target, "target", "", "device id")
	sf.StringVar(&req.BusinessVersion, "business-version", "", "business version part")
	sf.StringVar(&req.Action, "action", "", "action, e.g. restart or set-config")
	sf.StringVar(&params, "params", "", "params as a JSON object")
	sf.StringVar(&key, "idempotency-key", "", "send this Idempotency-Key header")
	sf.DurationVar(&wait, "wait", 0, "then wait up to this long for the outcome")
	get := &cobra.Command{
		Use:   "get OPERATION_ID",
		Short: "Show an operation",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			op, err := client.New(cf.server, cf.token).Operation(cmd.Context(), args[0], wait)
			if err != nil {
				return err
			}
			return printOperation(cmd.OutOrStdout(), cf.json, op, 200)
		},
	}
	get.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (max 60s) for it to leave started")
	op.AddCommand(submit, get)
	return op
}

func cmdCmd(cf *clientFlags) *cobra.Command {
	c := &cobra.Command{Use: "cmd", Short: "Read, cancel and resolve commands"}
	get := &cobra.Command{
		Use:   "get COMMAND_ID",
		Short: "Show a command with its receipts and events",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := client.New(cf.server, cf.token).Command(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			return printCommand(cmd.OutOrStdout(), out)
		},
	}
	cancel := &cobra.Command{
		Use:   "cancel COMMAND_ID",
		Short: "Cancel a command that was never published (else 409 already_published)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := client.New(cf.server, cf.token).Cancel(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			return printCommand(cmd.OutOrStdout(), out)
		},
	}
	var outcome, note string
	resolve := &cobra.Command{
		Use:   "resolve COMMAND_ID --outcome succeeded|failed --note TEXT",
		Short: "Record what really happened to a needs_attention command; finishes its operation",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := client.New(cf.server, cf.token).Resolve(cmd.Context(), args[0], outcome, note)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			return printCommand(cmd.OutOrStdout(), out)
		},
	}
	resolve.Flags().StringVar(&outcome, "outcome", "", "succeeded or failed")
	resolve.Flags().StringVar(&note, "note", "", "what you found")
	c.AddCommand(get, cancel, resolve)
	return c
}

func deviceCmd(cf *clientFlags) *cobra.Command {
	d := &cobra.Command{Use: "device", Short: "Read device presence"}
	list := &cobra.Command{
		Use: "list", Short: "List devices", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			devs, err := client.New(cf.server, cf.token).Devices(cmd.Context())
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), devs)
			}
			return printDevices(cmd.OutOrStdout(), devs)
		},
	}
	get := &cobra.Command{
		Use: "get DEVICE_ID", Short: "Show one device", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dev, err := client.New(cf.server, cf.token).Device(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), dev)
			}
			return printDevices(cmd.OutOrStdout(), []api.Device{dev})
		},
	}
	d.AddCommand(list, get)
	return d
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printOperation(w io.Writer, asJSON bool, op api.Operation, status int) error {
	if asJSON {
		return printJSON(w, op)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "operation\t%s\n", op.OperationID)
	fmt.Fprintf(tw, "status\t%s", op.Status)
	if op.Reason != "" {
		fmt.Fprintf(tw, " (%s)", op.Reason)
	}
	switch status {
	case 201:
		fmt.Fprint(tw, "  [new]")
	case 200:
	default:
		fmt.Fprintf(tw, "  [%d]", status)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "action\t%s on %s %s\n", op.Action, op.Target, compact(op.Params))
	fmt.Fprintf(tw, "command\t%s (attempt %d of the operation; all: %s)\n", op.CommandID, op.Attempt, strings.Join(op.CommandIDs, ", "))
	fmt.Fprintf(tw, "result\t%s\n", compact(op.Result))
	fmt.Fprintf(tw, "request_hash\t%s\n", op.RequestHash)
	fmt.Fprintf(tw, "lease\t%s token %d until %s\n", op.Owner, op.FencingToken, op.LeaseExpiresAt.Format(time.RFC3339))
	fmt.Fprintf(tw, "started / updated\t%s / %s\n", op.StartedAt.Format(time.RFC3339Nano), op.UpdatedAt.Format(time.RFC3339Nano))
	return tw.Flush()
}

func printCommand(w io.Writer, c api.Command) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "command\t%s\n", c.CommandID)
	fmt.Fprintf(tw, "operation\t%s\n", c.OperationID)
	fmt.Fprintf(tw, "device\t%s  action %s %s\n", c.DeviceID, c.Action, compact(c.Params))
	fmt.Fprintf(tw, "status\t%s", c.Status)
	if c.Reason != "" {
		fmt.Fprintf(tw, " (%s)", c.Reason)
	}
	fmt.Fprintf(tw, "\npublishes / queries\t%d / %d (qos %d)\n", c.Attempt, c.Queries, c.QoS)
	fmt.Fprintf(tw, "expires_at\t%s\n", c.ExpiresAt.Format(time.RFC3339))
	fmt.Fprintf(tw, "result\t%s\n", compact(c.Result))
	if c.ExecutedAs != "" {
		fmt.Fprintf(tw, "executed_as\t%s\n", c.ExecutedAs)
	}
	if c.LateOutcome != "" {
		fmt.Fprintf(tw, "late_outcome\t%s %s conflict=%v\n", c.LateOutcome, compact(c.LateResult), c.LateConflict)
	}
	fmt.Fprintln(tw, "\nreceipts:")
	for _, r := range c.Receipts {
		fmt.Fprintf(tw, "  %s\tseq %d\t%s\t%s\n", r.ReceivedAt.Format("15:04:05.000"), r.Seq, r.Status, r.Effect)
	}
	fmt.Fprintln(tw, "\nevents:")
	for _, e := range c.Events {
		mark := ""
		if e.Refused {
			mark = "  REFUSED"
		}
		fmt.Fprintf(tw, "  %s\t%s → %s\t%s\t%s%s\n", e.At.Format("15:04:05.000"), e.From, e.To, e.Reason, e.Instance, mark)
	}
	return tw.Flush()
}

func printDevices(w io.Writer, devs []api.Device) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tONLINE\tCONFIRMED\tSESSION\tDEDUPE\tQUERY\tSKEW\tLAST SEEN")
	for _, d := range devs {
		last := "-"
		if d.LastSeenAt != nil {
			last = d.LastSeenAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%v\t%v\t%dms\t%s\n", d.DeviceID, d.Online, d.Confirmed, d.Session,
			d.Capabilities.Dedupe, d.Capabilities.Query, d.ClockSkewMS, last)
	}
	return tw.Flush()
}

func compact(m json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, m) != nil {
		return string(m)
	}
	return b.String()
}

// doPrint sends one request and prints the answer as JSON (the task and
// grant records are read by people as JSON too).
func doPrint(cmd *cobra.Command, cf *clientFlags, method, path string, body any) error {
	var out json.RawMessage
	if _, err := client.New(cf.server, cf.token).Do(cmd.Context(), method, path, nil, body, &out); err != nil {
		return err
	}
	var v any
	_ = json.Unmarshal(out, &v)
	return printJSON(cmd.OutOrStdout(), v)
}

func taskCmd(cf *clientFlags) *cobra.Command {
	t := &cobra.Command{Use: "task", Short: "Tasks: versioned plans, approvals, rejections"}
	var steps, after, before, planHash, reason string
	var version, base int
	parseSteps := func() (json.RawMessage, error) {
		if !json.Valid([]byte(steps)) {
			return nil, fmt.Errorf("--steps: not valid JSON")
		}
		return json.RawMessage(steps), nil
	}
	create := &cobra.Command{
		Use: "create TASK_ID --steps JSON", Short: "Create a task with plan version 1", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := parseSteps()
			if err != nil {
				return err
			}
			body := map[string]any{"task_id": args[0], "steps": s}
			if after != "" {
				body["execute_after"] = after
			}
			if before != "" {
				body["execute_before"] = before
			}
			return doPrint(cmd, cf, http.MethodPost, "/v1/tasks", body)
		},
	}
	create.Flags().StringVar(&steps, "steps", "", `plan: [{"step":"...","action":"...","target":"...","params":{}}]`)
	create.Flags().StringVar(&after, "execute-after", "", "maintenance window start (RFC 3339)")
	create.Flags().StringVar(&before, "execute-before", "", "maintenance window end (RFC 3339)")
	plan := &cobra.Command{
		Use: "plan TASK_ID --steps JSON", Short: "Propose a new plan version", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := parseSteps()
			if err != nil {
				return err
			}
			body := map[string]any{"steps": s}
			if base > 0 {
				body["base_version"] = base
			}
			return doPrint(cmd, cf, http.MethodPut, "/v1/tasks/"+url.PathEscape(args[0])+"/plan", body)
		},
	}
	plan.Flags().StringVar(&steps, "steps", "", "the new plan")
	plan.Flags().IntVar(&base, "base-version", 0, "refuse (409 stale_version) unless this is the current version")
	approve := &cobra.Command{
		Use: "approve TASK_ID --version N", Short: "Approve one plan version", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doPrint(cmd, cf, http.MethodPost, "/v1/tasks/"+url.PathEscape(args[0])+"/approvals",
				map[string]any{"version": version, "plan_hash": planHash})
		},
	}
	approve.Flags().IntVar(&version, "version", 0, "the plan version you reviewed")
	approve.Flags().StringVar(&planHash, "plan-hash", "", "bind the approval to this plan hash")
	reject := &cobra.Command{
		Use: "reject TASK_ID --reason TEXT", Short: "Reject a task before it runs", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doPrint(cmd, cf, http.MethodPost, "/v1/tasks/"+url.PathEscape(args[0])+"/rejections", map[string]any{"reason": reason})
		},
	}
	reject.Flags().StringVar(&reason, "reason", "", "why")
	get := &cobra.Command{
		Use: "get TASK_ID", Short: "Show a task: status, plan, steps with their operation ids, history", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doPrint(cmd, cf, http.MethodGet, "/v1/tasks/"+url.PathEscape(args[0]), nil)
		},
	}
	t.AddCommand(create, plan, approve, reject, get)
	return t
}

func grantCmd(cf *clientFlags) *cobra.Command {
	g := &cobra.Command{Use: "grant", Short: "Grants: which principal may run which action on which devices"}
	var principal, action, devices string
	var all bool
	add := &cobra.Command{
		Use: "add --principal P --action GLOB --devices GLOB", Short: "Grant (idempotent)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return doPrint(cmd, cf, http.MethodPost, "/v1/grants",
				map[string]any{"principal": principal, "action": action, "devices": devices})
		},
	}
	add.Flags().StringVar(&principal, "principal", "", "who")
	add.Flags().StringVar(&action, "action", "", "action glob, e.g. restart or *")
	add.Flags().StringVar(&devices, "devices", "", "device glob, e.g. device-*")
	list := &cobra.Command{
		Use: "list", Short: "List live grants (--all: revoked too)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/v1/grants"
			if all {
				path += "?all=1"
			}
			return doPrint(cmd, cf, http.MethodGet, path, nil)
		},
	}
	list.Flags().BoolVar(&all, "all", false, "include revoked grants")
	revoke := &cobra.Command{
		Use: "revoke GRANT_ID", Short: "Revoke a grant", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return doPrint(cmd, cf, http.MethodDelete, "/v1/grants/"+url.PathEscape(args[0]), nil)
		},
	}
	g.AddCommand(add, list, revoke)
	return g
}

func verifyCmd() *cobra.Command {
	var cfg verify.Config
	cmd := &cobra.Command{
		Use:   "verify --db FILE [--state-dir DIR]",
		Short: "Check the contract's seven invariants on a run: the database and the devices' witness files",
		Long: `Reads the controller's database (read-only) and, with --state-dir, the simulator's
executions.jsonl and receipts.jsonl, and prints one verdict line per invariant
with its numbers. Exits 1 if any invariant fails.`,
		Args: cobra.NoArgs,
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
		Use:   "report --db FILE [--state-dir DIR] --out report.html",
		Short: "Write one self-contained HTML report of a run: verdicts, counts, a timeline per command of interest",
		Args:  cobra.NoArgs,
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
