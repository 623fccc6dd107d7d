package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultTopicRoot is the topic root when none is configured.
const DefaultTopicRoot = "fleet"

// MaxPayload bounds every payload the controller or a device accepts.
const MaxPayload = 256 << 10

// ErrInvalidDeviceID is returned for a device id outside the contract's charset.
var ErrInvalidDeviceID = errors.New("invalid device id")

// ValidDeviceID reports whether id is a legal device id: [A-Za-z0-9._-]{1,64},
// not starting with "controller-" (that prefix belongs to controller client
// ids), and not made only of dots ("." and ".." would make topics such as
// fleet/../commands).
func ValidDeviceID(id string) bool {
	return IDChars(id, 64, false) && !strings.HasPrefix(id, "controller-") && strings.Trim(id, ".") != ""
}

// Kind names the four per-device topics.
type Kind string

const (
	KindCommands Kind = "commands"
	KindReceipts Kind = "receipts"
	KindQueries  Kind = "queries"
	KindPresence Kind = "presence"
)

// Topic returns {root}/{device}/{kind}.
func Topic(root, device string, kind Kind) string {
	return root + "/" + device + "/" + string(kind)
}

// Wildcard returns the subscription filter {root}/+/{kind}.
func Wildcard(root string, kind Kind) string {
	return root + "/+/" + string(kind)
}

// ParseTopic splits {root}/{device}/{kind}. It fails for another root, a
// malformed device id or an unknown kind.
func ParseTopic(root, topic string) (device string, kind Kind, err error) {
	rest, ok := strings.CutPrefix(topic, root+"/")
	if !ok {
		return "", "", fmt.Errorf("topic %q: not under root %q", topic, root)
	}
	device, k, ok := strings.Cut(rest, "/")
	if !ok || strings.Contains(k, "/") {
		return "", "", fmt.Errorf("topic %q: want %s/{device}/{kind}", topic, root)
	}
	if !ValidDeviceID(device) {
		return "", "", fmt.Errorf("topic %q: %w", topic, ErrInvalidDeviceID)
	}
	switch Kind(k) {
	case KindCommands, KindReceipts, KindQueries, KindPresence:
		return device, Kind(k), nil
	}
	return "", "", fmt.Errorf("topic %q: unknown kind %q", topic, k)
}

// Command is what the controller publishes to {root}/{d}/commands.
type Command struct {
	CommandID   string          `json:"command_id"`
	OperationID string          `json:"operation_id"`
	Action      string          `json:"action"`
	Params      json.RawMessage `json:"params"`
	IssuedAt    time.Time       `json:"issued_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	Attempt     int             `json:"attempt"`
}

// ReceiptStatus is the status a device reports for one command.
type ReceiptStatus string

const (
	ReceiptReceived  ReceiptStatus = "received"
	ReceiptExecuting ReceiptStatus = "executing"
	ReceiptSucceeded ReceiptStatus = "succeeded"
	ReceiptFailed    ReceiptStatus = "failed"
	ReceiptRejected  ReceiptStatus = "rejected"
	// ReceiptUnknown answers a query about a command the device never saw.
	// It carries seq 0 and is never a device's latest receipt.
	ReceiptUnknown ReceiptStatus = "unknown"
)

// Final reports whether s ends the command on the device.
func (s ReceiptStatus) Final() bool {
	return s == ReceiptSucceeded || s == ReceiptFailed || s == ReceiptRejected
}

// Progress reports whether s is a device's progress on a command that has
// not ended: received or executing.
func (s ReceiptStatus) Progress() bool {
	return s == ReceiptReceived || s == ReceiptExecuting
}

// Valid reports whether s is one of the contract's receipt statuses.
func (s ReceiptStatus) Valid() bool {
	switch s {
	case ReceiptReceived, ReceiptExecuting, ReceiptSucceeded, ReceiptFailed, ReceiptRejected, ReceiptUnknown:
		return true
	}
	return false
}

// Receipt is what a device publishes to {root}/{d}/receipts.
type Receipt struct {
	CommandID   string          `json:"command_id"`
	OperationID string          `json:"operation_id"`
	Status      ReceiptStatus   `json:"status"`
	Seq         int             `json:"seq"`
	At          time.Time       `json:"at"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       string          `json:"error,omitempty"`
	QueryID     string          `json:"query_id,omitempty"`
}

// MaxSafeInteger is 2^53-1, the largest integer every JSON reader holds exactly.
const MaxSafeInteger = 1<<53 - 1

// Validate checks the fields every receipt must carry; a refusal is an
// *InputError naming the field.
func (r *Receipt) Validate() error {
	switch {
	case r.CommandID == "":
		return inputErr(ReasonBadID, "command_id", "missing")
	case !IDChars(r.CommandID, 200, true): // the controller's command ids
		return inputErr(ReasonBadID, "command_id", "%q is not a command id ([A-Za-z0-9._:-]{1,200})", shorten(r.CommandID, 40))
	case r.OperationID != "" && !IDChars(r.OperationID, 400, true): // derived ones (compensations) up to 400
		return inputErr(ReasonBadID, "operation_id", "%q is not an operation id ([A-Za-z0-9._:-]{1,400})", shorten(r.OperationID, 40))
	case r.QueryID != "" && !IDChars(r.QueryID, 200, true):
		return inputErr(ReasonBadID, "query_id", "%q is not a query id ([A-Za-z0-9._:-]{1,200})", shorten(r.QueryID, 40))
	case !r.Status.Valid():
		return inputErr(ReasonInvalidValue, "status", "unknown status %q", shorten(string(r.Status), 40))
	case r.Seq > MaxSafeInteger:
		return inputErr(ReasonBadNumber, "seq", "%d is beyond 2^53-1", r.Seq)
	case r.Status == ReceiptUnknown && r.Seq != 0:
		return inputErr(ReasonInvalidValue, "seq", "an unknown answer carries seq 0")
	case r.Status != ReceiptUnknown && r.Seq < 1:
		return inputErr(ReasonInvalidValue, "seq", "counts from 1")
	case !objectOrAbsent(r.Result):
		return inputErr(ReasonWrongType, "result", "must be a JSON object")
	case !storable(r):
		return inputErr(ReasonInvalidValue, "receipt", "a NUL character, or text that is not UTF-8")
	}
	return nil
}

// storable reports whether both backends can store r's text alike:
// PostgreSQL's text refuses a NUL character and invalid UTF-8, which would
// fail the receipt's transaction on every delivery instead of refusing it.
func storable(r *Receipt) bool {
	for _, s := range []string{r.CommandID, r.OperationID, r.Error, r.QueryID, string(r.Result)} {
		if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// objectOrAbsent reports whether raw is absent, null or a JSON object.
func objectOrAbsent(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null")) || t[0] == '{'
}

// Query is what the controller publishes to {root}/{d}/queries to ask about
// one command_id (or, failing that, any command of the same operation_id).
type Query struct {
	QueryID     string `json:"query_id"`
	CommandID   string `json:"command_id"`
	OperationID string `json:"operation_id"`
}

// Capabilities say what a device can do for the controller.
type Capabilities struct {
	// Dedupe: the device never executes a repeated command_id, nor a second
	// command of one operation_id.
	Dedupe bool `json:"dedupe"`
	// Query: the device answers Query messages.
	Query bool `json:"query"`
}

// Presence is the retained message on {root}/{d}/presence: a device's birth,
// its clean-shutdown offline, or the broker-published LWT.
type Presence struct {
	Online       bool          `json:"online"`
	Session      int64         `json:"session"`
	Capabilities *Capabilities `json:"capabilities,omitempty"`
	At           *time.Time    `json:"at,omitempty"`
}

// Validate checks a presence message's session: an integer from 0 to
// 2^53-1 (a larger one would overflow its rank, and no JSON reader holds it
// exactly).
func (p *Presence) Validate() error {
	if p.Session < 0 || p.Session > MaxSafeInteger {
		return inputErr(ReasonBadNumber, "session", "%d: want an integer from 0 to 2^53-1", p.Session)
	}
	return nil
}

// Rank orders presence messages: by session, then offline above online.
// Only a strictly higher rank than the stored one is applied.
func (p Presence) Rank() int64 {
	r := p.Session * 2
	if !p.Online {
		r++
	}
	return r
}

// Encode marshals v for the wire: compact JSON without HTML escaping, so
// "<" stays one byte and params reach the device as the caller sent them.
func Encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Decode unmarshals a payload into v, refusing oversized payloads and
// trailing data.
func Decode(payload []byte, v any) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("payload of %d bytes exceeds %d", len(payload), MaxPayload)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	// Only whitespace may follow (dec.More would let a stray ']' or '}' by).
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("decode: trailing data after JSON object")
	}
	return nil
}
