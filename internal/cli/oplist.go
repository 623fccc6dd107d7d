package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/client"
)

// The operators' lists: `controller op list` and `controller cmd list`
// read GET /v1/operations and GET /v1/commands, newest first, with the
// filters as flags. One page (--limit, 100 by default) unless --all
// follows every page's Link; a table by default, one JSON array with
// --json (every page's records with --all).

// maxOperatorLimit is the API's largest page of these lists.
const maxOperatorLimit = 1000

// listFlags are the flags both lists share.
type listFlags struct {
	statuses     []string
	device       string
	action       string
	since, until string
	limit        int
	all          bool
}

func (lf *listFlags) add(c *cobra.Command, states string) {
	f := c.Flags()
	f.StringSliceVar(&lf.statuses, "status", nil, "only these states (repeatable, or a comma list): "+states+", or open (every state not final)")
	f.StringVar(&lf.device, "device", "", "only this device's")
	f.StringVar(&lf.action, "action", "", "only this action's")
	f.StringVar(&lf.since, "since", "", "started at or after: RFC 3339, or a duration ago (e.g. 1h)")
	f.StringVar(&lf.until, "until", "", "started before: RFC 3339, or a duration ago")
	f.IntVar(&lf.limit, "limit", 0, fmt.Sprintf("records per page, 1 to %d (0: the server's default, 100)", maxOperatorLimit))
	f.BoolVar(&lf.all, "all", false, "follow every page to the end (the newest first)")
}

// times reads --since and --until against now.
func (lf *listFlags) times(now time.Time) (since, until time.Time, err error) {
	parse := func(name, v string) (time.Time, error) {
		if v == "" {
			return time.Time{}, nil
		}
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t, nil
		}
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			return now.Add(-d), nil
		}
		return time.Time{}, cmdline.Usagef("--%s %q: an RFC 3339 time (2026-12-05T21:00:00Z) or a duration ago (90m)", name, v)
	}
	if since, err = parse("since", lf.since); err != nil {
		return since, until, err
	}
	until, err = parse("until", lf.until)
	return since, until, err
}

func (lf *listFlags) check() error {
	if lf.limit < 0 || lf.limit > maxOperatorLimit {
		return cmdline.Usagef("--limit %d: from 1 to %d (0: the server's default, 100)", lf.limit, maxOperatorLimit)
	}
	return nil
}

// listed reads the first page, or with --all every page (the client
// follows the Link headers); the Page is the one read last.
func listed[T any](lf *listFlags, first func() ([]T, client.Page, error), all func() ([]T, error)) ([]T, client.Page, error) {
	if !lf.all {
		return first()
	}
	items, err := all()
	if items == nil {
		items = []T{}
	}
	return items, client.Page{Total: int64(len(items))}, err
}

// more tells a table's reader what else matched.
func more(w io.Writer, shown int, p client.Page) {
	if p.Next != "" {
		fmt.Fprintf(w, "%d of %d shown; --all lists them all, --limit sets the page\n", shown, p.Total)
	}
}

func opListCmd(cf *clientFlags) *cobra.Command {
	var lf listFlags
	var taskID, submittedBy string
	c := &cobra.Command{
		Use:   "list [--status S] [--device D] [--action A] [--task-id T] [--submitted-by P] [--since T] [--until T] [--limit N] [--all]",
		Short: "List operations, newest first, filtered (GET /v1/operations)",
		Long: `List operations, newest first (by start, then id). One page of --limit (100 by default);
--all follows every page to the end. Filters are ANDed; --status takes several states
(repeated or comma-separated), and open means every state not final (started,
failed_retryable). The table shows who submitted each operation and through what
(api, mcp, task, rollout, compensation); --json prints one JSON array of the records.`,
		Example: `  controller op list --status open
  controller op list --device device-7 --since 2h --all --json
  controller op list --submitted-by agent --status failed_final,failed_retryable`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.check(); err != nil {
				return err
			}
			since, until, err := lf.times(time.Now())
			if err != nil {
				return err
			}
			q := client.OperationQuery{Statuses: lf.statuses, Device: lf.device, Action: lf.action, TaskID: taskID,
				SubmittedBy: submittedBy, Since: since, Until: until, Limit: lf.limit}
			c := cf.client()
			ops, p, err := listed(&lf, func() ([]apiwire.Operation, client.Page, error) { return c.OperationsPage(cmd.Context(), q.Path()) },
				func() ([]apiwire.Operation, error) { return c.ListOperations(cmd.Context(), q) })
			if err != nil {
				return err
			}
			return cf.show(cmd, ops, func(w io.Writer) error {
				if err := printOperations(w, ops); err != nil {
					return err
				}
				more(w, len(ops), p)
				return nil
			})
		},
	}
	lf.add(c, "started, succeeded, failed_retryable, failed_final")
	c.Flags().StringVar(&taskID, "task-id", "", "only this task's (or rollout's) operations")
	c.Flags().StringVar(&submittedBy, "submitted-by", "", "only those this principal submitted")
	return c
}

func cmdListCmd(cf *clientFlags) *cobra.Command {
	var lf listFlags
	var operationID string
	c := &cobra.Command{
		Use:   "list [--status S] [--device D] [--action A] [--operation-id ID] [--since T] [--until T] [--limit N] [--all]",
		Short: "List commands, newest first, filtered (GET /v1/commands)",
		Long: `List commands, newest first (by creation, then id). One page of --limit (100 by default);
--all follows every page to the end. Filters are ANDed; --status takes several states
(repeated or comma-separated), and open means every state not final. The queue of
commands that wait for a person: --status needs_attention. --json prints one JSON
array of the records, each with its receipts and events.`,
		Example: `  controller cmd list --status needs_attention
  controller cmd list --device device-7 --status open --all
  controller cmd list --operation-id task-12:create-ticket:device-1:v1 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.check(); err != nil {
				return err
			}
			since, until, err := lf.times(time.Now())
			if err != nil {
				return err
			}
			q := client.CommandQuery{Statuses: lf.statuses, Device: lf.device, Action: lf.action, OperationID: operationID,
				Since: since, Until: until, Limit: lf.limit}
			c := cf.client()
			cmds, p, err := listed(&lf, func() ([]apiwire.Command, client.Page, error) { return c.CommandsPage(cmd.Context(), q.Path()) },
				func() ([]apiwire.Command, error) { return c.ListCommands(cmd.Context(), q) })
			if err != nil {
				return err
			}
			return cf.show(cmd, cmds, func(w io.Writer) error {
				if err := printCommands(w, cmds); err != nil {
					return err
				}
				more(w, len(cmds), p)
				return nil
			})
		},
	}
	lf.add(c, "pending, waiting_device, sent, received, executing, needs_attention, succeeded, failed, timeout, cancelled")
	c.Flags().StringVar(&operationID, "operation-id", "", "only this operation's commands")
	return c
}

func printOperations(w io.Writer, ops []apiwire.Operation) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "OPERATION\tSTATUS\tDEVICE\tACTION\tSTARTED\tSUBMITTED BY\tVIA")
	for _, op := range ops {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", op.OperationID, op.Status, op.Target, op.Action, stamp(op.StartedAt),
			orDash(op.SubmittedBy), orDash(op.Via))
	}
	return tw.Flush()
}

func printCommands(w io.Writer, cmds []apiwire.Command) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "COMMAND\tSTATUS\tDEVICE\tACTION\tISSUED\tOPERATION")
	for _, c := range cmds {
		status := c.Status
		if c.Reason != "" {
			status += " (" + c.Reason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.CommandID, status, c.DeviceID, c.Action, stamp(c.IssuedAt), c.OperationID)
	}
	return tw.Flush()
}
