package wire

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// checkReceiptPlain holds decodeReceiptPlain to json.Unmarshal on a payload
// CheckJSON accepts: where it decodes, json.Unmarshal decodes the same
// receipt without an error; where it does not, the receipt is untouched.
// It returns whether it decoded.
func checkReceiptPlain(t *testing.T, payload []byte) bool {
	t.Helper()
	if CheckJSON(payload, CheckOptions{}) != nil {
		return false
	}
	prior := Receipt{CommandID: "prior", Seq: 9, Result: json.RawMessage(`{"prior":1}`)}
	got, want := prior, prior
	ok := decodeReceiptPlain(payload, &got)
	if !ok {
		if !reflect.DeepEqual(got, prior) {
			t.Fatalf("%s: not decoded, but the receipt changed: %+v", payload, got)
		}
		return false
	}
	if err := json.Unmarshal(payload, &want); err != nil {
		t.Fatalf("%s: decoded as %+v, but json.Unmarshal refuses it: %v", payload, got, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n decoded      %+v\n json.Unmarshal %+v", payload, got, want)
	}
	return true
}

func TestDecodeReceiptPlainIsUnmarshal(t *testing.T) {
	for payload, plain := range map[string]bool{
		`{"command_id":"c-01J","operation_id":"t:s:dev-1:v1","status":"succeeded","seq":3,"at":"2026-12-07T09:30:01.123Z","result":{"ok":true,"n":[1,{"a":"}"}]}}`: true,
		` { "command_id" : "c-1" , "status" : "received" , "seq" : 1 , "at" : "2026-12-07T09:30:01+01:00" } `:                                                      true,
		`{}`: true,
		"{\"command_id\":\"c-1\",\"result\": \t{\"a\" : [1 , 2]} ,\"seq\":1}": true,
		`{"command_id":"c-1","result": 12 }`:                                  true,
		`{"command_id":"c-1","result":null}`:                                  true,
		`{"command_id":"c-1","result":"a\"b\\"}`:                              true,
		`{"command_id":"c-1","result":-1.5e3,"error":"x"}`:                    true,
		`{"command_id":"c-1","result":[],"query_id":"q-1"}`:                   true,
		`{"command_id":"c-1","extra":{"x":[1,2,{"y":"]"}]},"seq":2}`:          true,
		`{"command_id":"c-1","extra":true,"other":null,"n":1.5}`:              true,
		`{"command_id":"c-1","seq":-4}`:                                       true,
		`{"command_id":"c-1","seq":999999999999999999}`:                       true,
		`{"command_id":"c-1","seq":1000000000000000000}`:                      false, // 19 digits: json.Unmarshal's way
		`{"command_id":"c-1","seq":1.0}`:                                      false,
		`{"command_id":"c-1","seq":1e2}`:                                      false,
		`{"command_id":"c-1","seq":"1"}`:                                      false,
		`{"command_id":"c-1","seq":null}`:                                     false,
		`{"command_id":"c\u002d1"}`:                                           false,
		`{"command_id":"é"}`:                                                  false,
		`{"command_id":1}`:                                                    false,
		`{"command_id":null}`:                                                 false,
		`{"Command_ID":"c-1"}`:                                                false,
		`{"SEQ":1}`:                                                           false,
		"{\"\u017feq\":1}":                                                    false, // ſ folds to s
		`{"st\u0061tus":"x"}`:                                                 false,
		`{"at":"2026-13-07T09:30:01Z"}`:                                       false,
		`{"at":"yesterday"}`:                                                  false,
		`{"at":null}`:                                                         false,
		`{"error":"line\nbreak"}`:                                             false,
		`[]`:                                                                  false,
		`"x"`:                                                                 false,
	} {
		if got := checkReceiptPlain(t, []byte(payload)); got != plain {
			t.Errorf("%s: decoded %v, want %v", payload, got, plain)
		}
	}
}

// The receipts a device sends, as it sends them, take the plain way to the
// same receipt. The last sets every field: a field added to Receipt fails
// this test until it is set there (the check below finds any left zero),
// and then until decodeReceiptPlain reads it.
func TestDeviceReceiptsDecodePlain(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 30, 1, 123456789, time.UTC)
	every := Receipt{CommandID: "c-01JXYZ", OperationID: "t:s:dev-1:v1", Status: ReceiptSucceeded, Seq: 3, At: at,
		Result: json.RawMessage(`{"ok":true}`), Error: "none", QueryID: "q-01JXYZ"}
	v := reflect.ValueOf(every)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("the last receipt leaves %s zero: set it", v.Type().Field(i).Name)
		}
	}
	for _, r := range []Receipt{
		{CommandID: "c-01JXYZ", OperationID: "bench-sat-12:restart:dev-0042:v1", Status: ReceiptReceived, Seq: 1, At: at},
		{CommandID: "c-01JXYZ", OperationID: "op", Status: ReceiptSucceeded, Seq: 3, At: at, Result: json.RawMessage(`{"restarted_at":"2026-12-07T09:30:01Z"}`)},
		{CommandID: "c-01JXYZ", Status: ReceiptFailed, Seq: 2, At: at, Error: "disk full"},
		every,
	} {
		b, err := Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if !checkReceiptPlain(t, b) {
			t.Fatalf("%s: not decoded the plain way", b)
		}
		var back Receipt
		if err := DecodeDevice(b, &back); err != nil || !reflect.DeepEqual(back, r) {
			t.Fatalf("DecodeDevice(%s) = %+v, %v", b, back, err)
		}
	}
}

// BenchmarkDecodeReceipt: a device's final receipt through DecodeDevice,
// and through its checks and json.Unmarshal alone (the way before).
func BenchmarkDecodeReceipt(b *testing.B) {
	payload := []byte(`{"command_id":"c-01KC0000000000000000000000","operation_id":"bench-sat-12345:restart:dev-0042:v1",` +
		`"status":"succeeded","seq":3,"at":"2026-12-07T09:30:01.123456789Z","result":{"restarted_at":"2026-12-07T09:30:01Z"}}`)
	b.Run("DecodeDevice", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r Receipt
			if err := DecodeDevice(payload, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r Receipt
			if err := CheckJSON(payload, CheckOptions{}); err != nil {
				b.Fatal(err)
			}
			if err := DecodeInto(payload, &r, false); err != nil {
				b.Fatal(err)
			}
		}
	})
}
