package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/events"
)

var eventAt = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// streamServer serves the event stream of bus over HTTP, with tokens
// (t-reader, a reader with no role) when withAuth.
func streamServer(t *testing.T, bus *events.Bus, withAuth bool) *httptest.Server {
	t.Helper()
	cfg := Config{Instance: "i1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Events: bus}
	if withAuth {
		path := filepath.Join(t.TempDir(), "tokens.json")
		require.NoError(t, os.WriteFile(path, []byte(`[{"token":"t-reader","principal":"reader","roles":[]}]`), 0o600))
		auth, err := LoadTokens(path)
		require.NoError(t, err)
		cfg.Auth = auth
	}
	srv := httptest.NewServer(New(cfg))
	t.Cleanup(func() {
		bus.Close() // the streams end, as on the server's Shutdown
		srv.Close()
	})
	return srv
}

type sseEvent struct {
	id   string
	data apiwire.EventData
}

// sse is a minimal reader of one stream.
type sse struct {
	resp *http.Response
	rd   *bufio.Reader
}

func openSSE(t *testing.T, url string, header http.Header) *sse {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return &sse{resp: resp, rd: bufio.NewReader(resp.Body)}
}

// next reads one event (skipping retry lines and comments).
func (s *sse) next(t *testing.T) sseEvent {
	t.Helper()
	var ev sseEvent
	var data string
	for {
		line, err := s.rd.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && data != "":
			require.NoError(t, json.Unmarshal([]byte(data), &ev.data), data)
			return ev
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
}

func TestEventStreamAuth(t *testing.T) {
	t.Parallel()
	bus := events.New(events.Config{})
	srv := streamServer(t, bus, true)
	for _, tc := range []struct {
		path   string
		header string
		status int
	}{
		{"/v1/events", "", http.StatusUnauthorized},
		{"/v1/events?access_token=wrong", "", http.StatusUnauthorized},
		{"/v1/events", "Bearer t-reader", http.StatusOK},
		{"/v1/events?access_token=t-reader", "", http.StatusOK}, // EventSource cannot send headers
		{"/v1/events?access_token=t-reader&limit=3", "", http.StatusBadRequest},
		{"/v1/whoami?access_token=t-reader", "", http.StatusUnauthorized}, // this route alone takes it
		{"/v1/whoami", "Bearer t-reader", http.StatusOK},
	} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		require.NoError(t, err)
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		require.NoError(t, err)
		require.Equal(t, tc.status, resp.StatusCode, "%s %s", tc.path, tc.header)
		if tc.path == "/v1/whoami" {
			var who apiwire.Who
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&who))
			require.Equal(t, apiwire.Who{Principal: "reader", Roles: []string{}, Auth: true}, who)
		}
		cancel()
		resp.Body.Close()
	}
}

// TestEventStreamResumesWithLastEventID: a reader that reconnects with the
// last id it saw gets every event after it that the buffer holds, nothing
// missed, nothing twice; one whose id is older than the buffer gets a reset.
func TestEventStreamResumesWithLastEventID(t *testing.T) {
	t.Parallel()
	bus := events.New(events.Config{Buffer: 64, First: 1000})
	srv := streamServer(t, bus, false)
	first := openSSE(t, srv.URL+"/v1/events", nil)
	for i := range 10 {
		bus.Publish(events.KindCommand, fmt.Sprintf("c-%d", i), "succeeded", eventAt)
	}
	var last sseEvent
	for i := range 4 {
		last = first.next(t)
		require.Equal(t, fmt.Sprint(1000+i), last.id)
		require.Equal(t, apiwire.EventData{Kind: "command", ID: fmt.Sprintf("c-%d", i), Status: "succeeded", At: eventAt}, last.data)
	}
	first.resp.Body.Close() // the reader goes away after 4 of 10
	for i := 10; i < 20; i++ {
		bus.Publish(events.KindOperation, fmt.Sprintf("op-%d", i), "succeeded", eventAt)
	}
	again := openSSE(t, srv.URL+"/v1/events", http.Header{"Last-Event-Id": {last.id}})
	for i := 4; i < 20; i++ {
		ev := again.next(t)
		require.Equal(t, fmt.Sprint(1000+i), ev.id, "event %d", i)
	}
	bus.Publish(events.KindDevice, "device-1", "online", eventAt) // and the live ones follow
	ev := again.next(t)
	require.Equal(t, "1020", ev.id)
	require.Equal(t, "device", ev.data.Kind)

	// ?last_event_id= is the same, for a first connection.
	q := openSSE(t, srv.URL+"/v1/events?last_event_id=1018", nil)
	require.Equal(t, "1019", q.next(t).id)

	// 100 more: the ring (64) no longer holds the event after 1020.
	for range 100 {
		bus.Publish(events.KindCommand, "c", "pending", eventAt)
	}
	old := openSSE(t, srv.URL+"/v1/events", http.Header{"Last-Event-Id": {"1020"}})
	reset := old.next(t)
	require.Equal(t, "reset", reset.data.Kind)
	require.Equal(t, "1120", reset.id, "the reset carries the newest id: a reconnect after it resumes from there")
	bus.Publish(events.KindTask, "task-1", "approved", eventAt)
	require.Equal(t, "1121", old.next(t).id)
	garbage := openSSE(t, srv.URL+"/v1/events", http.Header{"Last-Event-Id": {"not-a-number"}})
	require.Equal(t, "reset", garbage.next(t).data.Kind)
}

// TestEventStreamDropsAReaderThatNeverReads: a client connects and never
// reads (a small receive buffer, so the server's writes block early);
// publishing goes on without waiting, the reader is dropped once it is a
// ring behind, and its handler returns (its write unblocked at once).
func TestEventStreamDropsAReaderThatNeverReads(t *testing.T) {
	t.Parallel()
	bus := events.New(events.Config{Buffer: 256})
	srv := streamServer(t, bus, false)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "GET /v1/events HTTP/1.1\r\nHost: %s\r\n\r\n", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	deadline := time.Now().Add(20 * time.Second)
	for bus.Subscribers() == 0 {
		require.True(t, time.Now().Before(deadline), "the stream never subscribed")
		<-time.After(5 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
	id := strings.Repeat("x", 200) // ~300 bytes an event: the socket buffers fill soon
	published, start := 0, time.Now()
	for bus.Dropped() == 0 {
		require.True(t, time.Now().Before(deadline), "not dropped after %d events", published)
		bus.Publish(events.KindCommand, id, "succeeded", eventAt)
		published++
	}
	took := time.Since(start)
	require.Zero(t, bus.Subscribers())
	// The handler's blocked write failed at once and it returned: the server
	// closed the connection, which the reader sees once it drains what the
	// socket buffers held (not at a write timeout of 10 s).
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := io.Copy(io.Discard, conn)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open after %d bytes", n)
	t.Logf("dropped after %d events (%s of publishing, %.1f µs each), never waiting on the reader",
		published, took, float64(took.Microseconds())/float64(published))
	require.EqualValues(t, 1, bus.Dropped())
	// Publishing goes on with the reader gone; a new reader is served.
	fresh := openSSE(t, srv.URL+"/v1/events", nil)
	bus.Publish(events.KindTask, "task-1", "completed", eventAt)
	require.Equal(t, "task-1", fresh.next(t).data.ID)
}
