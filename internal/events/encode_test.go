package events

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// encode writes what json.Marshal writes, byte for byte, for plain strings
// (its own way) and for every other string or time (json.Marshal's).
func TestEncodeIsMarshal(t *testing.T) {
	at := time.Date(2026, 12, 6, 18, 30, 0, 123456789, time.UTC)
	for _, d := range []apiwire.EventData{
		{Kind: "operation", ID: "task-88:restart-device:device-1001:approval-v3", Status: "succeeded", At: at},
		{Kind: "command", ID: "c-01JXYZ", Status: "sent", At: at.Truncate(time.Second), Principal: "alice@example.com"},
		{Kind: "device", ID: "", Status: "", At: time.Time{}},
		{Kind: "rollout", ID: "fw <1> & \"2\"", Status: "a\\b", At: at},
		{Kind: "rollout", ID: "a<b", Status: "ok", At: at},
		{Kind: "rollout", ID: "a>b", Status: "ok", At: at},
		{Kind: "rollout", ID: "ok", Status: "a&b", At: at},
		{Kind: "rollout", ID: "ok", Status: "ok", At: at, Principal: "q\"uote"},
		{Kind: "rollout", ID: "del\x7f", Status: "ok", At: at},
		{Kind: "task", ID: "ünïcode", Status: "\u2028\u2029", At: at, Principal: "bob\n"},
		{Kind: "operation", ID: "bad utf-8 \xff", Status: "ok", At: at},
		{Kind: "operation", ID: "x", Status: "tab\there", At: at.In(time.FixedZone("", 3600))},
		{Kind: "operation", ID: "x", Status: "far", At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: "operation", ID: "x", Status: "early", At: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: "operation", ID: "x", Status: "a zone of 24 hours", At: at.In(time.FixedZone("", 24*3600))},
	} {
		checkEncode(t, d)
	}
}

func checkEncode(t *testing.T, d apiwire.EventData) {
	t.Helper()
	want, err := json.Marshal(d)
	if err != nil {
		require.Nil(t, encode(d), "json.Marshal refuses %+v: %v", d, err)
		return
	}
	require.Equal(t, string(want), string(encode(d)), "%+v", d)
}

func FuzzEncodeIsMarshal(f *testing.F) {
	f.Add("operation", "op-1", "succeeded", "", int64(1_780_000_000_123_456_789))
	f.Add("command", "c<&>", "sent\x00", "p\"", int64(-9_000_000_000_000_000_000))
	f.Fuzz(func(t *testing.T, kind, id, status, principal string, nanos int64) {
		checkEncode(t, apiwire.EventData{Kind: kind, ID: id, Status: status, Principal: principal, At: time.Unix(0, nanos).UTC()})
	})
}
