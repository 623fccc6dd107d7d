package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/client"
)

// clientFlags are the flags of every client subcommand, and only theirs:
// each client group (op, cmd, device, task, grant) carries them as its
// persistent flags, so `serve --help` does not show them.
type clientFlags struct {
	server string
	token  string
	json   bool
}

// clientGroup returns a group of client subcommands with the client flags.
func clientGroup(use, short string) (*cobra.Command, *clientFlags) {
	g := &cobra.Command{Use: use, Short: short}
	cf := &clientFlags{}
	f := g.PersistentFlags()
	f.StringVar(&cf.server, "server", "http://127.0.0.1:8080", "the controller's API URL")
	f.StringVar(&cf.token, "token", "", "bearer token (see serve --tokens)")
	f.BoolVar(&cf.json, "json", false, "print the API's answer as JSON instead of text")
	return g, cf
}

func (cf *clientFlags) client() *client.Client { return client.New(cf.server, cf.token) }

// show prints v as indented JSON with --json, else its text view. Every
// client subcommand prints through here.
func (cf *clientFlags) show(cmd *cobra.Command, v any, text func(io.Writer) error) error {
	if cf.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return text(cmd.OutOrStdout())
}

func opCmd() *cobra.Command {
	op, cf := clientGroup("op", "Submit and read operations")
	var req apiwire.SubmitRequest
	var params, key string
	var wait time.Duration
	submit := &cobra.Command{
		Use:   "submit --target DEVICE --action ACTION [--task T --step S --business-version V | --operation-id ID]",
		Short: "Submit an operation (idempotent: the same operation_id and params again return the stored record)",
		Long: `Submit an operation. Its id is --operation-id, or task:step:target:business-version
from the parts. The same id with the same action, target and params returns the
stored record and runs nothing again (a failed_retryable one is retried); the
same id with other params is refused (422 idempotency_key_reused). An answer
still "started" is in doubt: ask again with the same id, never a new one.`,
		Example: `  controller op submit --task task-12 --step create-ticket --target device-1 --business-version v1 \
    --action restart --params '{"reason":"stuck"}' --wait 30s

  # a caller that has its own id for the intent
  controller op submit --operation-id ticket-4711 --target device-7 --action set-config --params '{"fw":"4.2"}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if params != "" {
				if !json.Valid([]byte(params)) {
					return cmdline.Usagef("--params: not valid JSON: %s", params)
				}
				req.Params = json.RawMessage(params)
			}
			c := cf.client()
			op, status, err := c.Submit(cmd.Context(), req, key)
			if err != nil {
				return err
			}
			if wait > 0 {
				if op, err = c.Operation(cmd.Context(), op.OperationID, wait); err != nil {
					return err
				}
			}
			return cf.show(cmd, op, func(w io.Writer) error { return printOperation(w, op, status) })
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
	sf.DurationVar(&wait, "wait", 0, "then wait up to this long (max 60s) for the outcome")
	_ = submit.MarkFlagRequired("target")
	_ = submit.MarkFlagRequired("action")
	get := &cobra.Command{
		Use:     "get OPERATION_ID",
		Short:   "Show an operation",
		Example: `  controller op get task-12:create-ticket:device-1:v1 --wait 30s`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			op, err := cf.client().Operation(cmd.Context(), args[0], wait)
			if err != nil {
				return err
			}
			return cf.show(cmd, op, func(w io.Writer) error { return printOperation(w, op, http.StatusOK) })
		},
	}
	get.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (max 60s) for it to leave started")
	op.AddCommand(submit, get, opListCmd(cf))
	return op
}

func cmdCmd() *cobra.Command {
	c, cf := clientGroup("cmd", "Read, cancel and resolve commands")
	showCommand := func(cmd *cobra.Command, out apiwire.Command) error {
		return cf.show(cmd, out, func(w io.Writer) error { return printCommand(w, out) })
	}
	get := &cobra.Command{
		Use:   "get COMMAND_ID",
		Short: "Show a command with its receipts and events",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := cf.client().Command(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return showCommand(cmd, out)
		},
	}
	cancel := &cobra.Command{
		Use:   "cancel COMMAND_ID",
		Short: "Cancel a command that was never published (else 409 already_published)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := cf.client().Cancel(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return showCommand(cmd, out)
		},
	}
	var outcome, note string
	resolve := &cobra.Command{
		Use:     "resolve COMMAND_ID --outcome succeeded|failed --note TEXT",
		Short:   "Record what really happened to a needs_attention command; finishes its operation",
		Example: `  controller cmd resolve c-01J... --outcome succeeded --note "checked on site: it restarted at 10:02"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := cf.client().Resolve(cmd.Context(), args[0], outcome, note)
			if err != nil {
				return err
			}
			return showCommand(cmd, out)
		},
	}
	resolve.Flags().Var(cmdline.NewEnum(&outcome, "", "succeeded", "failed"), "outcome", "what the device really did")
	resolve.Flags().StringVar(&note, "note", "", "what you found")
	_ = resolve.MarkFlagRequired("outcome")
	c.AddCommand(get, cancel, resolve, cmdListCmd(cf))
	return c
}

func deviceCmd() *cobra.Command {
	d, cf := clientGroup("device", "Device presence")
	var online string
	var pageSize int
	list := &cobra.Command{
		Use:   "list [--online true|false] [--page-size N]",
		Short: "List every device (the API's pages, followed to the end)",
		Long: `List every device the controller has heard of, by id. The API answers in pages
(GET /v1/devices?limit=&after=); this reads them all, following each page's Link.`,
		Example: `  controller device list
  controller device list --online false --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pageSize < 0 || pageSize > apiwire.MaxPageLimit {
				return cmdline.Usagef("--page-size %d: from 1 to %d (0: the server's default, %d)",
					pageSize, apiwire.MaxPageLimit, apiwire.DefaultPageLimit)
			}
			q := client.DeviceQuery{Limit: pageSize}
			if online != "" {
				b := online == "true"
				q.Online = &b
			}
			devs, err := cf.client().ListDevices(cmd.Context(), q)
			if err != nil {
				return err
			}
			return cf.show(cmd, devs, func(w io.Writer) error { return printDevices(w, devs) })
		},
	}
	list.Flags().Var(cmdline.NewEnum(&online, "", "true", "false"), "online", "only the devices online (true) or offline (false)")
	list.Flags().IntVar(&pageSize, "page-size", 0, "devices per API request (0: the server's default)")
	get := &cobra.Command{
		Use: "get DEVICE_ID", Short: "Show one device, its commands in flight and its queue", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dev, err := cf.client().Device(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return cf.show(cmd, dev, func(w io.Writer) error { return printDevice(w, dev) })
		},
	}
	reset := &cobra.Command{
		Use:   "reset-presence DEVICE_ID",
		Short: "Forget a device's presence rank, so its next presence applies whatever its session (admin)",
		Long: `Forget a device's stored presence rank. Use it for a device whose births are ignored as stale
(stale_presence > 0 in 'device get'): its session counter went backwards after a reflash or lost
storage, or a forged retained message poisoned the rank. Its next presence message then applies.`,
		Example: `  controller device reset-presence device-5 --token "$ADMIN_TOKEN"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dev, err := cf.client().ResetPresence(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return cf.show(cmd, dev, func(w io.Writer) error { return printDevices(w, []apiwire.Device{dev}) })
		},
	}
	d.AddCommand(list, get, reset)
	return d
}

// parseSteps reads --steps: a JSON array of {step, action, target, params};
// an unknown field is refused here, before anything is sent.
func parseSteps(s string) ([]apiwire.Step, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	var steps []apiwire.Step
	if err := dec.Decode(&steps); err != nil {
		return nil, cmdline.Usagef(`--steps: want [{"step":"...","action":"...","target":"...","params":{}}]: %w`, err)
	}
	return steps, nil
}

// parseTime reads an RFC 3339 flag; "" is nil.
func parseTime(flag, s string) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, cmdline.Usagef("--%s: want RFC 3339, e.g. 2025-06-01T02:00:00Z: %w", flag, err)
	}
	return &t, nil
}

const stepsHelp = `the plan, a JSON array: [{"step":"...","action":"...","target":"DEVICE","params":{}}]`

func taskCmd() *cobra.Command {
	t, cf := clientGroup("task", "Tasks: versioned plans, approvals, rejections")
	showTask := func(cmd *cobra.Command, task apiwire.TaskView, status int) error {
		return cf.show(cmd, task, func(w io.Writer) error { return printTask(w, task, status) })
	}
	var steps, after, before, planHash, reason string
	var version, base int
	create := &cobra.Command{
		Use:   "create TASK_ID --steps JSON [--execute-after T --execute-before T]",
		Short: "Create a task with plan version 1; it waits for approval",
		Example: `  controller task create task-88 \
    --steps '[{"step":"restart-device","action":"restart","target":"device-1001","params":{}}]'

  # inside a maintenance window
  controller task create task-89 --steps '[{"step":"fw","action":"set-config","target":"device-7","params":{"fw":"4.2"}}]' \
    --execute-after 2025-06-01T02:00:00Z --execute-before 2025-06-01T04:00:00Z`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := apiwire.TaskRequest{TaskID: args[0]}
			var err error
			if req.Steps, err = parseSteps(steps); err != nil {
				return err
			}
			if req.ExecuteAfter, err = parseTime("execute-after", after); err != nil {
				return err
			}
			if req.ExecuteBefore, err = parseTime("execute-before", before); err != nil {
				return err
			}
			task, status, err := cf.client().CreateTask(cmd.Context(), req)
			if err != nil {
				return err
			}
			return showTask(cmd, task, status)
		},
	}
	create.Flags().StringVar(&steps, "steps", "", stepsHelp)
	create.Flags().StringVar(&after, "execute-after", "", "maintenance window start (RFC 3339)")
	create.Flags().StringVar(&before, "execute-before", "", "maintenance window end (RFC 3339)")
	_ = create.MarkFlagRequired("steps")
	plan := &cobra.Command{
		Use:   "plan TASK_ID --steps JSON [--base-version N]",
		Short: "Propose a new plan version (it supersedes the one waiting for approval)",
		Example: `  controller task plan task-88 --base-version 1 \
    --steps '[{"step":"restart-device","action":"restart","target":"device-1002","params":{}}]'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req apiwire.PlanRequest
			var err error
			if req.Steps, err = parseSteps(steps); err != nil {
				return err
			}
			if cmd.Flags().Changed("base-version") {
				req.BaseVersion = &base
			}
			task, err := cf.client().UpdatePlan(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return showTask(cmd, task, http.StatusOK)
		},
	}
	plan.Flags().StringVar(&steps, "steps", "", stepsHelp)
	plan.Flags().IntVar(&base, "base-version", 0, "refuse (409 stale_version) unless this is the current version")
	_ = plan.MarkFlagRequired("steps")
	approve := &cobra.Command{
		Use:   "approve TASK_ID --version N [--plan-hash HEX]",
		Short: "Approve one plan version (four-eyes: not one you wrote)",
		Example: `  controller task get task-88                     # read the plan: its version and plan hash
  controller task approve task-88 --version 3 --plan-hash 9f86d081884c7d65... --token "$APPROVER_TOKEN"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, status, err := cf.client().Approve(cmd.Context(), args[0], apiwire.ApprovalRequest{Version: version, PlanHash: planHash})
			if err != nil {
				return err
			}
			return cf.show(cmd, a, func(w io.Writer) error { return printApproval(w, a, status) })
		},
	}
	approve.Flags().IntVar(&version, "version", 0, "the plan version you reviewed")
	approve.Flags().StringVar(&planHash, "plan-hash", "", "bind the approval to this plan hash (409 stale_version if the plan differs)")
	_ = approve.MarkFlagRequired("version")
	reject := &cobra.Command{
		Use:     "reject TASK_ID --reason TEXT",
		Short:   "Reject a task before it runs",
		Example: `  controller task reject task-88 --reason "wrong device: 1001 is the spare"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			task, err := cf.client().Reject(cmd.Context(), args[0], reason)
			if err != nil {
				return err
			}
			return showTask(cmd, task, http.StatusOK)
		},
	}
	reject.Flags().StringVar(&reason, "reason", "", "why")
	get := &cobra.Command{
		Use: "get TASK_ID", Short: "Show a task: status, plan, steps with their operation ids, history", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			task, err := cf.client().Task(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return showTask(cmd, task, http.StatusOK)
		},
	}
	t.AddCommand(create, plan, approve, reject, get)
	return t
}

func grantCmd() *cobra.Command {
	g, cf := clientGroup("grant", "Grants: which principal may run which action on which devices")
	showGrant := func(cmd *cobra.Command, gr apiwire.GrantView, status int) error {
		return cf.show(cmd, gr, func(w io.Writer) error { return printGrant(w, gr, status) })
	}
	var req apiwire.GrantRequest
	var all bool
	add := &cobra.Command{
		Use:     "add --principal P --action GLOB --devices GLOB",
		Aliases: []string{"create"},
		Short:   "Grant a principal an action on devices (idempotent: a live grant again returns it)",
		Example: `  controller grant add --principal agent --action restart --devices 'device-*' --token "$ADMIN_TOKEN"
  controller grant add --principal ops --action '*' --devices 'pump-[0-9]?'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gr, status, err := cf.client().CreateGrant(cmd.Context(), req)
			if err != nil {
				return err
			}
			return showGrant(cmd, gr, status)
		},
	}
	add.Flags().StringVar(&req.Principal, "principal", "", "who (a token's principal)")
	add.Flags().StringVar(&req.Action, "action", "", "action glob, e.g. restart or *")
	add.Flags().StringVar(&req.Devices, "devices", "", "device glob, e.g. device-*")
	for _, name := range []string{"principal", "action", "devices"} {
		_ = add.MarkFlagRequired(name)
	}
	list := &cobra.Command{
		Use: "list [--all]", Short: "List live grants (--all: revoked too)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gs, err := cf.client().Grants(cmd.Context(), all)
			if err != nil {
				return err
			}
			return cf.show(cmd, gs, func(w io.Writer) error { return printGrants(w, gs) })
		},
	}
	list.Flags().BoolVar(&all, "all", false, "include revoked grants")
	revoke := &cobra.Command{
		Use: "revoke GRANT_ID", Short: "Revoke a grant (again: the same answer)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			gr, err := cf.client().RevokeGrant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return showGrant(cmd, gr, http.StatusOK)
		},
	}
	g.AddCommand(add, list, revoke)
	return g
}
