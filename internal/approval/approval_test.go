package approval

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCheck: each verdict, and the contract's order where several apply.
func TestCheck(t *testing.T) {
	t.Parallel()
	ok := Request{Version: 3, PlanHash: "h3", Approver: "bob", Waiting: true, Current: 3, CurrentHash: "h3",
		Author: "alice", FourEyes: true}
	with := func(f func(*Request)) Request { r := ok; f(&r); return r }
	for _, c := range []struct {
		name string
		req  Request
		want Verdict
	}{
		{"approve", ok, Approve},
		{"no plan_hash given", with(func(r *Request) { r.PlanHash = "" }), Approve},
		{"exact replay, even after the task moved on", with(func(r *Request) {
			r.Prior, r.Waiting = &Approved{Version: 3, Approver: "bob"}, false
		}), Replay},
		{"another approver's approval on record", with(func(r *Request) {
			r.Prior, r.Waiting = &Approved{Version: 3, Approver: "carol"}, false
		}), IllegalState},
		{"not waiting, before stale", with(func(r *Request) { r.Waiting, r.Version = false, 2 }), IllegalState},
		{"another version", with(func(r *Request) { r.Version = 2 }), StaleVersion},
		{"another plan hash", with(func(r *Request) { r.PlanHash = "h2" }), StaleVersion},
		{"stale before four eyes", with(func(r *Request) { r.Version, r.Approver = 2, "alice" }), StaleVersion},
		{"four eyes", with(func(r *Request) { r.Approver = "alice" }), FourEyes},
		{"four eyes off", with(func(r *Request) { r.Approver, r.FourEyes = "alice", false }), Approve},
		{"a rollout: no plan hash", with(func(r *Request) { r.PlanHash, r.CurrentHash = "", "" }), Approve},
	} {
		require.Equal(t, c.want, Check(c.req), c.name)
	}
}

func TestWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	for _, c := range []struct {
		name            string
		w               Window
		missed, waiting bool
	}{
		{"none", Window{}, false, false},
		{"open", Window{After: at(-time.Minute), Before: at(time.Minute)}, false, false},
		{"not open yet", Window{After: at(time.Minute)}, false, true},
		{"missed", Window{Before: at(-time.Second)}, true, false},
		{"ends now: not missed", Window{Before: at(0)}, false, false},
		{"opens now: not waiting", Window{After: at(0)}, false, false},
	} {
		require.Equal(t, c.missed, c.w.Missed(now), c.name)
		require.Equal(t, c.waiting, c.w.Waiting(now), c.name)
	}
}

func TestAllows(t *testing.T) {
	t.Parallel()
	grants := []Grant{{Action: "restart", Devices: "dev-1*"}, {Action: "set-*", Devices: "lab-?"}, {Action: "[", Devices: "*"}}
	for _, c := range []struct {
		action, device string
		want           bool
	}{
		{"restart", "dev-1", true},
		{"restart", "dev-100", true},
		{"restart", "dev-2", false},
		{"reboot", "dev-1", false},
		{"set-config", "lab-a", true},
		{"set-config", "lab-ab", false},
		{"set", "lab-a", false},
		{"[", "dev-1", false}, // a malformed pattern matches nothing
	} {
		require.Equal(t, c.want, Allows(grants, c.action, c.device), "%s on %s", c.action, c.device)
	}
	require.False(t, Allows(nil, "restart", "dev-1"), "no grants")
	require.True(t, Allows([]Grant{{Action: "*", Devices: "*"}}, "restart", "dev-1"))
	require.NoError(t, ValidPattern("dev-[0-9]*"))
	require.Error(t, ValidPattern("dev-["))
}

func TestCheckStep(t *testing.T) {
	t.Parallel()
	ok := Step{ApprovedHash: "h", CurrentHash: "h", EnforceGrants: true, Grants: []Grant{{Action: "restart", Devices: "*"}},
		Action: "restart", Device: "dev-1", Seen: true}
	with := func(f func(*Step)) Step { s := ok; f(&s); return s }
	for _, c := range []struct {
		name string
		s    Step
		want string
	}{
		{"all hold", ok, ""},
		{"plan changed", with(func(s *Step) { s.CurrentHash = "h2" }), PlanChanged},
		{"plan changed first", with(func(s *Step) { s.CurrentHash, s.Grants, s.Seen = "h2", nil, false }), PlanChanged},
		{"permission revoked", with(func(s *Step) { s.Grants = nil }), PermissionRevoked},
		{"permission before device", with(func(s *Step) { s.Grants, s.Seen = nil, false }), PermissionRevoked},
		{"grants not enforced", with(func(s *Step) { s.Grants, s.EnforceGrants = nil, false }), ""},
		{"device unknown", with(func(s *Step) { s.Seen = false }), DeviceUnknown},
		{"a grant for another action", with(func(s *Step) { s.Action = "reboot" }), PermissionRevoked},
	} {
		require.Equal(t, c.want, CheckStep(c.s), c.name)
	}
}

func TestCheckStart(t *testing.T) {
	t.Parallel()
	ok := Start{ApprovalRequired: true, Version: 2, ApprovedVersion: 2, Approver: "bob", Creator: "alice", FourEyes: true,
		EnforceGrants: true, Grants: []Grant{{Action: "restart", Devices: "dev-*"}}, Action: "restart", Device: "dev-1"}
	with := func(f func(*Start)) Start { s := ok; f(&s); return s }
	for _, c := range []struct {
		name string
		s    Start
		want string
	}{
		{"all hold", ok, ""},
		{"approval of an older version", with(func(s *Start) { s.ApprovedVersion = 1 }), ApprovalMissing},
		{"no approver", with(func(s *Start) { s.Approver = "" }), ApprovalMissing},
		{"four eyes", with(func(s *Start) { s.Approver = "alice" }), "four_eyes"},
		{"four eyes off", with(func(s *Start) { s.Approver, s.FourEyes = "alice", false }), ""},
		{"no approval required", with(func(s *Start) { s.ApprovalRequired, s.Approver, s.ApprovedVersion = false, "", 0 }), ""},
		{"approval before grant", with(func(s *Start) { s.Approver, s.Grants = "", nil }), ApprovalMissing},
		{"permission revoked", with(func(s *Start) { s.Device = "lab-1" }), PermissionRevoked},
		{"grants not enforced", with(func(s *Start) { s.Device, s.EnforceGrants = "lab-1", false }), ""},
	} {
		require.Equal(t, c.want, CheckStart(c.s), c.name)
	}
}

// A rollout's device glob picks the ids it matches whole, in their order;
// a malformed glob is an error, not an empty set.
func TestMatchDevices(t *testing.T) {
	t.Parallel()
	ids := []string{"device-1", "device-10", "device-2", "sensor-1"}
	got, err := MatchDevices("device-?", ids)
	require.NoError(t, err)
	require.Equal(t, []string{"device-1", "device-2"}, got)
	got, err = MatchDevices("device-*", ids)
	require.NoError(t, err)
	require.Equal(t, []string{"device-1", "device-10", "device-2"}, got)
	got, err = MatchDevices("pump-*", ids)
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = MatchDevices("device-[", ids)
	require.Error(t, err)
}
