package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

func rolloutCmd() *cobra.Command {
	g, cf := clientGroup("rollout", "Rollouts: one action across a fleet, with rate, ramp, concurrency, abort thresholds and windows")
	showRollout := func(cmd *cobra.Command, r apiwire.RolloutView, status int) error {
		return cf.show(cmd, r, func(w io.Writer) error { return printRollout(w, r, status) })
	}
	var (
		req                   apiwire.RolloutRequest
		params, devices, file string
		after, before         string
		rampBase, rampEvery   int
		rampFactor            float64
		aborts, windows       []string
		version               int
		status                string
		interval              time.Duration
	)
	create := &cobra.Command{
		Use:   "create ROLLOUT_ID --action ACTION --devices GLOB|ID,ID... [--max-per-minute N] [flags] | --file BODY.json",
		Short: "Create a rollout (idempotent: the same request again returns it; other content gets 422)",
		Long: `Create a rollout: one action on every device of a set resolved now (a glob against
the devices seen so far, or a list of ids). Each device gets the ordinary operation
ROLLOUT_ID:rollout:DEVICE:v1. Starts are paced at --max-per-minute (or a ramp from
--ramp-base, multiplied by --ramp-factor each --ramp-every successes), at most
--max-in-flight at once, inside the windows; an --abort rule stops new starts once
its share of finished devices is reached. --file reads the whole POST /v1/rollouts
body instead (ROLLOUT_ID then overrides its rollout_id when given).`,
		Example: `  controller rollout create fw-42 --action set-config --params '{"fw":"4.2"}' --devices 'device-*' \
    --max-per-minute 600 --ramp-base 60 --ramp-factor 2 --ramp-every 50 --max-in-flight 100 \
    --abort failed:5:20 --abort timeout:10:20 --retries 2

  # nightly maintenance windows (UTC): 02:00 for two hours
  controller rollout create fw-43 --action restart --devices device-1,device-7 --max-per-minute 10 \
    --window '0 2 * * * 2h'

  controller rollout create --file rollout.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := req
			if file != "" {
				b, err := os.ReadFile(file)
				if err != nil {
					return cmdline.Usagef("--file: %w", err)
				}
				body = apiwire.RolloutRequest{}
				if err := json.Unmarshal(b, &body); err != nil {
					return cmdline.Usagef("--file %s: %w", file, err)
				}
			} else {
				if err := rolloutFlags(cmd, &body, params, devices, after, before, rampBase, rampFactor, rampEvery, aborts, windows); err != nil {
					return err
				}
			}
			if len(args) == 1 {
				body.RolloutID = args[0]
			}
			if body.RolloutID == "" {
				return cmdline.Usagef("give ROLLOUT_ID (or rollout_id in --file)")
			}
			r, st, err := cf.client().CreateRollout(cmd.Context(), body)
			if err != nil {
				return err
			}
			return showRollout(cmd, r, st)
		},
	}
	f := create.Flags()
	f.StringVar(&file, "file", "", "read the whole request body (JSON) from this file")
	f.StringVar(&req.Action, "action", "", "the action, e.g. set-config or restart")
	f.StringVar(&params, "params", "", "params as a JSON object")
	f.StringVar(&devices, "devices", "", "a device glob (device-*), or ids separated by commas")
	f.IntVar(&req.MaxPerMinute, "max-per-minute", 0, fmt.Sprintf("starts per minute at most (default %d)", apiwire.DefaultMaxPerMinute))
	f.IntVar(&req.MaxInFlight, "max-in-flight", 0, fmt.Sprintf("devices started and not finished at most (default %d)", apiwire.DefaultMaxInFlight))
	f.IntVar(&rampBase, "ramp-base", 0, "ramp: the first rate, per minute")
	f.Float64Var(&rampFactor, "ramp-factor", 2, "ramp: the rate's factor at each step")
	f.IntVar(&rampEvery, "ramp-every", 0, "ramp: a step each time this many more devices succeeded")
	f.StringArrayVar(&aborts, "abort", nil, "an abort rule WHEN:PERCENT:MIN_FINISHED, WHEN one of failed, timeout, rejected, needs_attention, any (repeatable)")
	f.StringArrayVar(&windows, "window", nil, "a recurring window (UTC) 'CRON DURATION', e.g. '0 2 * * * 2h' (repeatable)")
	f.IntVar(&req.Retries, "retries", 0, "retries of a device whose operation ended failed_retryable (timeout, offline, expired)")
	f.StringVar(&after, "execute-after", "", "no device starts before (RFC 3339)")
	f.StringVar(&before, "execute-before", "", "no device starts after; those not started are cancelled (RFC 3339)")

	get := &cobra.Command{
		Use:   "get ROLLOUT_ID",
		Short: "Show a rollout: status, counts by outcome, rate now, abort state, window, scheduler, history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := cf.client().Rollout(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return showRollout(cmd, r, http.StatusOK)
		},
	}
	list := &cobra.Command{
		Use:   "list [--status S]",
		Short: "List rollouts (the API's pages, followed to the end)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := cf.client().Rollouts(cmd.Context(), status)
			if err != nil {
				return err
			}
			return cf.show(cmd, rs, func(w io.Writer) error { return printRollouts(w, rs) })
		},
	}
	list.Flags().StringVar(&status, "status", "", "only rollouts in this status")
	devs := &cobra.Command{
		Use:     "devices ROLLOUT_ID [--status S]",
		Short:   "List a rollout's devices: operation id, status, reason, attempts",
		Example: `  controller rollout devices fw-42 --status failed`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ds, err := cf.client().RolloutDevices(cmd.Context(), args[0], status, 0)
			if err != nil {
				return err
			}
			return cf.show(cmd, ds, func(w io.Writer) error { return printRolloutDevices(w, ds) })
		},
	}
	devs.Flags().StringVar(&status, "status", "", "only devices in this status")
	move := func(action, short string) *cobra.Command {
		return &cobra.Command{
			Use: action + " ROLLOUT_ID", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				r, err := cf.client().MoveRollout(cmd.Context(), args[0], action)
				if err != nil {
					return err
				}
				return showRollout(cmd, r, http.StatusOK)
			},
		}
	}
	approve := &cobra.Command{
		Use:   "approve ROLLOUT_ID --version N",
		Short: "Approve a rollout whose action needs approval (four-eyes: not one you created)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, st, err := cf.client().ApproveRollout(cmd.Context(), args[0], version)
			if err != nil {
				return err
			}
			return showRollout(cmd, r, st)
		},
	}
	approve.Flags().IntVar(&version, "version", 0, "the rollout version you reviewed")
	_ = approve.MarkFlagRequired("version")
	watch := &cobra.Command{
		Use:   "watch ROLLOUT_ID [--interval 1s]",
		Short: "Follow a rollout live: a progress bar, counts by outcome, the start rate, the abort state",
		Long: `Follow a rollout until it ends and its last device in flight finished (or Ctrl-C):
a progress bar, the counts by outcome, the devices in flight, the start rate (allowed
now, and committed in the trailing minute) and each abort rule's state. On a terminal
the view is redrawn in place; otherwise a line is printed whenever it changes. Exits 0
when the rollout succeeded, 1 when it ended otherwise. --json prints each refresh as
a JSON object.`,
		Example: `  controller rollout watch fw-42`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval < 100*time.Millisecond {
				return cmdline.Usagef("--interval %s: at least 100ms", interval)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchRollout(ctx, cmd.OutOrStdout(), cf, args[0], interval)
		},
	}
	watch.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	g.AddCommand(create, get, list, devs, move("pause", "Pause: no new device starts; those started run to their end"),
		move("resume", "Resume a paused rollout"),
		move("cancel", "Cancel: no new device starts, those not published are cancelled, the published run to their end"),
		approve, watch)
	return g
}

// rolloutFlags fills a create request from the flags.
func rolloutFlags(cmd *cobra.Command, r *apiwire.RolloutRequest, params, devices, after, before string,
	rampBase int, rampFactor float64, rampEvery int, aborts, windows []string) error {
	if r.Action == "" {
		return cmdline.Usagef("--action is required (or --file)")
	}
	if params != "" {
		if !json.Valid([]byte(params)) {
			return cmdline.Usagef("--params: not valid JSON: %s", params)
		}
		r.Params = json.RawMessage(params)
	}
	switch {
	case devices == "":
		return cmdline.Usagef("--devices is required: a glob (device-*) or ids separated by commas")
	case strings.Contains(devices, ","):
		b, _ := json.Marshal(strings.Split(devices, ","))
		r.Devices = b
	default:
		b, _ := json.Marshal(devices)
		r.Devices = b
	}
	if cmd.Flags().Changed("ramp-base") || cmd.Flags().Changed("ramp-every") {
		r.Ramp = &apiwire.Ramp{BasePerMinute: rampBase, Factor: rampFactor, EverySucceeded: rampEvery}
	}
	for _, a := range aborts {
		parts := strings.Split(a, ":")
		if len(parts) != 3 {
			return cmdline.Usagef("--abort %q: want WHEN:PERCENT:MIN_FINISHED, e.g. failed:5:20", a)
		}
		pct, err1 := strconv.ParseFloat(parts[1], 64)
		minFinished, err2 := strconv.Atoi(parts[2])
		if err1 != nil || err2 != nil {
			return cmdline.Usagef("--abort %q: PERCENT a number, MIN_FINISHED an integer", a)
		}
		r.Abort = append(r.Abort, apiwire.AbortRule{When: parts[0], Percent: pct, MinFinished: minFinished})
	}
	for _, w := range windows {
		fields := strings.Fields(w)
		if len(fields) < 6 {
			return cmdline.Usagef("--window %q: want 'CRON DURATION', e.g. '0 2 * * * 2h'", w)
		}
		r.Windows = append(r.Windows, apiwire.MaintenanceWindow{Cron: strings.Join(fields[:len(fields)-1], " "), Duration: fields[len(fields)-1]})
	}
	var err error
	if r.ExecuteAfter, err = parseTime("execute-after", after); err != nil {
		return err
	}
	r.ExecuteBefore, err = parseTime("execute-before", before)
	return err
}

// watchRollout refreshes a rollout's view until it is over.
func watchRollout(ctx context.Context, w io.Writer, cf *clientFlags, id string, every time.Duration) error {
	c := cf.client()
	tty := isTerminal(w)
	drawn, last := 0, ""
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r, err := c.Rollout(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		over := fsm.RolloutState(r.Status).Terminal() && r.InFlight == 0
		switch {
		case cf.json:
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			if err := enc.Encode(r); err != nil {
				return err
			}
		case tty:
			lines := progressLines(r, time.Now())
			if drawn > 0 {
				fmt.Fprintf(w, "\x1b[%dA", drawn)
			}
			for _, l := range lines {
				fmt.Fprintf(w, "\x1b[2K%s\n", l)
			}
			drawn = len(lines)
		default:
			if line := progressLine(r); line != last {
				fmt.Fprintf(w, "%s  %s\n", time.Now().UTC().Format("15:04:05"), line)
				last = line
			}
		}
		if over {
			if !cf.json {
				fmt.Fprintf(w, "rollout %s %s%s\n", r.RolloutID, r.Status, reasonSuffix(r.Reason))
			}
			if r.Status != string(fsm.RolloutSucceeded) {
				return fmt.Errorf("rollout %s ended %s", r.RolloutID, r.Status)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// done counts the devices that will not start again: finished or cancelled.
func done(r apiwire.RolloutView) int {
	return r.Finished + r.Counts[string(fsm.DevCancelled)]
}

func bar(r apiwire.RolloutView, width int) string {
	if r.DevicesTotal == 0 {
		return ""
	}
	full := done(r) * width / r.DevicesTotal
	inFlight := min(r.InFlight*width/r.DevicesTotal, width-full)
	return "[" + strings.Repeat("#", full) + strings.Repeat(">", inFlight) + strings.Repeat(".", width-full-inFlight) + "]"
}

// outcomes is the non-zero counts of the outcomes, in the machine's order.
func outcomes(r apiwire.RolloutView) string {
	var parts []string
	for _, st := range fsm.RolloutDevice.States() {
		if st == fsm.DevPending || st == fsm.DevStarted {
			continue
		}
		if n := r.Counts[string(st)]; n > 0 || st == fsm.DevSucceeded || st == fsm.DevFailed {
			parts = append(parts, fmt.Sprintf("%s %d", st, n))
		}
	}
	return strings.Join(parts, " ")
}

func abortLine(r apiwire.RolloutView) string {
	if len(r.AbortState) == 0 {
		return "no abort rule"
	}
	var parts []string
	finished, minFinished := 0, 0
	for _, a := range r.AbortState {
		s := fmt.Sprintf("%s %.1f%% (at %g%%)", a.When, a.SharePercent, a.Percent)
		if a.Tripped {
			s += " TRIPPED"
		}
		parts = append(parts, s)
		finished, minFinished = a.Finished, max(minFinished, a.MinFinished)
	}
	s := strings.Join(parts, ", ") + fmt.Sprintf(" of %d finished", finished)
	if finished < minFinished {
		s += fmt.Sprintf(", min %d", minFinished)
	}
	return s
}

func rateLine(r apiwire.RolloutView) string {
	return fmt.Sprintf("rate %.0f/min, %d started in the last minute", r.Rate.AllowedPerMinute, r.Rate.StartsLastMinute)
}

// progressLine is the one-line view (for logs and pipes).
func progressLine(r apiwire.RolloutView) string {
	pct := 0
	if r.DevicesTotal > 0 {
		pct = done(r) * 100 / r.DevicesTotal
	}
	return fmt.Sprintf("%s %3d%% %d/%d %s | %s | in flight %d | %s | abort: %s", bar(r, 20), pct, done(r),
		r.DevicesTotal, r.Status, outcomes(r), r.InFlight, rateLine(r), abortLine(r))
}

// progressLines is the view a terminal redraws in place.
func progressLines(r apiwire.RolloutView, now time.Time) []string {
	pct := 0
	if r.DevicesTotal > 0 {
		pct = done(r) * 100 / r.DevicesTotal
	}
	lines := []string{
		fmt.Sprintf("rollout %s  %s%s", r.RolloutID, r.Status, reasonSuffix(r.Reason)),
		fmt.Sprintf("%s %3d%%  %d/%d done, %d in flight, %d pending", bar(r, 40), pct, done(r), r.DevicesTotal, r.InFlight,
			r.Counts[string(fsm.DevPending)]+r.Counts[string(fsm.DevRetry)]),
		"outcomes  " + outcomes(r),
		fmt.Sprintf("%s (%d in the last 10 s, %d in all)", rateLine(r), r.Rate.StartsLast10s, r.Rate.Starts),
		"abort     " + abortLine(r),
	}
	if !fsm.RolloutState(r.Status).Terminal() {
		win := "open"
		switch {
		case !r.Window.Open && r.Window.Opens != nil:
			win = "closed, opens " + stamp(*r.Window.Opens)
		case !r.Window.Open:
			win = "closed"
		case r.Window.Ends != nil:
			win = "open until " + stamp(*r.Window.Ends)
		}
		lines = append(lines, fmt.Sprintf("window    %s; scheduler %s (token %d)   %s", win, r.Scheduler.Owner,
			r.Scheduler.FencingToken, now.UTC().Format("15:04:05")))
	}
	return lines
}

func printRollout(w io.Writer, r apiwire.RolloutView, status int) error {
	tw := newTab(w)
	fmt.Fprintf(tw, "rollout\t%s%s\n", r.RolloutID, answered(status))
	fmt.Fprintf(tw, "status\t%s%s\n", r.Status, reasonSuffix(r.Reason))
	fmt.Fprintf(tw, "version\t%d\n", r.Version)
	fmt.Fprintf(tw, "action\t%s %s\n", r.Action, compact(r.Params))
	fmt.Fprintf(tw, "devices\t%s: %d\n", compact(r.Devices), r.DevicesTotal)
	fmt.Fprintf(tw, "progress\t%s %d/%d done, %d in flight\n", bar(r, 30), done(r), r.DevicesTotal, r.InFlight)
	fmt.Fprintf(tw, "outcomes\t%s\n", outcomes(r))
	limits := fmt.Sprintf("%d/min, %d in flight", r.MaxPerMinute, r.MaxInFlight)
	if r.Ramp != nil {
		limits += fmt.Sprintf(", ramp from %d/min ×%g every %d succeeded", r.Ramp.BasePerMinute, r.Ramp.Factor, r.Ramp.EverySucceeded)
	}
	if r.Retries > 0 {
		limits += fmt.Sprintf(", %d retries", r.Retries)
	}
	fmt.Fprintf(tw, "limits\t%s\n", limits)
	fmt.Fprintf(tw, "rate\t%.0f/min allowed (a start every %d ms at most); %d started in the last minute, %d in the last 10 s, %d in all\n",
		r.Rate.AllowedPerMinute, r.Rate.IntervalMS, r.Rate.StartsLastMinute, r.Rate.StartsLast10s, r.Rate.Starts)
	fmt.Fprintf(tw, "abort\t%s\n", abortLine(r))
	ws := []string{"any time"}
	if r.ExecuteAfter != nil || r.ExecuteBefore != nil {
		ws[0] = window(r.ExecuteAfter, r.ExecuteBefore)
	}
	for _, win := range r.Windows {
		ws = append(ws, fmt.Sprintf("'%s' for %s (UTC)", win.Cron, win.Duration))
	}
	fmt.Fprintf(tw, "windows\t%s\n", strings.Join(ws, "; "))
	if r.ApprovalRequired {
		if a := r.Approval; a != nil {
			fmt.Fprintf(tw, "approval\tversion %d by %s at %s\n", a.Version, a.Approver, stampPtr(a.ApprovedAt))
		} else {
			fmt.Fprintf(tw, "approval\trequired, none yet\n")
		}
	}
	fmt.Fprintf(tw, "created\t%s by %s\n", stamp(r.CreatedAt), orDash(r.CreatedBy))
	fmt.Fprintf(tw, "scheduler\t%s, fencing token %d, lease until %s\n", orDash(r.Scheduler.Owner), r.Scheduler.FencingToken,
		stamp(r.Scheduler.LeaseExpiresAt))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.History) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nhistory:")
	tw = newTab(w)
	fmt.Fprintln(tw, "  AT\tPRINCIPAL\tACTION\tFROM → TO\tREASON")
	for _, h := range r.History {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s → %s\t%s\n", stamp(h.At), orDash(h.Principal), h.Action, orDash(h.From), orDash(h.To), h.Reason)
	}
	return tw.Flush()
}

func printRollouts(w io.Writer, rs []apiwire.RolloutView) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "ROLLOUT\tSTATUS\tACTION\tDEVICES\tDONE\tIN FLIGHT\tSUCCEEDED\tFAILED\tCREATED")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.RolloutID, r.Status, r.Action, r.DevicesTotal, done(r), r.InFlight,
			r.Counts[string(fsm.DevSucceeded)], r.Counts[string(fsm.DevFailed)], stamp(r.CreatedAt))
	}
	return tw.Flush()
}

func printRolloutDevices(w io.Writer, ds []apiwire.RolloutDeviceView) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "DEVICE\tSTATUS\tATTEMPTS\tSTARTED\tFINISHED\tOPERATION\tREASON")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.DeviceID, d.Status, d.Attempts, stampPtr(d.StartedAt),
			stampPtr(d.FinishedAt), d.OperationID, d.Reason)
	}
	return tw.Flush()
}
