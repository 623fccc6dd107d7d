package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Input limits. A device's message is refused whole when it breaks one, an
// API request body likewise (see internal/api); nothing of it is applied.
const (
	// MaxDevicePayload bounds a receipt or presence message the controller
	// accepts (commands a device accepts are bounded by MaxPayload).
	MaxDevicePayload = 64 << 10
	// MaxResultBytes bounds a receipt's encoded result, and MaxErrorBytes
	// its error, as a device sends them: with the ids at their longest, a
	// receipt within both always fits in MaxDevicePayload, so no final
	// receipt that a conforming device sends is ever refused. A device
	// whose action's result is larger sends TooLargeResult in its place
	// (BoundReceipt).
	MaxResultBytes = 32 << 10
	MaxErrorBytes  = 1 << 10
	// MaxSalvagePayload bounds an oversized receipt the controller still
	// reads the status of (SalvageReceipt): the shipped broker's
	// max_packet_size.
	MaxSalvagePayload = 1 << 20
	// MaxDepth bounds the nesting of objects and arrays in any JSON the
	// controller accepts, from a device or through its API.
	MaxDepth = 32
)

// Reasons an input is refused, the reason label of
// controller_inputs_refused_total.
const (
	ReasonTooLarge = "too_large" // over its size limit
	// ReasonResultTooLarge: a receipt over MaxDevicePayload whose result
	// was dropped and whose status was applied (SalvageReceipt).
	ReasonResultTooLarge = "result_too_large"
	ReasonInvalidJSON    = "invalid_json"  // not JSON, or trailing data after the value
	ReasonTooDeep        = "too_deep"      // objects and arrays nested deeper than MaxDepth
	ReasonDuplicateKey   = "duplicate_key" // an object with two members of one name
	ReasonBadNumber      = "bad_number"    // a number that does not fit where it goes
	ReasonWrongType      = "wrong_type"    // a field of the wrong JSON type
	ReasonUnknownField   = "unknown_field" // a field the request type does not have (API bodies only)
	ReasonBadID          = "bad_id"        // an id outside its charset or length
	ReasonInvalidValue   = "invalid_value" // any other value the contract refuses
	ReasonBadTopic       = "bad_topic"     // an MQTT topic outside {root}/{d}/{kind}
	ReasonRateLimited    = "rate_limited"  // over the device's rate (dropped, acknowledged)
	ReasonMediaType      = "unsupported_media_type"
	ReasonForbiddenOrig  = "forbidden_origin"
	ReasonMisdirected    = "misdirected_host"
)

// InputError is an input refused by a limit or a rule: Reason is one of the
// Reason constants, Field names where ("params.a[2]", "" for the whole
// input), Msg says what is wrong.
type InputError struct {
	Reason string
	Field  string
	Msg    string
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func inputErr(reason, field, format string, args ...any) *InputError {
	return &InputError{Reason: reason, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Reason returns the Reason of an *InputError in err's chain, or def.
func Reason(err error, def string) string {
	var ie *InputError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return def
}

// CheckOptions chooses the rules of CheckJSON beyond syntax.
type CheckOptions struct {
	// MaxDepth bounds nesting (MaxDepth when 0).
	MaxDepth int
	// SafeIntegers refuses an integer (no fraction, no exponent) beyond
	// ±(2^53-1), which a double would silently change (I-JSON, RFC 7493).
	// Device results keep their numbers as sent, so they do not set it.
	SafeIntegers bool
}

// CheckJSON checks data, which must be one JSON value, and returns the first
// rule it breaks as an *InputError naming where: invalid JSON or trailing
// data, nesting deeper than the limit, an object with a member name twice,
// a number no double holds (1e400), and with SafeIntegers an integer
// beyond ±(2^53-1). It reads data once and allocates only for object keys.
func CheckJSON(data []byte, o CheckOptions) error {
	if !json.Valid(data) {
		return syntaxError(data)
	}
	return CheckValidJSON(data, o)
}

// CheckValidJSON is CheckJSON for data already known to be one valid JSON
// value (json.Valid): it skips the syntax check.
func CheckValidJSON(data []byte, o CheckOptions) error {
	if o.MaxDepth <= 0 {
		o.MaxDepth = MaxDepth
	}
	var (
		keys [8][]byte
		path [4]pathElem
	)
	c := &checker{data: data, opts: o, keys: keys[:0], path: path[:0]}
	c.skipSpace()
	return c.value(0)
}

// syntaxError says why data is not one JSON value.
func syntaxError(data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return inputErr(ReasonInvalidJSON, "", "empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return inputErr(ReasonInvalidJSON, "", "not JSON: %v", err)
	}
	return inputErr(ReasonInvalidJSON, "", "trailing data after the JSON value (at byte %d)", dec.InputOffset())
}

// checker walks JSON already known to be valid.
type checker struct {
	data []byte
	i    int
	opts CheckOptions
	path []pathElem
	// keys are the member names seen in the objects being walked, the
	// innermost object's last; each object truncates it back to where
	// its own names started when it ends.
	keys [][]byte
}

type pathElem struct {
	key   []byte
	index int // -1 for an object member
}

func (c *checker) where() string {
	var b strings.Builder
	for _, p := range c.path {
		if p.index >= 0 {
			fmt.Fprintf(&b, "[%d]", p.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(shorten(string(p.key), 40))
	}
	return b.String()
}

// shorten keeps an error message bounded, whatever a caller sent.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func (c *checker) skipSpace() { c.i = spaceEnd(c.data, c.i) }

// spaceEnd returns the index of the first byte of b at or after i that is
// not JSON whitespace.
func spaceEnd(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func (c *checker) value(depth int) error {
	switch b := c.data[c.i]; {
	case b == '{' || b == '[':
		if depth+1 > c.opts.MaxDepth {
			return inputErr(ReasonTooDeep, c.where(), "objects and arrays nested deeper than %d", c.opts.MaxDepth)
		}
		if b == '{' {
			return c.object(depth + 1)
		}
		return c.array(depth + 1)
	case b == '"':
		c.skipString()
	case b == 't' || b == 'n':
		c.i += 4
	case b == 'f':
		c.i += 5
	default:
		return c.number()
	}
	return nil
}

func (c *checker) object(depth int) error {
	c.i++                    // {
	first := len(c.keys)     // this object's names are c.keys[first:]
	var seen map[string]bool // past a few members, a set
	for {
		c.skipSpace()
		if c.data[c.i] == '}' {
			c.i++
			c.keys = c.keys[:first]
			return nil
		}
		if c.data[c.i] == ',' {
			c.i++
			c.skipSpace()
		}
		start := c.i
		c.skipString()
		key := c.key(c.data[start:c.i])
		dup := false
		if seen != nil {
			dup = seen[string(key)]
			seen[string(key)] = true
		} else {
			for _, k := range c.keys[first:] {
				if bytes.Equal(k, key) {
					dup = true
					break
				}
			}
			c.keys = append(c.keys, key)
			if len(c.keys)-first > 16 {
				seen = make(map[string]bool, 32)
				for _, k := range c.keys[first:] {
					seen[string(k)] = true
				}
			}
		}
		c.path = append(c.path, pathElem{key: key, index: -1})
		if dup {
			return inputErr(ReasonDuplicateKey, c.where(), "appears twice in one object")
		}
		c.skipSpace()
		c.i++ // :
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
		c.skipSpace()
	}
}

func (c *checker) array(depth int) error {
	c.i++ // [
	for n := 0; ; n++ {
		c.skipSpace()
		if c.data[c.i] == ']' {
			c.i++
			return nil
		}
		if c.data[c.i] == ',' {
			c.i++
			c.skipSpace()
		}
		c.path = append(c.path, pathElem{index: n})
		if err := c.value(depth); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
		c.skipSpace()
	}
}

// key decodes a member name (with its quotes), unescaping only when needed
// (else it is data's own bytes).
func (c *checker) key(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	var s string
	_ = json.Unmarshal(raw, &s) // valid JSON: cannot fail
	return []byte(s)
}

func (c *checker) skipString() {
	c.i++ // opening quote
	for c.i < len(c.data) {
		switch c.data[c.i] {
		case '\\':
			c.i += 2
		case '"':
			c.i++
			return
		default:
			c.i++
		}
	}
}

func (c *checker) number() error {
	start := c.i
	for ; c.i < len(c.data); c.i++ {
		if b := c.data[c.i]; !(b >= '0' && b <= '9' || b == '-' || b == '+' || b == '.' || b == 'e' || b == 'E') {
			break
		}
	}
	lit := string(c.data[start:c.i])
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return inputErr(ReasonBadNumber, c.where(), "the number %s does not fit in a double; send it as a string", shorten(lit, 40))
	}
	if c.opts.SafeIntegers && !strings.ContainsAny(lit, ".eE") && math.Abs(f) >= 1<<53 {
		return inputErr(ReasonBadNumber, c.where(), "the integer %s is beyond ±(2^53-1); send it as a string", shorten(lit, 40))
	}
	return nil
}

// DecodeInto decodes data, already checked by CheckJSON, into v (a pointer
// to a struct) and names the field of any refusal: a field of the wrong
// type (wrong_type), a number that does not fit its field (bad_number), a
// time that is not RFC 3339 (wrong_type), and with strict an unknown field
// (unknown_field). Without strict, unknown fields are ignored, as device
// messages may carry fields of a later protocol version.
func DecodeInto(data []byte, v any, strict bool) error {
	var err error
	if strict {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
	} else {
		// One value (the checks before a decode make sure of it): Unmarshal
		// decodes it as a Decoder would, without the Decoder's buffer.
		err = json.Unmarshal(data, v)
	}
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te):
		if te.Field == "" {
			return inputErr(ReasonWrongType, "", "want %s, got %s", describe(te.Type), te.Value)
		}
		if lit, ok := strings.CutPrefix(te.Value, "number "); ok {
			return inputErr(ReasonBadNumber, te.Field, "the number %s does not fit %s", shorten(lit, 40), describe(te.Type))
		}
		return inputErr(ReasonWrongType, te.Field, "want %s, got %s", describe(te.Type), te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return inputErr(ReasonUnknownField, "", "unknown field %s", shorten(name, 60))
	}
	// An Unmarshaler's own error (a time that does not parse) names no
	// field: find the top-level time field that refuses its value.
	if field := badTimeField(data, v); field != "" {
		return inputErr(ReasonWrongType, field, "want an RFC 3339 time as a string, e.g. \"2026-01-02T15:04:05Z\"")
	}
	return inputErr(ReasonInvalidValue, "", "%v", err)
}

var timeType = reflect.TypeFor[time.Time]()

// badTimeField returns the JSON name of the first top-level time field of
// *v whose value in data does not decode, or "".
func badTimeField(data []byte, v any) string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return ""
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil {
		return ""
	}
	for i := range t.NumField() {
		f := t.Field(i)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft != timeType {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		raw, ok := members[name]
		if !ok {
			continue
		}
		var tm *time.Time
		if json.Unmarshal(raw, &tm) != nil {
			return name
		}
	}
	return ""
}

// describe names a Go type as JSON: "a string", "an integer", ...
func describe(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	if t == timeType {
		return "an RFC 3339 time as a string"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return describe(t.Elem())
	}
	return "another type"
}

// DecodeDevice decodes a receipt or presence payload into v: at most
// MaxDevicePayload bytes, one JSON value nested at most MaxDepth deep, no
// member name twice, numbers that fit, fields of the right type. Unknown
// fields are ignored. Every refusal is an *InputError.
func DecodeDevice(payload []byte, v any) error {
	if len(payload) > MaxDevicePayload {
		return inputErr(ReasonTooLarge, "", "payload of %d bytes exceeds %d", len(payload), MaxDevicePayload)
	}
	if err := CheckJSON(payload, CheckOptions{}); err != nil {
		return err
	}
	if r, ok := v.(*Receipt); ok && decodeReceiptPlain(payload, r) {
		return nil
	}
	return DecodeInto(payload, v, false)
}

// TooLargeResult is the result a receipt carries in place of one over
// MaxResultBytes: {"result_too_large":{"bytes":N,"limit":32768}}.
func TooLargeResult(n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"result_too_large":{"bytes":%d,"limit":%d}}`, n, MaxResultBytes))
}

// BoundReceipt makes a receipt a device is about to send fit the
// protocol's limits: a result over MaxResultBytes becomes TooLargeResult,
// an error over MaxErrorBytes is cut at a character boundary. The status
// is never changed: the action's outcome is the fact that matters.
func BoundReceipt(r *Receipt) {
	if len(r.Result) > MaxResultBytes {
		r.Result = TooLargeResult(len(r.Result))
	}
	if len(r.Error) > MaxErrorBytes {
		cut := MaxErrorBytes
		for cut > 0 && !utf8.RuneStart(r.Error[cut]) {
			cut--
		}
		r.Error = r.Error[:cut]
	}
}

// SalvageReceipt reads a receipt payload over MaxDevicePayload (up to
// MaxSalvagePayload) whose result broke the result limit, so that its
// status is not lost: the result is replaced by TooLargeResult, the error
// bounded, unknown fields dropped, and the receipt re-encoded within the
// limits. A payload oversized for anything but its result is refused. The
// caller runs it through DecodeDevice and Validate like any other, so
// every other rule still holds; a payload that is not a JSON object with
// the receipt's fields is an *InputError (too_large).
func SalvageReceipt(payload []byte) ([]byte, error) {
	if len(payload) > MaxSalvagePayload {
		return nil, inputErr(ReasonTooLarge, "", "payload of %d bytes exceeds %d", len(payload), MaxSalvagePayload)
	}
	var r Receipt
	err := CheckJSON(payload, CheckOptions{})
	if err == nil {
		err = json.Unmarshal(payload, &r)
	}
	if err != nil {
		return nil, inputErr(ReasonTooLarge, "", "payload of %d bytes exceeds %d, and its receipt cannot be read: %v",
			len(payload), MaxDevicePayload, err)
	}
	if len(r.Result) <= MaxResultBytes {
		return nil, inputErr(ReasonTooLarge, "", "payload of %d bytes exceeds %d, and not for its result", len(payload), MaxDevicePayload)
	}
	BoundReceipt(&r)
	if err := r.Validate(); err != nil {
		return nil, inputErr(ReasonTooLarge, "", "payload of %d bytes exceeds %d, and it is no valid receipt: %v", len(payload), MaxDevicePayload, err)
	}
	out, err := Encode(r)
	if err != nil || len(out) > MaxDevicePayload {
		return nil, inputErr(ReasonTooLarge, "", "payload of %d bytes exceeds %d, and its ids alone do", len(payload), MaxDevicePayload)
	}
	return out, nil
}
