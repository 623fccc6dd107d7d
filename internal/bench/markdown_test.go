package bench

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The docs page carries the run's headline figures and each phase, with
// where and when it ran.
func TestMarkdownCarriesTheFigures(t *testing.T) {
	t.Parallel()
	r := &Result{Date: "2026-12-05T19:00:00Z", GoVersion: "go1.26.8", Commit: "abc123", CPUs: 2, Devices: 100,
		Seconds: 10, Concurrency: 256, Backend: "sqlite", Instances: 1, CeilingPerS: 4624.5, PassthroughPerS: 1680.1, ControllerPerS: 849.2,
		Ratio: 0.1836, CPUMSPerOp: 1.37, StatementsPerOp: 27.3,
		Phases: []*Phase{{Name: "controller", Mode: "closed", Concurrency: 256, PerS: 849.2,
			Latency: Summary{P50: 250.5, P99: 410.25}, Errors: 1, Unfinished: 2, DBRoundTripsPerOp: 27.3,
			CPU: []CPUUse{{Process: "controller", MSPerOp: 1.37}, {Process: "broker", MSPerOp: 0.26}}}}}
	md := r.Markdown()
	for _, want := range []string{
		"# Latest `make bench` (sqlite, 100 devices)",
		"2026-12-05T19:00:00Z", "commit abc123", "2 CPUs",
		"| controller_per_s | 849.2 |", "| passthrough_per_s | 1680.1 |", "| ratio (controller / pass-through) | 0.1836 |",
		"| ceiling_per_s (reference: MQTT only, in-memory fleet) | 4624.5 |",
		"| controller | closed, 256 in flight | 849.2 | 250.50 | 410.25 | 3 | 27.30 | controller 1.370, broker 0.260 |",
		"[benchmarks.md](benchmarks.md)",
	} {
		require.Contains(t, md, want)
	}
	require.False(t, strings.Contains(md, "commit -"), "a known commit is named")
}

// The commit a run names is the work tree's HEAD when the build carries no
// VCS stamp (go test builds without one), and nothing outside a git tree.
func TestBuildInfoNamesTheWorkTreesCommit(t *testing.T) {
	_, commit := buildInfo()
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		require.Empty(t, commit, "no git tree, no commit")
		return
	}
	require.NotEmpty(t, commit)
	require.Equal(t, strings.TrimSpace(string(head)), strings.TrimSuffix(commit, "+dirty"))
}
