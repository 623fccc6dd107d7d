package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

// waiting starts GET /v1/operations/{id}?wait= and returns once the
// request watches the operation, with the channel its answer comes on.
func (b *routesBundle) waiting(t *testing.T, id, wait string) <-chan *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- b.send(t, "GET", "/v1/operations/"+id+"?wait="+wait, "") }()
	require.Eventually(t, func() bool {
		b.srv.hub.mu.Lock()
		defer b.srv.hub.mu.Unlock()
		return len(b.srv.hub.waiters[id]) > 0
	}, 5*time.Second, time.Millisecond, "the request watches %s", id)
	return done
}

func answered(t *testing.T, done <-chan *httptest.ResponseRecorder) apiwire.Operation {
	t.Helper()
	select {
	case rec := <-done:
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var op apiwire.Operation
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &op))
		return op
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
		return apiwire.Operation{}
	}
}

// A ?wait= request for an operation this instance committed as started
// reads nothing: it is answered with the operation its end committed. One
// the hub does not know is read first; and a hint the end never reached
// (told elsewhere) is overtaken by the poll's read.
func TestWaitIsAnsweredFromTheCommittedEnd(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	for _, id := range []string{"op-w1", "op-w2", "op-w3"} {
		rec := b.send(t, "POST", "/v1/operations", `{"operation_id":"`+id+`","target":"device-1","action":"restart"}`)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	}

	// endsWith tells the end of id (its committed row) and returns the
	// waiting request's answer.
	endsWith := func(id string, done <-chan *httptest.ResponseRecorder) string {
		t.Helper()
		ended := domain.Operation{OperationID: id, Status: fsm.OpSucceeded, CommandIDs: []string{}, Compensations: []string{}}
		b.srv.Changed(id, &ended)
		return answered(t, done).Status
	}
	readFirst := func(id, why string) <-chan *httptest.ResponseRecorder {
		t.Helper()
		before := b.st.RoundTrips()
		done := b.waiting(t, id, "30s")
		require.Eventually(t, func() bool { return b.st.RoundTrips() > before }, 5*time.Second, time.Millisecond, why)
		return done
	}

	b.srv.Started("op-w1")
	before := b.st.RoundTrips()
	done := b.waiting(t, "op-w1", "30s")
	require.Equal(t, before, b.st.RoundTrips(), "known started: nothing read")
	require.Equal(t, string(fsm.OpSucceeded), endsWith("op-w1", done), "the committed end, not a read (the store still says started)")
	require.Equal(t, before, b.st.RoundTrips(), "nothing read at all")

	require.Equal(t, string(fsm.OpSucceeded), endsWith("op-w2", readFirst("op-w2", "not known started: read first")))

	b.srv.Started("op-w3")
	before = b.st.RoundTrips()
	got := answered(t, b.waiting(t, "op-w3", "2s"))
	require.Equal(t, string(fsm.OpStarted), got.Status, "answered at its wait's end")
	require.Greater(t, b.st.RoundTrips(), before, "the poll read it")

	b.srv.Started("op-w3")
	b.srv.Reset()
	require.Equal(t, string(fsm.OpSucceeded), endsWith("op-w3", readFirst("op-w3", "forgotten after a reset: read first")))
}

// Callers waiting for operations whose end no wake-up reaches (another
// instance's, on a shared SQLite file) are found by the hub's poll: one
// read every WaitPoll for all of them, not one read each.
func TestWaitPollsOnceForAllItsCallers(t *testing.T) {
	t.Parallel()
	b := setupRoutes(t)
	const callers = 20
	ids := make([]string, callers)
	dones := make([]<-chan *httptest.ResponseRecorder, callers)
	for i := range ids {
		ids[i] = fmt.Sprintf("op-p%d", i)
		rec := b.send(t, "POST", "/v1/operations", `{"operation_id":"`+ids[i]+`","target":"device-1","action":"restart"}`)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		b.srv.Started(ids[i])
		dones[i] = b.waiting(t, ids[i], "30s")
	}
	last := callers - 1 // waiting the shortest: found with all the others
	op, err := b.st.GetOperation(context.Background(), ids[last])
	require.NoError(t, err)

	start, before := time.Now(), b.st.RoundTrips()
	rec := b.send(t, "POST", "/v1/commands/"+op.CommandID+"/cancel", "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	cancelled := b.st.RoundTrips() - before
	require.Equal(t, string(fsm.OpFailedFinal), answered(t, dones[last]).Status, "found by the poll")
	polls := int64(time.Since(start)/(250*time.Millisecond)) + 1
	reads := b.st.RoundTrips() - before - cancelled
	require.LessOrEqual(t, reads, polls+1, "%d polls' reads and the caller's own, not one read per caller", polls)

	for _, id := range ids[:last] { // the others end here
		b.srv.Changed(id, &domain.Operation{OperationID: id, Status: fsm.OpSucceeded, CommandIDs: []string{}, Compensations: []string{}})
	}
	for _, done := range dones[:last] {
		require.Equal(t, string(fsm.OpSucceeded), answered(t, done).Status)
	}
	require.Eventually(t, func() bool {
		b.srv.hub.mu.Lock()
		defer b.srv.hub.mu.Unlock()
		return b.srv.hub.polling == nil && len(b.srv.hub.since) == 0
	}, 5*time.Second, time.Millisecond, "no waiter left: the poll stopped")
}
