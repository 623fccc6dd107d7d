package domain

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/jcs"
)

func TestDerive(t *testing.T) {
	id, err := DeriveOperationID(OperationParts{"task-12", "create-ticket", "device-1001", "v1"})
	require.NoError(t, err)
	require.Equal(t, "task-12:create-ticket:device-1001:v1", id)

	bad := []OperationParts{
		{"", "s", "d", "v"},
		{"t:x", "s", "d", "v"},
		{"t", "s p", "d", "v"},
		{"t", "s", "d", strings.Repeat("v", 65)},
		{"t", "s", "dé", "v"},
	}
	for _, p := range bad {
		_, err := DeriveOperationID(p)
		require.True(t, errors.Is(err, ErrInvalid), "%+v", p)
	}
	_, err = DeriveOperationID(OperationParts{"t", "s", "d", strings.Repeat("v", 64)})
	require.NoError(t, err)
}

func TestValidateWhole(t *testing.T) {
	require.NoError(t, ValidateOperationID("a:b:c", 200))
	require.NoError(t, ValidateOperationID(strings.Repeat("a", 200), 200))
	require.Error(t, ValidateOperationID(strings.Repeat("a", 201), 200))
	require.NoError(t, ValidateOperationID(strings.Repeat("a", 400), 400))
	require.Error(t, ValidateOperationID("", 200))
	require.Error(t, ValidateOperationID("a b", 200))
	require.Error(t, ValidateOperationID("a/b", 200))
}

func TestReserved(t *testing.T) {
	require.True(t, TaskStepShaped("task-88:restart-device:device-1001:approval-v3"))
	require.True(t, TaskStepShaped("x:approval-v12"))
	require.False(t, TaskStepShaped("x:approval-v"))
	require.False(t, TaskStepShaped("x:approval-v3:compensate:v1"))
	require.False(t, TaskStepShaped("approval-v3"))
	require.True(t, ApprovalLike("approval-v3"))
	require.False(t, ApprovalLike("v3"))
}

func TestRolloutShaped(t *testing.T) {
	for _, id := range []string{"fw-42:rollout:device-1:v1", "fw-42:rollout:device-1:v12", "a:rollout:b:v0",
		"f.w_4-2:rollout:dev.ice_1-x:v1", strings.Repeat("r", 90) + ":rollout:d:v1"} {
		require.True(t, RolloutShaped(id), id)
		require.False(t, TaskStepShaped(id), "%s: not an approval id", id)
	}
	for _, id := range []string{"fw-42:rollout:device-1", "fw-42:rollout:device-1:v", "fw-42:rollout:device-1:version1",
		"x:fw-42:rollout:device-1:v1", "fw-42:rollout:device-1:v1:compensate:v2", "fw-42:rollouts:device-1:v1",
		":rollout:device-1:v1", "fw-42:rollout::v1", "fw-42:Rollout:device-1:v1", "fw-42:rollout:device-1:v1\n", "rollout:device-1:v1"} {
		require.False(t, RolloutShaped(id), id)
	}
}

func TestCanonicalParams(t *testing.T) {
	for _, in := range []string{"", "null", "  null "} {
		out, err := CanonicalParams(json.RawMessage(in))
		require.NoError(t, err)
		require.JSONEq(t, `{}`, string(out))
	}
	for _, in := range []string{`[]`, `"x"`, `1`, `{"a":}`} {
		_, err := CanonicalParams(json.RawMessage(in))
		require.True(t, errors.Is(err, ErrInvalid), in)
	}
	out, err := CanonicalParams(json.RawMessage(`{ "b": 1.0, "a": [10, 1e1] }`))
	require.NoError(t, err)
	require.Equal(t, `{"a":[10,10],"b":1}`, string(out))
}

// Hashes stored by earlier versions stay what they were (these were computed
// by the version that encoded {action, target, params} and canonicalized
// the result): a retry after an upgrade still matches its operation.
func TestRequestHashIsStable(t *testing.T) {
	for _, c := range []struct{ action, target, params, hash string }{
		{"restart", "device-1", `{}`, "9af026209c2cc719f9257f99dc51b42d393dc128d59da125fa79f801c929ed9d"},
		{"set_config", "pump-17", `{"bench_k":123}`, "a4802db77001112815352a72795a85ad2022aed4e7c632d2f2044857b73a2b4a"},
		{"firmware.update", "dev_9", `{"a":[1,2.5,"x\"y\\z\n"],"b":{"é":"<&>","z":null},"n":1e+21}`, "ed72c5699b7cebb8ccb2aa5613f274e9b06c1d7433c4f320bdbb8e3100d21162"},
	} {
		p, err := CanonicalParams(json.RawMessage(c.params))
		require.NoError(t, err)
		require.Equal(t, c.hash, RequestHash(c.action, c.target, p), "%s %s %s", c.action, c.target, c.params)
	}
}

func TestRequestHashIgnoresKeyOrderAndNumberSpelling(t *testing.T) {
	p1, err := CanonicalParams(json.RawMessage(`{"reason":"stuck","delay":1}`))
	require.NoError(t, err)
	p2, _ := CanonicalParams(json.RawMessage(`{"delay":1.0e0, "reason":"stuck"}`))
	h1 := RequestHash("restart", "device-1", p1)
	h2 := RequestHash("restart", "device-1", p2)
	require.Equal(t, h1, h2)
	require.Len(t, h1, 64)
	h3 := RequestHash("restart", "device-2", p1)
	require.NotEqual(t, h1, h3)
	p4, _ := CanonicalParams(json.RawMessage(`{"reason":"stuck","delay":2}`))
	h4 := RequestHash("restart", "device-1", p4)
	require.NotEqual(t, h1, h4)
}

// BenchmarkSplitParams: a submit's params, flat (the common kind, Plain)
// and nested, and the flat ones the full way (splitParams), as before Plain.
func BenchmarkSplitParams(b *testing.B) {
	const flat = `{"reason":"maintenance","window_s":300}`
	for _, c := range []struct {
		name, params string
		split        func(json.RawMessage) (json.RawMessage, json.RawMessage, error)
	}{
		{"flat", flat, SplitParams},
		{"flat-full-way", flat, splitParams},
		{"nested", `{"window":{"s":300,"from":"02:00"},"reason":"maintenance"}`, SplitParams},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.split(json.RawMessage(c.params)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Params Plain takes as they are come out as the full way makes them.
func TestPlainParamsSplitAsTheFullWay(t *testing.T) {
	for _, p := range []string{`{}`, `{"reason":"maintenance","window_s":300}`, `{"A":-1,"a":true,"b":null,"c":"<&> ~"}`} {
		require.True(t, jcs.Plain([]byte(p)), p)
		sent, canonical, err := SplitParams(json.RawMessage(p))
		require.NoError(t, err)
		fsent, fcanonical, err := splitParams(json.RawMessage(p))
		require.NoError(t, err)
		require.Equal(t, string(fsent), string(sent), p)
		require.Equal(t, string(fcanonical), string(canonical), p)
	}
}
