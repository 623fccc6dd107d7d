package jcs_test

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/jcs"
)

func canon(t *testing.T, in string) string {
	t.Helper()
	out, err := jcs.Canonicalize([]byte(in))
	require.NoError(t, err, "input %s", in)
	return string(out)
}

// RFC 8785 §3.2.2: the combined example of literals, numbers and strings.
func TestRFC8785Example(t *testing.T) {
	t.Parallel()
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],` +
		`"string":"€$\u000f\nA'B\"\\\\\"/"}`
	require.Equal(t, want, canon(t, in))
}

// RFC 8785 §3.2.3: members sorted by UTF-16 code units.
func TestRFC8785Sorting(t *testing.T) {
	t.Parallel()
	in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want := "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\"," +
		"\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\"," +
		"\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"
	require.Equal(t, want, canon(t, in))
}

// U+1F600 is D83D DE00 in UTF-16 and so sorts before U+FB33, although it
// sorts after it by code point or UTF-8 bytes.
func TestSortingIsByUTF16NotCodePoint(t *testing.T) {
	t.Parallel()
	require.Equal(t, "{\"\U0001F600\":1,\"\uff66\":2}", canon(t, `{"\uff66":2,"\ud83d\ude00":1}`))
	require.Equal(t, `{"a":1,"aa":2,"b":3}`, canon(t, `{"b":3,"aa":2,"a":1}`))
	require.Equal(t, `{"":0,"A":1,"a":2}`, canon(t, `{"a":2,"":0,"A":1}`))
}

// RFC 8785 Appendix B: IEEE-754 bit patterns and their serialization.
func TestRFC8785NumberSamples(t *testing.T) {
	t.Parallel()
	samples := []struct{ bits, want string }{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"},
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	}
	for _, s := range samples {
		raw, err := hex.DecodeString(s.bits)
		require.NoError(t, err)
		f := math.Float64frombits(binary.BigEndian.Uint64(raw))

		// Through Marshal (the double itself) ...
		out, err := jcs.Marshal(f)
		require.NoError(t, err, s.bits)
		require.Equal(t, s.want, string(out), s.bits)

		// ... and through Canonicalize, from a 17-digit spelling of the
		// same double and from the expected text (a fixed point).
		require.Equal(t, s.want, canon(t, strconv.FormatFloat(f, 'g', 17, 64)), s.bits)
		require.Equal(t, s.want, canon(t, s.want), s.bits)
	}
}

func TestNumbers(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"0":                       "0",
		"-0":                      "0",
		"-0.0e-5":                 "0",
		"1e21":                    "1e+21",
		"1e-7":                    "1e-7",
		"1e20":                    "100000000000000000000",
		"123456789012345678901":   "123456789012345680000",
		"123456789012345680000":   "123456789012345680000",
		"5e-324":                  "5e-324",
		"1.7976931348623157e308":  "1.7976931348623157e+308",
		"9007199254740992":        "9007199254740992",
		"9007199254740993":        "9007199254740992", // not a double: rounds to even
		"0.000001":                "0.000001",
		"0.0000001":               "1e-7",
		"0.00000123":              "0.00000123",
		"333333333.3333333":       "333333333.3333333",
		"333333333.33333329":      "333333333.3333333",
		"1E30":                    "1e+30",
		"4.50":                    "4.5",
		"2e-3":                    "0.002",
		"-1.5e-10":                "-1.5e-10",
		"12345.678e10":            "123456780000000",
		"1.2345e25":               "1.2345e+25",
		"100":                     "100",
		"0.1":                     "0.1",
		"0.30000000000000004":     "0.30000000000000004",
		"1e-400":                  "0", // underflow rounds to 0, as in JSON.parse
		"[1.0,1,1e0,10,1e1,1E+1]": "[1,1,1,10,10,10]",
	}
	for in, want := range cases {
		require.Equal(t, want, canon(t, in), in)
	}
}

// Random doubles: the output parses back to the same double and carries the
// same significant digits as strconv's shortest formatting.
func TestNumberRoundTrip(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8785, 1))
	for range 100_000 {
		f := math.Float64frombits(rng.Uint64())
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		out, err := jcs.Marshal(f)
		require.NoError(t, err)
		back, err := strconv.ParseFloat(string(out), 64)
		require.NoError(t, err, "%s", out)
		require.Equal(t, f, back, "%s", out)
		require.Equal(t, digits(strconv.FormatFloat(f, 'e', -1, 64)), digits(string(out)), "%v", f)
	}
}

// digits returns the significant digits of a decimal number's text.
func digits(s string) string {
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		s = s[:i]
	}
	s = strings.Trim(strings.NewReplacer("-", "", ".", "").Replace(s), "0")
	return s
}

func TestStrings(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		`"plain"`:              `"plain"`,
		`"\u0000\u0001\u001f"`: `"\u0000\u0001\u001f"`,
		`"\b\f\n\r\t"`:         `"\b\f\n\r\t"`,
		`"\u0008\u000C\u000a"`: `"\b\f\n"`,
		`"\u001B"`:             `"\u001b"`,
		`"\"\\\/"`:             `"\"\\/"`,
		`"\u007f"`:             "\"\x7f\"",
		`"\u2028\u2029"`:       "\"\u2028\u2029\"",
		`"<&>"`:                `"<&>"`,
		`"\u003c\u0026\u003e"`: `"<&>"`,
		`"\u00e9t\u00C9"`:      `"étÉ"`,
		`"\ud83d\ude00"`:       `"😀"`,
		`"\uD83D\uDE00"`:       `"😀"`,
		`"😀"`:                  `"😀"`,
		`"\ufffd"`:             `"` + "\ufffd" + `"`,
		"\"\xef\xbf\xbd\"":     `"` + "\ufffd" + `"`,
	}
	for in, want := range cases {
		require.Equal(t, want, canon(t, in), in)
	}
}

func TestLiteralsAndStructure(t *testing.T) {
	t.Parallel()
	require.Equal(t, `true`, canon(t, " true "))
	require.Equal(t, `null`, canon(t, "\n\tnull\r\n"))
	require.Equal(t, `[]`, canon(t, `[ ]`))
	require.Equal(t, `{}`, canon(t, `{ }`))
	require.Equal(t, `[[],{},[{}]]`, canon(t, `[ [ ] , { } , [ { } ] ]`))
	require.Equal(t, `{"a":{"b":[1,{"c":null,"d":false}]},"e":"f"}`,
		canon(t, `{"e":"f","a":{"b":[1,{"d":false,"c":null}]}}`))

	// Deep nesting, up to encoding/json's limit, is written out once.
	deep := strings.Repeat(`{"b":0,"a":[`, 4000) + `"x"` + strings.Repeat("]}", 4000)
	want := strings.Repeat(`{"a":[`, 4000) + `"x"` + strings.Repeat(`],"b":0}`, 4000)
	require.Equal(t, want, canon(t, deep))
}

// The output never depends on member order, whitespace, escapes or number
// spelling: the property request_hash relies on.
func TestSpellingsAgree(t *testing.T) {
	t.Parallel()
	groups := [][]string{
		{
			`{"action":"restart","target":"device-1","params":{"delay":1,"reason":"stuck"}}`,
			`{"params":{"reason":"stuck","delay":1.0},"target":"device-1","action":"restart"}`,
			"{ \"target\" : \"device-1\" ,\n \"params\" : { \"delay\" : 1e0 , \"reason\" : \"\\u0073tuck\" } , \"action\" : \"restart\" }",
			`{"action":"re\u0073tart","params":{"delay":10e-1,"reason":"stuck"},"target":"device\u002d1"}`,
		},
		{`10`, `1e1`, `10.0`, `1E+1`, `100e-1`, `0.1e2`},
		{`[0.5]`, `[5e-1]`, `[0.50]`, `[ 50E-2 ]`},
		{`0`, `-0`, `0.0`, `0e10`, `-0e-3`},
	}
	for _, g := range groups {
		want := canon(t, g[0])
		for _, in := range g[1:] {
			require.Equal(t, want, canon(t, in), in)
		}
	}
	// And other values do differ.
	require.NotEqual(t,
		canon(t, `{"params":{"delay":1}}`),
		canon(t, `{"params":{"delay":"1"}}`))
}

func TestMarshal(t *testing.T) {
	t.Parallel()
	type params struct {
		Reason string  `json:"reason"`
		Delay  float64 `json:"delay"`
	}
	v := struct {
		Target string         `json:"target"`
		Action string         `json:"action"`
		Params params         `json:"params"`
		Extra  map[string]any `json:"extra"`
	}{"device-1", "restart", params{"<stuck>", 1}, map[string]any{"z": math.Copysign(0, -1), "a": []any{1e21, "€"}}}
	out, err := jcs.Marshal(v)
	require.NoError(t, err)
	require.Equal(t,
		`{"action":"restart","extra":{"a":[1e+21,"€"],"z":0},"params":{"delay":1,"reason":"<stuck>"},"target":"device-1"}`,
		string(out))

	_, err = jcs.Marshal(math.Inf(1))
	require.Error(t, err)
	_, err = jcs.Marshal(make(chan int))
	require.Error(t, err)
}

func TestRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want error
	}{
		{``, jcs.ErrSyntax},
		{`   `, jcs.ErrSyntax},
		{`{`, jcs.ErrSyntax},
		{`[1,]`, jcs.ErrSyntax},
		{`{"a":1,}`, jcs.ErrSyntax},
		{`{"a" 1}`, jcs.ErrSyntax},
		{`{a:1}`, jcs.ErrSyntax},
		{`[1 2]`, jcs.ErrSyntax},
		{`1 2`, jcs.ErrSyntax},
		{`{} {}`, jcs.ErrSyntax},
		{`{}x`, jcs.ErrSyntax},
		{`NaN`, jcs.ErrSyntax},
		{`Infinity`, jcs.ErrSyntax},
		{`01`, jcs.ErrSyntax},
		{`+1`, jcs.ErrSyntax},
		{`.5`, jcs.ErrSyntax},
		{`1.`, jcs.ErrSyntax},
		{`0x10`, jcs.ErrSyntax},
		{`'a'`, jcs.ErrSyntax},
		{`"\x"`, jcs.ErrSyntax},
		{`"\u12"`, jcs.ErrSyntax},
		{"\"tab\tinside\"", jcs.ErrSyntax},
		{"\ufeff{}", jcs.ErrSyntax}, // a byte order mark
		{`tru`, jcs.ErrSyntax},

		{`{"a":1,"a":2}`, jcs.ErrDuplicateName},
		{`{"a":1,"\u0061":2}`, jcs.ErrDuplicateName},
		{`{"b":{"x":1,"y":2,"x":3}}`, jcs.ErrDuplicateName},
		{`[{"😀":1,"\ud83d\ude00":2}]`, jcs.ErrDuplicateName},

		{`1e400`, jcs.ErrNumber},
		{`-1e400`, jcs.ErrNumber},
		{`[1.7976931348623159e308]`, jcs.ErrNumber},
		{`{"a":123e99999}`, jcs.ErrNumber},

		{`"\ud800"`, jcs.ErrString},
		{`"\udc00"`, jcs.ErrString},
		{`"\ud800x"`, jcs.ErrString},
		{`"\ud800\u0041"`, jcs.ErrString},
		{`"\ud800\ud800"`, jcs.ErrString},
		{`"\ude00\ud83d"`, jcs.ErrString},
		{`"a\ud83d"`, jcs.ErrString},
		{`{"\udfff":1}`, jcs.ErrString},
		{"\"\xff\"", jcs.ErrString},
		{"\"\xc3\"", jcs.ErrString},
		{"\"\xed\xa0\x80\"", jcs.ErrString}, // a surrogate encoded as UTF-8
		{"\"\xc0\xaf\"", jcs.ErrString},     // overlong
		{"{\"a\xff\":1}", jcs.ErrString},
	}
	for _, c := range cases {
		out, err := jcs.Canonicalize([]byte(c.in))
		require.ErrorIs(t, err, c.want, "input %q gave %q", c.in, out)
		require.Nil(t, out)
		require.NotEmpty(t, err.Error())
	}
}

func TestErrorMessagesNameTheProblem(t *testing.T) {
	t.Parallel()
	_, err := jcs.Canonicalize([]byte(`{"ok":1,"dup":1,"dup":2}`))
	require.EqualError(t, err, `jcs: duplicate member name: "dup"`)
	_, err = jcs.Canonicalize([]byte(`[1e400]`))
	require.EqualError(t, err, `jcs: number is not a finite double: 1e400`)
	_, err = jcs.Canonicalize([]byte(`"\ud800"`))
	require.EqualError(t, err, `jcs: string is not valid Unicode: lone surrogate \ud800`)
	_, err = jcs.Canonicalize([]byte("[\"ab\xff\"]"))
	require.EqualError(t, err, `jcs: string is not valid Unicode: invalid UTF-8 at byte 4`)
}

// FuzzCanonicalize checks, for every input Canonicalize accepts, that the
// output is valid JSON holding the same value, and that canonicalizing it
// again changes nothing.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"literals":[null,true,false]}`,
		`{"\u20ac":"Euro Sign","\r":"CR","\ufb33":"x","1":"One","\ud83d\ude00":"e","\u0080":"c","\u00f6":"o"}`,
		`"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"`,
		`[0,-0,1e21,1e-7,5e-324,1.7976931348623157e308,9007199254740993,0.000001]`,
		`{"a":{"b":[1,{"c":null}]},"a2":"\u2028"}`,
		`{"a":1,"a":2}`, `"\ud800"`, `1e400`, `[1,]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := jcs.Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q -> %q", in, out)
		}
		again, err := jcs.Canonicalize(out)
		if err != nil {
			t.Fatalf("canonical output rejected: %q -> %q: %v", in, out, err)
		}
		if string(again) != string(out) {
			t.Fatalf("not a fixed point: %q -> %q -> %q", in, out, again)
		}
		var v1, v2 any
		if json.Unmarshal(in, &v1) != nil || json.Unmarshal(out, &v2) != nil || !reflect.DeepEqual(v1, v2) {
			t.Fatalf("value changed: %q -> %q", in, out)
		}
	})
}
