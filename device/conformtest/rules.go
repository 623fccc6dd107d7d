package conformtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Check runs every rule against the device, in the order of Rules, and
// returns their results. It fails only when the suite cannot run at all
// (bad options, no broker).
func Check(ctx context.Context, o Options) ([]Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.TopicRoot == "" {
		o.TopicRoot = wire.DefaultTopicRoot
	}
	if o.Action == "" {
		o.Action = DefaultAction
	}
	if len(o.Params) == 0 {
		o.Params = json.RawMessage(`{}`)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	run := "conform-" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
	w, err := dial(ctx, o, "controller-"+run)
	if err != nil {
		return nil, err
	}
	defer w.close()
	s := &suite{o: o, w: w, run: run, settle: min(max(o.Timeout/10, 100*time.Millisecond), 2*time.Second),
		caps: wire.Capabilities{Dedupe: true, Query: true}}
	steps := []func(context.Context) Result{
		s.presenceBirth, s.receiptsOrdered, s.dedupeCommandID, s.dedupeOperationID,
		s.dedupeBeforeExpiry, s.expiredRejected, s.queryKnown, s.queryByOperation,
		s.queryUnknown, s.malformedIgnored, s.presenceSessionIncreases, s.dedupeSurvivesRestart,
	}
	results := make([]Result, 0, len(steps))
	for i, step := range steps {
		if err := ctx.Err(); err != nil {
			return results, err
		}
		r := step(ctx)
		r.Rule = Rules[i]
		if r.Outcome == Fail {
			if lost := w.lostErr(); lost != nil {
				r.Detail += fmt.Sprintf(" (the suite's own broker connection was lost: %v)", lost)
			}
		}
		o.Logf("%s", r)
		results = append(results, r)
		if i == 0 {
			s.sendE()
		}
	}
	return results, nil
}

// suite is one run against one device.
type suite struct {
	o      Options
	w      *watcher
	run    string
	settle time.Duration

	caps       wire.Capabilities // from the birth; both true until one is seen
	maxSession int64             // the largest session of any presence seen
	hadSession bool

	a, e, m    *command // receipts-ordered's, dedupe-before-expiry's, malformed-ignored's
	eSentAt    time.Time
	restarted  bool
	restartErr string
}

// command is one the suite sent, with what it learnt: the device's latest
// receipt for it, once final.
type command struct {
	wire.Command
	latest *seen // its final receipt
}

// refresh makes c.latest the last receipt the device sent for c (not an
// answer to a query): after a rule caught a second run, the next rules
// judge against what the device last said, so one flaw fails one rule.
func (s *suite) refresh(c *command) {
	if c == nil {
		return
	}
	rs := receipts(s.w.since(0), forCommand(c.CommandID))
	for j := len(rs) - 1; j >= 0; j-- {
		if rs[j].receipt.Status.Valid() && rs[j].receipt.Status != wire.ReceiptUnknown {
			c.latest = &rs[j]
			return
		}
	}
}

// ran reports whether the command ran on the device (a final receipt other
// than rejected).
func (c *command) ran() bool {
	return c != nil && c.latest != nil && c.latest.receipt.Status != wire.ReceiptRejected
}

func pass() Result           { return Result{Outcome: Pass} }
func skip(why string) Result { return Result{Outcome: Skip, Detail: why} }
func fail(format string, args ...any) Result {
	return Result{Outcome: Fail, Detail: fmt.Sprintf(format, args...)}
}
func (s *suite) id(kind, letter string) string { return kind + "-" + s.run + "-" + letter }

// newCommand makes a command of the suite's action, valid for ttl.
func (s *suite) newCommand(letter, opLetter string, ttl time.Duration) *command {
	now := time.Now().UTC().Truncate(time.Millisecond)
	return &command{Command: wire.Command{
		CommandID: s.id("c", letter), OperationID: s.id("op", opLetter), Action: s.o.Action,
		Params: s.o.Params, IssuedAt: now, ExpiresAt: now.Add(ttl), Attempt: 1,
	}}
}

// send publishes c (QoS 0 to a dedupe:false device, as the controller does).
func (s *suite) send(c wire.Command) error {
	b, err := wire.Encode(c)
	if err != nil {
		return err
	}
	var qos byte = 1
	if !s.caps.Dedupe {
		qos = 0
	}
	s.o.Logf("conformtest: send %s", b)
	return s.w.publish(wire.KindCommands, qos, b)
}

func (s *suite) query(q wire.Query) error {
	b, err := wire.Encode(q)
	if err != nil {
		return err
	}
	s.o.Logf("conformtest: query %s", b)
	return s.w.publish(wire.KindQueries, 1, b)
}

// describe says what was sent, for FAIL lines.
func describe(c wire.Command) string {
	return fmt.Sprintf("command %s (operation %s, action %s, expires_at %s, attempt %d)",
		c.CommandID, c.OperationID, c.Action, c.ExpiresAt.Format(time.RFC3339Nano), c.Attempt)
}

// noteSessions keeps the largest session of the presence messages in ms.
func (s *suite) noteSessions(ms []seen) {
	for _, p := range presences(ms) {
		if p.perr == nil && p.presence.Session != nil && (!s.hadSession || *p.presence.Session > s.maxSession) {
			s.maxSession, s.hadSession = *p.presence.Session, true
		}
	}
}

// runCommand sends c and waits for its final receipt, each wait up to the
// timeout (a receipt of c restarts it), then the settling time. It returns
// c's receipts seen from the send on, and sets c.latest to the final one.
func (s *suite) runCommand(ctx context.Context, c *command) ([]seen, error) {
	i := s.w.mark()
	if err := s.send(c.Command); err != nil {
		return nil, err
	}
	own := forCommand(c.CommandID)
	n := 0
	for {
		final := false
		progressed := s.w.waitFor(ctx, i, s.o.Timeout, func(ms []seen) bool {
			rs := receipts(ms, own)
			for _, r := range rs {
				if r.receipt.Status.Final() {
					final = true
				}
			}
			return final || len(rs) > n
		})
		if !progressed {
			break
		}
		if final {
			pause(ctx, s.settle)
			break
		}
		n = len(receipts(s.w.since(i), own))
	}
	rs := receipts(s.w.since(i), own)
	for j := len(rs) - 1; j >= 0; j-- {
		if rs[j].receipt.Status.Final() {
			c.latest = &rs[j]
			break
		}
	}
	return rs, nil
}

// others lists the receipts in ms that keep refuses: shown in FAIL lines
// about a missing answer, since a wrong id is a common cause.
func others(ms []seen, keep func(wire.Receipt) bool) string {
	var out []seen
	for _, m := range ms {
		if m.kind == wire.KindReceipts && (m.rerr != nil || !keep(m.receipt)) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "; other messages on " + "the receipts topic meanwhile: " + show(out)
}

// presence-birth: a retained birth with online, session, capabilities.
func (s *suite) presenceBirth(ctx context.Context) Result {
	// The retained message comes right after the SUBACK; give it a moment.
	s.w.waitFor(ctx, 0, min(s.o.Timeout, time.Second), func(ms []seen) bool { return len(presences(ms)) > 0 })
	ms := s.w.since(0)
	s.noteSessions(ms)
	first := presences(ms)
	if len(first) > 0 && first[0].retained && first[0].perr == nil && first[0].presence.birth() {
		return s.judgeBirth(first[0])
	}
	// Not online now: wait for a birth, then read the retained message again.
	var birth *seen
	ok := s.w.waitFor(ctx, 0, s.o.Timeout, func(ms []seen) bool {
		for _, p := range presences(ms) {
			if p.perr == nil && p.presence.birth() {
				birth = &p
				return true
			}
		}
		return false
	})
	retained := "no retained message"
	if len(first) > 0 && first[0].retained {
		retained = "the retained message " + show(first[:1])
	}
	if !ok {
		return fail("no birth (online:true) on %s within %s: a new subscriber found %s; saw %s",
			s.w.topics[wire.KindPresence], s.o.Timeout, retained, show(presences(s.w.since(0))))
	}
	s.noteSessions(s.w.since(0))
	i := s.w.mark()
	if err := s.w.resubscribe(); err != nil {
		return fail("could not subscribe again to read the retained presence: %v", err)
	}
	var again *seen
	s.w.waitFor(ctx, i, min(s.o.Timeout, 2*time.Second), func(ms []seen) bool {
		for _, p := range presences(ms) {
			if p.retained {
				again = &p
				return true
			}
		}
		return false
	})
	switch {
	case again == nil:
		return fail("the birth %s is not retained: a new subscriber to %s gets no retained message", show([]seen{*birth}), s.w.topics[wire.KindPresence])
	case again.perr != nil || !again.presence.birth():
		return fail("the birth %s is not retained: a new subscriber to %s gets %s", show([]seen{*birth}), s.w.topics[wire.KindPresence], show([]seen{*again}))
	}
	return s.judgeBirth(*again)
}

// judgeBirth checks a retained birth's members and keeps its capabilities.
func (s *suite) judgeBirth(b seen) Result {
	p := b.presence
	var missing []string
	if p.Session == nil {
		missing = append(missing, "session")
	}
	if p.Capabilities == nil || p.Capabilities.Dedupe == nil || p.Capabilities.Query == nil {
		missing = append(missing, "capabilities {dedupe, query}")
	} else {
		s.caps = wire.Capabilities{Dedupe: *p.Capabilities.Dedupe, Query: *p.Capabilities.Query}
	}
	if len(missing) > 0 {
		return fail("the retained birth %s lacks %s", show([]seen{b}), strings.Join(missing, " and "))
	}
	if *p.Session < 0 || *p.Session > wire.MaxSafeInteger {
		return fail("the retained birth %s has session %d: want 0 to 2^53-1", show([]seen{b}), *p.Session)
	}
	return pass()
}

// sendE sends dedupe-before-expiry's command right after presence-birth,
// so that its expiry passes while the next rules run.
func (s *suite) sendE() {
	if !s.caps.Dedupe {
		return
	}
	s.e = s.newCommand("e", "e", max(s.o.Timeout/2, time.Second))
	s.eSentAt = time.Now()
	if err := s.send(s.e.Command); err != nil {
		s.e = nil
	}
}

var statusRank = map[wire.ReceiptStatus]int{
	wire.ReceiptReceived: 1, wire.ReceiptExecuting: 2,
	wire.ReceiptSucceeded: 3, wire.ReceiptFailed: 3, wire.ReceiptRejected: 3,
}

// receipts-ordered: command_id and operation_id, seq strictly increasing
// from 1, ending in a final status.
func (s *suite) receiptsOrdered(ctx context.Context) Result {
	s.a = s.newCommand("a", "a", time.Hour)
	i := s.w.mark()
	rs, err := s.runCommand(ctx, s.a)
	if err != nil {
		return fail("could not send %s: %v", describe(s.a.Command), err)
	}
	sent := "sent " + describe(s.a.Command)
	switch {
	case len(rs) == 0:
		return fail("%s; no receipt for it on %s within %s%s", sent, s.w.topics[wire.KindReceipts], s.o.Timeout,
			others(s.w.since(i), forCommand(s.a.CommandID)))
	case s.a.latest == nil:
		return fail("%s; saw %s and no final receipt (succeeded, failed, rejected) within %s of the last", sent, show(rs), s.o.Timeout)
	}
	prevSeq, prevRank, finals := 0, 0, 0
	for j, r := range rs {
		rc := r.receipt
		if err := rc.Validate(); err != nil {
			return fail("%s; saw %s: receipt %d is not valid: %v", sent, show(rs), j+1, err)
		}
		switch {
		case rc.OperationID != s.a.OperationID:
			return fail("%s; saw %s: receipt %d carries operation_id %q, want %q", sent, show(rs), j+1, rc.OperationID, s.a.OperationID)
		case rc.Status == wire.ReceiptUnknown:
			return fail("%s; saw %s: unknown is only an answer to a query", sent, show(rs))
		case j == 0 && rc.Seq != 1:
			return fail("%s; saw %s: the first receipt has seq %d, want 1", sent, show(rs), rc.Seq)
		case rc.Seq <= prevSeq:
			return fail("%s; saw %s: seq %d after seq %d, want strictly increasing", sent, show(rs), rc.Seq, prevSeq)
		case statusRank[rc.Status] < prevRank || statusRank[rc.Status] == prevRank && prevRank < 3:
			return fail("%s; saw %s: %s after %s, want received, executing, then one final status", sent, show(rs), rc.Status, rs[j-1].receipt.Status)
		}
		if rc.Status.Final() {
			finals++
		}
		prevSeq, prevRank = rc.Seq, statusRank[rc.Status]
	}
	if finals > 1 || !rs[len(rs)-1].receipt.Status.Final() {
		return fail("%s; saw %s: receipts after the final one", sent, show(rs))
	}
	return pass()
}

// needRan is the FAIL for a rule that needs a command that ran.
func needRan(what string, c *command) Result {
	switch {
	case c == nil || c.latest == nil:
		return fail("needs a command that ran, and %s got no final receipt (see its rule)", what)
	default:
		return fail("needs a command that ran, and %s was rejected: %s (choose an action the device runs with --action and --params)",
			what, show([]seen{*c.latest}))
	}
}

// judgeRepeat checks the answers to a repeat of c (or to another command of
// its operation, other): every receipt about c or other must be c's latest
// receipt, unchanged, and at least one must come.
func judgeRepeat(sent string, c *command, other string, rs []seen, timeout time.Duration) Result {
	want := c.latest.receipt
	wantShow := show([]seen{*c.latest})
	if len(rs) == 0 {
		return fail("%s; no receipt within %s, want the latest receipt of %s again: %s", sent, timeout, c.CommandID, wantShow)
	}
	for _, r := range rs {
		got := r.receipt
		switch {
		case other != "" && got.CommandID == other:
			if got.Status == wire.ReceiptRejected {
				return fail("%s; saw %s: answered for %s, want the latest receipt of %s, which took the operation, carrying its command_id: %s",
					sent, show(rs), other, c.CommandID, wantShow)
			}
			return fail("%s; saw %s: it ran, a second command of operation %s (want the latest receipt of %s: %s)",
				sent, show(rs), c.OperationID, c.CommandID, wantShow)
		case got.Status.Progress():
			return fail("%s; saw %s: new %s receipts for a command that had ended, so it ran again (want its latest receipt: %s)",
				sent, show(rs), got.Status, wantShow)
		case got.Seq > want.Seq:
			return fail("%s; saw %s: seq %d after its final seq %d, so it ran again (want its latest receipt: %s)",
				sent, show(rs), got.Seq, want.Seq, wantShow)
		case got.Status == wire.ReceiptRejected && got.Error == "expired" && want.Status != wire.ReceiptRejected:
			return fail("%s; saw %s: rejected as expired, so the expiry check came before the dedupe check (want its latest receipt: %s)",
				sent, show(rs), wantShow)
		}
		if why := differs(got, want); why != "" {
			return fail("%s; saw %s: %s (want its latest receipt unchanged: %s)", sent, show(rs), why, wantShow)
		}
	}
	return pass()
}

// differs names what of got is not want: command_id, status, seq, result
// (as JSON values), error.
func differs(got, want wire.Receipt) string {
	switch {
	case got.CommandID != want.CommandID:
		return fmt.Sprintf("command_id %q, want %q", got.CommandID, want.CommandID)
	case got.Status != want.Status:
		return fmt.Sprintf("status %s, want %s", got.Status, want.Status)
	case got.Seq != want.Seq:
		return fmt.Sprintf("seq %d, want %d", got.Seq, want.Seq)
	case !sameJSON(got.Result, want.Result):
		return fmt.Sprintf("another result %s, want %s: it ran again", orNone(got.Result), orNone(want.Result))
	case got.Error != want.Error:
		return fmt.Sprintf("error %q, want %q", got.Error, want.Error)
	}
	return ""
}

func orNone(b json.RawMessage) string {
	if len(b) == 0 {
		return "(none)"
	}
	return shorten(string(b), 200)
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if len(a) == 0 || string(a) == "null" {
		return len(b) == 0 || string(b) == "null"
	}
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	return reflect.DeepEqual(x, y)
}

// repeat sends c (a repeat, or a new command_id of an operation that ran)
// and returns the receipts that came about c or the commands named in
// watch: waiting for a first one, then the settling time.
func (s *suite) repeat(ctx context.Context, c wire.Command, watch ...string) ([]seen, error) {
	keep := forCommand(append([]string{c.CommandID}, watch...)...)
	i := s.w.mark()
	if err := s.send(c); err != nil {
		return nil, err
	}
	if s.w.waitFor(ctx, i, s.o.Timeout, func(ms []seen) bool { return len(receipts(ms, keep)) > 0 }) {
		pause(ctx, s.settle)
	}
	return receipts(s.w.since(i), keep), nil
}

const skipNoDedupe = "the device declares dedupe:false (it may run a repeated command again)"

// dedupe-command-id: the same command again is answered with its latest receipt.
func (s *suite) dedupeCommandID(ctx context.Context) Result {
	if !s.caps.Dedupe {
		return skip(skipNoDedupe)
	}
	s.refresh(s.a)
	if !s.a.ran() {
		return needRan(RuleReceiptsOrdered+"'s command "+s.a.CommandID, s.a)
	}
	again := s.a.Command
	again.Attempt = 2
	rs, err := s.repeat(ctx, again)
	if err != nil {
		return fail("could not send: %v", err)
	}
	return judgeRepeat("sent "+describe(again)+" again, its other fields unchanged", s.a, "", rs, s.o.Timeout)
}

// dedupe-operation-id: a new command_id of an operation that ran.
func (s *suite) dedupeOperationID(ctx context.Context) Result {
	if !s.caps.Dedupe {
		return skip(skipNoDedupe)
	}
	s.refresh(s.a)
	if !s.a.ran() {
		return needRan(RuleReceiptsOrdered+"'s command "+s.a.CommandID, s.a)
	}
	b := s.newCommand("b", "a", time.Hour).Command
	rs, err := s.repeat(ctx, b, s.a.CommandID)
	if err != nil {
		return fail("could not send: %v", err)
	}
	return judgeRepeat("sent "+describe(b)+", a new command_id of an operation that ran as "+s.a.CommandID, s.a, b.CommandID, rs, s.o.Timeout)
}

// dedupe-before-expiry: a repeat after expires_at gets the latest receipt.
func (s *suite) dedupeBeforeExpiry(ctx context.Context) Result {
	if !s.caps.Dedupe {
		return skip(skipNoDedupe)
	}
	if s.e == nil {
		return fail("could not send its command after the birth")
	}
	own := forCommand(s.e.CommandID)
	s.w.waitFor(ctx, 0, s.o.Timeout, func(ms []seen) bool {
		for _, r := range receipts(ms, own) {
			if r.receipt.Status.Final() {
				return true
			}
		}
		return false
	})
	rs := receipts(s.w.since(0), own)
	for j := len(rs) - 1; j >= 0; j-- {
		if rs[j].receipt.Status.Final() {
			s.e.latest = &rs[j]
			break
		}
	}
	sent := fmt.Sprintf("sent %s at %s", describe(s.e.Command), s.eSentAt.UTC().Format(time.RFC3339Nano))
	switch {
	case s.e.latest == nil:
		return fail("%s; saw %s and no final receipt by now", sent, show(rs))
	case s.e.latest.receipt.Status == wire.ReceiptRejected && s.e.latest.receipt.Error == "expired":
		return fail("%s; saw %s: rejected as expired on first sight, so the device's clock runs ahead of the suite's by more than %s, or it misreads expires_at; cannot check the repeat",
			sent, show(rs), s.e.ExpiresAt.Sub(s.eSentAt).Round(time.Millisecond))
	case !s.e.ran():
		return needRan("the command "+s.e.CommandID, s.e)
	}
	t := time.NewTimer(time.Until(s.e.ExpiresAt.Add(time.Second)))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return fail("cancelled")
	}
	again := s.e.Command
	again.Attempt = 2
	sentAt := time.Now() // repeat returns after its settling time
	got, err := s.repeat(ctx, again)
	if err != nil {
		return fail("could not send: %v", err)
	}
	return judgeRepeat(fmt.Sprintf("it ran; sent %s again at %s, after its expires_at",
		again.CommandID, sentAt.UTC().Format(time.RFC3339Nano)), s.e, "", got, s.o.Timeout)
}

// expired-rejected: a never-seen expired command gets rejected/expired.
func (s *suite) expiredRejected(ctx context.Context) Result {
	x := s.newCommand("x", "x", time.Hour)
	x.IssuedAt = x.IssuedAt.Add(-2 * time.Hour)
	x.ExpiresAt = x.IssuedAt.Add(time.Hour)
	i := s.w.mark()
	rs, err := s.runCommand(ctx, x)
	if err != nil {
		return fail("could not send: %v", err)
	}
	sent := "sent " + describe(x.Command) + ", expired an hour ago"
	for _, r := range rs {
		switch r.receipt.Status {
		case wire.ReceiptExecuting, wire.ReceiptSucceeded, wire.ReceiptFailed:
			return fail("%s; saw %s: it ran (want rejected with error expired)", sent, show(rs))
		}
	}
	switch {
	case x.latest == nil:
		return fail("%s; saw %s and no final receipt within %s (want rejected with error expired)%s",
			sent, show(rs), s.o.Timeout, others(s.w.since(i), forCommand(x.CommandID)))
	case x.latest.receipt.Error != "expired":
		return fail("%s; saw %s: error %q, want expired", sent, show(rs), x.latest.receipt.Error)
	}
	return pass()
}

const skipNoQuery = "the device declares query:false (it does not answer queries)"

// ask publishes q and returns the answers to it, or the receipts of the
// asked command that forgot the query_id; waiting for a first answer, then
// the settling time.
func (s *suite) ask(ctx context.Context, q wire.Query, alsoIDs ...string) (answers, stray []seen, err error) {
	i := s.w.mark()
	if err := s.query(q); err != nil {
		return nil, nil, err
	}
	strayKeep := forCommand(append([]string{q.CommandID}, alsoIDs...)...)
	if s.w.waitFor(ctx, i, s.o.Timeout, func(ms []seen) bool {
		return len(receipts(ms, forQuery(q.QueryID))) > 0 || len(receipts(ms, strayKeep)) > 0
	}) {
		pause(ctx, s.settle)
	}
	ms := s.w.since(i)
	return receipts(ms, forQuery(q.QueryID)), receipts(ms, strayKeep), nil
}

// judgeAnswer checks the answers to a query whose right answer is want.
func (s *suite) judgeAnswer(sent string, q wire.Query, want wire.Receipt, answers, stray []seen) Result {
	if len(answers) == 0 {
		if len(stray) > 0 {
			return fail("%s; saw %s: no query_id %q in the answer", sent, show(stray), q.QueryID)
		}
		return fail("%s; no answer carrying query_id %s within %s", sent, q.QueryID, s.o.Timeout)
	}
	for _, a := range answers {
		got := a.receipt
		if got.Status == wire.ReceiptUnknown && want.Status != wire.ReceiptUnknown {
			return fail("%s; saw %s: unknown, want %s seq %d carrying command_id %s", sent, show(answers), want.Status, want.Seq, want.CommandID)
		}
		if why := differs(got, want); why != "" {
			return fail("%s; saw %s: %s", sent, show(answers), why)
		}
	}
	return pass()
}

// query-known: a Query for a command that ran gets its current status.
func (s *suite) queryKnown(ctx context.Context) Result {
	if !s.caps.Query {
		return skip(skipNoQuery)
	}
	s.refresh(s.a)
	if !s.a.ran() {
		return needRan(RuleReceiptsOrdered+"'s command "+s.a.CommandID, s.a)
	}
	q := wire.Query{QueryID: s.id("q", "k"), CommandID: s.a.CommandID, OperationID: s.a.OperationID}
	answers, stray, err := s.ask(ctx, q)
	if err != nil {
		return fail("could not send: %v", err)
	}
	return s.judgeAnswer(fmt.Sprintf("asked about %s (query %s), which ended %s seq %d", q.CommandID, q.QueryID,
		s.a.latest.receipt.Status, s.a.latest.receipt.Seq), q, s.a.latest.receipt, answers, stray)
}

// query-by-operation: a Query for an unseen command_id of an operation
// that ran gets that command's status, with its command_id.
func (s *suite) queryByOperation(ctx context.Context) Result {
	switch {
	case !s.caps.Query:
		return skip(skipNoQuery)
	case !s.caps.Dedupe:
		return skip("the device declares dedupe:false (it keeps no record of operations)")
	}
	s.refresh(s.a)
	switch {
	case !s.a.ran():
		return needRan(RuleReceiptsOrdered+"'s command "+s.a.CommandID, s.a)
	}
	q := wire.Query{QueryID: s.id("q", "o"), CommandID: s.id("c", "o"), OperationID: s.a.OperationID}
	answers, stray, err := s.ask(ctx, q, s.a.CommandID)
	if err != nil {
		return fail("could not send: %v", err)
	}
	return s.judgeAnswer(fmt.Sprintf("asked about %s, never sent, of operation %s, which ran as %s (query %s)",
		q.CommandID, q.OperationID, s.a.CommandID, q.QueryID), q, s.a.latest.receipt, answers, stray)
}

// query-unknown: a Query for a command never seen gets unknown, seq 0.
func (s *suite) queryUnknown(ctx context.Context) Result {
	if !s.caps.Query {
		return skip(skipNoQuery)
	}
	q := wire.Query{QueryID: s.id("q", "u"), CommandID: s.id("c", "u"), OperationID: s.id("op", "u")}
	answers, stray, err := s.ask(ctx, q)
	if err != nil {
		return fail("could not send: %v", err)
	}
	sent := fmt.Sprintf("asked about %s of operation %s, neither ever sent (query %s)", q.CommandID, q.OperationID, q.QueryID)
	if len(answers) == 0 {
		return s.judgeAnswer(sent, q, wire.Receipt{}, answers, stray)
	}
	for _, a := range answers {
		got := a.receipt
		switch {
		case got.Status != wire.ReceiptUnknown:
			return fail("%s; saw %s: status %s, want unknown", sent, show(answers), got.Status)
		case got.Seq != 0:
			return fail("%s; saw %s: seq %d, want 0", sent, show(answers), got.Seq)
		case got.CommandID != q.CommandID:
			return fail("%s; saw %s: command_id %q, want the asked %q", sent, show(answers), got.CommandID, q.CommandID)
		case got.OperationID != "" && got.OperationID != q.OperationID:
			return fail("%s; saw %s: operation_id %q, want the asked %q", sent, show(answers), got.OperationID, q.OperationID)
		}
	}
	return pass()
}

// malformedPayloads go to the commands and the queries topic.
var malformedPayloads = [][]byte{
	[]byte("not json"),
	[]byte(`{"command_id":`),
	{},
	[]byte("null"),
	[]byte(`["c-1"]`),
	[]byte(`{"command_id":42,"operation_id":true,"query_id":[],"action":{},"expires_at":"soon","attempt":"x"}`),
	{0xff, 0xfe, '{', '}'},
}

// malformed-ignored: garbage changes nothing; the next command is answered.
func (s *suite) malformedIgnored(ctx context.Context) Result {
	i := s.w.mark()
	for _, kind := range []wire.Kind{wire.KindCommands, wire.KindQueries} {
		for _, p := range malformedPayloads {
			if err := s.w.publish(kind, 1, p); err != nil {
				return fail("could not send: %v", err)
			}
		}
	}
	sent := fmt.Sprintf("sent %d malformed payloads on %s and on %s (not JSON, truncated, empty, null, an array, ids of the wrong types, not UTF-8)",
		len(malformedPayloads), s.w.topics[wire.KindCommands], s.w.topics[wire.KindQueries])
	s.m = s.newCommand("m", "m", time.Hour)
	rs, err := s.runCommand(ctx, s.m)
	if err != nil {
		return fail("could not send: %v", err)
	}
	ms := s.w.since(i)
	s.noteSessions(ms)
	if ps := presences(ms); len(ps) > 0 {
		return fail("%s; the device's presence changed meanwhile: %s (it crashed or disconnected)", sent, show(ps))
	}
	if s.m.latest == nil {
		return fail("%s, then %s; saw %s and no final receipt within %s: the device stopped answering%s",
			sent, describe(s.m.Command), show(rs), s.o.Timeout, others(ms, forCommand(s.m.CommandID)))
	}
	var earlier []string
	for _, c := range []*command{s.a, s.e} {
		if c != nil {
			earlier = append(earlier, c.CommandID)
		}
	}
	if rerun := receipts(ms, func(r wire.Receipt) bool {
		return forCommand(earlier...)(r) && r.Status.Progress()
	}); len(rerun) > 0 {
		return fail("%s; saw %s: an earlier command ran again", sent, show(rerun))
	}
	return pass()
}

const skipNoRestart = "needs --restart, a command that kills the device abruptly and starts it again"

// presence-session-increases: after Restart, a new birth with a larger session.
func (s *suite) presenceSessionIncreases(ctx context.Context) Result {
	if s.o.Restart == nil {
		return skip(skipNoRestart)
	}
	s.noteSessions(s.w.since(0))
	before, had := s.maxSession, s.hadSession
	i := s.w.mark()
	rctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	err := s.o.Restart(rctx)
	cancel()
	if err != nil {
		s.restartErr = err.Error()
		return fail("the restart failed: %v", err)
	}
	var birth *seen
	ok := s.w.waitFor(ctx, i, s.o.Timeout, func(ms []seen) bool {
		for _, p := range presences(ms) {
			if p.perr == nil && p.presence.birth() {
				birth = &p
				return true
			}
		}
		return false
	})
	if !ok {
		s.restartErr = "no birth after the restart"
		return fail("ran the restart; no birth on %s within %s; saw %s", s.w.topics[wire.KindPresence], s.o.Timeout, show(presences(s.w.since(i))))
	}
	s.restarted = true
	s.o.Logf("conformtest: birth after the restart: %s", birth.raw)
	// The last will of the killed connection counts too: it carries the
	// session before.
	for _, p := range presences(s.w.since(i)) {
		if p.at.Equal(birth.at) && string(p.raw) == string(birth.raw) {
			break
		}
		s.noteSessions([]seen{p})
	}
	before, had = s.maxSession, s.hadSession
	switch {
	case birth.presence.Session == nil:
		return fail("ran the restart; the new birth %s has no session", show([]seen{*birth}))
	case !had:
		return fail("ran the restart; the new birth is %s, but no presence before it carried a session to compare with", show([]seen{*birth}))
	case *birth.presence.Session <= before:
		return fail("ran the restart; the new birth %s has session %d, not larger than %d, the largest before it (saw %s)",
			show([]seen{*birth}), *birth.presence.Session, before, show(presences(s.w.since(i))))
	}
	s.noteSessions([]seen{*birth})
	return pass()
}

// dedupe-survives-restart: after Restart, repeats still do not run.
func (s *suite) dedupeSurvivesRestart(ctx context.Context) Result {
	switch {
	case s.o.Restart == nil:
		return skip(skipNoRestart)
	case !s.caps.Dedupe:
		return skip(skipNoDedupe)
	case !s.restarted:
		return fail("the device did not come back after the restart (%s)", s.restartErr)
	}
	s.refresh(s.a)
	s.refresh(s.m)
	// The freshest record that ran (malformed-ignored's), else receipts-ordered's.
	latest := s.m
	if !latest.ran() {
		latest = s.a
	}
	if !latest.ran() {
		return needRan(RuleReceiptsOrdered+"'s command "+s.a.CommandID, s.a)
	}
	type probe struct {
		sent string
		c    wire.Command
		of   *command
		also string
	}
	var probes []probe
	for _, c := range []*command{s.a, s.m} {
		if c.ran() {
			again := c.Command
			again.Attempt++
			probes = append(probes, probe{"after the restart, sent " + describe(again) + " again", again, c, ""})
		}
	}
	d := s.newCommand("d", "m", time.Hour).Command
	d.OperationID = latest.OperationID
	probes = append(probes, probe{"after the restart, sent " + describe(d) + ", a new command_id of an operation that ran as " + latest.CommandID, d, latest, d.CommandID})
	for _, p := range probes {
		rs, err := s.repeat(ctx, p.c, p.of.CommandID)
		if err != nil {
			return fail("could not send: %v", err)
		}
		if r := judgeRepeat(p.sent, p.of, p.also, rs, s.o.Timeout); r.Outcome != Pass {
			return r
		}
	}
	return pass()
}
