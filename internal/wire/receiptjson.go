package wire

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// receiptMembers are Receipt's JSON names, read from its tags.
var receiptMembers = func() []string {
	t := reflect.TypeFor[Receipt]()
	names := make([]string, t.NumField())
	for i := range names {
		names[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return names
}()

// decodeReceiptPlain decodes a receipt payload that CheckJSON accepted into
// r as json.Unmarshal would, for the common kind: every member of the
// receipt's a string of printable ASCII with no escape, seq an integer of
// at most 18 digits, at a time Time.UnmarshalJSON takes, result any value
// (copied as it is), and every other member name neither one of the
// receipt's spelt in another case nor anything but ASCII without escapes
// (encoding/json matches names without regard to case, Unicode's folding
// included). It returns false, and leaves r as it was, for any other
// payload: json.Unmarshal decodes that one, with its own errors.
//
// Every receipt passes here, three an operation: encoding/json scanned each
// once more before it decoded it by reflection.
func decodeReceiptPlain(data []byte, r *Receipt) bool {
	out := *r
	s := scanner{b: data}
	if !s.byte('{') {
		return false
	}
	for first := true; !s.byte('}'); first = false {
		if !first && !s.byte(',') {
			return false
		}
		name, ok := s.plainString()
		if !ok || !s.byte(':') {
			return false
		}
		s.space()
		start := s.i
		switch string(name) {
		case "command_id":
			ok = s.text(&out.CommandID)
		case "operation_id":
			ok = s.text(&out.OperationID)
		case "status":
			var v string
			ok = s.text(&v)
			out.Status = ReceiptStatus(v)
		case "error":
			ok = s.text(&out.Error)
		case "query_id":
			ok = s.text(&out.QueryID)
		case "seq":
			out.Seq, ok = s.integer()
		case "at":
			_, ok = s.plainString()
			ok = ok && out.At.UnmarshalJSON(data[start:s.i]) == nil
		case "result":
			ok = s.skipValue()
			out.Result = append(json.RawMessage(nil), data[start:s.i]...)
		default:
			for _, m := range receiptMembers {
				if strings.EqualFold(string(name), m) {
					return false
				}
			}
			ok = s.skipValue()
		}
		if !ok {
			return false
		}
	}
	if !s.end() {
		return false
	}
	*r = out
	return true
}

// scanner walks a JSON text that json.Valid accepted.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() { s.i = spaceEnd(s.b, s.i) }

// byte reads c after any whitespace.
func (s *scanner) byte(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end says nothing but whitespace follows.
func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// plainString reads a string of printable ASCII without a backslash and
// returns its contents.
func (s *scanner) plainString() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := s.b[s.i:j]
			s.i = j + 1
			return v, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// text reads a plainString into v.
func (s *scanner) text(v *string) bool {
	b, ok := s.plainString()
	*v = string(b)
	return ok
}

// integer reads an integer of at most 18 digits (no fraction, no exponent).
func (s *scanner) integer() (int, bool) {
	s.space()
	j := s.i
	if j < len(s.b) && s.b[j] == '-' {
		j++
	}
	k := j
	for k < len(s.b) && s.b[k] >= '0' && s.b[k] <= '9' {
		k++
	}
	if k == j || k-j > 18 || k < len(s.b) && (s.b[k] == '.' || s.b[k] == 'e' || s.b[k] == 'E') {
		return 0, false
	}
	n, err := strconv.Atoi(string(s.b[s.i:k]))
	if err != nil {
		return 0, false
	}
	s.i = k
	return n, true
}

// skipValue steps over one value of the valid text.
func (s *scanner) skipValue() bool {
	s.space()
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		s.skipString()
		return true
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				s.skipString()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					s.i++
					return true
				}
			}
			s.i++
		}
		return false
	}
	for s.i < len(s.b) { // a number or a literal: up to what ends it
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return true
		}
		s.i++
	}
	return true
}

// skipString steps over the string that begins at s.i.
func (s *scanner) skipString() {
	for s.i++; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			s.i++
		case '"':
			s.i++
			return
		}
	}
}
