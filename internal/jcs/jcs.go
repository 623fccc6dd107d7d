package jcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Errors returned by Canonicalize and Marshal. Every error they return wraps
// exactly one of these, so a caller can map all of them to one "invalid
// input" answer or tell them apart with errors.Is.
var (
	// ErrSyntax: the input is not exactly one valid JSON value.
	ErrSyntax = errors.New("jcs: invalid JSON")
	// ErrDuplicateName: an object has two members with the same name.
	ErrDuplicateName = errors.New("jcs: duplicate member name")
	// ErrNumber: a number is not a finite IEEE-754 double.
	ErrNumber = errors.New("jcs: number is not a finite double")
	// ErrString: the input is not valid UTF-8, or a string holds a \uXXXX
	// surrogate escape that is not half of a pair.
	ErrString = errors.New("jcs: string is not valid Unicode")
)

// Canonicalize returns the RFC 8785 canonical form of the JSON text data.
// See the package documentation for the rules and the rejected inputs.
func Canonicalize(data []byte) ([]byte, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: invalid UTF-8 at byte %d", ErrString, invalidUTF8At(data))
	}
	if !json.Valid(data) {
		var raw json.RawMessage
		err := json.Unmarshal(data, &raw) // only for a message with an offset
		if err == nil {
			err = errors.New("not a JSON value")
		}
		return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	c := &canonicalizer{data: data, dec: json.NewDecoder(bytes.NewReader(data))}
	c.dec.UseNumber()
	v, err := c.value()
	if err != nil {
		return nil, err
	}
	// json.Valid has already ruled out trailing data; this keeps the walk
	// honest should the two ever disagree.
	if _, err := c.dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the top-level value", ErrSyntax)
	}
	return v.append(make([]byte, 0, len(data))), nil
}

// Marshal encodes v with encoding/json and returns the canonical form of the
// result. encoding/json writes invalid UTF-8 in a Go string as U+FFFD, and
// fails on NaN and infinities, as Canonicalize would.
func Marshal(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("jcs: marshal: %w", err)
	}
	return Canonicalize(data)
}

// The input is parsed into a tree first and written out once, so the work is
// linear in the input (plus the sorts) however deep the nesting: writing each
// object's members into a buffer of its own would copy a deep value once
// per level.
type value struct {
	scalar            []byte   // canonical text of a string, number or literal
	array             []value  // elements, when isArray
	members           []member // members in canonical order, when isObject
	isArray, isObject bool
}

type member struct {
	name  string
	units []uint16 // name as UTF-16 code units, the sort key
	value value
}

func (v *value) append(b []byte) []byte {
	switch {
	case v.isArray:
		b = append(b, '[')
		for i := range v.array {
			if i > 0 {
				b = append(b, ',')
			}
			b = v.array[i].append(b)
		}
		return append(b, ']')
	case v.isObject:
		b = append(b, '{')
		for i := range v.members {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, v.members[i].name)
			b = append(b, ':')
			b = v.members[i].value.append(b)
		}
		return append(b, '}')
	}
	return append(b, v.scalar...)
}

type canonicalizer struct {
	data []byte
	dec  *json.Decoder
}

// next returns the next token and the raw input bytes it was read from
// (possibly preceded by whitespace, ',' or ':').
func (c *canonicalizer) next() (json.Token, []byte, error) {
	start := c.dec.InputOffset()
	tok, err := c.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	return tok, c.data[start:c.dec.InputOffset()], nil
}

// value reads one JSON value.
func (c *canonicalizer) value() (value, error) {
	tok, raw, err := c.next()
	if err != nil {
		return value{}, err
	}
	return c.token(tok, raw)
}

func (c *canonicalizer) token(tok json.Token, raw []byte) (value, error) {
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return c.object()
		case '[':
			return c.array()
		}
		return value{}, fmt.Errorf("%w: unexpected %q", ErrSyntax, t)
	case string:
		s, err := unquote(raw)
		if err != nil {
			return value{}, err
		}
		return value{scalar: AppendString(nil, s)}, nil
	case json.Number:
		f, err := strconv.ParseFloat(t.String(), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return value{}, fmt.Errorf("%w: %s", ErrNumber, t)
		}
		return value{scalar: appendNumber(nil, f)}, nil
	case bool:
		if t {
			return value{scalar: []byte("true")}, nil
		}
		return value{scalar: []byte("false")}, nil
	case nil:
		return value{scalar: []byte("null")}, nil
	}
	return value{}, fmt.Errorf("%w: unexpected token %v", ErrSyntax, tok)
}

func (c *canonicalizer) array() (value, error) {
	v := value{isArray: true}
	for {
		tok, raw, err := c.next()
		if err != nil {
			return value{}, err
		}
		if tok == json.Delim(']') {
			return v, nil
		}
		e, err := c.token(tok, raw)
		if err != nil {
			return value{}, err
		}
		v.array = append(v.array, e)
	}
}

func (c *canonicalizer) object() (value, error) {
	v := value{isObject: true}
	for {
		tok, raw, err := c.next()
		if err != nil {
			return value{}, err
		}
		if tok == json.Delim('}') {
			break
		}
		if _, ok := tok.(string); !ok {
			return value{}, fmt.Errorf("%w: object member name is not a string", ErrSyntax)
		}
		name, err := unquote(raw)
		if err != nil {
			return value{}, err
		}
		mv, err := c.value()
		if err != nil {
			return value{}, err
		}
		v.members = append(v.members, member{name: name, units: utf16.Encode([]rune(name)), value: mv})
	}
	slices.SortFunc(v.members, func(x, y member) int { return slices.Compare(x.units, y.units) })
	for i := 1; i < len(v.members); i++ {
		if v.members[i].name == v.members[i-1].name {
			return value{}, fmt.Errorf("%w: %q", ErrDuplicateName, v.members[i].name)
		}
	}
	return v, nil
}

// unquote decodes the raw JSON string token in raw (leading whitespace, ','
// or ':' allowed), already checked for syntax and UTF-8 by the caller. Unlike
// encoding/json, which turns a lone surrogate escape into U+FFFD, it rejects
// one.
func unquote(raw []byte) (string, error) {
	i := bytes.IndexByte(raw, '"')
	j := bytes.LastIndexByte(raw, '"')
	if i < 0 || j <= i {
		return "", fmt.Errorf("%w: malformed string token", ErrSyntax)
	}
	s := raw[i+1 : j]
	if bytes.IndexByte(s, '\\') < 0 {
		return string(s), nil
	}
	out := make([]byte, 0, len(s))
	for k := 0; k < len(s); k++ {
		if s[k] != '\\' {
			out = append(out, s[k])
			continue
		}
		k++
		if k >= len(s) {
			return "", fmt.Errorf("%w: truncated escape", ErrSyntax)
		}
		switch s[k] {
		case '"', '\\', '/':
			out = append(out, s[k])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(s[k+1:])
			if !ok {
				return "", fmt.Errorf("%w: bad \\u escape", ErrSyntax)
			}
			k += 4
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00: // high half: a low half must follow
				lo, ok := rune(0), false
				if k+2 < len(s) && s[k+1] == '\\' && s[k+2] == 'u' {
					lo, ok = hex4(s[k+3:])
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return "", fmt.Errorf("%w: lone surrogate \\u%04x", ErrString, r)
				}
				k += 6
				r = utf16.DecodeRune(r, lo)
			case utf16.IsSurrogate(r):
				return "", fmt.Errorf("%w: lone surrogate \\u%04x", ErrString, r)
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", fmt.Errorf("%w: bad escape \\%c", ErrSyntax, s[k])
		}
	}
	return string(out), nil
}

func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

const hexDigits = "0123456789abcdef"

// AppendString appends s (valid UTF-8) to b as a canonical JSON string, as
// ECMAScript's JSON.stringify writes it: for Canonicalize, and for a caller
// that writes a canonical document out itself.
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendNumber writes the finite double f by the ECMAScript Number::toString
// algorithm (ECMA-262, Number::toString with radix 10). strconv's shortest
// formatting yields the digits s and exponent: the fewest digits that
// round-trip, the closest to f among those, as ECMAScript requires.
func appendNumber(b []byte, f float64) []byte {
	if f == 0 { // +0 and -0
		return append(b, '0')
	}
	if f < 0 {
		b = append(b, '-')
		f = -f
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // d[.ddd]e±XX
	p := bytes.IndexByte(e, 'e')
	exp, _ := strconv.Atoi(string(e[p+1:]))
	var digits []byte
	digits = append(digits, e[0])
	if p > 1 {
		digits = append(digits, e[2:p]...)
	}
	k := len(digits) // number of significant digits
	n := exp + 1     // f = 0.digits × 10^n
	switch {
	case k <= n && n <= 21: // integer: digits then n-k zeros
		b = append(b, digits...)
		for range n - k {
			b = append(b, '0')
		}
	case 0 < n && n <= 21: // fraction with the point inside the digits
		b = append(b, digits[:n]...)
		b = append(b, '.')
		b = append(b, digits[n:]...)
	case -6 < n && n <= 0: // 0.000ddd
		b = append(b, '0', '.')
		for range -n {
			b = append(b, '0')
		}
		b = append(b, digits...)
	default: // exponent form
		b = append(b, digits[0])
		if k > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if n-1 >= 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, int64(n-1), 10)
	}
	return b
}

func invalidUTF8At(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(data)
}
