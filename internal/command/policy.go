package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
)

// Offline policies: what a command for an offline device does.
const (
	OfflineWait = "wait" // waiting_device until expires_at, then timeout
	OfflineFail = "fail" // failed at once, reason device_offline
)

// On-unknown policies for devices that cannot deduplicate.
const (
	UnknownNeedsAttention = "needs_attention" // park an unproven outcome for a person
	UnknownResend         = "resend"          // the caller accepts a possible duplicate
)

// Approval policies.
const (
	ApprovalNone     = "none"
	ApprovalRequired = "required" // only through an approved task
)

// Concurrency policies: how an action's commands to one device relate to
// the others.
const (
	ConcurrencyParallel = "parallel" // published as they come
	ConcurrencySerial   = "serial"   // one serial command in flight per device, in submit order
)

// Policy is how the controller drives one action's commands.
type Policy struct {
	// AckTimeout: with no final receipt by then, the device is asked (a Query
	// for the same command_id) and, for a dedupe device, the command may be
	// re-sent. Later checks back off exponentially.
	AckTimeout time.Duration
	// MaxAttempts bounds the publishes of one command_id (and, separately,
	// the queries about it); past that the command waits for its expiry.
	MaxAttempts int
	// TTL: a command's expires_at is its issue time plus TTL.
	TTL time.Duration
	// Offline is wait or fail.
	Offline string
	// OnUnknown is needs_attention or resend, for dedupe:false devices.
	OnUnknown string
	// Approval is none or required.
	Approval string
	// Concurrency is parallel or serial (see store/queues.go).
	Concurrency string
	// Supersede: a new operation of this action on a device cancels the
	// older ones whose command was never published.
	Supersede bool
}

// Serial says whether the action's commands queue per device.
func (p Policy) Serial() bool { return p.Concurrency == ConcurrencySerial }

// Validate checks a policy.
func (p Policy) Validate() error {
	switch {
	case p.AckTimeout <= 0:
		return fmt.Errorf("policy: ack_timeout must be positive, got %s", p.AckTimeout)
	case p.MaxAttempts < 1:
		return fmt.Errorf("policy: max_attempts must be at least 1, got %d", p.MaxAttempts)
	case p.TTL <= 0:
		return fmt.Errorf("policy: ttl must be positive, got %s", p.TTL)
	case p.Offline != OfflineWait && p.Offline != OfflineFail:
		return fmt.Errorf("policy: offline must be wait or fail, got %q", p.Offline)
	case p.OnUnknown != UnknownNeedsAttention && p.OnUnknown != UnknownResend:
		return fmt.Errorf("policy: on_unknown must be needs_attention or resend, got %q", p.OnUnknown)
	case p.Approval != ApprovalNone && p.Approval != ApprovalRequired:
		return fmt.Errorf("policy: approval must be required or none, got %q", p.Approval)
	case p.Concurrency != ConcurrencyParallel && p.Concurrency != ConcurrencySerial:
		return fmt.Errorf("policy: concurrency must be parallel or serial, got %q", p.Concurrency)
	}
	return nil
}

// Backoff is the wait before check number n (from 0) after a send or query:
// AckTimeout doubled each time, capped at 8×.
func (p Policy) Backoff(n int) time.Duration {
	if n > 3 {
		n = 3
	}
	return p.AckTimeout << n
}

// QueuedRecheck is how long a serial command queued behind another waits
// before it looks at its queue again by itself (the capped backoff): the
// fallback, since the end of the one ahead wakes it through the feed.
func (p Policy) QueuedRecheck() time.Duration { return p.Backoff(3) }

// Policies maps actions to policies, with defaults for the others.
type Policies struct {
	Defaults Policy
	Actions  map[string]Policy
}

// For returns the policy of an action.
func (ps Policies) For(action string) Policy {
	if p, ok := ps.Actions[action]; ok {
		return p
	}
	return ps.Defaults
}

// policyOverride is one entry of the policy file; absent fields keep the default.
type policyOverride struct {
	AckTimeout  *duration `json:"ack_timeout"`
	MaxAttempts *int      `json:"max_attempts"`
	TTL         *duration `json:"ttl"`
	Offline     *string   `json:"offline"`
	OnUnknown   *string   `json:"on_unknown"`
	Approval    *string   `json:"approval"`
	Concurrency *string   `json:"concurrency"`
	Supersede   *bool     `json:"supersede"`
}

type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"5s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

func (o policyOverride) apply(p Policy) Policy {
	if o.AckTimeout != nil {
		p.AckTimeout = time.Duration(*o.AckTimeout)
	}
	if o.MaxAttempts != nil {
		p.MaxAttempts = *o.MaxAttempts
	}
	if o.TTL != nil {
		p.TTL = time.Duration(*o.TTL)
	}
	if o.Offline != nil {
		p.Offline = *o.Offline
	}
	if o.OnUnknown != nil {
		p.OnUnknown = *o.OnUnknown
	}
	if o.Approval != nil {
		p.Approval = *o.Approval
	}
	if o.Concurrency != nil {
		p.Concurrency = *o.Concurrency
	}
	if o.Supersede != nil {
		p.Supersede = *o.Supersede
	}
	return p
}

// LoadPolicies reads a policy file over the defaults from the flags:
//
//	{"defaults": {"ack_timeout": "5s", "max_attempts": 5, "ttl": "10m", "offline": "wait",
//	              "on_unknown": "needs_attention", "approval": "none", "concurrency": "parallel",
//	              "supersede": false},
//	 "actions":  {"restart": {"approval": "required", "concurrency": "serial"},
//	              "set-config": {"offline": "fail", "concurrency": "serial", "supersede": true}}}
//
// Every field is optional; an action's entry overrides the file's defaults,
// which override the flags. An empty path gives the flags' defaults alone.
func LoadPolicies(path string, base Policy) (Policies, error) {
	ps := Policies{Defaults: base, Actions: map[string]Policy{}}
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Policies{}, fmt.Errorf("policy file: %w", err)
		}
		var file struct {
			Defaults policyOverride            `json:"defaults"`
			Actions  map[string]policyOverride `json:"actions"`
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&file); err != nil {
			return Policies{}, fmt.Errorf("policy file %s: %w", path, err)
		}
		ps.Defaults = file.Defaults.apply(base)
		for action, o := range file.Actions {
			ps.Actions[action] = o.apply(ps.Defaults)
		}
	}
	if err := ps.Defaults.Validate(); err != nil {
		return Policies{}, fmt.Errorf("default %w", err)
	}
	for action, p := range ps.Actions {
		if err := p.Validate(); err != nil {
			return Policies{}, fmt.Errorf("action %s: %w", action, err)
		}
	}
	return ps, nil
}

// QoS is the one QoS rule for commands: a device that cannot deduplicate
// (and a device never seen, which is assumed unable to) gets each command
// at most once, at QoS 0; every other device gets QoS 1. A submit's own
// publish decision applies it in SQL, to the device's row as its
// transaction reads it (the store's CommandInsertForDevice).
func QoS(dev domain.Device) int {
	if dev.Capabilities.Dedupe {
		return 1
	}
	return 0
}
