package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("1.5s", "250ms", "-30s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string (or the number 0).
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "0" {
		*d = 0
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"500ms\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Trigger decides when a fault fires. Each place where a fault could fire is
// an opportunity (an incoming command, a receipt about to be published, ...).
// The first Skip opportunities never fire; after that each fires with
// probability P, and at most Count times in all when Count > 0. P = 0 with
// Count > 0 means "the next Count opportunities". P = 0 and Count = 0 is off.
// Counters are per device and start again when the device's faults change.
type Trigger struct {
	P     float64 `json:"p,omitempty"`
	Count int     `json:"count,omitempty"`
	Skip  int     `json:"skip,omitempty"`
}

// Enabled reports whether the trigger can ever fire.
func (t Trigger) Enabled() bool { return t.P > 0 || t.Count > 0 }

func (t Trigger) validate(name string) error {
	switch {
	case t.P < 0 || t.P > 1:
		return fmt.Errorf("%s: p %v outside [0,1]", name, t.P)
	case t.Count < 0:
		return fmt.Errorf("%s: negative count", name)
	case t.Skip < 0:
		return fmt.Errorf("%s: negative skip", name)
	}
	return nil
}

// Receipt classes a ReceiptFault can be limited to, besides the receipt
// statuses themselves (received, executing, succeeded, failed, rejected,
// unknown).
const (
	// ClassFinal matches succeeded, failed and rejected.
	ClassFinal = "final"
	// ClassQuery matches every answer to a query.
	ClassQuery = "query"
)

var receiptClasses = []string{"received", "executing", "succeeded", "failed", "rejected", "unknown", ClassFinal, ClassQuery}

// ReceiptFault acts on receipts the device is about to publish.
type ReceiptFault struct {
	Trigger
	// Statuses limits the fault to receipts of these statuses or classes
	// (see ClassFinal, ClassQuery); empty means every receipt.
	Statuses []string `json:"statuses,omitempty"`
	// Delay is how long delay_receipt holds a receipt (default 1s), and the
	// longest time reorder_receipt waits for a later receipt to overtake the
	// one it holds (default 1s).
	Delay Duration `json:"delay,omitempty"`
}

func (f ReceiptFault) validate(name string) error {
	if err := f.Trigger.validate(name); err != nil {
		return err
	}
	for _, s := range f.Statuses {
		if !slices.Contains(receiptClasses, s) {
			return fmt.Errorf("%s: unknown status %q (want one of %s)", name, s, strings.Join(receiptClasses, ", "))
		}
	}
	if f.Delay < 0 {
		return fmt.Errorf("%s: negative delay", name)
	}
	return nil
}

func (f ReceiptFault) matches(status string, query bool) bool {
	if len(f.Statuses) == 0 {
		return true
	}
	final := status == "succeeded" || status == "failed" || status == "rejected"
	for _, s := range f.Statuses {
		if s == status || (s == ClassFinal && final) || (s == ClassQuery && query) {
			return true
		}
	}
	return false
}

// ActionFault acts on a command's action: slow_execution, fail, reject.
type ActionFault struct {
	Trigger
	// Actions limits the fault to these actions; empty means every action.
	Actions []string `json:"actions,omitempty"`
	// Delay is how long slow_execution makes an action take.
	Delay Duration `json:"delay,omitempty"`
	// Error is the error string of fail (default "simulated_failure") and
	// reject (default "simulated_rejection").
	Error string `json:"error,omitempty"`
}

func (f ActionFault) validate(name string) error {
	if err := f.Trigger.validate(name); err != nil {
		return err
	}
	if f.Delay < 0 {
		return fmt.Errorf("%s: negative delay", name)
	}
	return nil
}

func (f ActionFault) matches(action string) bool {
	return len(f.Actions) == 0 || slices.Contains(f.Actions, action)
}

// Point names a place in the device's handling of a command where an
// outage fault (drop_connection, crash) can strike. Each point is right after
// a durable step and before the step's receipt is published.
type Point string

const (
	// PointCommand: a command message arrived; nothing is recorded and it is
	// not acknowledged yet (a crash here makes the broker redeliver it).
	PointCommand Point = "command"
	// PointReceived: the "received" record is durable and the message
	// acknowledged; the received receipt is not published.
	PointReceived Point = "received"
	// PointExecuting: "executing" is durable with the planned outcome; the
	// action has not started; the executing receipt is not published.
	PointExecuting Point = "executing"
	// PointExecuted: the action ran and its line is in executions.jsonl; the
	// final receipt is not durable yet.
	PointExecuted Point = "executed"
	// PointFinal: the final receipt is durable and not published.
	PointFinal Point = "final"
)

var points = []Point{PointCommand, PointReceived, PointExecuting, PointExecuted, PointFinal}

// OutageFault takes the device's connection away (drop_connection) or kills
// the device (crash), either at a Point of command handling or, when Every
// is set, on a timer (each tick is one opportunity). A drop is an
// opportunity only while the device is connected.
type OutageFault struct {
	Trigger
	// At is the point of command handling (default "command"); ignored when
	// Every is set.
	At Point `json:"at,omitempty"`
	// Every makes the fault time-based: one opportunity per tick.
	Every Duration `json:"every,omitempty"`
	// For is how long the device stays away: offline time for
	// drop_connection, down time before the restart for crash. 0 means it
	// comes back at once (with a new session either way).
	For Duration `json:"for,omitempty"`
}

func (f OutageFault) validate(name string) error {
	if err := f.Trigger.validate(name); err != nil {
		return err
	}
	if f.At != "" && !slices.Contains(points, f.At) {
		return fmt.Errorf("%s: unknown point %q", name, f.At)
	}
	if f.At != "" && f.Every != 0 {
		return fmt.Errorf("%s: at and every exclude each other", name)
	}
	if f.Every < 0 || f.For < 0 {
		return fmt.Errorf("%s: negative duration", name)
	}
	return nil
}

func (f OutageFault) at() Point {
	if f.At == "" {
		return PointCommand
	}
	return f.At
}

// Legacy turns a device into one without the contract's guarantees. When
// Enabled, the device announces capabilities {dedupe: Dedupe, query: Query}
// and behaves accordingly: without dedupe it executes every delivery of a
// command, repeats included (each one a line in executions.jsonl); without
// query it ignores queries. JSON: true (dedupe and query both false), false,
// or {"dedupe":false,"query":true}.
type Legacy struct {
	Enabled bool
	Dedupe  bool
	Query   bool
}

// MarshalJSON writes false, or the capabilities object.
func (l Legacy) MarshalJSON() ([]byte, error) {
	if !l.Enabled {
		return []byte("false"), nil
	}
	return json.Marshal(struct {
		Dedupe bool `json:"dedupe"`
		Query  bool `json:"query"`
	}{l.Dedupe, l.Query})
}

// UnmarshalJSON reads true, false or {"dedupe":..,"query":..}.
func (l *Legacy) UnmarshalJSON(b []byte) error {
	switch string(bytes.TrimSpace(b)) {
	case "true":
		*l = Legacy{Enabled: true}
		return nil
	case "false", "null":
		*l = Legacy{}
		return nil
	}
	var v struct {
		Dedupe bool `json:"dedupe"`
		Query  bool `json:"query"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("legacy: want true, false or {\"dedupe\":bool,\"query\":bool}: %w", err)
	}
	*l = Legacy{Enabled: true, Dedupe: v.Dedupe, Query: v.Query}
	return nil
}

// Faults is the fault set of one device. The zero value is a conforming
// device without faults. JSON keys are the field tags below.
type Faults struct {
	// DropCommand: an incoming command is lost before the device records it
	// (the message is acknowledged, so the broker does not redeliver it).
	DropCommand Trigger `json:"drop_command,omitzero"`
	// DropReceipt: a receipt is not published (it stays the device's latest
	// receipt, so a repeat or a query still gets it).
	DropReceipt ReceiptFault `json:"drop_receipt,omitzero"`
	// DuplicateReceipt: a receipt is published twice.
	DuplicateReceipt ReceiptFault `json:"duplicate_receipt,omitzero"`
	// DelayReceipt: a receipt is published Delay later.
	DelayReceipt ReceiptFault `json:"delay_receipt,omitzero"`
	// ReorderReceipt: a receipt is held back and published right after the
	// device's next receipt (or after Delay if none comes).
	ReorderReceipt ReceiptFault `json:"reorder_receipt,omitzero"`
	// DropConnection: the TCP connection is closed without DISCONNECT (the
	// broker publishes the LWT); the device keeps working, stays away For,
	// then reconnects with a new session.
	DropConnection OutageFault `json:"drop_connection,omitzero"`
	// Crash: the device dies (no DISCONNECT, in-memory state lost, durable
	// state kept) and boots again after For.
	Crash OutageFault `json:"crash,omitzero"`
	// SlowExecution: the action takes Delay.
	SlowExecution ActionFault `json:"slow_execution,omitzero"`
	// Fail: the action runs (one line in executions.jsonl) and fails with
	// Error, with no effect on the device's state.
	Fail ActionFault `json:"fail,omitzero"`
	// Reject: the command is rejected with Error before it is accepted; it
	// does not run and does not take its operation_id.
	Reject ActionFault `json:"reject,omitzero"`
	// IgnoreQueries: a query is not answered.
	IgnoreQueries Trigger `json:"ignore_queries,omitzero"`
	// ClockSkew is added to the device's clock: its expiry checks and every
	// "at" it writes (receipts, birth, witness lines).
	ClockSkew Duration `json:"clock_skew,omitzero"`
	// Legacy: see Legacy.
	Legacy Legacy `json:"legacy,omitzero"`
}

// Validate checks every fault's parameters.
func (f Faults) Validate() error {
	errs := []error{
		f.DropCommand.validate("drop_command"),
		f.DropReceipt.validate("drop_receipt"),
		f.DuplicateReceipt.validate("duplicate_receipt"),
		f.DelayReceipt.validate("delay_receipt"),
		f.ReorderReceipt.validate("reorder_receipt"),
		f.DropConnection.validate("drop_connection"),
		f.Crash.validate("crash"),
		f.SlowExecution.validate("slow_execution"),
		f.Fail.validate("fail"),
		f.Reject.validate("reject"),
		f.IgnoreQueries.validate("ignore_queries"),
	}
	return errors.Join(errs...)
}

// Merge returns f with the top-level keys of the JSON object patch replaced
// (a key present in patch replaces that whole fault; keys not in it are
// kept). Unknown keys are an error.
func (f Faults) Merge(patch []byte) (Faults, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(patch, &keys); err != nil {
		return Faults{}, fmt.Errorf("faults: want a JSON object: %w", err)
	}
	if _, err := decodeFaults(patch); err != nil {
		return Faults{}, err
	}
	base, err := json.Marshal(f)
	if err != nil {
		return Faults{}, err
	}
	var merged map[string]json.RawMessage
	if err := json.Unmarshal(base, &merged); err != nil {
		return Faults{}, err
	}
	for k, v := range keys {
		merged[k] = v
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return Faults{}, err
	}
	return decodeFaults(b)
}

func decodeFaults(b []byte) (Faults, error) {
	var f Faults
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Faults{}, fmt.Errorf("faults: %w", err)
	}
	if dec.More() {
		return Faults{}, errors.New("faults: trailing data after the JSON object")
	}
	if err := f.Validate(); err != nil {
		return Faults{}, fmt.Errorf("faults: %w", err)
	}
	return f, nil
}

// Override gives the devices whose id matches Match (an exact id or a glob
// with *, ? and [...], matched against the whole id) their own faults.
type Override struct {
	Match  string `json:"match"`
	Faults Faults `json:"faults"`
}

// Profile is a fleet's fault profile: fleet-wide defaults and per-device
// overrides. A device takes the Faults of the first override that matches
// its id, else Defaults. In the JSON file an override lists only the keys it
// changes: they are merged over the defaults when the file is read (see
// ParseProfile). Seed, when not 0, seeds the fault decisions unless the
// fleet's Config.Seed is set.
type Profile struct {
	Seed     int64      `json:"seed,omitempty"`
	Defaults Faults     `json:"defaults,omitzero"`
	Devices  []Override `json:"devices,omitempty"`
}

// For returns the faults of one device.
func (p Profile) For(id string) Faults {
	for _, o := range p.Devices {
		if o.Match == id {
			return o.Faults
		}
		if ok, _ := path.Match(o.Match, id); ok {
			return o.Faults
		}
	}
	return p.Defaults
}

// shared is For, as a pointer into p: devices of the same entry share
// their Faults (a Device replaces its pointer, never the value).
func (p *Profile) shared(id string) *Faults {
	for i := range p.Devices {
		o := &p.Devices[i]
		if o.Match == id {
			return &o.Faults
		}
		if ok, _ := path.Match(o.Match, id); ok {
			return &o.Faults
		}
	}
	return &p.Defaults
}

// Validate checks the defaults, every override and every pattern.
func (p Profile) Validate() error {
	if err := p.Defaults.Validate(); err != nil {
		return fmt.Errorf("defaults: %w", err)
	}
	for i, o := range p.Devices {
		if o.Match == "" {
			return fmt.Errorf("devices[%d]: match is empty", i)
		}
		if _, err := path.Match(o.Match, ""); err != nil {
			return fmt.Errorf("devices[%d]: match %q: %w", i, o.Match, err)
		}
		if err := o.Faults.Validate(); err != nil {
			return fmt.Errorf("devices[%d] (%s): %w", i, o.Match, err)
		}
	}
	return nil
}

// ParseProfile reads a JSON fault profile:
//
//	{"seed": 7,
//	 "defaults": {"drop_receipt": {"p": 0.1, "statuses": ["final"]}},
//	 "devices": [{"match": "device-1?", "faults": {"crash": {"count": 1, "at": "executed"}}}]}
//
// Each override's keys replace the same keys of the defaults; its other keys
// keep the defaults. Unknown keys are an error.
func ParseProfile(b []byte) (Profile, error) {
	var raw struct {
		Seed     int64           `json:"seed"`
		Defaults json.RawMessage `json:"defaults"`
		Devices  []struct {
			Match  string          `json:"match"`
			Faults json.RawMessage `json:"faults"`
		} `json:"devices"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Profile{}, fmt.Errorf("fault profile: %w", err)
	}
	if dec.More() {
		return Profile{}, errors.New("fault profile: trailing data after the JSON object")
	}
	p := Profile{Seed: raw.Seed}
	if len(raw.Defaults) > 0 && string(raw.Defaults) != "null" {
		f, err := decodeFaults(raw.Defaults)
		if err != nil {
			return Profile{}, fmt.Errorf("fault profile: defaults: %w", err)
		}
		p.Defaults = f
	}
	for i, d := range raw.Devices {
		f := p.Defaults
		if len(d.Faults) > 0 && string(d.Faults) != "null" {
			var err error
			if f, err = p.Defaults.Merge(d.Faults); err != nil {
				return Profile{}, fmt.Errorf("fault profile: devices[%d]: %w", i, err)
			}
		}
		p.Devices = append(p.Devices, Override{Match: d.Match, Faults: f})
	}
	if err := p.Validate(); err != nil {
		return Profile{}, fmt.Errorf("fault profile: %w", err)
	}
	return p, nil
}

// LoadProfile reads and parses a JSON fault profile file.
func LoadProfile(file string) (Profile, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return Profile{}, fmt.Errorf("fault profile: %w", err)
	}
	p, err := ParseProfile(b)
	if err != nil {
		return Profile{}, fmt.Errorf("%s: %w", file, err)
	}
	return p, nil
}

// trigState counts one fault's opportunities and firings on one device.
type trigState struct{ seen, fired int }

// fire decides one opportunity of the named fault. The caller holds the
// device's lock (it owns the counters and the random source).
func (d *Device) fireLocked(name string, t Trigger) bool {
	if !t.Enabled() {
		return false
	}
	s := d.trig[name]
	if s == nil {
		if d.trig == nil {
			d.trig = map[string]*trigState{}
		}
		s = &trigState{}
		d.trig[name] = s
	}
	s.seen++
	if s.seen <= t.Skip {
		return false
	}
	if t.Count > 0 && s.fired >= t.Count {
		return false
	}
	p := t.P
	if p == 0 {
		p = 1
	}
	if d.rng.Float64() >= p {
		return false
	}
	s.fired++
	return true
}
