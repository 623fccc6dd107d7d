package sim_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
)

func TestParseProfileMergesOverridesOverDefaults(t *testing.T) {
	t.Parallel()
	p, err := sim.ParseProfile([]byte(`{
	  "seed": 42,
	  "defaults": {
	    "drop_receipt": {"p": 0.1, "statuses": ["final"]},
	    "slow_execution": {"p": 1, "delay": "250ms", "actions": ["restart"]},
	    "clock_skew": "-30s"
	  },
	  "devices": [
	    {"match": "device-1", "faults": {"legacy": true}},
	    {"match": "device-1?", "faults": {"crash": {"count": 1, "at": "executed", "for": "1s"}, "drop_receipt": {}}},
	    {"match": "device-[2-3]", "faults": {"legacy": {"dedupe": false, "query": true}}}
	  ]}`))
	require.NoError(t, err)
	require.Equal(t, int64(42), p.Seed)

	def := p.For("device-9")
	require.Equal(t, sim.ReceiptFault{Trigger: sim.Trigger{P: 0.1}, Statuses: []string{"final"}}, def.DropReceipt)
	require.Equal(t, sim.Duration(250*time.Millisecond), def.SlowExecution.Delay)
	require.Equal(t, sim.Duration(-30*time.Second), def.ClockSkew)
	require.False(t, def.Legacy.Enabled)

	d1 := p.For("device-1")
	require.Equal(t, sim.Legacy{Enabled: true}, d1.Legacy)
	require.Equal(t, def.DropReceipt, d1.DropReceipt, "keys not in the override keep the defaults")

	d12 := p.For("device-12")
	require.Equal(t, sim.OutageFault{Trigger: sim.Trigger{Count: 1}, At: sim.PointExecuted, For: sim.Duration(time.Second)}, d12.Crash)
	require.False(t, d12.DropReceipt.Enabled(), "an override key replaces the whole fault")
	require.Equal(t, def.SlowExecution, d12.SlowExecution)

	require.Equal(t, sim.Legacy{Enabled: true, Query: true}, p.For("device-3").Legacy)
	require.Equal(t, def, p.For("device-4"))

	// The profile survives a round trip through JSON.
	f := filepath.Join(t.TempDir(), "p.json")
	require.NoError(t, os.WriteFile(f, []byte(`{"defaults":{"fail":{"count":2,"error":"boom"}}}`), 0o644))
	lp, err := sim.LoadProfile(f)
	require.NoError(t, err)
	require.Equal(t, sim.ActionFault{Trigger: sim.Trigger{Count: 2}, Error: "boom"}, lp.Defaults.Fail)
}

func TestParseProfileRejectsMistakes(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]string{
		"unknown top key":    `{"default": {}}`,
		"unknown fault":      `{"defaults": {"drop_commands": {"p": 1}}}`,
		"unknown fault key":  `{"defaults": {"drop_command": {"prob": 1}}}`,
		"p above 1":          `{"defaults": {"drop_command": {"p": 1.5}}}`,
		"negative count":     `{"defaults": {"fail": {"count": -1}}}`,
		"bad status":         `{"defaults": {"drop_receipt": {"p": 1, "statuses": ["done"]}}}`,
		"bad point":          `{"defaults": {"crash": {"count": 1, "at": "later"}}}`,
		"at and every":       `{"defaults": {"crash": {"count": 1, "at": "final", "every": "1s"}}}`,
		"bad duration":       `{"defaults": {"clock_skew": "an hour"}}`,
		"number duration":    `{"defaults": {"clock_skew": 30}}`,
		"bad legacy":         `{"defaults": {"legacy": {"dedupe": false, "queries": true}}}`,
		"bad glob":           `{"devices": [{"match": "device-[", "faults": {}}]}`,
		"empty match":        `{"devices": [{"match": "", "faults": {}}]}`,
		"bad override fault": `{"devices": [{"match": "x", "faults": {"reject": {"p": -1}}}]}`,
		"trailing data":      `{} {}`,
	} {
		_, err := sim.ParseProfile([]byte(src))
		require.Error(t, err, name)
	}
}

func TestFaultsMerge(t *testing.T) {
	t.Parallel()
	base := sim.Faults{DropCommand: sim.Trigger{P: 0.5}, IgnoreQueries: sim.Trigger{Count: 1}}
	got, err := base.Merge([]byte(`{"drop_command": {"count": 3}}`))
	require.NoError(t, err)
	require.Equal(t, sim.Faults{DropCommand: sim.Trigger{Count: 3}, IgnoreQueries: sim.Trigger{Count: 1}}, got)
	_, err = base.Merge([]byte(`{"drop_command": {"p": 7}}`))
	require.Error(t, err)
	_, err = base.Merge([]byte(`[]`))
	require.Error(t, err)
}

func TestStartValidatesConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, cfg := range map[string]sim.Config{
		"no broker":     {Devices: 1, StateDir: dir},
		"bad scheme":    {MQTT: "ws://127.0.0.1:1", Devices: 1, StateDir: dir},
		"no port":       {MQTT: "tcp://127.0.0.1", Devices: 1, StateDir: dir},
		"no devices":    {MQTT: "tcp://127.0.0.1:1", StateDir: dir},
		"no state dir":  {MQTT: "tcp://127.0.0.1:1", Devices: 1},
		"bad id":        {MQTT: "tcp://127.0.0.1:1", IDs: []string{"controller-1"}, StateDir: dir},
		"same id twice": {MQTT: "tcp://127.0.0.1:1", IDs: []string{"a", "a"}, StateDir: dir},
		"wildcard root": {MQTT: "tcp://127.0.0.1:1", Devices: 1, StateDir: dir, TopicRoot: "fleet/#"},
		"bad faults":    {MQTT: "tcp://127.0.0.1:1", Devices: 1, StateDir: dir, Faults: sim.Profile{Defaults: sim.Faults{DropCommand: sim.Trigger{P: -1}}}},
	} {
		_, err := sim.Start(t.Context(), cfg)
		require.Error(t, err, name)
	}
}
