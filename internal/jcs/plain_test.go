package jcs_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/fleetctl/fleetctl/internal/jcs"
)

// checkPlain: what Plain accepts, Canonicalize returns unchanged, CheckIJSON
// accepts, and compacting leaves alone (FuzzCanonicalForm runs it on every
// input).
func checkPlain(t *testing.T, data, canonical []byte, err, ij error) {
	t.Helper()
	if !jcs.Plain(data) {
		return
	}
	if err != nil || ij != nil || !bytes.Equal(canonical, data) {
		t.Fatalf("Plain(%q) but Canonicalize = %q, %v; CheckIJSON %v", data, canonical, err, ij)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil || !bytes.Equal(b.Bytes(), data) {
		t.Fatalf("Plain(%q) but compacted it is %q (%v)", data, b.Bytes(), err)
	}
}

func TestPlain(t *testing.T) {
	for in, want := range map[string]bool{
		`{}`:                 true,
		`{"reason":"bench"}`: true,
		`{"bench_k":12345}`:  true,
		`{"a":1,"b":"x y","c":true,"d":false,"e":null,"f":-7,"g":0}`: true,
		`{"a":999999999999999}`:  true,
		`{"a":9999999999999999}`: false, // 16 digits: left to the slow way
		`{"b":1,"a":2}`:          false, // out of order
		`{"a":1,"a":2}`:          false, // twice
		`{"A":1,"a":2}`:          true,  // 'A' sorts before 'a'
		`{"a":-0}`:               false, // canonical 0
		`{"a":01}`:               false,
		`{"a":1.5}`:              false,
		`{"a":1e3}`:              false,
		`{"a":"\u00e9"}`:         false,
		"{\"a\":\"\u00e9\"}":     false,
		`{"a":"<&>"}`:            true, // RFC 8785 escapes none of them
		`{"a":"q\""}`:            false,
		`{"a":[1]}`:              false,
		`{"a":{}}`:               false,
		`{ "a":1}`:               false,
		`{"a":1,}`:               false,
		`{"a":1}}`:               false,
		`{"a":truex}`:            false,
		`{"a":tru}`:              false,
		`{"a":-}`:                false,
		`{"a"}`:                  false,
		`{"a":"}`:                false,
		`{"a\u0000":1}`:          false,
		"{\"a\x7f\":1}":          false,
		`[]`:                     false,
		`{`:                      false,
		``:                       false,
		`null`:                   false,
	} {
		if got := jcs.Plain([]byte(in)); got != want {
			t.Errorf("Plain(%s) = %v, want %v", in, got, want)
		}
		out, err := jcs.Canonicalize([]byte(in))
		checkPlain(t, []byte(in), out, err, jcs.CheckIJSON([]byte(in)))
	}
}
