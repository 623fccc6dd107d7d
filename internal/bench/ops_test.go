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

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/fleetctl/fleetctl/internal/metrics"
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

// The store's series read from a real controller's metrics
// (internal/metrics, served by its handler): the round trips, the batches'
// count and seconds, and each wait by its label, its own series only; a
// controller without the waits reads them empty, one without the round
// trips is an error.
func TestStoreSampleFromTheControllersMetrics(t *testing.T) {
	read := func(m *metrics.Metrics) (storeSample, error) {
		srv := httptest.NewServer(m.Handler())
		defer srv.Close()
		load := newControllerLoad([]string{srv.URL}, "run1", 3, 4)
		defer load.http.CloseIdleConnections()
		return load.readStoreSample(context.Background(), 0)
	}
	m := metrics.New()
	m.CountRoundTrips(func() int64 { return 123456 })
	m.Batch(5, 3*time.Millisecond, false)
	m.Batch(2, time.Millisecond, false)
	s, err := read(m)
	require.NoError(t, err)
	require.Equal(t, 123456.0, s.trips)
	require.Equal(t, 2.0, s.batch.count())
	require.InDelta(t, 0.004, s.batch.sum, 1e-9)
	require.Zero(t, s.waits[0].count(), "a controller that answered no change yet")
	require.Zero(t, s.waits[1].count())

	for range 3 {
		m.Answered("submit", 1500*time.Microsecond)
	}
	m.Answered("receipts", 10*time.Millisecond)
	s, err = read(m)
	require.NoError(t, err)
	submits, receipts := s.waits[0], s.waits[1]
	require.Equal(t, 3.0, submits.count(), "its own series only")
	require.InDelta(t, 0.0045, submits.sum, 1e-9)
	require.InDelta(t, 0.00199, submits.quantile(0.99), 1e-9, "the 2.97th of 3, all in the bucket from 1 to 2 ms")
	require.Equal(t, 1.0, receipts.count())
	require.InDelta(t, 0.01592, receipts.quantile(0.99), 1e-9, "the 0.99th of 1, in the bucket from 8 to 16 ms")

	_, err = read(metrics.New())
	require.ErrorContains(t, err, "no controller_store_round_trips_total")
}

// A phase's series is the reading after it less the one before, summed
// over the instances; its count is its +Inf bucket's, and its quantile is
// interpolated within the bucket where it falls, as Prometheus's
// histogram_quantile does.
func TestHistogramQuantiles(t *testing.T) {
	inf := math.Inf(1)
	before := histogram{buckets: []bucket{{0.001, 10}, {0.002, 20}, {0.004, 30}, {inf, 30}}, sum: 0.05}
	after := histogram{buckets: []bucket{{0.001, 60}, {0.002, 110}, {0.004, 129}, {inf, 130}}, sum: 0.2}
	require.Equal(t, 30.0, before.count())
	// 100 observations in the phase, 0.15 s in all: 50 under 1 ms, 40 from
	// 1 to 2, 9 from 2 to 4, 1 over 4 ms.
	phase := after.add(before, -1)
	require.Equal(t, []bucket{{0.001, 50}, {0.002, 90}, {0.004, 99}, {inf, 100}}, phase.buckets)
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

	// A bucket the text left out is added: the series' count as +Inf.
	h := histogramOf(&dto.Histogram{SampleCount: proto.Uint64(4), SampleSum: proto.Float64(0.01),
		Bucket: []*dto.Bucket{{UpperBound: proto.Float64(0.002), CumulativeCount: proto.Uint64(3)}}})
	require.Equal(t, histogram{buckets: []bucket{{0.002, 3}, {inf, 4}}, sum: 0.01}, h)
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
