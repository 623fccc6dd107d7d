// Package verify checks the contract's invariants on any run (the eighth,
// about rollouts, when the run has any; the tenth, about serial commands,
// always), from the
// controller's database (read-only, one snapshot, through store.Audit) and
// the devices' witness files (executions.jsonl and receipts.jsonl, through
// package witness), independently of the code that made the run: the store
// only hands over rows; every judgement is made here. `controller verify`
// prints one verdict line per invariant.
package verify

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// Verdict is one invariant's result.
type Verdict struct {
	N      int
	Name   string
	OK     bool
	Detail string
}

// Config says what to read.
type Config struct {
	DB       string
	StateDir string        // the simulator's --state-dir ("" skips the witness checks)
	Slack    time.Duration // sweep interval + lease ttl, past expires_at
	Now      time.Time
}

// Run checks every invariant.
func Run(ctx context.Context, cfg Config) ([]Verdict, error) {
	if cfg.Now.IsZero() {
		cfg.Now = time.Now()
	}
	var execs []witness.Execution
	var rcpts []witness.PublishedReceipt
	var err error
	if cfg.StateDir != "" {
		if execs, err = witness.ReadExecutions(cfg.StateDir); err != nil {
			return nil, err
		}
		if rcpts, err = witness.ReadReceipts(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	a, err := backend.OpenAudit(ctx, cfg.DB)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	r, err := read(ctx, a)
	if err != nil {
		return nil, err
	}
	vs := []Verdict{
		r.once(execs), r.forward(), r.notStuck(cfg.Now.Add(-cfg.Slack)), r.reflected(rcpts), r.keysKept(), r.fencing(), r.successKept(),
	}
	rs, err := a.Rollouts(ctx)
	if err != nil {
		return nil, err
	}
	if v, ok := r.rollouts(rs); ok {
		vs = append(vs, v)
	}
	serial, err := a.SerialCommands(ctx)
	if err != nil {
		return nil, err
	}
	vs = append(vs, r.serial(serial, execs, rcpts))
	return vs, nil
}

// run is what the checks read from the database, from one snapshot.
type run struct {
	legacy     map[string]bool // devices without dedupe
	events     []domain.Event  // the whole log, in order
	commands   []store.AuditCommand
	operations []store.AuditOperation
}

func read(ctx context.Context, a *store.Audit) (*run, error) {
	r := &run{legacy: map[string]bool{}}
	legacy, err := a.LegacyDevices(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range legacy {
		r.legacy[id] = true
	}
	if r.events, err = a.Events(ctx); err != nil {
		return nil, err
	}
	if r.commands, err = a.Commands(ctx); err != nil {
		return nil, err
	}
	if r.operations, err = a.Operations(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// 1. On dedupe devices, each operation_id is executed at most once.
func (r *run) once(execs []witness.Execution) Verdict {
	per := map[string]int{}
	for _, e := range execs {
		if !r.legacy[e.DeviceID] {
			per[e.OperationID]++
		}
	}
	twice := 0
	for _, n := range per {
		if n > 1 {
			twice++
		}
	}
	return Verdict{1, "each operation executed at most once on dedupe devices", twice == 0,
		fmt.Sprintf("%d executions of %d operations in the witness, %d executed twice", len(execs), len(per), twice)}
}

// 2. No command moves backwards; no terminal state is rewritten: every
// applied event replayed against the fsm tables.
func (r *run) forward() Verdict {
	bad, checked := 0, 0
	var first string
	state := map[string]string{}
	for _, e := range r.events {
		machine, id, from, to := e.Machine, e.EntityID, e.From, e.To
		if e.Refused || (machine != fsm.Command.Name() && machine != fsm.Operation.Name() && machine != fsm.Task.Name()) {
			continue
		}
		key := machine + "/" + id
		checked++
		prev, seen := state[key]
		ok := true
		switch {
		case from == "" && !seen: // the first record
		case seen && from != prev:
			ok = false // the log skipped a state: something moved without a record
		case from == to: // annotations: late outcomes, re-sends, retries asking
		case machine == fsm.Command.Name():
			ok = fsm.Command.Can(fsm.CommandState(from), fsm.CommandState(to))
		case machine == fsm.Operation.Name():
			ok = fsm.Operation.Can(fsm.OperationState(from), fsm.OperationState(to))
		case machine == fsm.Task.Name():
			ok = fsm.Task.Can(fsm.TaskState(from), fsm.TaskState(to))
		}
		if !ok {
			bad++
			if first == "" {
				first = fmt.Sprintf(" (first: %s %s %s→%s)", machine, id, from, to)
			}
		}
		state[key] = to
	}
	// The stored state must be the last one the log reached.
	for _, c := range r.commands {
		if s, ok := state[fsm.Command.Name()+"/"+c.CommandID]; ok && s != string(c.Status) {
			bad++
		}
	}
	return Verdict{2, "no backward move, no terminal state rewritten", bad == 0,
		fmt.Sprintf("%d transitions replayed against the fsm tables, %d illegal%s", checked, bad, first)}
}

// settled: terminal, or parked for a person in needs_attention.
func settled(s fsm.CommandState) bool { return s.Terminal() || s == fsm.CmdNeedsAttention }

// 3. Every command is terminal, or parked in needs_attention, by expires_at
// plus the slack (deadline is now minus the slack).
func (r *run) notStuck(deadline time.Time) Verdict {
	open, stuck := 0, 0
	for _, c := range r.commands {
		if settled(c.Status) {
			continue
		}
		open++
		if c.ExpiresAt.UnixMilli() < deadline.UnixMilli() {
			stuck++
		}
	}
	return Verdict{3, "nothing stuck past expires_at + sweep + lease ttl", stuck == 0,
		fmt.Sprintf("%d commands, %d still open within their deadline, %d stuck past it", len(r.commands), open, stuck)}
}

// 4. Every final receipt a device published is reflected: in the state, or
// as a late outcome (of that command, or of the command asked about).
func (r *run) reflected(rcpts []witness.PublishedReceipt) Verdict {
	cmds := map[string]store.AuditCommand{}
	adopted := map[string]bool{} // commands that ran as another command_id's answer
	for _, c := range r.commands {
		cmds[c.CommandID] = c
		if c.ExecutedAs != "" && (c.Status == fsm.CmdSucceeded || c.Status == fsm.CmdFailed) {
			adopted[c.ExecutedAs] = true
		}
	}
	finals := map[string]bool{}
	missing := 0
	for _, p := range rcpts {
		if !p.Status.Final() || finals[p.CommandID] {
			continue
		}
		finals[p.CommandID] = true
		c, ok := cmds[p.CommandID]
		done := ok && (c.Status == fsm.CmdSucceeded || c.Status == fsm.CmdFailed || c.LateOutcome != "" || c.Status == fsm.CmdNeedsAttention)
		if !done && !adopted[p.CommandID] {
			missing++
		}
	}
	return Verdict{4, "every final receipt a device published is reflected", missing == 0,
		fmt.Sprintf("%d commands with a published final receipt, %d not reflected in state or late outcome", len(finals), missing)}
}

// 5. A reused key never changed anything: every command of an operation
// carries the operation's own action, target and params.
func (r *run) keysKept() Verdict {
	ops := map[string]store.AuditOperation{}
	for _, o := range r.operations {
		ops[o.OperationID] = o
	}
	diff := 0
	for _, c := range r.commands {
		if o, ok := ops[c.OperationID]; ok && (c.Action != o.Action || c.DeviceID != o.Target || !bytes.Equal(c.Params, o.Params)) {
			diff++
		}
	}
	return Verdict{5, "a reused key with other params changed nothing", diff == 0,
		fmt.Sprintf("%d operations, %d commands differing from their operation's request", len(r.operations), diff)}
}

// 6. No decision carrying a stale fencing token was applied: per entity,
// the tokens of applied decisions never go down.
func (r *run) fencing() Verdict {
	opOf := map[string]string{}
	for _, c := range r.commands {
		opOf[c.CommandID] = c.OperationID
	}
	maxTok := map[string]int64{}
	newest := map[string]domain.Event{} // the event that set maxTok
	applied, stale, refused := 0, 0, 0
	first := ""
	for _, e := range r.events {
		if e.Refused {
			if e.Reason == store.ReasonFenced {
				refused++
			}
			continue
		}
		if e.FencingToken <= 0 {
			continue
		}
		op := e.EntityID
		if e.Machine == fsm.Command.Name() {
			op = opOf[e.EntityID]
		}
		applied++
		if e.FencingToken < maxTok[op] {
			if stale == 0 {
				first = fmt.Sprintf("; the first: %s, %s (event %d, %s %s %s→%s, instance %s) after %s (event %d, %s %s %s→%s, instance %s)",
					op, tokenAt(e), e.ID, e.Machine, e.EntityID, e.From, e.To, e.Instance,
					tokenAt(newest[op]), newest[op].ID, newest[op].Machine, newest[op].EntityID, newest[op].From, newest[op].To, newest[op].Instance)
			}
			stale++
		}
		if e.FencingToken > maxTok[op] {
			maxTok[op], newest[op] = e.FencingToken, e
		}
	}
	return Verdict{6, "no decision with a stale fencing token applied", stale == 0,
		fmt.Sprintf("%d fenced decisions applied, %d with a token older than one already used, %d refused as fenced%s", applied, stale, refused, first)}
}

// tokenAt names an event's token and time, for a verdict's detail.
func tokenAt(e domain.Event) string {
	return fmt.Sprintf("token %d at %s", e.FencingToken, e.At.UTC().Format("15:04:05.000"))
}

// 7. Nothing reported succeeded is lost: every operation the log shows
// reaching succeeded is still succeeded.
func (r *run) successKept() Verdict {
	status := map[string]fsm.OperationState{}
	succeeded := 0
	for _, o := range r.operations {
		status[o.OperationID] = o.Status
		if o.Status == fsm.OpSucceeded {
			succeeded++
		}
	}
	lost := map[string]bool{}
	for _, e := range r.events {
		if e.Refused || e.Machine != fsm.Operation.Name() || e.To != string(fsm.OpSucceeded) {
			continue
		}
		if s, ok := status[e.EntityID]; ok && s != fsm.OpSucceeded {
			lost[e.EntityID] = true
		}
	}
	return Verdict{7, "nothing reported succeeded is lost", len(lost) == 0,
		fmt.Sprintf("%d operations succeeded, %d that once succeeded and are not now", succeeded, len(lost))}
}

// Print writes one line per verdict and returns whether all passed.
func Print(w io.Writer, vs []Verdict) bool {
	sort.Slice(vs, func(i, j int) bool { return vs[i].N < vs[j].N })
	all := true
	for _, x := range vs {
		mark := "PASS"
		if !x.OK {
			mark, all = "FAIL", false
		}
		fmt.Fprintf(w, "invariant %d %s: %s: %s\n", x.N, mark, x.Name, x.Detail)
	}
	return all
}
