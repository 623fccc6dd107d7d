package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// The text views of the client subcommands: one "key  value" block per
// record, tables for lists. --json prints the API's answer instead.

func newTab(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(&trimWriter{w: w}, 0, 4, 2, ' ', 0)
}

// trimWriter drops the spaces the tabwriter pads an empty last column with,
// line by line. Every view ends its lines with '\n'.
type trimWriter struct {
	w    io.Writer
	line []byte
}

func (t *trimWriter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c != '\n' {
			t.line = append(t.line, c)
			continue
		}
		t.line = append(bytes.TrimRight(t.line, " "), '\n')
		if _, err := t.w.Write(t.line); err != nil {
			return 0, err
		}
		t.line = t.line[:0]
	}
	return len(p), nil
}

// answered marks a record the call created ("[new]"); 200 means it existed
// (a replay) and is not marked.
func answered(status int) string {
	switch status {
	case http.StatusCreated:
		return "  [new]"
	case http.StatusOK, 0:
		return ""
	default:
		return fmt.Sprintf("  [%d]", status)
	}
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printOperation(w io.Writer, op apiwire.Operation, status int) error {
	tw := newTab(w)
	fmt.Fprintf(tw, "operation\t%s\n", op.OperationID)
	fmt.Fprintf(tw, "status\t%s", op.Status)
	if op.Reason != "" {
		fmt.Fprintf(tw, " (%s)", op.Reason)
	}
	fmt.Fprintln(tw, answered(status))
	fmt.Fprintf(tw, "action\t%s on %s %s\n", op.Action, op.Target, compact(op.Params))
	fmt.Fprintf(tw, "command\t%s (attempt %d of the operation; all: %s)\n", op.CommandID, op.Attempt, strings.Join(op.CommandIDs, ", "))
	fmt.Fprintf(tw, "result\t%s\n", compact(op.Result))
	fmt.Fprintf(tw, "request_hash\t%s\n", op.RequestHash)
	if op.Compensates != "" {
		fmt.Fprintf(tw, "compensates\t%s\n", op.Compensates)
	}
	if len(op.Compensations) > 0 {
		fmt.Fprintf(tw, "compensations\t%s\n", strings.Join(op.Compensations, ", "))
	}
	fmt.Fprintf(tw, "lease\t%s token %d until %s\n", op.Owner, op.FencingToken, op.LeaseExpiresAt.Format(time.RFC3339))
	fmt.Fprintf(tw, "started / updated\t%s / %s\n", op.StartedAt.Format(time.RFC3339Nano), op.UpdatedAt.Format(time.RFC3339Nano))
	return tw.Flush()
}

func printCommand(w io.Writer, c apiwire.Command) error {
	tw := newTab(w)
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
	if c.ResolvedBy != "" {
		fmt.Fprintf(tw, "resolved_by\t%s\n", c.ResolvedBy)
	}
	if c.SerialSeq > 0 {
		fmt.Fprintf(tw, "serial_seq\t%d\n", c.SerialSeq)
	}
	if c.QueuedBehind != "" {
		fmt.Fprintf(tw, "queued_behind\t%s\n", c.QueuedBehind)
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

func printDevices(w io.Writer, devs []apiwire.Device) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "DEVICE\tONLINE\tCONFIRMED\tSESSION\tDEDUPE\tQUERY\tSKEW\tSTALE PRESENCE\tLAST SEEN")
	for _, d := range devs {
		stale := "0"
		if d.StalePresence > 0 {
			stale = fmt.Sprintf("%d (last session %d)", d.StalePresence, d.LastStaleSession)
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%v\t%v\t%dms\t%s\t%s\n", d.DeviceID, d.Online, d.Confirmed, d.Session,
			d.Capabilities.Dedupe, d.Capabilities.Query, d.ClockSkewMS, stale, stampPtr(d.LastSeenAt))
	}
	return tw.Flush()
}

// printDevice is one device's row, then its commands in flight (oldest
// first) and its serial queue (in the order they will be published).
func printDevice(w io.Writer, d apiwire.DeviceDetail) error {
	if err := printDevices(w, []apiwire.Device{d.Device}); err != nil {
		return err
	}
	for _, l := range []struct {
		name string
		ids  []string
	}{{"in_flight", d.InFlight}, {"queued", d.Queued}} {
		fmt.Fprintf(w, "\n%s: %d\n", l.name, len(l.ids))
		for i, id := range l.ids {
			fmt.Fprintf(w, "  %d. %s\n", i+1, id)
		}
	}
	return nil
}

// window shows a task's maintenance window.
func window(after, before *time.Time) string {
	switch {
	case after == nil && before == nil:
		return "none (runs once approved)"
	case before == nil:
		return "from " + stamp(*after)
	case after == nil:
		return "until " + stamp(*before)
	default:
		return stamp(*after) + " → " + stamp(*before)
	}
}

// printTask: id, status, reason, version, plan hash, requester, window,
// approval; then the steps with their operation ids; then the history.
func printTask(w io.Writer, t apiwire.TaskView, status int) error {
	tw := newTab(w)
	fmt.Fprintf(tw, "task\t%s\n", t.TaskID)
	fmt.Fprintf(tw, "status\t%s%s\n", t.Status, answered(status))
	if t.Reason != "" {
		fmt.Fprintf(tw, "reason\t%s\n", t.Reason)
	}
	fmt.Fprintf(tw, "version\t%d\n", t.Version)
	fmt.Fprintf(tw, "plan hash\t%s\n", t.PlanHash)
	requester := t.Requester
	if requester == "" {
		requester = "- (the author of the version that gets approved)"
	}
	fmt.Fprintf(tw, "requester\t%s\n", requester)
	fmt.Fprintf(tw, "created by\t%s\n", orDash(t.CreatedBy))
	fmt.Fprintf(tw, "window\t%s\n", window(t.ExecuteAfter, t.ExecuteBefore))
	if a := t.Approval; a != nil {
		fmt.Fprintf(tw, "approval\tversion %d by %s at %s\n", a.Version, a.Approver, stamp(a.ApprovedAt))
	} else {
		fmt.Fprintf(tw, "approval\tnone\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nsteps:")
	tw = newTab(w)
	fmt.Fprintln(tw, "  STEP\tACTION\tTARGET\tPARAMS\tOPERATION")
	for _, s := range t.Steps {
		opID := "- (set at approval)"
		if s.OperationID != nil {
			opID = *s.OperationID
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", s.Step.Step, s.Action, s.Target, compact(s.Params), opID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nhistory:")
	tw = newTab(w)
	fmt.Fprintln(tw, "  AT\tPRINCIPAL\tACTION\tFROM → TO\tVERSION\tREASON")
	for _, h := range t.History {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s → %s\t%d\t%s\n", stamp(h.At), orDash(h.Principal), h.Action, orDash(h.From), orDash(h.To), h.Version, h.Reason)
	}
	return tw.Flush()
}

func printApproval(w io.Writer, a apiwire.ApprovalV, status int) error {
	tw := newTab(w)
	fmt.Fprintf(tw, "task\t%s\n", a.TaskID)
	fmt.Fprintf(tw, "approved version\t%d%s\n", a.Version, answered(status))
	fmt.Fprintf(tw, "plan hash\t%s\n", a.PlanHash)
	fmt.Fprintf(tw, "approver\t%s\n", a.Approver)
	fmt.Fprintf(tw, "approved at\t%s\n", stamp(a.ApprovedAt))
	return tw.Flush()
}

// printGrant: id, principal, action, devices, created by and at, revoked at.
func printGrant(w io.Writer, g apiwire.GrantView, status int) error {
	tw := newTab(w)
	fmt.Fprintf(tw, "grant\t%s%s\n", g.GrantID, answered(status))
	fmt.Fprintf(tw, "principal\t%s\n", g.Principal)
	fmt.Fprintf(tw, "action\t%s\n", g.Action)
	fmt.Fprintf(tw, "devices\t%s\n", g.Devices)
	fmt.Fprintf(tw, "created by\t%s\n", orDash(g.CreatedBy))
	fmt.Fprintf(tw, "created at\t%s\n", stamp(g.CreatedAt))
	revoked := "- (live)"
	if g.RevokedAt != nil {
		revoked = stamp(*g.RevokedAt)
	}
	fmt.Fprintf(tw, "revoked at\t%s\n", revoked)
	return tw.Flush()
}

func printGrants(w io.Writer, gs []apiwire.GrantView) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "GRANT\tPRINCIPAL\tACTION\tDEVICES\tCREATED BY\tCREATED AT\tREVOKED AT")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.GrantID, g.Principal, g.Action, g.Devices, orDash(g.CreatedBy),
			stamp(g.CreatedAt), stampPtr(g.RevokedAt))
	}
	return tw.Flush()
}

func compact(m json.RawMessage) string {
	if len(m) == 0 {
		return "null"
	}
	var b bytes.Buffer
	if json.Compact(&b, m) != nil {
		return string(m)
	}
	return b.String()
}
