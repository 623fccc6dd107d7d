package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestCheckJSONNamesTheRuleAndWhere(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 33) + `1` + strings.Repeat(`}`, 33)
	justDeepEnough := strings.Repeat(`[`, 32) + strings.Repeat(`]`, 32)
	cases := []struct {
		name, in      string
		safe          bool
		reason, field string
	}{
		{"not JSON", `{"a":`, false, ReasonInvalidJSON, ""},
		{"empty", `  `, false, ReasonInvalidJSON, ""},
		{"trailing", `{}{}`, false, ReasonInvalidJSON, ""},
		{"too deep", deep, false, ReasonTooDeep, strings.TrimSuffix(strings.Repeat("a.", 32), ".")},
		{"too deep in an array", `{"x":[` + justDeepEnough + `]}`, false, ReasonTooDeep, "x" + strings.Repeat("[0]", 31)},
		{"duplicate", `{"a":1,"b":{"c":1,"c":2}}`, false, ReasonDuplicateKey, "b.c"},
		{"duplicate by escape", `{"a":1,"\u0061":2}`, false, ReasonDuplicateKey, "a"},
		{"duplicate past the set threshold", `{` + manyKeys(20) + `,"k3":0}`, false, ReasonDuplicateKey, "k3"},
		{"no double holds it", `{"n":[1,1e400]}`, false, ReasonBadNumber, "n[1]"},
		{"unsafe integer", `{"n":9007199254740993}`, true, ReasonBadNumber, "n"},
	}
	for _, c := range cases {
		err := CheckJSON([]byte(c.in), CheckOptions{SafeIntegers: c.safe})
		require.Error(t, err, c.name)
		var ie *InputError
		require.ErrorAs(t, err, &ie, c.name)
		require.Equal(t, c.reason, ie.Reason, "%s: %v", c.name, err)
		require.Equal(t, c.field, ie.Field, "%s: %v", c.name, err)
	}
	for _, ok := range []string{`{}`, `[]`, `"s"`, `1`, `null`, justDeepEnough, `{"n":9007199254740993}`, `{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}`,
		`{"s":"with \"quotes\" and \\ and , : { ["}`, ` { "a" : [ 1 , 2.5e3 , -0 , true , false , null ] } `, `{` + manyKeys(40) + `}`} {
		require.NoError(t, CheckJSON([]byte(ok), CheckOptions{}), ok)
	}
	require.NoError(t, CheckJSON([]byte(`{"n":9007199254740991,"f":1e300}`), CheckOptions{SafeIntegers: true}))
}

// manyKeys is n distinct members "k0":1 ... "k<n-1>":1.
func manyKeys(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = `"k` + strconv.Itoa(i) + `":1`
	}
	return strings.Join(parts, ",")
}

func TestCheckJSONBoundsItsMessage(t *testing.T) {
	key := strings.Repeat("k", 10000)
	err := CheckJSON([]byte(`{"`+key+`":1,"`+key+`":2}`), CheckOptions{})
	require.Error(t, err)
	require.Less(t, len(err.Error()), 200)
}

func TestDecodeDeviceRefusesAndIgnoresUnknownFields(t *testing.T) {
	var r Receipt
	require.NoError(t, DecodeDevice([]byte(`{"command_id":"c-1","status":"succeeded","seq":3,"colour":"red","at":"2026-01-02T03:04:05Z"}`), &r))
	require.Equal(t, 3, r.Seq)
	cases := []struct {
		name, in      string
		reason, field string
	}{
		{"too large", `{"command_id":"` + strings.Repeat("x", MaxDevicePayload) + `"}`, ReasonTooLarge, ""},
		{"wrong type", `{"command_id":7,"status":"succeeded","seq":1}`, ReasonWrongType, "command_id"},
		{"fraction for an integer", `{"command_id":"c","status":"succeeded","seq":1.5}`, ReasonBadNumber, "seq"},
		{"integer overflow", `{"command_id":"c","status":"succeeded","seq":1e30}`, ReasonBadNumber, "seq"},
		{"bad time", `{"command_id":"c","status":"succeeded","seq":1,"at":"yesterday"}`, ReasonWrongType, "at"},
		{"time of the wrong type", `{"command_id":"c","status":"succeeded","seq":1,"at":17}`, ReasonWrongType, "at"},
		{"not an object", `[1,2]`, ReasonWrongType, ""},
	}
	for _, c := range cases {
		var r Receipt
		err := DecodeDevice([]byte(c.in), &r)
		var ie *InputError
		require.ErrorAs(t, err, &ie, c.name)
		require.Equal(t, c.reason, ie.Reason, "%s: %v", c.name, err)
		require.Equal(t, c.field, ie.Field, "%s: %v", c.name, err)
	}
	var p Presence
	err := DecodeDevice([]byte(`{"online":"yes","session":1}`), &p)
	require.Equal(t, ReasonWrongType, Reason(err, ""))
	require.Contains(t, err.Error(), "online: want true or false, got string")
}

func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		r             Receipt
		reason, field string
	}{
		{Receipt{Status: ReceiptSucceeded, Seq: 1}, ReasonBadID, "command_id"},
		{Receipt{CommandID: "c 1", Status: ReceiptSucceeded, Seq: 1}, ReasonBadID, "command_id"},
		{Receipt{CommandID: strings.Repeat("c", 201), Status: ReceiptSucceeded, Seq: 1}, ReasonBadID, "command_id"},
		{Receipt{CommandID: "c-1", OperationID: "a/b", Status: ReceiptSucceeded, Seq: 1}, ReasonBadID, "operation_id"},
		{Receipt{CommandID: "c-1", QueryID: "q\n", Status: ReceiptSucceeded, Seq: 1}, ReasonBadID, "query_id"},
		{Receipt{CommandID: "c-1", Status: "exploded", Seq: 1}, ReasonInvalidValue, "status"},
		{Receipt{CommandID: "c-1", Status: ReceiptSucceeded, Seq: 1 << 60}, ReasonBadNumber, "seq"},
		{Receipt{CommandID: "c-1", Status: ReceiptSucceeded, Seq: 1, Result: []byte(`[1]`)}, ReasonWrongType, "result"},
	}
	for _, c := range cases {
		err := c.r.Validate()
		var ie *InputError
		require.ErrorAs(t, err, &ie, "%+v", c.r)
		require.Equal(t, c.reason, ie.Reason, "%+v: %v", c.r, err)
		require.Equal(t, c.field, ie.Field, "%+v: %v", c.r, err)
	}
	ok := Receipt{CommandID: "c-01J", OperationID: "task-1:s:device-1:v1", QueryID: "q-1", Status: ReceiptSucceeded, Seq: 2}
	require.NoError(t, ok.Validate())
	require.Error(t, (&Presence{Session: -1}).Validate())
	require.Error(t, (&Presence{Session: 1 << 60}).Validate())
	require.NoError(t, (&Presence{Session: 7}).Validate())
}

// A receipt within the result and error limits fits the payload limit with
// every id at its longest: a conforming device's final receipt is never
// refused.
func TestReceiptWithinLimitsFitsThePayloadLimit(t *testing.T) {
	r := Receipt{CommandID: strings.Repeat("c", 200), OperationID: strings.Repeat("o", 400), QueryID: strings.Repeat("q", 200),
		Status: ReceiptSucceeded, Seq: MaxSafeInteger, At: time.Now().UTC(),
		Result: json.RawMessage(`{"k":"` + strings.Repeat("\\u0000", (MaxResultBytes-10)/6) + `"}`),
		Error:  strings.Repeat("\\", MaxErrorBytes)}
	require.LessOrEqual(t, len(r.Result), MaxResultBytes)
	out, err := Encode(r)
	require.NoError(t, err)
	require.LessOrEqual(t, len(out), MaxDevicePayload)
}

func TestBoundReceiptReplacesAnOversizedResultAndKeepsTheStatus(t *testing.T) {
	big := json.RawMessage(`{"config":"` + strings.Repeat("x", 70<<10) + `"}`)
	r := Receipt{CommandID: "c-1", Status: ReceiptSucceeded, Seq: 2, Result: big, Error: strings.Repeat("é", MaxErrorBytes)}
	BoundReceipt(&r)
	require.Equal(t, ReceiptSucceeded, r.Status)
	require.JSONEq(t, fmt.Sprintf(`{"result_too_large":{"bytes":%d,"limit":%d}}`, len(big), MaxResultBytes), string(r.Result))
	require.LessOrEqual(t, len(r.Error), MaxErrorBytes)
	require.True(t, utf8.ValidString(r.Error), "cut at a character boundary")
}

func TestSalvageReceipt(t *testing.T) {
	big := `{"command_id":"c-1","operation_id":"op-1","status":"succeeded","seq":3,"result":{"config":"` +
		strings.Repeat("x", 70<<10) + `"},"extra":1}`
	out, err := SalvageReceipt([]byte(big))
	require.NoError(t, err)
	var r Receipt
	require.NoError(t, DecodeDevice(out, &r))
	require.NoError(t, r.Validate())
	require.Equal(t, "c-1", r.CommandID)
	require.Equal(t, ReceiptSucceeded, r.Status)
	require.EqualValues(t, 3, r.Seq)
	require.Contains(t, string(r.Result), "result_too_large")

	for _, bad := range []string{
		`{"command_id":"c-1","pad":"` + strings.Repeat("x", 70<<10) + `"}`,                              // no status
		`{"command_id":"c-1","status":"succeeded","seq":1,"pad":"` + strings.Repeat("x", 70<<10) + `"}`, // not its result
		`{"command_id":"c-1","status":"succeeded","seq":1,"result":{"a":"` + strings.Repeat("x", 70<<10) + `"},"status":"failed"}`,
		`[` + strings.Repeat(`1,`, 40<<10) + `1]`, // not a receipt
		`{"command_id":"c-1","status":"succeeded","seq":1,"result":"` + strings.Repeat("x", MaxSalvagePayload) + `"}`,
	} {
		_, err := SalvageReceipt([]byte(bad))
		require.Equal(t, ReasonTooLarge, Reason(err, ""), "%.60s", bad)
	}
}
