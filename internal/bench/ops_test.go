package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A 503 is honoured: the caller waits Retry-After, sends the same request
// again (the same operation_id), counts it, and then long-polls until the
// operation is final.
func TestControllerLoadRetriesOverloadedWithTheSameOperation(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	var polls int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPost:
			b, _ := io.ReadAll(r.Body)
			bodies = append(bodies, string(b))
			if len(bodies) == 1 {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"error":"overloaded","message":"try later"}`)
				return
			}
			var req submitBody
			if err := json.Unmarshal(b, &req); err != nil {
				t.Errorf("submit body: %v", err) // not require: this is the server's goroutine
			}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(operation{OperationID: req.TaskID + ":" + req.Step + ":" + req.Target + ":" + req.BusinessVersion, Status: "started"})
		case r.Method == http.MethodGet:
			if got := r.URL.Query().Get("wait"); got != "30s" {
				t.Errorf("?wait=%q, want 30s", got)
			}
			polls++
			status := "started"
			if polls == 2 {
				status = "succeeded"
			}
			_ = json.NewEncoder(w).Encode(operation{OperationID: strings.TrimPrefix(r.URL.Path, "/v1/operations/"), Status: status})
		}
	}))
	defer srv.Close()
	load := newControllerLoad([]string{srv.URL}, "run1", 3, 4)
	require.NoError(t, load.op("sat")(context.Background(), 4))
	require.Equal(t, int64(1), load.overloaded.Load())
	require.Len(t, bodies, 2)
	require.Equal(t, bodies[0], bodies[1])
	require.JSONEq(t, `{"task_id":"run1-sat-4","step":"restart","target":"device-2","business_version":"v1",
		"action":"restart","params":{"reason":"bench"}}`, bodies[0])
	require.Equal(t, 2, polls)
}

func TestFinalStatesOtherThanSucceededAreErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"operation_id":"run1-sat-1:set-config:device-2:v1","status":"failed_final","reason":"boom"}`)
	}))
	defer srv.Close()
	err := newControllerLoad([]string{srv.URL}, "run1", 3, 4).op("sat")(context.Background(), 1)
	require.Error(t, err)
	require.Equal(t, "operation_failed_final", errKind(err))
}

func TestRetryAfter(t *testing.T) {
	require.Equal(t, 2*time.Second, retryAfter("2"))
	require.Equal(t, 500*time.Millisecond, retryAfter("0.5"))
	require.Equal(t, time.Second, retryAfter(""))
	require.Equal(t, maxRetryAfter, retryAfter("3600"))
	require.Equal(t, time.Duration(0), retryAfter(time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)))
}

func TestNextLink(t *testing.T) {
	base := "http://127.0.0.1:8080"
	require.Equal(t, base+"/v1/devices?after=device-9&limit=10000",
		nextLink(base, `</v1/devices?after=device-9&limit=10000>; rel="next"`))
	require.Equal(t, "", nextLink(base, `</v1/devices?after=x>; rel="prev"`))
	require.Equal(t, "", nextLink(base, ""))
}

func TestQuantiles(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	s := summarize(lat)
	require.Equal(t, 50.0, s.P50)
	require.Equal(t, 90.0, s.P90)
	require.Equal(t, 99.0, s.P99)
	require.Equal(t, 100.0, s.Max)
	require.Equal(t, 50.5, s.Mean)
}

// With several instances, operation k is submitted to instance k%N and
// its final state asked of the same instance.
func TestOperationsGoRoundRobinToInstances(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{} // operation_id -> the instances it reached
	newInstance := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var id, status string
			if r.Method == http.MethodPost {
				var req submitBody
				require.NoError(t, json.NewDecoder(r.Body).Decode(&req))
				id, status = req.TaskID+":"+req.Step+":"+req.Target+":"+req.BusinessVersion, "started"
				w.WriteHeader(http.StatusCreated)
			} else {
				id, status = strings.TrimPrefix(r.URL.Path, "/v1/operations/"), "succeeded"
			}
			mu.Lock()
			seen[id] = append(seen[id], name)
			mu.Unlock()
			_ = json.NewEncoder(w).Encode(operation{OperationID: id, Status: status})
		}))
	}
	var bases []string
	for _, name := range []string{"i0", "i1", "i2"} {
		srv := newInstance(name)
		defer srv.Close()
		bases = append(bases, srv.URL)
	}
	load := newControllerLoad(bases, "run1", 5, 4)
	for k := int64(0); k < 7; k++ {
		require.NoError(t, load.op("sat")(context.Background(), k))
	}
	require.Len(t, seen, 7)
	for k := int64(0); k < 7; k++ {
		w := workFor("run1", "sat", 5, k)
		want := fmt.Sprintf("i%d", k%3)
		require.Equal(t, []string{want, want}, seen[w.operationID], "operation %d", k)
	}
}

func TestMetricValues(t *testing.T) {
	text := `# HELP controller_store_round_trips_total Statements sent to the database.
# TYPE controller_store_round_trips_total counter
controller_store_round_trips_total_other 5
controller_store_round_trips_total 123456
controller_store_batch_seconds_bucket{le="0.001"} 40
controller_store_batch_seconds_sum 2.5
controller_store_batch_seconds_count 1.5e+06
go_goroutines 12
`
	v, err := metricValues(strings.NewReader(text), storeMetrics[:]...)
	require.NoError(t, err)
	require.Equal(t, []float64{123456, 1.5e6, 2.5}, v, "in the order asked, labelled and longer names skipped")
	_, err = metricValues(strings.NewReader(text), "controller_store_round_trips_total", "controller_commits_total")
	require.ErrorContains(t, err, "no controller_commits_total")
	_, err = metricValues(strings.NewReader("controller_store_round_trips_total x\n"), "controller_store_round_trips_total")
	require.ErrorContains(t, err, "controller_store_round_trips_total: ")
}

// A histogram's series is read by its labels, its buckets and its sum; a
// phase's is the reading after it less the one before, summed over the
// instances; its count is its +Inf bucket's, and its quantile is
// interpolated within the bucket where it falls, as Prometheus's
// histogram_quantile does.
func TestHistogramQuantiles(t *testing.T) {
	text := func(sum float64, submit ...float64) string {
		var b strings.Builder
		for i, le := range []string{"0.001", "0.002", "0.004", "+Inf"} {
			fmt.Fprintf(&b, "controller_store_change_seconds_bucket{change=\"submit\",le=%q} %g\n", le, submit[i])
			fmt.Fprintf(&b, "controller_store_change_seconds_bucket{change=\"receipts\",le=%q} 7\n", le)
		}
		fmt.Fprintf(&b, "controller_store_change_seconds_sum{change=\"receipts\"} 9\n")
		fmt.Fprintf(&b, "controller_store_change_seconds_sum{change=\"submit\"} %g\n", sum)
		fmt.Fprintf(&b, "controller_store_change_seconds_count{change=\"submit\"} %g\n", submit[3])
		return b.String()
	}
	read := func(s string) histogram {
		h, err := readHistogram(strings.NewReader(s), "controller_store_change_seconds", storeWaits[0])
		require.NoError(t, err)
		return h
	}
	before := read(text(0.05, 10, 20, 30, 30))
	require.Equal(t, histogram{buckets: []bucket{{0.001, 10}, {0.002, 20}, {0.004, 30}, {math.Inf(1), 30}}, sum: 0.05}, before,
		"its own series only")
	require.Equal(t, 30.0, before.count())
	// 100 observations in the phase, 0.15 s in all: 50 under 1 ms, 40 from
	// 1 to 2, 9 from 2 to 4, 1 over 4 ms.
	phase := read(text(0.2, 60, 110, 129, 130)).add(before, -1)
	require.Equal(t, []bucket{{0.001, 50}, {0.002, 90}, {0.004, 99}, {math.Inf(1), 100}}, phase.buckets)
	require.InDelta(t, 0.15, phase.sum, 1e-9)
	require.Equal(t, 100.0, phase.count())
	require.InDelta(t, 0.001, phase.quantile(0.5), 1e-9, "the 50th of 100 is the first bucket's top")
	require.InDelta(t, 0.0015, phase.quantile(0.7), 1e-9, "the 70th: halfway through the second")
	require.InDelta(t, 0.004, phase.quantile(0.99), 1e-9)
	require.InDelta(t, 0.004, phase.quantile(0.999), 1e-9, "in +Inf: the largest finite bound")
	two := histogram{}.add(phase, 1).add(phase, 1)
	require.Equal(t, 200.0, two.count(), "two instances' phases add up")
	require.InDelta(t, 0.3, two.sum, 1e-9)
	require.InDelta(t, phase.quantile(0.9), two.quantile(0.9), 1e-12)
	require.Zero(t, histogram{}.quantile(0.99), "no observations")
	none := read("go_goroutines 12\n")
	require.Zero(t, none.count(), "a controller without the histogram")
	_, err := readHistogram(strings.NewReader(`controller_store_change_seconds_bucket{change="submit",le="x"} 1`+"\n"),
		"controller_store_change_seconds", storeWaits[0])
	require.ErrorContains(t, err, `le "x"`)
}

func TestSeveralInstancesNeedPostgres(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"controller", "devicesim"} {
		require.NoError(t, os.WriteFile(filepath.Join(bin, name), nil, 0o755))
	}
	cfg := Config{Bin: bin, Instances: 3}.withDefaults()
	require.ErrorContains(t, cfg.validate(), "3 instances need a postgres:// database")
	cfg.DB = "/tmp/x.db"
	require.ErrorContains(t, cfg.validate(), "need a postgres://")
	cfg.DB = "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"
	require.NoError(t, cfg.validate())
	cfg.Instances, cfg.DB = 1, ""
	require.NoError(t, cfg.validate())
	cfg.Name = "latest"
	require.Error(t, cfg.validate())
	cfg.Name = "postgres-3"
	require.NoError(t, cfg.validate())
}

func TestLocalPostgresIsOnlyLookedForOnLoopback(t *testing.T) {
	pid, err := localPostgres("/tmp/x.db")
	require.NoError(t, err)
	require.Zero(t, pid)
	pid, err = localPostgres("postgres://u@db.example:5432/x")
	require.NoError(t, err)
	require.Zero(t, pid)
	_, err = localPostgres("postgres://u@127.0.0.1:1/x")
	require.ErrorContains(t, err, "no postgres process started with -p 1")
}

// The CPU of a process tree counts its live children's.
func TestTreeCPUTimeCountsChildren(t *testing.T) {
	self, err := cpuTime(os.Getpid())
	require.NoError(t, err)
	tree, err := treeCPUTime(os.Getpid())
	require.NoError(t, err)
	require.GreaterOrEqual(t, tree, self)
}
