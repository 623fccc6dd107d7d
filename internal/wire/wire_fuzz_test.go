package wire

// Fuzz targets for the wire decoders: the payloads a device sends the
// controller (Receipt, Presence: DecodeDevice, as the ingestor decodes them)
// and the ones the controller sends a device (Command, Query: Decode), and
// the topic parser. `go test` runs the seeds under testdata/fuzz as unit
// tests; `go test -fuzz '^FuzzReceipt$' ./internal/wire/` explores (.ci/fuzz
// runs each target for a few seconds in `make test`).
//
// Each target asserts properties, not only "does not panic":
//   - whatever a decoder accepts is exactly one JSON value within its limit
//     (MaxDevicePayload, 64 KiB, for DecodeDevice; MaxPayload, 256 KiB, for
//     Decode): the same payload padded to the limit is accepted, one byte
//     more is refused;
//   - what DecodeDevice accepts is nested at most MaxDepth deep, has no
//     member name twice, and reads the same with the lenient Decode;
//   - whatever is accepted re-encodes (Encode) to a payload that decodes to
//     the same value, and encoding that again gives the same bytes;
//   - validation (Receipt.Validate, Presence.Validate) gives the same answer
//     for the re-encoded value, and what it accepts keeps the contract's
//     rules: ids in their charset and length, status and seq, a result
//     object, text PostgreSQL can store; presence ranking in session order
//     (no overflow, nothing at or below a device never seen);
//   - a receipt DecodeDevice decodes its own plain way (decodeReceiptPlain)
//     is the one json.Unmarshal decodes.

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// sameJSON reports whether two raw JSON values are the same text once
// compacted; absent and null count as the same (Encode writes an absent
// json.RawMessage without omitempty as null).
func sameJSON(a, b json.RawMessage) bool {
	norm := func(r json.RawMessage) string {
		t := bytes.TrimSpace(r)
		if len(t) == 0 {
			return "null"
		}
		var out bytes.Buffer
		if err := json.Compact(&out, t); err != nil {
			return "invalid:" + string(t)
		}
		return out.String()
	}
	return norm(a) == norm(b)
}

// sameTime compares two decoded times as instants and as written (offset
// included), since Encode writes the offset the payload carried.
func sameTime(a, b time.Time) bool {
	return a.Equal(b) && a.Format(time.RFC3339Nano) == b.Format(time.RFC3339Nano)
}

// decoder is one of the package's decoders with its size limit: Decode
// (what a device accepts: commands, queries) or DecodeDevice (what the
// controller accepts from a device: receipts, presence).
type decoder struct {
	name   string
	decode func([]byte, any) error
	max    int
}

var (
	deviceSide     = decoder{"Decode", Decode, MaxPayload}
	controllerSide = decoder{"DecodeDevice", DecodeDevice, MaxDevicePayload}
)

// checkSizeLimit pads an accepted payload with JSON whitespace to exactly
// the decoder's limit (still accepted) and to one byte more (refused). It
// allocates up to 256 KiB, so it runs for one input in 64.
func (d decoder) checkSizeLimit(t *testing.T, payload []byte, v func() any) {
	t.Helper()
	if crc32.ChecksumIEEE(payload)%64 != 0 || len(payload) > d.max {
		return
	}
	padded := append(bytes.Clone(payload), bytes.Repeat([]byte(" "), d.max-len(payload))...)
	if err := d.decode(padded, v()); err != nil {
		t.Fatalf("%s: payload padded to its limit (%d bytes) refused: %v", d.name, len(padded), err)
	}
	if err := d.decode(append(padded, ' '), v()); err == nil {
		t.Fatalf("%s: payload of %d bytes (over its limit) accepted", d.name, len(padded)+1)
	}
}

// accepts runs the checks common to every payload type: a payload over the
// decoder's limit is refused; an accepted one is exactly one JSON value.
func (d decoder) accepts(t *testing.T, payload []byte, v any) bool {
	t.Helper()
	err := d.decode(payload, v)
	if len(payload) > d.max && err == nil {
		t.Fatalf("%s: payload of %d bytes accepted", d.name, len(payload))
	}
	if err != nil {
		return false
	}
	if !json.Valid(payload) {
		t.Fatalf("%s accepted %q, which is not exactly one JSON value", d.name, payload)
	}
	return true
}

// deviceChecks are the controller's rules for a device's message, checked
// on what DecodeDevice accepted: nested at most MaxDepth deep, no member
// name twice in an object (names compared decoded, in valid UTF-8), and
// Decode (the lenient decoder) reads the same value from it.
func deviceChecks[T any](t *testing.T, payload []byte, v T) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(payload))
	depth, maxDepth := 0, 0
	type frame struct {
		object bool
		names  map[string]bool
		key    bool // the next string token is a member name
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		top := (*frame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.key
		if top != nil && top.object {
			top.key = !top.key
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				depth++
				maxDepth = max(maxDepth, depth)
				stack = append(stack, &frame{object: tok == '{', names: map[string]bool{}, key: true})
			default:
				depth--
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].key = true
				}
			}
		case string:
			// Names are compared decoded, so only in valid UTF-8: there,
			// names that differ only in invalid bytes decode alike (U+FFFD)
			// while DecodeDevice tells them apart as sent; such names match
			// no field and are ignored (the comparison with Decode below
			// checks that the value is the same).
			if isKey && utf8.Valid(payload) {
				if top.names[tok] {
					t.Fatalf("DecodeDevice accepted the member name %q twice in %q", tok, payload)
				}
				top.names[tok] = true
			}
		}
	}
	if maxDepth > MaxDepth {
		t.Fatalf("DecodeDevice accepted nesting %d deep (limit %d): %q", maxDepth, MaxDepth, payload)
	}
	var lenient T
	if err := Decode(payload, &lenient); err != nil {
		t.Fatalf("Decode refuses what DecodeDevice accepted (%q): %v", payload, err)
	}
	a, _ := Encode(v)
	b, _ := Encode(lenient)
	if !bytes.Equal(a, b) {
		t.Fatalf("Decode and DecodeDevice read %q differently:\n %s\n %s", payload, b, a)
	}
}

// roundTrip encodes v, decodes the result with d and returns it with the
// encoded bytes; it fails the test if the encoding does not decode or is
// not a fixed point.
func roundTrip[T any](t *testing.T, d decoder, v T) (T, []byte) {
	t.Helper()
	b1, err := Encode(v)
	if err != nil {
		t.Fatalf("Encode of a decoded %T failed: %v", v, err)
	}
	var v2 T
	if err := d.decode(b1, &v2); err != nil {
		t.Fatalf("re-encoded %T %q does not decode (%s): %v", v, b1, d.name, err)
	}
	b2, err := Encode(v2)
	if err != nil {
		t.Fatalf("second Encode failed: %v", err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("Encode is not a fixed point:\n first  %s\n second %s", b1, b2)
	}
	return v2, b1
}

// validID is the id rule of a receipt, written out: [A-Za-z0-9._:-]{1,200}
// for command_id and query_id, {1,400} for operation_id.
func validID(id string, maxLen int) bool {
	if len(id) < 1 || len(id) > maxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:-", c) >= 0) {
			return false
		}
	}
	return true
}

func FuzzReceipt(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte) {
		checkReceiptPlain(t, payload)
		var r Receipt
		if !controllerSide.accepts(t, payload, &r) {
			return
		}
		deviceChecks(t, payload, r)
		verr := r.Validate()
		if verr == nil {
			switch {
			case !validID(r.CommandID, 200), r.QueryID != "" && !validID(r.QueryID, 200),
				r.OperationID != "" && !validID(r.OperationID, 400):
				t.Fatalf("accepted ids outside their charset or length: %q %q %q", r.CommandID, r.OperationID, r.QueryID)
			case !r.Status.Valid():
				t.Fatalf("accepted status %q", r.Status)
			case r.Status == ReceiptUnknown && r.Seq != 0, r.Status != ReceiptUnknown && r.Seq < 1:
				t.Fatalf("accepted status %s with seq %d", r.Status, r.Seq)
			}
			// Storable as text by both backends (PostgreSQL refuses a NUL
			// character and invalid UTF-8).
			for _, s := range []string{r.CommandID, r.OperationID, r.Error, r.QueryID, string(r.Result)} {
				if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
					t.Fatalf("accepted a receipt with text PostgreSQL cannot store: %q", s)
				}
			}
			if res := bytes.TrimSpace(r.Result); len(res) > 0 && !bytes.Equal(res, []byte("null")) {
				var obj map[string]json.RawMessage
				if err := json.Unmarshal(res, &obj); err != nil {
					t.Fatalf("accepted result %q, not a JSON object: %v", res, err)
				}
			}
			controllerSide.checkSizeLimit(t, payload, func() any { return new(Receipt) })
		}
		r2, b := roundTrip(t, controllerSide, r)
		if r2.CommandID != r.CommandID || r2.OperationID != r.OperationID || r2.Status != r.Status ||
			r2.Seq != r.Seq || !sameTime(r2.At, r.At) || !sameJSON(r2.Result, r.Result) ||
			r2.Error != r.Error || r2.QueryID != r.QueryID {
			t.Fatalf("round trip changed the receipt:\n before %+v\n after  %+v\n via    %s", r, r2, b)
		}
		if (r2.Validate() == nil) != (verr == nil) {
			t.Fatalf("Validate disagrees after the round trip: %v, then %v (%s)", verr, r2.Validate(), b)
		}
	})
}

func FuzzPresence(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte) {
		var p Presence
		if !controllerSide.accepts(t, payload, &p) {
			return
		}
		deviceChecks(t, payload, p)
		verr := p.Validate()
		if inRange := p.Session >= 0 && p.Session <= MaxSafeInteger; (verr == nil) != inRange {
			t.Fatalf("Validate of session %d: %v", p.Session, verr)
		}
		if verr == nil {
			// Rank orders presence by session, then offline above online: the
			// rank of the next presence in that order must be above its own
			// (no overflow, no wrap-around).
			if p.Online {
				off := p
				off.Online = false
				if off.Rank() <= p.Rank() {
					t.Fatalf("offline rank %d not above online rank %d at session %d", off.Rank(), p.Rank(), p.Session)
				}
			}
			if next := (Presence{Online: true, Session: p.Session + 1}); next.Validate() == nil && next.Rank() <= p.Rank() {
				t.Fatalf("session %d (rank %d) does not rank above session %d (rank %d)", next.Session, next.Rank(), p.Session, p.Rank())
			}
			if p.Rank() <= -1 {
				t.Fatalf("accepted session %d has rank %d, at or below the stored rank of a device never seen (-1)", p.Session, p.Rank())
			}
			controllerSide.checkSizeLimit(t, payload, func() any { return new(Presence) })
		}
		p2, b := roundTrip(t, controllerSide, p)
		same := p2.Online == p.Online && p2.Session == p.Session &&
			(p2.Capabilities == nil) == (p.Capabilities == nil) && (p2.At == nil) == (p.At == nil)
		if same && p.Capabilities != nil {
			same = *p2.Capabilities == *p.Capabilities
		}
		if same && p.At != nil {
			same = sameTime(*p2.At, *p.At)
		}
		if !same {
			t.Fatalf("round trip changed the presence:\n before %+v\n after  %+v\n via    %s", p, p2, b)
		}
		if (p2.Validate() == nil) != (verr == nil) {
			t.Fatalf("Validate disagrees after the round trip: %v, then %v (%s)", verr, p2.Validate(), b)
		}
	})
}

func FuzzCommand(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte) {
		var c Command
		if deviceSide.accepts(t, payload, &c) {
			c2, b := roundTrip(t, deviceSide, c)
			if c2.CommandID != c.CommandID || c2.OperationID != c.OperationID || c2.Action != c.Action ||
				!sameJSON(c2.Params, c.Params) || !sameTime(c2.IssuedAt, c.IssuedAt) ||
				!sameTime(c2.ExpiresAt, c.ExpiresAt) || c2.Attempt != c.Attempt {
				t.Fatalf("round trip changed the command:\n before %+v\n after  %+v\n via    %s", c, c2, b)
			}
			// Params reach the device as sent: no HTML escaping on the way.
			if bytes.Contains(c.Params, []byte("<")) && !bytes.Contains(b, []byte("<")) {
				t.Fatalf("Encode escaped the params' '<': %s", b)
			}
		}
		var q Query
		if deviceSide.accepts(t, payload, &q) {
			q2, b := roundTrip(t, deviceSide, q)
			if q2 != q {
				t.Fatalf("round trip changed the query:\n before %+v\n after  %+v\n via    %s", q, q2, b)
			}
		}
	})
}

// validDeviceID is the contract's rule, written out independently of
// ValidDeviceID's regexp: [A-Za-z0-9._-]{1,64}, not controller-*, and (the
// implementation's extra rule) not only dots.
func validDeviceID(id string) bool {
	if len(id) < 1 || len(id) > 64 || strings.HasPrefix(id, "controller-") || strings.Trim(id, ".") == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

var kinds = []Kind{KindCommands, KindReceipts, KindQueries, KindPresence}

func FuzzParseTopic(f *testing.F) {
	f.Fuzz(func(t *testing.T, root, topic string) {
		device, kind, err := ParseTopic(root, topic)
		if err == nil {
			if !validDeviceID(device) {
				t.Fatalf("ParseTopic(%q, %q) accepted device id %q", root, topic, device)
			}
			if got := Topic(root, device, kind); got != topic {
				t.Fatalf("ParseTopic(%q, %q) = %q, %q; Topic gives back %q", root, topic, device, kind, got)
			}
		}
		// The other way: every topic built from a device id and a kind parses
		// back to them when the id is valid, and never when it is not. The
		// candidate id is the topic text itself (any string the fuzzer finds).
		for _, k := range kinds {
			d, gotKind, err := ParseTopic(root, Topic(root, topic, k))
			switch valid := validDeviceID(topic); {
			case valid && (err != nil || d != topic || gotKind != k):
				t.Fatalf("Topic(%q, %q, %s) parses to %q, %q, %v", root, topic, k, d, gotKind, err)
			case !valid && err == nil:
				t.Fatalf("Topic(%q, %q, %s) with an invalid device id parsed to %q, %q", root, topic, k, d, gotKind)
			}
		}
	})
}
