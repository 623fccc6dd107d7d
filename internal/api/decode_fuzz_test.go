package api

// A fuzz target for the request decoders (decodeBody, decodeOptionalBody)
// with every request body type, through httptest requests and the same
// MaxBytesReader that ServeHTTP puts in front of them: no server runs.
// `go test` runs the seeds under testdata/fuzz; .ci/fuzz explores it for a
// few seconds in `make test`.
//
// Properties, for each body type:
//   - a refusal maps to a 4xx answer (400 invalid_json / invalid_request, 413
//     too_large), never to a 5xx;
//   - an accepted body is exactly one JSON value, I-JSON, every member name
//     the decoder mapped to a field is that field's exact name, and no field
//     holds a NUL character (PostgreSQL's text cannot store one);
//   - an accepted body re-encodes to one that is accepted and decodes to the
//     same value (re-encoding that gives the same bytes);
//   - the same body with an unknown member added is refused, naming it;
//   - padded with whitespace to 1 MiB it is still accepted, one byte more
//     is 413 too_large.

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/jcs"
)

// bodyKinds are the request bodies of the API, by route.
var bodyKinds = []struct {
	route    string
	new      func() any
	optional bool // decodeOptionalBody: an empty body is no body
}{
	{"POST /v1/operations", func() any { return new(apiwire.SubmitRequest) }, false},
	{"POST /v1/tasks", func() any { return new(apiwire.TaskRequest) }, false},
	{"PUT /v1/tasks/{id}/plan", func() any { return new(apiwire.PlanRequest) }, false},
	{"POST /v1/tasks/{id}/approvals", func() any { return new(apiwire.ApprovalRequest) }, false},
	{"POST /v1/tasks/{id}/rejections", func() any { return new(apiwire.RejectionRequest) }, false},
	{"POST /v1/grants", func() any { return new(apiwire.GrantRequest) }, false},
	{"POST /v1/operations/{id}/compensations", func() any { return new(apiwire.CompensationRequest) }, false},
	{"POST /v1/commands/{id}/resolve", func() any { return new(apiwire.ResolveRequest) }, false},
	{"POST /v1/commands/{id}/cancel", func() any { return new(struct{}) }, true},
}

// decode runs one body through the decoder of kind k as a handler would.
func decode(k int, body []byte) (any, error) {
	v := bodyKinds[k].new()
	r := httptest.NewRequest(http.MethodPost, "/v1/x", bytes.NewReader(body))
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, MaxBody)
	if bodyKinds[k].optional {
		return v, decodeOptionalBody(r, v)
	}
	return v, decodeBody(r, v)
}

// exactNames reports the first member name of body that is not the exact
// name of a field of t where t is a struct (at any depth: the steps of a
// plan too), or "".
func exactNames(body []byte, t reflect.Type) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	bad, _ := walkNames(dec, t)
	return bad
}

// opaque: a type that decodes itself (json.RawMessage, time.Time), whose
// members are not fields.
func opaque(t reflect.Type) bool {
	return reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]())
}

func walkNames(dec *json.Decoder, t reflect.Type) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return "", false
	}
	d, isDelim := tok.(json.Delim)
	switch {
	case isDelim && d == '{' && t.Kind() == reflect.Struct && !opaque(t):
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			fields[name] = f.Type
		}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return "", false
			}
			name := tok.(string)
			ft, ok := fields[name]
			if !ok {
				return name, true
			}
			if bad, ok := walkNames(dec, ft); bad != "" || !ok {
				return bad, ok
			}
		}
		_, err := dec.Token() // '}'
		return "", err == nil
	case isDelim && d == '[' && t.Kind() == reflect.Slice && !opaque(t):
		for dec.More() {
			if bad, ok := walkNames(dec, t.Elem()); bad != "" || !ok {
				return bad, ok
			}
		}
		_, err := dec.Token() // ']'
		return "", err == nil
	case isDelim && (d == '{' || d == '['):
		// Any other value (params, times): skip it whole.
		for depth := 1; depth > 0; {
			tok, err := dec.Token()
			if err != nil {
				return "", false
			}
			if d, ok := tok.(json.Delim); ok {
				if d == '{' || d == '[' {
					depth++
				} else {
					depth--
				}
			}
		}
	}
	return "", true
}

// nulString finds a string holding a NUL character in a decoded JSON value,
// params aside.
func nulString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, strings.IndexByte(v, 0) >= 0
	case []any:
		for _, e := range v {
			if s, ok := nulString(e); ok {
				return s, true
			}
		}
	case map[string]any:
		for k, e := range v {
			if k == "params" {
				continue
			}
			if s, ok := nulString(e); ok {
				return s, true
			}
		}
	}
	return "", false
}

func FuzzDecodeBody(f *testing.F) {
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		k := int(kind) % len(bodyKinds)
		route := bodyKinds[k].route
		v, err := decode(k, body)
		if err != nil {
			if ae := toAPIError(err); ae.Status != http.StatusBadRequest && ae.Status != http.StatusRequestEntityTooLarge {
				t.Fatalf("%s: body %q refused as %d %s (%s)", route, body, ae.Status, ae.Code, ae.Message)
			}
			return
		}
		if bodyKinds[k].optional && len(bytes.TrimSpace(body)) == 0 {
			return // no body at all (whitespace only counts as none)
		}
		if !json.Valid(body) {
			t.Fatalf("%s: accepted %q, which is not exactly one JSON value", route, body)
		}
		if err := jcs.CheckIJSON(body); err != nil {
			t.Fatalf("%s: accepted %q, which is not I-JSON: %v", route, body, err)
		}
		typ := reflect.TypeOf(v)
		if bad := exactNames(body, typ); bad != "" {
			t.Fatalf("%s: accepted member %q, which is not the exact name of a field, in %q", route, bad, body)
		}

		// Re-encoded, it decodes the same (and encoding is a fixed point).
		b1, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: cannot re-encode the decoded %+v: %v", route, v, err)
		}
		// Its text can be stored by both backends: no NUL character (which
		// PostgreSQL's text refuses) in a field; params stay raw JSON.
		var generic any
		_ = json.Unmarshal(b1, &generic)
		if s, ok := nulString(generic); ok {
			t.Fatalf("%s: accepted a NUL character in %q, from %q", route, s, body)
		}
		v2, err := decode(k, b1)
		if err != nil {
			t.Fatalf("%s: re-encoded body %s refused: %v (from %q)", route, b1, err, body)
		}
		b2, _ := json.Marshal(v2)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("%s: the re-encoded body decodes to another value:\n %s\n %s", route, b1, b2)
		}

		// An unknown member is refused, and named.
		if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
			at := len(body) - len(trimmed) + 1
			sep := ","
			if rest := bytes.TrimLeft(trimmed[1:], " \t\r\n"); len(rest) > 0 && rest[0] == '}' {
				sep = ""
			}
			extra := append(append(bytes.Clone(body[:at]), `"zz_unknown":1`+sep...), body[at:]...)
			_, err := decode(k, extra)
			if err == nil {
				t.Fatalf("%s: accepted the unknown member in %s", route, extra)
			}
			if ae := toAPIError(err); ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "zz_unknown") {
				t.Fatalf("%s: unknown member refused as %d %s %q", route, ae.Status, ae.Code, ae.Message)
			}
		}

		// Size: padded to exactly 1 MiB, accepted; one byte more, 413. (It
		// allocates 1 MiB, so it runs for one accepted body in 32.)
		if crc32.ChecksumIEEE(body)%32 == 0 && len(body) <= MaxBody {
			padded := append(bytes.Clone(body), bytes.Repeat([]byte(" "), MaxBody-len(body))...)
			if _, err := decode(k, padded); err != nil {
				t.Fatalf("%s: body padded to 1 MiB refused: %v", route, err)
			}
			_, err := decode(k, append(padded, ' '))
			if ae := toAPIError(err); err == nil || ae.Status != http.StatusRequestEntityTooLarge || ae.Code != "too_large" {
				t.Fatalf("%s: body of 1 MiB + 1 byte: %v", route, err)
			}
		}
	})
}
