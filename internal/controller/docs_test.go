package controller

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/rollout"
)

// operationsPage is the operators' reference, whose metrics table must name
// every metric the controller exports.
const operationsPage = "../../docs/operations.md"

// TestOperationsPageNamesEveryMetric keeps the metrics table of
// docs/operations.md true: every controller_* metric the daemon exports
// has a row there, and every row names one it exports. The names come
// from a controller built by New (its /metrics, which shows every metric
// that has a sample, the ones registered inline included) and from the
// descriptions of the collectors it registers (which name the labelled
// metrics that have no sample yet).
func TestOperationsPageNamesEveryMetric(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(operationsPage)
	require.NoError(t, err)
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(controller_[a-z0-9_]+)`").FindAllStringSubmatch(string(b), -1) {
		rows = append(rows, m[1])
	}

	names := map[string]bool{}
	for _, n := range scrapedNames(t) {
		names[n] = true
	}
	for _, n := range describedNames(t) {
		names[n] = true
	}
	var exported []string
	for n := range names {
		if strings.HasPrefix(n, "controller_") {
			exported = append(exported, n)
		}
	}
	sort.Strings(exported)
	require.Contains(t, exported, "controller_mqtt_connections_lost_total", "the inline metric was scraped")
	require.Contains(t, exported, "controller_transitions_total", "a labelled metric without samples was described")

	var missing []string
	for _, n := range exported {
		if !slices.Contains(rows, n) {
			missing = append(missing, n)
		}
	}
	require.Empty(t, missing, "metrics without a row in the metrics table of %s", operationsPage)
	for _, r := range rows {
		require.True(t, names[r], "%s has a row for %s, which the controller does not export", operationsPage, r)
	}
}

// scrapedNames builds a controller (no broker needed: New connects nothing)
// and reads the metric families its /metrics serves.
func scrapedNames(t *testing.T) []string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DB = filepath.Join(t.TempDir(), "controller.db")
	cfg.HTTP = "127.0.0.1:0"
	cfg.MQTT = "tcp://127.0.0.1:1"
	cfg.InstanceID = "docs"
	c, err := New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	require.NoError(t, err)
	defer c.Close()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "http://"+c.HTTPAddr()+"/metrics", nil)
	c.api.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) `).FindAllStringSubmatch(rec.Body.String(), -1) {
		names = append(names, m[1])
	}
	require.NotEmpty(t, names)
	return names
}

// describedNames names every metric of the collectors the controller
// registers, from their descriptions: the contract's metrics (each field
// of metrics.Metrics), the rollouts' and the event stream's.
func describedNames(t *testing.T) []string {
	t.Helper()
	var cs []prometheus.Collector
	m := reflect.ValueOf(metrics.New()).Elem()
	for i := range m.NumField() {
		if c, ok := m.Field(i).Interface().(prometheus.Collector); ok {
			cs = append(cs, c)
		}
	}
	reg := &recorder{}
	rollout.NewMetrics(reg, nil)
	cs = append(cs, reg.cs...)
	cs = append(cs, events.New(events.Config{}).Collectors()...)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for _, c := range cs {
		ch := make(chan *prometheus.Desc)
		go func() {
			c.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			require.NotNil(t, m, "a description without a name: %s", d)
			names = append(names, m[1])
		}
	}
	return names
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
