package domain

// Fuzz targets for operation ids and request hashes. `go test` runs the
// seeds under testdata/fuzz as unit tests; .ci/fuzz explores each for a few
// seconds in `make test`.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/fleetctl/fleetctl/internal/jcs"
)

// validPart is the contract's rule for one part of a derived id, written
// out independently of wire.IDChars: [A-Za-z0-9._-]{1,64}.
func validPart(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return false
		}
	}
	return true
}

func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// parseDerived is the strict parser of a derived id: exactly four parts
// separated by ':', each a valid part.
func parseDerived(id string) (OperationParts, bool) {
	f := strings.Split(id, ":")
	if len(f) != 4 {
		return OperationParts{}, false
	}
	for _, s := range f {
		if !validPart(s) {
			return OperationParts{}, false
		}
	}
	return OperationParts{f[0], f[1], f[2], f[3]}, true
}

func allValid(p OperationParts) bool {
	return validPart(p.TaskID) && validPart(p.Step) && validPart(p.Target) && validPart(p.BusinessVersion)
}

// checkDerive asserts the properties of one tuple and returns its id ("" if
// refused).
func checkDerive(t *testing.T, p OperationParts) string {
	t.Helper()
	id, err := DeriveOperationID(p)
	if !allValid(p) {
		if err == nil {
			t.Fatalf("DeriveOperationID(%+v) accepted an invalid part: %q", p, id)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("DeriveOperationID(%+v) refused without ErrInvalid: %v", p, err)
		}
		return ""
	}
	if err != nil {
		t.Fatalf("DeriveOperationID(%+v) refused valid parts: %v", p, err)
	}
	back, ok := parseDerived(id)
	if !ok || back != p {
		t.Fatalf("DeriveOperationID(%+v) = %q parses back to %+v (ok %v)", p, id, back, ok)
	}
	// A derived id is a legal operation id of its own length class (up to
	// 4*64+3 = 259 characters; a caller's whole id is up to 200, derived
	// ones such as compensations up to 400).
	if err := ValidateOperationID(id, 400); err != nil {
		t.Fatalf("derived id %q is not a valid operation id: %v", id, err)
	}
	if TaskStepShaped(id) != ApprovalLike(p.BusinessVersion) {
		t.Fatalf("TaskStepShaped(%q) = %v but ApprovalLike(%q) = %v", id, TaskStepShaped(id), p.BusinessVersion, ApprovalLike(p.BusinessVersion))
	}
	if want := p.Step == "rollout" && versionLike(p.BusinessVersion); RolloutShaped(id) != want {
		t.Fatalf("RolloutShaped(%q) = %v, want %v (step %q, business_version %q)", id, RolloutShaped(id), want, p.Step, p.BusinessVersion)
	}
	return id
}

func FuzzDerive(f *testing.F) {
	f.Fuzz(func(t *testing.T, a1, a2, a3, a4, b1, b2, b3, b4 string) {
		pa, pb := OperationParts{a1, a2, a3, a4}, OperationParts{b1, b2, b3, b4}
		ida, idb := checkDerive(t, pa), checkDerive(t, pb)
		// No two distinct valid tuples give the same id.
		if ida != "" && idb != "" && (ida == idb) != (pa == pb) {
			t.Fatalf("%+v and %+v derive %q and %q", pa, pb, ida, idb)
		}
		// The tuples nearest to a collision: one character moved across
		// each boundary between two parts.
		if ida == "" {
			return
		}
		parts := []string{a1, a2, a3, a4}
		for i := 0; i < 3; i++ {
			for _, dir := range []int{-1, 1} {
				g := append([]string(nil), parts...)
				if dir < 0 && len(g[i]) > 1 { // last byte of part i to the front of part i+1
					g[i], g[i+1] = g[i][:len(g[i])-1], g[i][len(g[i])-1:]+g[i+1]
				} else if dir > 0 && len(g[i+1]) > 1 { // first byte of part i+1 to the end of part i
					g[i], g[i+1] = g[i]+g[i+1][:1], g[i+1][1:]
				} else {
					continue
				}
				q := OperationParts{g[0], g[1], g[2], g[3]}
				if idq := checkDerive(t, q); idq != "" && idq == ida {
					t.Fatalf("%+v and %+v both derive %q", pa, q, ida)
				}
			}
		}
	})
}

// versionLike: v and one or more ASCII digits, a rollout version's part.
func versionLike(v string) bool {
	if len(v) < 2 || v[0] != 'v' {
		return false
	}
	for i := 1; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	return true
}

// validWhole is the contract's rule for a caller's whole id, written out:
// [A-Za-z0-9._:-]{1,maxLen}.
func validWhole(id string, maxLen int) bool {
	if len(id) < 1 || len(id) > maxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) && id[i] != ':' {
			return false
		}
	}
	return true
}

func FuzzValidateWhole(f *testing.F) {
	f.Fuzz(func(t *testing.T, id string) {
		for _, max := range []int{200, 400} {
			err := ValidateOperationID(id, max)
			if (err == nil) != validWhole(id, max) {
				t.Fatalf("ValidateOperationID(%q, %d) = %v", id, max, err)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidateOperationID(%q) refused without ErrInvalid: %v", id, err)
			}
		}
		// Reserved: exactly the ids whose last ':'-separated part is
		// approval-v<digits>, with something before it.
		i := strings.LastIndexByte(id, ':')
		want := i >= 0 && ApprovalLike(id[i+1:])
		if TaskStepShaped(id) != want {
			t.Fatalf("TaskStepShaped(%q) = %v, want %v", id, TaskStepShaped(id), want)
		}
		// RolloutShaped: exactly the valid ids of four ':'-separated
		// parts, none empty, the second "rollout", the last v<digits>.
		parts := strings.Split(id, ":")
		want = validWhole(id, len(id)) && len(parts) == 4 && parts[0] != "" && parts[1] == "rollout" && parts[2] != "" &&
			versionLike(parts[3])
		if RolloutShaped(id) != want {
			t.Fatalf("RolloutShaped(%q) = %v, want %v", id, RolloutShaped(id), want)
		}
	})
}

// hashOf is request_hash written out from the contract: SHA-256 of the JCS
// of {action, target, params}. The three names sort as action, params,
// target; action and target are strings JCS writes as encoding/json does for
// the id charset (checked by the caller).
func hashOf(t *testing.T, action, target string, canonical []byte) string {
	t.Helper()
	a, _ := json.Marshal(action)
	g, _ := json.Marshal(target)
	body := `{"action":` + string(a) + `,"params":` + string(canonical) + `,"target":` + string(g) + `}`
	c, err := jcs.Canonicalize([]byte(body))
	if err != nil {
		t.Fatalf("canonical form of %s: %v", body, err)
	}
	if string(c) != body {
		t.Fatalf("the hashed document is not canonical as built: %s vs %s", c, body)
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:])
}

// FuzzParams feeds the params as they arrive in a request body (the value of
// "params" in a JSON object: any JSON value, null included) to Params and
// RequestHash: what is not I-JSON or not an object is refused; what is
// accepted is sent as the same value, compacted, and hashed as the SHA-256
// of the canonical {action, params, target}, which changes with each of
// them.
func FuzzParams(f *testing.F) {
	f.Fuzz(func(t *testing.T, action, target string, value []byte) {
		var body struct {
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(append(append([]byte(`{"params":`), value...), '}'), &body); err != nil {
			return // not a value the API's decoder would hand over
		}
		sent, canonical, err := SplitParams(body.Params)
		canon2, cerr := CanonicalParams(body.Params)
		if ij := jcs.CheckIJSON(body.Params); ij != nil && err == nil {
			t.Fatalf("Params accepted %s, which is not I-JSON: %v", body.Params, ij)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("SplitParams(%s) refused without ErrInvalid: %v", body.Params, err)
			}
			// Refused params are refused as CanonicalParams refuses them, or
			// for I-JSON reasons (big integers) only Params checks.
			if cerr == nil && jcs.CheckIJSON(body.Params) == nil {
				t.Fatalf("SplitParams(%s) refused (%v) what CanonicalParams and CheckIJSON accept", body.Params, err)
			}
			return
		}
		if cerr != nil || !bytes.Equal(canonical, canon2) {
			t.Fatalf("Params and CanonicalParams disagree on %s: %s / %s, %v", body.Params, canonical, canon2, cerr)
		}
		// Sent: the caller's object, compacted; the same JSON value.
		if !json.Valid(sent) || sent[0] != '{' {
			t.Fatalf("sent params %q is not a JSON object", sent)
		}
		var compact bytes.Buffer
		_ = json.Compact(&compact, sent)
		if !bytes.Equal(compact.Bytes(), sent) {
			t.Fatalf("sent params %q are not compact", sent)
		}
		// Canonical: a fixed point of JCS, and the canonical form of what is sent.
		if c, err := jcs.Canonicalize(sent); err != nil || !bytes.Equal(c, canonical) {
			t.Fatalf("canonical %s is not JCS(sent %s) = %s (%v)", canonical, sent, c, err)
		}
		if c, err := jcs.Canonicalize(canonical); err != nil || !bytes.Equal(c, canonical) {
			t.Fatalf("JCS is not idempotent on %s: %s (%v)", canonical, c, err)
		}
		if jcs.CheckIJSON(sent) != nil {
			t.Fatalf("sent params %s are not I-JSON: %v", sent, jcs.CheckIJSON(sent))
		}
		if ValidateAction(action) != nil || !validPart(target) {
			return
		}
		h := RequestHash(action, target, canonical)
		if want := hashOf(t, action, target, canonical); h != want {
			t.Fatalf("RequestHash(%q, %q, %s) = %s, want %s", action, target, canonical, h, want)
		}
		// The same params sent again in their canonical spelling: the same
		// canonical form, unless that spelling writes a large double as an
		// integer beyond 2^53 (1e16 as 10000000000000000), which I-JSON
		// refuses from a caller.
		if _, c2, err := SplitParams(canonical); err == nil && !bytes.Equal(c2, canonical) ||
			err != nil && !strings.Contains(err.Error(), "beyond ±(2^53-1)") {
			t.Fatalf("the canonical params %s, sent again, give %s (%v)", canonical, c2, err)
		}
		// Another action or target: another hash.
		if h2 := RequestHash(action+"x", target, canonical); h2 == h {
			t.Fatalf("action %q and %q hash the same", action, action+"x")
		}
		if h2 := RequestHash(action, target+"x", canonical); h2 == h {
			t.Fatalf("target %q and %q hash the same", target, target+"x")
		}
	})
}
