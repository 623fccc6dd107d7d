package apiwire

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// checkAppendJSON holds AppendJSON to json.Marshal: the same bytes, or an
// error where json.Marshal has one.
func checkAppendJSON(t *testing.T, o Operation) {
	t.Helper()
	want, werr := json.Marshal(o)
	got, err := o.AppendJSON([]byte("prefix"))
	switch {
	case werr != nil && err == nil:
		t.Fatalf("json.Marshal refuses %+v (%v); AppendJSON wrote %s", o, werr, got)
	case werr == nil && err != nil:
		t.Fatalf("AppendJSON refuses %+v: %v", o, err)
	case werr == nil && "prefix"+string(want) != string(got):
		t.Fatalf("%+v:\nAppendJSON   %s\njson.Marshal prefix%s", o, got, want)
	}
}

func TestAppendJSONIsMarshal(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 30, 1, 123456789, time.UTC)
	base := Operation{
		OperationID: "task-88:restart:dev-1:v3", Status: "succeeded", RequestHash: "sha256:ab12", Action: "restart",
		Target: "dev-1", Params: json.RawMessage(`{"reason":"bench","n":[1,2.5,null,true]}`),
		Result: json.RawMessage(`{"ok":true}`), CommandID: "c-01JXYZ", CommandIDs: []string{"c-01JXYZ"}, Attempt: 1,
		Compensations: []string{}, Owner: "ctl-1", FencingToken: 7, LeaseExpiresAt: at.Add(time.Minute), Version: 3,
		StartedAt: at, UpdatedAt: at.Truncate(time.Second), SubmittedBy: "anonymous", Via: "api",
	}
	cases := map[string]func(o *Operation){
		"as it is": func(*Operation) {},
		"every optional member": func(o *Operation) {
			o.Reason, o.TaskID, o.Step, o.BusinessVersion, o.Compensates = "r", "t", "s", "v", "x"
		},
		"approved":               func(o *Operation) { o.ApprovedBy, o.ApprovedVersion = "alice@example.com", 4 },
		"no result":              func(o *Operation) { o.Result = nil },
		"null result":            func(o *Operation) { o.Result = json.RawMessage("null") },
		"nil lists":              func(o *Operation) { o.CommandIDs, o.Compensations = nil, nil },
		"two commands":           func(o *Operation) { o.CommandIDs = []string{"c-1", "c-2"}; o.Compensations = []string{"op-a", "op-b"} },
		"zero times":             func(o *Operation) { o.LeaseExpiresAt, o.StartedAt, o.UpdatedAt = time.Time{}, time.Time{}, time.Time{} },
		"a zone":                 func(o *Operation) { o.StartedAt = at.In(time.FixedZone("", -(5*3600 + 30*60))) },
		"a zone of 24 hours":     func(o *Operation) { o.StartedAt = at.In(time.FixedZone("", 24*3600)) },
		"a zone with seconds":    func(o *Operation) { o.UpdatedAt = at.In(time.FixedZone("", 3600+7)) },
		"year 10000":             func(o *Operation) { o.UpdatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
		"year -1":                func(o *Operation) { o.LeaseExpiresAt = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) },
		"quote":                  func(o *Operation) { o.Reason = `device: failed "x"` },
		"html":                   func(o *Operation) { o.Target = "a<b>&c" },
		"control":                func(o *Operation) { o.Owner = "tab\there\n" },
		"unicode":                func(o *Operation) { o.SubmittedBy = "ünïcode \u2028" },
		"bad utf-8":              func(o *Operation) { o.CommandIDs = []string{"c-\xff"} },
		"del":                    func(o *Operation) { o.Via = "\x7f" },
		"raw with spaces":        func(o *Operation) { o.Params = json.RawMessage("{ \"a\" : [ 1 , 2 ] }\n") },
		"raw with a spaced text": func(o *Operation) { o.Params = json.RawMessage(`{"a":"x y"}`) },
		"raw with html":          func(o *Operation) { o.Result = json.RawMessage(`{"a":"<b>&"}`) },
		"raw with U+2028":        func(o *Operation) { o.Result = json.RawMessage("{\"a\":\"\u2028\u2029 \u2030\"}") },
		"raw with bad utf-8":     func(o *Operation) { o.Result = json.RawMessage("{\"a\":\"\xff\"}") },
		"raw not json":           func(o *Operation) { o.Params = json.RawMessage(`{"a":`) },
		"raw empty":              func(o *Operation) { o.Params = json.RawMessage{} },
		"raw two values":         func(o *Operation) { o.Params = json.RawMessage(`{}{}`) },
		"raw a number":           func(o *Operation) { o.Result = json.RawMessage(`-1.5e3`) },
		"negative numbers":       func(o *Operation) { o.Attempt, o.FencingToken, o.Version, o.ApprovedVersion = -1, -2, -3, -4 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			o := base
			mutate(&o)
			checkAppendJSON(t, o)
		})
	}
	var l Operations
	if got, err := l.AppendJSON(nil); err != nil || string(got) != "null" {
		t.Fatalf("no page: %s, %v", got, err)
	}
	l = Operations{}
	for range 3 {
		want, _ := json.Marshal(l)
		if got, err := l.AppendJSON(nil); err != nil || string(got) != string(want) {
			t.Fatalf("a page of %d: %s, %v; json.Marshal %s", len(l), got, err, want)
		}
		l = append(l, base)
		base.Target = "t<" + base.Target // a member for json.Marshal's own way
	}
	l = append(l, Operation{UpdatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	if _, err := l.AppendJSON(nil); err == nil {
		t.Fatal("an operation json.Marshal refuses does not fail its page")
	}
}

// A record with every member set is written as json.Marshal writes it: a
// field added to Operation fails this test until AppendJSON writes it (the
// check below finds any field left zero).
func TestAppendJSONWritesEveryMember(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 30, 1, 5, time.UTC)
	o := Operation{OperationID: "op", Status: "succeeded", RequestHash: "h", Action: "restart", Target: "dev-1",
		Params: json.RawMessage(`{"a":1}`), Result: json.RawMessage(`{"b":2}`), Reason: "r", CommandID: "c-2",
		CommandIDs: []string{"c-1", "c-2"}, Attempt: 2, TaskID: "t", Step: "s", BusinessVersion: "v1", Compensates: "op-0",
		Compensations: []string{"op-2"}, Owner: "ctl-1", FencingToken: 3, LeaseExpiresAt: at, Version: 4, StartedAt: at,
		UpdatedAt: at, SubmittedBy: "alice", Via: "api", ApprovedBy: "bob", ApprovedVersion: 5}
	v := reflect.ValueOf(o)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("the record leaves %s zero: set it", v.Type().Field(i).Name)
		}
	}
	if !o.plain() {
		t.Fatal("the record is not one AppendJSON writes itself")
	}
	checkAppendJSON(t, o)
}

// TestAppendJSONIsMarshalAtRandom draws operations from plain and awkward
// parts alike.
func TestAppendJSONIsMarshalAtRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 7))
	strs := []string{"", "a", "dev-1", "c-01JXYZ", "a b", `q"`, `back\slash`, "<", "&", "\u00e9", "\u2028", "\xff", "\x00", "\x7f", "~"}
	raws := []json.RawMessage{nil, {}, json.RawMessage("null"), json.RawMessage(`{}`), json.RawMessage(`{"a":1}`),
		json.RawMessage(`[1, 2]`), json.RawMessage(`"<"`), json.RawMessage(`{"a":`), json.RawMessage(`"\u2028"`),
		json.RawMessage("\"\u2028\""), json.RawMessage(` 1`), json.RawMessage(`true`)}
	str := func() string { return strs[rng.IntN(len(strs))] }
	list := func() []string {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		return []string{str(), str()}
	}
	when := func() time.Time {
		t := time.Unix(rng.Int64N(400_000_000_000)-100_000_000_000, rng.Int64N(1e9))
		switch rng.IntN(4) {
		case 0:
			return t.UTC()
		case 1:
			return t.In(time.FixedZone("", (rng.IntN(60)-30)*3600+rng.IntN(3)*1800))
		case 2:
			return time.Time{}
		}
		return t.Round(time.Millisecond).UTC()
	}
	for range 5000 {
		checkAppendJSON(t, Operation{
			OperationID: str(), Status: str(), RequestHash: str(), Action: str(), Target: str(),
			Params: raws[rng.IntN(len(raws))], Result: raws[rng.IntN(len(raws))], Reason: str(), CommandID: str(),
			CommandIDs: list(), Attempt: rng.IntN(5) - 1, TaskID: str(), Step: str(), BusinessVersion: str(),
			Compensates: str(), Compensations: list(), Owner: str(), FencingToken: rng.Int64() - rng.Int64(),
			LeaseExpiresAt: when(), Version: rng.Int64N(100), StartedAt: when(), UpdatedAt: when(),
			SubmittedBy: str(), Via: str(), ApprovedBy: str(), ApprovedVersion: rng.IntN(3),
		})
	}
}

func FuzzAppendJSONIsMarshal(f *testing.F) {
	f.Add("op-1", "started", `{"reason":"bench"}`, "c-1", int64(1_780_000_000_123_456_789), 0)
	f.Add("op<", "a\"b", `{"a": 1}`, "\u2028", int64(-9_000_000_000_000_000_000), 3600)
	f.Fuzz(func(t *testing.T, id, status, raw, cmd string, nanos int64, zone int) {
		at := time.Unix(0, nanos).In(time.FixedZone("", zone%(48*3600)))
		checkAppendJSON(t, Operation{OperationID: id, Status: status, Target: id, Params: json.RawMessage(raw),
			Result: json.RawMessage(raw), CommandID: cmd, CommandIDs: []string{cmd, id}, Reason: status,
			LeaseExpiresAt: at, StartedAt: at.UTC(), UpdatedAt: at, ApprovedBy: cmd, ApprovedVersion: zone})
	})
}

// BenchmarkOperationJSON compares the answer of a submit written by hand
// with encoding/json's.
func BenchmarkOperationJSON(b *testing.B) {
	at := time.Date(2026, 12, 7, 9, 30, 1, 123456789, time.UTC)
	o := Operation{
		OperationID: "bench-sat-12345:restart:dev-0042:v1", Status: "succeeded", RequestHash: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		Action: "restart", Target: "dev-0042", Params: json.RawMessage(`{"reason":"bench"}`), Result: json.RawMessage(`{"restarted_at":"2026-12-07T09:30:01Z"}`),
		CommandID: "c-01JXYZ0000000000000000000", CommandIDs: []string{"c-01JXYZ0000000000000000000"}, Attempt: 1,
		TaskID: "bench-sat-12345", Step: "restart", BusinessVersion: "v1", Compensations: []string{}, Owner: "bench-1",
		FencingToken: 1, LeaseExpiresAt: at.Add(30 * time.Second), Version: 2, StartedAt: at, UpdatedAt: at, SubmittedBy: "anonymous", Via: "api",
	}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var buf bytes.Buffer
			_ = json.NewEncoder(&buf).Encode(o)
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ := o.AppendJSON(make([]byte, 0, 1024))
			_ = append(buf, '\n')
		}
	})
}
