package wire

// Fuzz targets for the wire decoders: the payloads a device sends the
// controller (Receipt, Presence) and the ones the controller sends a device
// (Command, Query), and the topic parser. `go test` runs the seeds under
// testdata/fuzz as unit tests; `go test -fuzz '^FuzzReceipt$' ./internal/wire/`
// explores (.ci/fuzz runs each target for a few seconds in `make test`).
//
// Each target asserts properties, not only "does not panic":
//   - whatever Decode accepts is exactly one JSON value, at most MaxPayload
//     bytes (padding an accepted payload past MaxPayload is refused);
//   - whatever it accepts re-encodes (Encode) to a payload that decodes to the
//     same value, and encoding that again gives the same bytes (a fixed point);
//   - validation (Receipt.Validate, Presence.Validate) gives the same answer
//     for the re-encoded value, and what it accepts keeps the contract's
//     rules; the presence it accepts ranks in session order (no overflow,
//     nothing at or below a device never seen).

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

// checkSizeLimit pads an accepted payload with JSON whitespace to exactly
// MaxPayload bytes (still accepted) and to one byte more (refused). It
// allocates 256 KiB, so it runs for one input in 64.
func checkSizeLimit(t *testing.T, payload []byte, v func() any) {
	t.Helper()
	if crc32.ChecksumIEEE(payload)%64 != 0 || len(payload) > MaxPayload {
		return
	}
	padded := append(bytes.Clone(payload), bytes.Repeat([]byte(" "), MaxPayload-len(payload))...)
	if err := Decode(padded, v()); err != nil {
		t.Fatalf("payload padded to MaxPayload (%d bytes) refused: %v", len(padded), err)
	}
	if err := Decode(append(padded, ' '), v()); err == nil {
		t.Fatalf("payload of %d bytes (over MaxPayload) accepted", len(padded)+1)
	}
}

// decodeAccepted runs the checks common to every payload type: a payload
// over MaxPayload is refused; an accepted one is exactly one JSON value.
func decodeAccepted(t *testing.T, payload []byte, v any) bool {
	t.Helper()
	err := Decode(payload, v)
	if len(payload) > MaxPayload && err == nil {
		t.Fatalf("payload of %d bytes accepted", len(payload))
	}
	if err != nil {
		return false
	}
	if !json.Valid(payload) {
		t.Fatalf("Decode accepted %q, which is not exactly one JSON value", payload)
	}
	return true
}

// roundTrip encodes v, decodes the result into fresh (a pointer to a zero
// value of v's type) and returns it with the encoded bytes; it fails the test
// if the encoding does not decode or is not a fixed point.
func roundTrip[T any](t *testing.T, v T) (T, []byte) {
	t.Helper()
	b1, err := Encode(v)
	if err != nil {
		t.Fatalf("Encode of a decoded %T failed: %v", v, err)
	}
	var v2 T
	if err := Decode(b1, &v2); err != nil {
		t.Fatalf("re-encoded %T %q does not decode: %v", v, b1, err)
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

func FuzzReceipt(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r Receipt
		if !decodeAccepted(t, payload, &r) {
			return
		}
		verr := r.Validate()
		if verr == nil {
			switch {
			case r.CommandID == "":
				t.Fatalf("accepted a receipt without command_id")
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
			checkSizeLimit(t, payload, func() any { return new(Receipt) })
		}
		r2, b := roundTrip(t, r)
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
		if !decodeAccepted(t, payload, &p) {
			return
		}
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
			checkSizeLimit(t, payload, func() any { return new(Presence) })
		}
		p2, b := roundTrip(t, p)
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
		if decodeAccepted(t, payload, &c) {
			c2, b := roundTrip(t, c)
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
		if decodeAccepted(t, payload, &q) {
			q2, b := roundTrip(t, q)
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
