package wire

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEncodeKeepsParamsAsSent(t *testing.T) {
	b, err := Encode(Command{CommandID: "c-1", Params: json.RawMessage(`{"html": "<b>&</b>", "n": 1.50}`)})
	require.NoError(t, err)
	require.Contains(t, string(b), `"params":{"html":"<b>&</b>","n":1.50}`)
	require.NotContains(t, string(b), `\u003c`)
	require.NotEqual(t, byte('\n'), b[len(b)-1])
}

func TestDeviceIDsOfDotsAreRefused(t *testing.T) {
	for _, id := range []string{".", "..", "...", "controller-c1", "", "a/b", "a+b"} {
		require.False(t, ValidDeviceID(id), id)
	}
	for _, id := range []string{"device-1", "a.b", ".hidden", "x..", "A_b-9"} {
		require.True(t, ValidDeviceID(id), id)
	}
}

func TestReceiptResultMustBeAnObject(t *testing.T) {
	r := Receipt{CommandID: "c-1", Status: ReceiptSucceeded, Seq: 3}
	for _, ok := range []string{``, `null`, `{}`, ` {"a":1}`} {
		r.Result = json.RawMessage(ok)
		require.NoError(t, r.Validate(), ok)
	}
	for _, bad := range []string{`"done"`, `[1]`, `7`, `true`} {
		r.Result = json.RawMessage(bad)
		require.Error(t, r.Validate(), bad)
	}
}

// Every receipt status is progress (received, executing), final
// (succeeded, failed, rejected), or unknown, the answer about a command
// the device never saw: exactly one of them.
func TestReceiptStatusesAreProgressFinalOrUnknown(t *testing.T) {
	for s, want := range map[ReceiptStatus]string{
		ReceiptReceived: "progress", ReceiptExecuting: "progress",
		ReceiptSucceeded: "final", ReceiptFailed: "final", ReceiptRejected: "final",
		ReceiptUnknown: "unknown",
	} {
		require.True(t, s.Valid(), s)
		got := "unknown"
		switch {
		case s.Progress() && s.Final():
			got = "both"
		case s.Progress():
			got = "progress"
		case s.Final():
			got = "final"
		}
		require.Equal(t, want, got, s)
	}
	require.False(t, ReceiptStatus("done").Progress())
}
