package wire

import (
	"strconv"
	"strings"
	"testing"

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
