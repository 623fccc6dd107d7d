package api

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// GET /v1/events is a server-sent event stream (text/event-stream) of this
// instance's changes, from the events.Bus the store feeds after each
// commit. Each event is
//
//	id: <sequence number>
//	data: {"kind":"command|operation|device|task|rollout","id":"...","status":"...","at":"RFC 3339"}
//
// A reader that reconnects with Last-Event-ID (EventSource does so by
// itself; ?last_event_id= does the same for a first connection) gets every
// event the buffer still holds after that id, then the live ones. When the
// buffer no longer reaches back that far it gets one event of kind "reset"
// instead: it must read its lists again. A reader too slow to keep up (its
// channel full) is disconnected; it reconnects and resumes the same way.
//
// The same bearer tokens as every GET (any valid token may read); since a
// browser's EventSource cannot send headers, this route alone also takes the
// token as ?access_token=.

// Tunables of the stream.
const (
	// eventsHeartbeat: a comment line this often keeps idle connections
	// (and proxies) alive and finds dead readers.
	eventsHeartbeat = 15 * time.Second
	// eventsWriteTimeout bounds one write to a reader: a reader that takes
	// no bytes for this long is disconnected.
	eventsWriteTimeout = 10 * time.Second
	// eventsStopTimeout bounds the last write to a reader when the server
	// stops.
	eventsStopTimeout = time.Second
	// eventsRetryMS is the reconnection delay the stream asks EventSource for.
	eventsRetryMS = 2000
	// eventsBatch is how many events one Take copies.
	eventsBatch = 256
	// eventsWriteBytes bounds one write.
	eventsWriteBytes = 256 << 10
	// eventsPace is the shortest time between two writes to a reader: the
	// events of that time go in one write (a dashboard sees them within
	// it), so a reader costs a few writes a second at any rate of events.
	eventsPace = 100 * time.Millisecond
)

// dashboardRoutes adds the routes the dashboard reads: GET /v1/events,
// GET /v1/tasks, GET /v1/whoami, and the page itself under /ui/ (public: it
// asks for a token to call the API), which / redirects to.
func (s *Server) dashboardRoutes() {
	s.mux.HandleFunc("GET /v1/events", tokenFromQuery(s.need("", s.handleEvents)))
	s.mux.HandleFunc("GET /v1/tasks", s.need("", s.serve(s.handleListTasks)))
	s.mux.HandleFunc("GET /v1/whoami", s.need("", s.serve(withQuery(nil, s.handleWhoami))))
	if s.cfg.UI != nil {
		s.mux.Handle("GET /ui/", s.cfg.UI)
		s.mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	}
}

// fail answers the stream's request with an error, through serve: the one
// place that maps errors to their status and code.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.serve(func(*http.Request) (int, any, error) { return 0, nil, err })(w, r)
}

// tokenFromQuery lets ?access_token= stand for the Authorization header, for
// the routes a browser's EventSource reads.
func tokenFromQuery(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if tok := r.URL.Query().Get("access_token"); tok != "" && r.Header.Get("Authorization") == "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		h(w, r)
	}
}

// resumeFrom reads the reader's last id: the Last-Event-ID header, else
// ?last_event_id=. An id that is not a number is not one of ours: it is
// taken as older than the buffer (a reset).
func resumeFrom(r *http.Request) events.Resume {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return events.Resume{}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return events.Resume{LastID: 0, Given: true}
	}
	return events.Resume{LastID: n, Given: true}
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r.URL.Query(), "stream", []string{"access_token", "last_event_id"}); err != nil {
		s.fail(w, r, err)
		return
	}
	bus := s.cfg.Events
	if bus == nil {
		s.fail(w, r, apiErr(http.StatusNotFound, "not_found", "this server has no event stream"))
		return
	}
	sub, reset, err := bus.Subscribe(resumeFrom(r))
	if err != nil {
		s.fail(w, r, apiErr(http.StatusServiceUnavailable, "unavailable", "the server is stopping"))
		return
	}
	defer bus.Unsubscribe(sub)

	g := &writeGuard{rc: http.NewResponseController(w)}
	finished := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		select {
		case <-sub.Done():
			g.stop(sub.Err())
		case <-finished:
		}
	}()
	defer watch.Wait()
	defer close(finished)

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy in front must not buffer the stream
	w.WriteHeader(http.StatusOK)

	buf := make([]byte, 0, 32<<10)
	buf = append(buf, "retry: "...)
	buf = strconv.AppendInt(buf, eventsRetryMS, 10)
	buf = append(buf, "\n\n"...)
	if reset {
		at := time.Now().UTC()
		buf = appendEvent(buf, events.Event{Seq: sub.Start,
			Data: []byte(`{"kind":"reset","id":"","status":"","at":"` + at.Format(time.RFC3339Nano) + `"}`)})
	}
	if !g.flush(w, buf) {
		return
	}
	heartbeat := time.NewTicker(eventsHeartbeat)
	defer heartbeat.Stop()
	pace := time.NewTimer(eventsPace)
	defer pace.Stop()
	var batch []events.Event
	for {
		select {
		case <-sub.Ready():
		case <-heartbeat.C:
			if !g.flush(w, append(buf[:0], ": keep-alive\n\n"...)) {
				return
			}
			continue
		case <-sub.Done():
			if errors.Is(sub.Err(), events.ErrSlow) {
				s.cfg.Logger.Info("event stream reader dropped: a whole buffer behind", "remote", r.RemoteAddr)
			}
			return // dropped, or the server stops: the stream ends
		case <-r.Context().Done():
			return
		}
		// Everything waiting goes in one write, up to eventsWriteBytes.
		buf = buf[:0]
		for len(buf) < eventsWriteBytes {
			batch = sub.Take(batch[:0], eventsBatch)
			if len(batch) == 0 {
				break
			}
			for _, ev := range batch {
				buf = appendEvent(buf, ev)
			}
		}
		clear(batch) // the ring keeps the events; the batch need not
		if len(buf) > 0 && !g.flush(w, buf) {
			return
		}
		if len(buf) >= eventsWriteBytes {
			continue // more wait: no pause
		}
		// At most one write per eventsPace: a reader costs the controller
		// a few writes a second, however many events there are.
		pace.Reset(eventsPace)
		select {
		case <-pace.C:
		case <-sub.Done():
			if errors.Is(sub.Err(), events.ErrSlow) {
				s.cfg.Logger.Info("event stream reader dropped: a whole buffer behind", "remote", r.RemoteAddr)
			}
			return
		case <-r.Context().Done():
			return
		}
	}
}

// appendEvent appends one event in the stream's framing.
func appendEvent(buf []byte, ev events.Event) []byte {
	buf = append(buf, "id: "...)
	buf = strconv.AppendUint(buf, ev.Seq, 10)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, ev.Data...)
	return append(buf, "\n\n"...)
}

// writeGuard bounds each write to a reader: eventsWriteTimeout normally;
// once the reader is dropped, a write blocked on it fails at once and no
// other starts; once the server stops, the last writes have
// eventsStopTimeout (a reader that still takes bytes gets the end of its
// stream, one that is stuck does not hold up the shutdown).
type writeGuard struct {
	mu    sync.Mutex
	rc    *http.ResponseController
	cut   bool
	limit time.Time
}

func (g *writeGuard) stop(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if errors.Is(err, events.ErrSlow) {
		g.cut = true
		_ = g.rc.SetWriteDeadline(time.Now())
		return
	}
	g.limit = time.Now().Add(eventsStopTimeout)
	_ = g.rc.SetWriteDeadline(g.limit)
}

// flush writes and flushes buf within its deadline; false when the reader
// is gone, was dropped, or took too long.
func (g *writeGuard) flush(w http.ResponseWriter, buf []byte) bool {
	g.mu.Lock()
	if g.cut {
		g.mu.Unlock()
		return false
	}
	d := time.Now().Add(eventsWriteTimeout)
	if !g.limit.IsZero() && g.limit.Before(d) {
		d = g.limit
	}
	_ = g.rc.SetWriteDeadline(d)
	g.mu.Unlock()
	if _, err := w.Write(buf); err != nil {
		return false
	}
	return g.rc.Flush() == nil
}

func (s *Server) handleWhoami(r *http.Request) (int, any, error) {
	if !s.cfg.Auth.Enabled() {
		return http.StatusOK, apiwire.Who{Principal: principal(r), Roles: []string{RoleOperator, RoleApprover, RoleAdmin}}, nil
	}
	_, bearer, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	tok, _ := s.cfg.Auth.lookup(strings.TrimSpace(bearer)) // need already checked it
	roles := slices.Clone(tok.Roles)
	if roles == nil {
		roles = []string{}
	}
	return http.StatusOK, apiwire.Who{Principal: tok.Principal, Roles: roles, Auth: true}, nil
}

// handleListTasks answers one page of tasks: ?limit=, ?after=,
// ?status=<task state> (the dashboard asks for waiting_approval).
func (s *Server) handleListTasks(r *http.Request) (int, any, error) {
	lq, err := parseList(r, "status")
	if err != nil {
		return 0, nil, err
	}
	var f store.TaskFilter
	if v, ok := lq.values["status"]; ok {
		st := fsm.TaskState(v[0])
		if !slices.Contains(fsm.Task.States(), st) {
			return 0, nil, invalidParam("status", strconv.Quote(v[0])+": a task state (waiting_approval, approved, running, completed, rejected, failed)")
		}
		f.Status = &st
	}
	ks, err := s.cfg.Store.ListTasks(r.Context(), f, lq.page)
	if err != nil {
		return 0, nil, err
	}
	out := make([]apiwire.TaskListItem, 0, len(ks.Items))
	for _, k := range ks.Items {
		out = append(out, apiwire.TaskListItem{TaskID: k.TaskID, Status: string(k.Status), Reason: k.Reason, Version: k.Version,
			PlanHash: k.PlanHash, Author: k.Author, CreatedBy: k.CreatedBy, ExecuteAfter: k.ExecuteAfter,
			ExecuteBefore: k.ExecuteBefore, Steps: wireSteps(k.Steps), CreatedAt: k.CreatedAt, UpdatedAt: k.UpdatedAt})
	}
	return answerList(lq, out, ks.Total, ks.Next)
}
