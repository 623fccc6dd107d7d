package bench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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
	load := newControllerLoad(srv.URL, "run1", 3, 4)
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
	err := newControllerLoad(srv.URL, "run1", 3, 4).op("sat")(context.Background(), 1)
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
