package jcs

import "bytes"

// Plain reports whether data is a JSON object already in its canonical
// form, I-JSON and compact, from its bytes alone: a flat object whose
// member names and string values are printable ASCII without a quote or a
// backslash, its names in ascending order (which is RFC 8785's order for
// ASCII, and leaves no name twice), and whose other values are integers of
// at most 15 digits other than -0, true, false or null. Such a text is its
// own canonical form: Canonicalize and CheckIJSON would return it
// unchanged and nil. false says only that this check cannot tell; they
// decide then.
//
// Most params are of this kind ({"reason":"maintenance"}), and a submit
// checks its params for both on every call.
func Plain(data []byte) bool {
	if len(data) < 2 || data[0] != '{' || data[len(data)-1] != '}' {
		return false
	}
	if len(data) == 2 {
		return true
	}
	var last []byte
	for i := 1; ; {
		name, n := plainString(data[i:])
		if n == 0 || (last != nil && bytes.Compare(name, last) <= 0) {
			return false
		}
		last, i = name, i+n
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i++
		if n = plainValue(data[i:]); n == 0 {
			return false
		}
		i += n
		switch {
		case i == len(data)-1:
			return true
		case data[i] != ',':
			return false
		}
		i++
	}
}

// plainString reads a string of printable ASCII without a quote or a
// backslash at the start of b: its contents and its length with the
// quotes, or 0.
func plainString(b []byte) ([]byte, int) {
	if len(b) == 0 || b[0] != '"' {
		return nil, 0
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], i + 1
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, 0
		}
	}
	return nil, 0
}

// plainValue reads a plain member value (Plain) at the start of b: its
// length, or 0.
func plainValue(b []byte) int {
	if _, n := plainString(b); n > 0 {
		return n
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(b, []byte(lit)) {
			return len(lit)
		}
	}
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	start := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	digits := b[start:i]
	switch {
	case len(digits) == 0 || len(digits) > 15:
		return 0
	case digits[0] == '0' && (len(digits) > 1 || start > 0): // 01 is not JSON; -0 is written 0
		return 0
	}
	return i
}
