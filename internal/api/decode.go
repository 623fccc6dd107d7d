package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Request bodies. Every body is refused whole, with a message naming the
// field, when it breaks one of these rules (the reason, in
// controller_inputs_refused_total{source="http"}, in parentheses):
//
//   - over MaxBody, 1 MiB: 413 too_large (too_large);
//   - not one JSON value, or trailing data: 400 invalid_json (invalid_json);
//   - nested deeper than wire.MaxDepth (32), a member name twice, a number
//     no double holds or an integer beyond ±(2^53-1) (I-JSON, RFC 7493), a
//     field of the wrong type, a number that does not fit its field, an
//     unknown field, an id outside its charset or length: 400
//     invalid_request (too_deep, duplicate_key, bad_number, wrong_type,
//     unknown_field, bad_id);
//   - params over MaxParams, 256 KiB: 413 too_large (too_large).
//
// Every other 400 counts as invalid_value.

// MaxParams bounds the params of one operation or plan step, as sent.
const MaxParams = 256 << 10

// decodeBody reads the request body, checks it and decodes it into v,
// refusing unknown fields.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err // a MaxBytesError is 413 too_large
	}
	return decodeJSON(body, v)
}

// decodeOptionalBody is decodeBody for routes whose body may be absent.
func decodeOptionalBody(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	return decodeJSON(body, v)
}

func decodeJSON(body []byte, v any) error {
	if err := wire.CheckJSON(body, wire.CheckOptions{SafeIntegers: true}); err != nil {
		return bodyError(err)
	}
	// encoding/json matches names case-insensitively: "Target" beside
	// "target" would be a duplicate resolved silently (found by FuzzDecodeBody).
	if t := reflect.TypeOf(v); mayHoldInexactName(body, foldedNames(t)) {
		if name, _ := inexactName(json.NewDecoder(bytes.NewReader(body)), t); name != "" {
			return refusal(http.StatusBadRequest, "invalid_request", wire.ReasonUnknownField,
				fmt.Sprintf("request body: unknown field %q", name))
		}
	}
	if err := wire.DecodeInto(body, v, true); err != nil {
		return bodyError(err)
	}
	// A decoded string holds a NUL only from the escape \u0000: the checks
	// above refuse a raw control character inside a string.
	if !bytes.Contains(body, []byte(`\u0000`)) {
		return nil
	}
	if field := nulField(reflect.ValueOf(v), ""); field != "" {
		return refusal(http.StatusBadRequest, "invalid_request", wire.ReasonInvalidValue,
			fmt.Sprintf("request body: %s holds a NUL character (\\u0000), which the store cannot keep", field))
	}
	return nil
}

// foldedNamesOf caches foldedNames by type.
var foldedNamesOf sync.Map // reflect.Type -> map[string]string

// foldedNames maps the lower-case form of the JSON name of every field of
// every struct reachable from t (through pointers, slices, arrays and
// maps) to the name: the names inexactName compares member names with.
func foldedNames(t reflect.Type) map[string]string {
	if m, ok := foldedNamesOf.Load(t); ok {
		return m.(map[string]string)
	}
	m := map[string]string{}
	var add func(t reflect.Type, seen map[reflect.Type]bool)
	add = func(t reflect.Type, seen map[reflect.Type]bool) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			name := jsonName(t.Field(i))
			m[strings.ToLower(name)] = name
			add(t.Field(i).Type, seen)
		}
	}
	add(t, map[reflect.Type]bool{})
	foldedNamesOf.Store(t, m)
	return m
}

// mayHoldInexactName is inexactName's quick test: false when no string of
// the body (member names and values alike) is a field name of names in
// another case, so that the walk could find nothing. It answers true,
// leaving the decision to the walk, for any string with an escape or a
// byte outside ASCII (encoding/json folds "ſ" to "s" and "K" to "k"), and
// for any that matches a name in another case. body is valid JSON.
func mayHoldInexactName(body []byte, names map[string]string) bool {
	var lower [64]byte
	for i := 0; i < len(body); i++ {
		if body[i] != '"' {
			continue
		}
		j := i + 1
		for ; body[j] != '"'; j++ {
			if c := body[j]; c == '\\' || c >= 0x80 {
				return true
			}
		}
		// Longer strings fold to no name (ASCII folding keeps the length).
		if s := body[i+1 : j]; len(s) <= len(lower) {
			for k, c := range s {
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				}
				lower[k] = c
			}
			if name, ok := names[string(lower[:len(s)])]; ok && name != string(s) {
				return true
			}
		}
		i = j
	}
	return false
}

// bodyError maps a wire.InputError to its status and code.
func bodyError(err error) error {
	var ie *wire.InputError
	if !errors.As(err, &ie) {
		return err
	}
	msg := "request body: " + ie.Error()
	switch ie.Reason {
	case wire.ReasonInvalidJSON:
		return refusal(http.StatusBadRequest, "invalid_json", ie.Reason, msg)
	case wire.ReasonTooLarge:
		return refusal(http.StatusRequestEntityTooLarge, "too_large", ie.Reason, msg)
	}
	return refusal(http.StatusBadRequest, "invalid_request", ie.Reason, msg)
}

// refusal is an APIError that counts as an input refused for reason.
func refusal(status int, code, reason, msg string) *APIError {
	return &APIError{Status: status, Code: code, Message: msg, Reason: reason}
}

// checkParams refuses params over MaxParams.
func checkParams(field string, params []byte) error {
	if len(params) > MaxParams {
		return refusal(http.StatusRequestEntityTooLarge, "too_large", wire.ReasonTooLarge,
			fmt.Sprintf("%s: %d bytes, over the limit of %d (256 KiB)", field, len(params), MaxParams))
	}
	return nil
}

// ids is the check of the id rules, as the contract gives them:
// [A-Za-z0-9._-]{1,max}, or with ':' too.
func ids(max int, colon bool) func(string) bool {
	return func(s string) bool { return wire.IDChars(s, max, colon) }
}

// idRule checks one kind of id.
type idRule struct {
	what string // as the message names the rule
	ok   func(string) bool
}

var (
	partID      = idRule{"[A-Za-z0-9._-]{1,64}", ids(64, false)}
	operationID = idRule{"[A-Za-z0-9._:-]{1,200}", ids(200, true)}
	anyOpID     = idRule{"[A-Za-z0-9._:-]{1,400}", ids(400, true)} // derived (a compensation's)
	plainID     = idRule{"[A-Za-z0-9._:-]{1,200}", ids(200, true)}
	deviceID    = idRule{"[A-Za-z0-9._-]{1,64}, not controller-*", wire.ValidDeviceID}
	actionName  = idRule{"[A-Za-z0-9._-]{1,64}", ids(64, false)}
)

// check refuses v (named field) when it breaks the rule (bad_id); an empty
// v is refused only when required.
func (rule idRule) check(field, v string, required bool) error {
	if v == "" && !required || rule.ok(v) {
		return nil
	}
	return refusal(http.StatusBadRequest, "invalid_request", wire.ReasonBadID,
		fmt.Sprintf("%s %q: must match %s", field, shorten(v), rule.what))
}

// shorten keeps a message bounded, whatever a caller sent.
func shorten(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkSubmit checks a submit's ids and params, and its Idempotency-Key.
func checkSubmit(req apiwire.SubmitRequest, key string) error {
	return firstError(
		operationID.check("Idempotency-Key", key, false),
		operationID.check("operation_id", req.OperationID, false),
		partID.check("task_id", req.TaskID, false),
		partID.check("step", req.Step, false),
		partID.check("business_version", req.BusinessVersion, false),
		deviceID.check("target", req.Target, true),
		actionName.check("action", req.Action, true),
		checkParams("params", req.Params),
	)
}

// checkSteps checks a plan's steps' ids (400 invalid_plan, as the domain's
// other plan refusals) and params.
func checkSteps(steps []apiwire.Step) error {
	for i, st := range steps {
		at := fmt.Sprintf("steps[%d].", i)
		err := firstError(
			partID.check(at+"step", st.Step, true),
			deviceID.check(at+"target", st.Target, true),
			actionName.check(at+"action", st.Action, true),
		)
		var ae *APIError
		if errors.As(err, &ae) {
			return refusal(ae.Status, "invalid_plan", ae.Reason, ae.Message)
		}
		if err := checkParams(at+"params", st.Params); err != nil {
			return err
		}
	}
	return nil
}
