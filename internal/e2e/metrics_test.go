package e2e

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/metrics"
)

// scrape reads the /metrics of the controller at url with Prometheus's own
// text parser: its metric families by name.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s/metrics", url)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err, "GET %s/metrics", url)
	return families
}

// metricAt returns one series of the controller at url, named as the
// exposition writes it: `name` or `name{label="value",...}`, its labels in
// any order. A labelled series the controller has not made yet reads 0: a
// vector shows no series before its first use. A name without labels that
// the controller does not expose, or a label its family does not have,
// fails the test, so that a misspelt name cannot pass for a 0.
func metricAt(t testing.TB, url, series string) float64 {
	t.Helper()
	name, want := parseSeries(t, series)
	family, ok := scrape(t, url)[name]
	if !ok {
		require.NotEmpty(t, want, "the controller at %s exposes no %s", url, name)
		return 0
	}
	have := map[string]bool{}
	for _, m := range family.GetMetric() {
		for _, l := range m.GetLabel() {
			have[l.GetName()] = true
		}
	}
	for label := range want {
		require.True(t, have[label], "%s has no label %q", name, label)
	}
	for _, m := range family.GetMetric() {
		if maps.Equal(labelsOf(m), want) {
			return valueOf(m)
		}
	}
	return 0
}

// parseSeries splits `name{label="value",...}` with the text parser itself
// (as a sample line of value 0), so that quoting and escapes are the
// format's.
func parseSeries(t testing.TB, series string) (name string, labels map[string]string) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(series + " 0\n"))
	require.NoError(t, err, "series %q", series)
	require.Len(t, families, 1, "series %q", series)
	for name, f := range families {
		return name, labelsOf(f.GetMetric()[0])
	}
	panic("unreachable")
}

// labelsOf is a series' labels by name.
func labelsOf(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// valueOf is a counter's, a gauge's or an untyped series' value.
func valueOf(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}

// TestMetricAtReadsTheControllersSeries reads what internal/metrics
// serves, and checks that a misspelt name or label fails rather than
// reading 0.
func TestMetricAtReadsTheControllersSeries(t *testing.T) {
	m := metrics.New()
	m.InputRefused(metrics.SourceReceipts, "too_large")
	m.InputRefused(metrics.SourceReceipts, "too_large")
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	require.Equal(t, 2.0, metricAt(t, srv.URL, `controller_inputs_refused_total{reason="too_large",source="receipts"}`))
	require.Equal(t, 2.0, metricAt(t, srv.URL, `controller_inputs_refused_total{source="receipts",reason="too_large"}`), "labels in any order")
	require.Zero(t, metricAt(t, srv.URL, `controller_inputs_refused_total{reason="bad_id",source="receipts"}`), "a series not made yet")
	require.Zero(t, metricAt(t, srv.URL, `controller_failpoint_hits_total{name="submit-before-commit"}`), "a vector not used yet")
	require.Zero(t, metricAt(t, srv.URL, `controller_receipts_total{effect="applied"}`), "made at 0")
	require.Zero(t, metricAt(t, srv.URL, "controller_takeovers_total"))
	require.Equal(t, map[[2]string]int{{"receipts", "too_large"}: 2}, refusedAt(t, srv.URL))

	for _, series := range []string{
		"controller_takeover_total",                         // no such name
		`controller_receipts_total{efect="applied"}`,        // no such label
		`controller_receipts_total{effect="applied",x="y"}`, // one label too many
		`controller_receipts_total{effect="applied"`,        // not a series
	} {
		failed := fails(t, func(tb testing.TB) { metricAt(tb, srv.URL, series) })
		require.True(t, failed, "%s must fail the test, not read 0", series)
	}
}

// fails runs f with a testing.TB that records a failure instead of
// failing t, and says whether f failed.
func fails(t *testing.T, f func(testing.TB)) bool {
	r := &failRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failed
}

type failRecorder struct {
	testing.TB
	failed bool
}

func (r *failRecorder) Helper()               {}
func (r *failRecorder) Errorf(string, ...any) { r.failed = true }
func (r *failRecorder) FailNow()              { r.failed = true; runtime.Goexit() }
