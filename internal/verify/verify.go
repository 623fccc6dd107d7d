// Package verify checks the contract's seven invariants on any run, from the
// controller's database (read-only) and the devices' witness files
// (executions.jsonl and receipts.jsonl), independently of the code that
// made the run. `controller verify` prints one verdict line per invariant.
package verify

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"sort"
	"time"

	_ "github.com/mattn/go-sqlite3" // the sqlite3 driver

	"github.com/fleetctl/fleetctl/internal/fsm"
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
	db, err := sql.Open("sqlite3", "file:"+cfg.DB+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if cfg.Now.IsZero() {
		cfg.Now = time.Now()
	}
	var execs []witness.Execution
	var rcpts []witness.PublishedReceipt
	if cfg.StateDir != "" {
		if execs, err = witness.ReadExecutions(cfg.StateDir); err != nil {
			return nil, err
		}
		if rcpts, err = witness.ReadReceipts(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	v := &verifier{ctx: ctx, db: db, cfg: cfg}
	out := []Verdict{
		v.once(execs), v.forward(), v.notStuck(), v.reflected(rcpts), v.keysKept(), v.fencing(), v.successKept(),
	}
	return out, v.err
}

type verifier struct {
	ctx context.Context
	db  *sql.DB
	cfg Config
	err error
}

func (v *verifier) rows(q string, args ...any) [][]any {
	if v.err != nil {
		return nil
	}
	rs, err := v.db.QueryContext(v.ctx, q, args...)
	if err != nil {
		v.err = err
		return nil
	}
	defer rs.Close()
	cols, _ := rs.Columns()
	var out [][]any
	for rs.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			v.err = err
			return nil
		}
		for i, x := range vals {
			if b, ok := x.([]byte); ok {
				vals[i] = string(b)
			}
		}
		out = append(out, vals)
	}
	if err := rs.Err(); err != nil {
		v.err = err
	}
	return out
}

// 1. On dedupe devices, each operation_id is executed at most once.
func (v *verifier) once(execs []witness.Execution) Verdict {
	legacy := map[string]bool{}
	for _, r := range v.rows(`SELECT device_id FROM devices WHERE seen = 1 AND dedupe = 0`) {
		legacy[r[0].(string)] = true
	}
	per := map[string]int{}
	for _, e := range execs {
		if !legacy[e.DeviceID] {
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
func (v *verifier) forward() Verdict {
	bad, checked := 0, 0
	var first string
	state := map[string]string{}
	for _, r := range v.rows(`SELECT machine, entity_id, from_state, to_state FROM events WHERE refused = 0 AND machine IN ('command','operation','task') ORDER BY id`) {
		machine, id, from, to := r[0].(string), r[1].(string), r[2].(string), r[3].(string)
		key := machine + "/" + id
		checked++
		prev, seen := state[key]
		ok := true
		switch {
		case from == "" && !seen: // the first record
		case seen && from != prev:
			ok = false // the log skipped a state: something moved without a record
		case from == to: // annotations: late outcomes, re-sends, retries asking
		case machine == "command":
			ok = fsm.Command.Can(fsm.CommandState(from), fsm.CommandState(to))
		case machine == "operation":
			ok = fsm.Operation.Can(fsm.OperationState(from), fsm.OperationState(to))
		case machine == "task":
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
	for _, r := range v.rows(`SELECT command_id, status FROM commands`) {
		if s, ok := state["command/"+r[0].(string)]; ok && s != r[1].(string) {
			bad++
		}
	}
	return Verdict{2, "no backward move, no terminal state rewritten", bad == 0,
		fmt.Sprintf("%d transitions replayed against the fsm tables, %d illegal%s", checked, bad, first)}
}

// 3. Every command is terminal, or parked in needs_attention, by expires_at
// plus the slack.
func (v *verifier) notStuck() Verdict {
	deadline := v.cfg.Now.Add(-v.cfg.Slack).UnixMilli()
	stuck := v.rows(`SELECT command_id FROM commands WHERE status NOT IN ('succeeded','failed','timeout','cancelled','needs_attention') AND expires_at < ?`, deadline)
	open := v.rows(`SELECT COUNT(*) FROM commands WHERE status NOT IN ('succeeded','failed','timeout','cancelled','needs_attention')`)
	total := v.rows(`SELECT COUNT(*) FROM commands`)
	n := 0
	if len(total) > 0 {
		n = int(total[0][0].(int64))
	}
	o := 0
	if len(open) > 0 {
		o = int(open[0][0].(int64))
	}
	return Verdict{3, "nothing stuck past expires_at + sweep + lease ttl", len(stuck) == 0,
		fmt.Sprintf("%d commands, %d still open within their deadline, %d stuck past it", n, o, len(stuck))}
}

// 4. Every final receipt a device published is reflected: in the state, or
// as a late outcome (of that command, or of the command asked about).
func (v *verifier) reflected(rcpts []witness.PublishedReceipt) Verdict {
	type cmd struct{ status, late, op string }
	cmds := map[string]cmd{}
	for _, r := range v.rows(`SELECT command_id, status, late_outcome, operation_id FROM commands`) {
		cmds[r[0].(string)] = cmd{r[1].(string), r[2].(string), r[3].(string)}
	}
	adopted := map[string]bool{} // commands that ran as another command_id's answer
	for _, r := range v.rows(`SELECT executed_as FROM commands WHERE executed_as != '' AND status IN ('succeeded','failed')`) {
		adopted[r[0].(string)] = true
	}
	finals := map[string]bool{}
	missing := 0
	for _, r := range rcpts {
		if !r.Status.Final() || finals[r.CommandID] {
			continue
		}
		finals[r.CommandID] = true
		c, ok := cmds[r.CommandID]
		done := ok && (c.status == "succeeded" || c.status == "failed" || c.late != "" || c.status == "needs_attention")
		if !done && !adopted[r.CommandID] {
			missing++
		}
	}
	return Verdict{4, "every final receipt a device published is reflected", missing == 0,
		fmt.Sprintf("%d commands with a published final receipt, %d not reflected in state or late outcome", len(finals), missing)}
}

// 5. A reused key never changed anything: every command of an operation
// carries the operation's own action, target and params.
func (v *verifier) keysKept() Verdict {
	diff := v.rows(`SELECT c.command_id FROM commands c JOIN operations o USING (operation_id)
		WHERE c.action != o.action OR c.device_id != o.target OR c.params != o.params`)
	ops := v.rows(`SELECT COUNT(*) FROM operations`)
	n := int64(0)
	if len(ops) > 0 {
		n = ops[0][0].(int64)
	}
	return Verdict{5, "a reused key with other params changed nothing", len(diff) == 0,
		fmt.Sprintf("%d operations, %d commands differing from their operation's request", n, len(diff))}
}

// 6. No decision carrying a stale fencing token was applied: per entity,
// the tokens of applied decisions never go down.
func (v *verifier) fencing() Verdict {
	maxTok := map[string]int64{}
	opOf := map[string]string{}
	for _, r := range v.rows(`SELECT command_id, operation_id FROM commands`) {
		opOf[r[0].(string)] = r[1].(string)
	}
	applied, stale := 0, 0
	refused := v.rows(`SELECT COUNT(*) FROM events WHERE refused = 1 AND reason = 'fenced'`)
	for _, r := range v.rows(`SELECT machine, entity_id, fencing_token FROM events WHERE refused = 0 AND fencing_token > 0 ORDER BY id`) {
		machine, id, tok := r[0].(string), r[1].(string), r[2].(int64)
		op := id
		if machine == "command" {
			op = opOf[id]
		}
		if machine == "lease" && tok == 0 {
			continue
		}
		applied++
		if tok < maxTok[op] {
			stale++
		}
		if tok > maxTok[op] {
			maxTok[op] = tok
		}
	}
	nref := int64(0)
	if len(refused) > 0 {
		nref = refused[0][0].(int64)
	}
	return Verdict{6, "no decision with a stale fencing token applied", stale == 0,
		fmt.Sprintf("%d fenced decisions applied, %d with a token older than one already used, %d refused as fenced", applied, stale, nref)}
}

// 7. Nothing reported succeeded is lost: every operation the log shows
// reaching succeeded is still succeeded.
func (v *verifier) successKept() Verdict {
	lost := v.rows(`SELECT DISTINCT e.entity_id FROM events e JOIN operations o ON o.operation_id = e.entity_id
		WHERE e.machine = 'operation' AND e.to_state = 'succeeded' AND e.refused = 0 AND o.status != 'succeeded'`)
	ok := v.rows(`SELECT COUNT(*) FROM operations WHERE status = 'succeeded'`)
	n := int64(0)
	if len(ok) > 0 {
		n = ok[0][0].(int64)
	}
	return Verdict{7, "nothing reported succeeded is lost", len(lost) == 0,
		fmt.Sprintf("%d operations succeeded, %d that once succeeded and are not now", n, len(lost))}
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
