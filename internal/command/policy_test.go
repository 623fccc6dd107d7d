package command

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var base = Policy{AckTimeout: 5 * time.Second, MaxAttempts: 5, TTL: 10 * time.Minute, Offline: OfflineWait,
	OnUnknown: UnknownNeedsAttention, Approval: ApprovalNone, Concurrency: ConcurrencyParallel}

func TestLoadPolicies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"defaults":{"ack_timeout":"2s"},
		"actions":{"restart":{"approval":"required","max_attempts":3},"legacy-op":{"on_unknown":"resend","offline":"fail"},
		"set-config":{"concurrency":"serial","supersede":true}}}`), 0o644))
	ps, err := LoadPolicies(path, base)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, ps.For("set-config").AckTimeout)
	require.Equal(t, ApprovalNone, ps.For("set-config").Approval)
	require.True(t, ps.For("set-config").Serial())
	require.True(t, ps.For("set-config").Supersede)
	require.False(t, ps.For("restart").Serial(), "parallel by default")
	require.False(t, ps.For("restart").Supersede)
	r := ps.For("restart")
	require.Equal(t, ApprovalRequired, r.Approval)
	require.Equal(t, 3, r.MaxAttempts)
	require.Equal(t, 2*time.Second, r.AckTimeout, "an action inherits the file's defaults")
	require.Equal(t, UnknownResend, ps.For("legacy-op").OnUnknown)
	require.Equal(t, OfflineFail, ps.For("legacy-op").Offline)

	none, err := LoadPolicies("", base)
	require.NoError(t, err)
	require.Equal(t, base, none.For("anything"))
}

func TestLoadPoliciesRejectsBadFiles(t *testing.T) {
	for name, body := range map[string]string{
		"unknown field":        `{"defaults":{"colour":"red"}}`,
		"bad duration":         `{"defaults":{"ttl":"forever"}}`,
		"bad offline":          `{"actions":{"restart":{"offline":"maybe"}}}`,
		"bad on_unknown":       `{"actions":{"restart":{"on_unknown":"pray"}}}`,
		"bad approval":         `{"actions":{"restart":{"approval":"maybe"}}}`,
		"zero attempts":        `{"defaults":{"max_attempts":0}}`,
		"bad concurrency":      `{"actions":{"restart":{"concurrency":"sometimes"}}}`,
		"supersede not a bool": `{"defaults":{"supersede":"yes"}}`,
		"not json":             `{`,
	} {
		path := filepath.Join(t.TempDir(), "p.json")
		require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
		_, err := LoadPolicies(path, base)
		require.Error(t, err, name)
	}
	_, err := LoadPolicies(filepath.Join(t.TempDir(), "missing.json"), base)
	require.Error(t, err)
}

func TestBackoff(t *testing.T) {
	p := base
	p.AckTimeout = time.Second
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second},
		[]time.Duration{p.Backoff(0), p.Backoff(1), p.Backoff(2), p.Backoff(3), p.Backoff(9)})
}

func TestIDsAreUniqueAndOrdered(t *testing.T) {
	seen := map[string]bool{}
	now := time.Now()
	prev := ""
	for i := 0; i < 10000; i++ {
		id := NewCommandID(now.Add(time.Duration(i) * time.Millisecond))
		require.Len(t, id, 28)
		require.False(t, seen[id])
		seen[id] = true
		require.Greater(t, id, prev, "time-ordered")
		prev = id
	}
}
