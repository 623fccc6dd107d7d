package jcs_test

// Fuzz targets for the canonicalisation (RFC 8785) and the request_hash built
// on it. `go test` runs the seeds under testdata/fuzz as unit tests; .ci/fuzz
// explores each for a few seconds in `make test`.
//
//   - FuzzCanonicalForm: any bytes. What is accepted is valid JSON whose
//     canonical form is a fixed point (canon(canon(x)) == canon(x)), is the
//     same JSON value, and equals an independent serialiser's output; what is
//     refused wraps one of the package's errors, and CheckIJSON agrees with
//     Canonicalize on duplicate names and numbers that fit no double.
//     What Plain accepts is its own canonical form, I-JSON and compact.
//   - FuzzEquivalentSpellings: the input drives a generator of JSON values,
//     each written twice with other key orders, whitespace, string escapes and
//     number spellings (1, 1.0, 1e0, 10e-1, 0.1e1, -0 for 0, ...). Both
//     spellings have the same canonical form and request_hash; the same values
//     with one I-JSON defect (a duplicate name spelt otherwise, a lone
//     surrogate, an integer beyond 2^53, a number no double holds) are
//     refused in every spelling.

import (
	"bytes"
	"encoding/json"
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/jcs"
)

// node is a JSON value as the generator and the oracle see it.
type node struct {
	kind  byte // 'n' null, 'b' bool, 'f' number, 's' string, 'a' array, 'o' object, 'r' raw text (a defect)
	b     bool
	f     float64
	s     string
	elems []node
	keys  []string
	vals  []node
}

// fromAny converts what encoding/json decoded into a node.
func fromAny(v any) node {
	switch v := v.(type) {
	case nil:
		return node{kind: 'n'}
	case bool:
		return node{kind: 'b', b: v}
	case float64:
		return node{kind: 'f', f: v}
	case string:
		return node{kind: 's', s: v}
	case []any:
		n := node{kind: 'a'}
		for _, e := range v {
			n.elems = append(n.elems, fromAny(e))
		}
		return n
	case map[string]any:
		n := node{kind: 'o'}
		for k, e := range v {
			n.keys = append(n.keys, k)
			n.vals = append(n.vals, fromAny(e))
		}
		return n
	}
	panic("unexpected type")
}

// oracle writes n in canonical form, independently of the package: members
// sorted by UTF-16 code units, strings escaped as JSON.stringify does, and
// numbers by ECMAScript's Number::toString, here from strconv's shortest
// fixed ('f') and exponent ('e') forms.
func oracle(n node) string {
	var b strings.Builder
	writeOracle(&b, n)
	return b.String()
}

func writeOracle(b *strings.Builder, n node) {
	switch n.kind {
	case 'n':
		b.WriteString("null")
	case 'b':
		b.WriteString(strconv.FormatBool(n.b))
	case 'f':
		b.WriteString(esNumber(n.f))
	case 's':
		b.WriteString(esString(n.s))
	case 'a':
		b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			writeOracle(b, e)
		}
		b.WriteByte(']')
	case 'o':
		idx := make([]int, len(n.keys))
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(i, j int) bool {
			return slices.Compare(utf16.Encode([]rune(n.keys[idx[i]])), utf16.Encode([]rune(n.keys[idx[j]]))) < 0
		})
		b.WriteByte('{')
		for i, k := range idx {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(esString(n.keys[k]))
			b.WriteByte(':')
			writeOracle(b, n.vals[k])
		}
		b.WriteByte('}')
	}
}

func esNumber(f float64) string {
	if f == 0 {
		return "0"
	}
	if a := math.Abs(f); a >= 1e-6 && a < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	p := strings.IndexByte(s, 'e')
	exp := strings.TrimLeft(s[p+2:], "0")
	return s[:p+2] + exp
}

func esString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte("0123456789abcdef"[r>>4])
				b.WriteByte("0123456789abcdef"[r&0xF])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// wraps reports whether err wraps exactly one of the package's errors.
func wrapsOne(err error) bool {
	n := 0
	for _, e := range []error{jcs.ErrSyntax, jcs.ErrDuplicateName, jcs.ErrNumber, jcs.ErrString} {
		if errors.Is(err, e) {
			n++
		}
	}
	return n == 1
}

func FuzzCanonicalForm(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := jcs.Canonicalize(data)
		ij := jcs.CheckIJSON(data)
		checkPlain(t, data, out, err, ij)
		if err != nil {
			if out != nil || !wrapsOne(err) {
				t.Fatalf("Canonicalize(%q) = %q, %v: want nil and one of the package's errors", data, out, err)
			}
			// Refusals CheckIJSON must share (it reports the first reason it
			// meets, which may be another one).
			if (errors.Is(err, jcs.ErrDuplicateName) || errors.Is(err, jcs.ErrNumber)) && ij == nil {
				t.Fatalf("Canonicalize refused %q (%v) but CheckIJSON accepts it", data, err)
			}
			if !json.Valid(data) && !errors.Is(err, jcs.ErrSyntax) && utf8.Valid(data) {
				t.Fatalf("invalid JSON %q refused as %v, not ErrSyntax", data, err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("Canonicalize accepted %q, which is not one JSON value", data)
		}
		if !utf8.Valid(out) || !json.Valid(out) {
			t.Fatalf("canonical form %q is not valid UTF-8 JSON", out)
		}
		again, err := jcs.Canonicalize(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: canon(%q) = %q, canon of that = %q (%v)", data, out, again, err)
		}
		// CheckIJSON refuses what Canonicalize accepts only for an integer
		// written without fraction or exponent beyond 2^53.
		if ij != nil && (!errors.Is(ij, jcs.ErrIJSON) || !strings.Contains(ij.Error(), "beyond")) {
			t.Fatalf("CheckIJSON refuses %q (%v), which Canonicalize accepts", data, ij)
		}
		var v1, v2 any
		if err := json.Unmarshal(data, &v1); err != nil {
			t.Fatalf("encoding/json refuses accepted %q: %v", data, err)
		}
		if err := json.Unmarshal(out, &v2); err != nil {
			t.Fatalf("encoding/json refuses canonical %q: %v", out, err)
		}
		n1 := fromAny(v1)
		if want := oracle(n1); want != string(out) {
			t.Fatalf("Canonicalize(%q)\n = %s\n want %s", data, out, want)
		}
		if oracle(fromAny(v2)) != string(out) {
			t.Fatalf("the canonical form %q decodes to another value", out)
		}
	})
}

// gen turns fuzz bytes into JSON values; past the end it reads zeros.
type gen struct {
	b []byte
	i int
}

func (g *gen) next() byte {
	if g.i >= len(g.b) {
		return 0
	}
	c := g.b[g.i]
	g.i++
	return c
}

// alphabet holds the characters strings are drawn from: the ones with
// special escapes, controls, '/', DEL, multi-byte and astral ones, U+2028.
var alphabet = []rune{'a', 'b', 'Z', '0', ' ', '"', '\\', '/', '\b', '\f', '\n', '\r', '\t', 0, 0x1f, 0x7f,
	'é', '€', 0x2028, 0x2029, 0xfeff, 0xffff, 0xfb33, 0x1f600, 0x10ffff, 'A', 'e', '-'}

func (g *gen) str() string {
	n := int(g.next() % 6)
	var b strings.Builder
	for range n {
		b.WriteRune(alphabet[int(g.next())%len(alphabet)])
	}
	return b.String()
}

var specials = []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 0.5, 1e21, 1e-6, 1e-7, 9007199254740991,
	-9007199254740991, 9007199254740992, 1e16, 5e-324, math.MaxFloat64, math.SmallestNonzeroFloat64, 123456789012345680000,
	333333333.33333329, 4.5, 2e-3, 1e300}

func (g *gen) number() float64 {
	switch g.next() % 4 {
	case 0:
		return specials[int(g.next())%len(specials)]
	case 1:
		return float64(int8(g.next()))
	case 2: // mantissa and decimal exponent
		m := int(g.next())<<8 | int(g.next())
		e := int(g.next()%50) - 25
		f, _ := strconv.ParseFloat(strconv.Itoa(m)+"e"+strconv.Itoa(e), 64)
		return f
	}
	var bits uint64
	for range 8 {
		bits = bits<<8 | uint64(g.next())
	}
	if f := math.Float64frombits(bits); !math.IsInf(f, 0) && !math.IsNaN(f) {
		return f
	}
	return 0
}

func (g *gen) value(depth int) node {
	k := g.next() % 8
	if depth >= 4 && k >= 6 {
		k %= 6
	}
	switch k {
	case 0:
		return node{kind: 'n'}
	case 1:
		return node{kind: 'b', b: g.next()%2 == 1}
	case 2, 3:
		return node{kind: 'f', f: g.number()}
	case 4, 5:
		return node{kind: 's', s: g.str()}
	case 6:
		n := node{kind: 'a'}
		for range int(g.next() % 5) {
			n.elems = append(n.elems, g.value(depth+1))
		}
		return n
	}
	return g.object(depth)
}

func (g *gen) object(depth int) node {
	n := node{kind: 'o'}
	for range int(g.next() % 5) {
		k := g.str()
		if slices.Contains(n.keys, k) {
			continue
		}
		n.keys = append(n.keys, k)
		n.vals = append(n.vals, g.value(depth+1))
	}
	return n
}

// writer spells a node one way out of many, by its random choices.
type writer struct {
	r *rand.Rand
	// strict: never write an integer beyond 2^53 without fraction or
	// exponent (I-JSON refuses those; the values stay the same).
	strict bool
	b      strings.Builder
}

func (w *writer) ws() {
	if w.r.IntN(3) == 0 {
		w.b.WriteString([]string{" ", "\n", "\t", "\r\n  "}[w.r.IntN(4)])
	}
}

func (w *writer) value(n node) {
	w.ws()
	switch n.kind {
	case 'n':
		w.b.WriteString("null")
	case 'b':
		w.b.WriteString(strconv.FormatBool(n.b))
	case 'f':
		w.b.WriteString(w.number(n.f))
	case 'r':
		w.b.WriteString(n.s)
	case 's':
		w.b.WriteString(w.str(n.s))
	case 'a':
		w.b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				w.b.WriteByte(',')
			}
			w.value(e)
		}
		w.ws()
		w.b.WriteByte(']')
	case 'o':
		order := w.r.Perm(len(n.keys))
		w.b.WriteByte('{')
		for i, k := range order {
			if i > 0 {
				w.b.WriteByte(',')
			}
			w.ws()
			w.b.WriteString(w.str(n.keys[k]))
			w.ws()
			w.b.WriteByte(':')
			w.value(n.vals[k])
		}
		w.ws()
		w.b.WriteByte('}')
	}
	w.ws()
}

// number writes f as one of the decimal spellings of exactly the decimal
// that strconv's shortest form gives: the same double whichever is read.
func (w *writer) number(f float64) string {
	if f == 0 {
		return []string{"0", "-0", "0.0", "-0.0", "0e5", "-0E-3", "0.000", "0e+0"}[w.r.IntN(8)]
	}
	sign := ""
	if f < 0 {
		sign = "-"
	}
	s := strconv.FormatFloat(math.Abs(f), 'e', -1, 64) // d.ddde±XX
	p := strings.IndexByte(s, 'e')
	digits := strings.Replace(s[:p], ".", "", 1) // D, value = D[0].D[1:] × 10^exp
	exp, _ := strconv.Atoi(s[p+1:])
	e := func(n int) string { // an exponent, spelt in one of the ways JSON allows
		m := []string{"e", "E"}[w.r.IntN(2)]
		if n >= 0 && w.r.IntN(2) == 0 {
			m += "+"
		}
		return m + strconv.Itoa(n)
	}
	zeros := strings.Repeat("0", w.r.IntN(4))
	switch w.r.IntN(6) {
	case 0: // strconv's shortest, as 'g' writes it
		g := strconv.FormatFloat(math.Abs(f), 'g', -1, 64)
		if w.strict && !strings.ContainsAny(g, ".e") && math.Abs(f) >= 1<<53 {
			g += ".0"
		}
		return sign + g
	case 1: // integer mantissa: 1e0, 5e-1
		return sign + digits + zeros + e(exp-(len(digits)-1)-len(zeros))
	case 2: // 0.1e1
		return sign + "0." + digits + zeros + e(exp+1)
	case 3: // d.ddd0e±x
		frac := digits[1:] + zeros
		if frac == "" {
			frac = "0"
		}
		return sign + digits[:1] + "." + frac + e(exp)
	case 4: // plain decimal, when the exponent is small: 1, 1.0, 0.001, 10.50
		if exp > 25 || exp < -25 {
			break
		}
		var int_, frac string
		if exp >= 0 {
			if exp+1 >= len(digits) {
				int_, frac = digits+strings.Repeat("0", exp+1-len(digits)), ""
			} else {
				int_, frac = digits[:exp+1], digits[exp+1:]
			}
		} else {
			int_, frac = "0", strings.Repeat("0", -exp-1)+digits
		}
		frac += zeros
		if frac == "" && (w.r.IntN(2) == 0 || w.strict && math.Abs(f) >= 1<<53) {
			frac = "0"
		}
		if frac == "" {
			return sign + int_
		}
		return sign + int_ + "." + frac
	}
	return sign + digits[:1] + "." + digits[1:] + "0" + e(exp) // 1.0e0 style (a trailing zero)
}

// str writes s with a random mix of raw characters and escapes.
func (w *writer) str(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		short := map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r]
		mustEscape := r < 0x20 || r == '"' || r == '\\'
		switch c := w.r.IntN(3); {
		case c == 0 && short != "":
			b.WriteString(short)
		case c == 1 || mustEscape:
			b.WriteString(uEscape(r, w.r.IntN(2) == 0))
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func uEscape(r rune, upper bool) string {
	hex := func(u rune) string {
		h := strconv.FormatInt(int64(u)|0x10000, 16)[1:]
		if upper {
			h = strings.ToUpper(h)
		}
		return `\u` + h
	}
	if r >= 0x10000 {
		hi, lo := utf16.EncodeRune(r)
		return hex(hi) + hex(lo)
	}
	return hex(r)
}

// spell writes n with the random choices of seed.
func spell(n node, seed uint64, strict bool) string {
	w := &writer{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), strict: strict}
	w.value(n)
	return w.b.String()
}

// Defects that make a document not I-JSON. Each is put into one object or
// array of the params, chosen by the fuzz input: a second member whose name
// decodes the same as another's (spelt with its own escapes), or a member or
// element whose text is the defect.
var defects = []struct {
	name string
	text []string // the defect's spellings; none for a duplicate name
	want error    // what Canonicalize says (nil: it accepts it)
}{
	{"duplicate name", nil, jcs.ErrDuplicateName},
	{"lone surrogate", []string{`"\ud800"`, `"x\udc00"`, `"\ud83dx"`, `"\ud83d\ud83d"`, `"\ude00\ud83d"`, `"\uDBFF\u0041"`}, jcs.ErrString},
	{"integer beyond 2^53", []string{"9007199254740992", "9007199254740993", "-9007199254740993", "18446744073709551616",
		"1" + strings.Repeat("0", 30)}, nil},
	{"number no double holds", []string{"1e400", "-1e309", "1.7976931348623159e308", "123e99999"}, jcs.ErrNumber},
}

// containers lists the objects and arrays of n, n first.
func containers(n *node) []*node {
	var out []*node
	if n.kind == 'o' || n.kind == 'a' {
		out = append(out, n)
	}
	for i := range n.elems {
		out = append(out, containers(&n.elems[i])...)
	}
	for i := range n.vals {
		out = append(out, containers(&n.vals[i])...)
	}
	return out
}

// clone copies n deeply, so that a defect goes into one copy only.
func clone(n node) node {
	c := n
	c.keys = slices.Clone(n.keys)
	c.elems, c.vals = nil, nil
	for _, e := range n.elems {
		c.elems = append(c.elems, clone(e))
	}
	for _, v := range n.vals {
		c.vals = append(c.vals, clone(v))
	}
	return c
}

// checkDefect puts one defect into params, at a place and in a spelling
// chosen by pick, and checks that every spelling of the result is refused:
// by Canonicalize with want (or accepted, want nil), and always by the
// params check of a submit (domain.SplitParams).
func checkDefect(t *testing.T, params node, seed uint64, pick byte, d int) {
	t.Helper()
	def := defects[d]
	p := clone(params)
	var where *node
	if def.text == nil {
		var objs []*node
		for _, c := range containers(&p) {
			if c.kind == 'o' && len(c.keys) > 0 {
				objs = append(objs, c)
			}
		}
		where = objs[int(pick)%len(objs)] // p itself has a member
		k := int(pick/8) % len(where.keys)
		where.keys = append(where.keys, where.keys[k])
		where.vals = append(where.vals, clone(where.vals[len(where.vals)-1-int(pick)%len(where.vals)]))
	} else {
		cs := containers(&p)
		where = cs[int(pick)%len(cs)]
		raw := node{kind: 'r', s: def.text[int(pick/4)%len(def.text)]}
		if where.kind == 'a' {
			where.elems = append(where.elems, raw)
		} else {
			where.keys = append(where.keys, "\x00defect")
			where.vals = append(where.vals, raw)
		}
	}
	for i := range uint64(3) {
		doc := spell(p, seed+i, true)
		out, err := jcs.Canonicalize([]byte(doc))
		if def.want == nil && err != nil || def.want != nil && !errors.Is(err, def.want) {
			t.Fatalf("%s: Canonicalize(%s) = %s, %v; want %v", def.name, doc, out, err, def.want)
		}
		if _, _, err := domain.SplitParams(json.RawMessage(doc)); !errors.Is(err, domain.ErrInvalid) {
			t.Fatalf("%s: domain.SplitParams accepted %s (%v)", def.name, doc, err)
		}
	}
}

func FuzzEquivalentSpellings(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, defect uint8) {
		g := &gen{b: data}
		params := g.object(1)
		params.keys = append(params.keys, "\x00value") // at least one member, of any kind
		params.vals = append(params.vals, g.value(1))
		h := fnv.New64a()
		h.Write(data)
		seed := h.Sum64()

		if d := int(defect) % (len(defects) + 1); d > 0 {
			checkDefect(t, params, seed, byte(int(defect)/(len(defects)+1))^g.next(), d-1)
			return
		}
		want := oracle(params)
		var hash string
		for i := range uint64(3) {
			// Spelling 0 may write integers beyond 2^53 without a fraction
			// (not I-JSON, but the same values for Canonicalize); 1 and 2
			// are I-JSON, as a submit's params must be.
			text := spell(params, seed+i, i > 0)
			out, err := jcs.Canonicalize([]byte(text))
			if err != nil || string(out) != want {
				t.Fatalf("spelling %d of the same value:\n %s\n canonical %s (%v)\n want      %s", i, text, out, err, want)
			}
			if i == 0 {
				continue
			}
			sent, canonical, err := domain.SplitParams(json.RawMessage(text))
			if err != nil || string(canonical) != want {
				t.Fatalf("domain.SplitParams(%s) = %s, %v; want %s", text, canonical, err, want)
			}
			if c, _ := jcs.Canonicalize(sent); string(c) != want {
				t.Fatalf("sent params %s are another value than %s", sent, text)
			}
			got := domain.RequestHash("restart", "device-1", canonical)
			if hash != "" && got != hash {
				t.Fatalf("the same params hash %s and %s:\n %s", hash, got, text)
			}
			hash = got
		}
	})
}
