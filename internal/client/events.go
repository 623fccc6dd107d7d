package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// StreamEvent is one event of GET /v1/events: its SSE id and its data.
type StreamEvent struct {
	Seq string // the SSE id, for Last-Event-ID
	apiwire.EventData
}

// EventStream reads GET /v1/events.
type EventStream struct {
	body io.ReadCloser
	rd   *bufio.Reader
	// LastID is the id of the last event read ("" before one).
	LastID string
}

// Events opens the event stream; lastID, if not "", is sent as
// Last-Event-ID, so that the stream resumes after it. The stream has no
// timeout: it ends with ctx, Close, or the server.
func (c *Client) Events(ctx context.Context, lastID string) (*EventStream, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+"/v1/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	hc := &http.Client{Transport: c.HTTP.Transport} // no Timeout: a stream lasts
	resp, err := hc.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, &UnreachableError{Server: c.Server, Err: err}
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		e := &Error{Status: resp.StatusCode, Code: fmt.Sprintf("http_%d", resp.StatusCode), Message: strings.TrimSpace(string(raw))}
		var body struct {
			Code    string `json:"error"`
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &body) == nil && body.Code != "" {
			e.Code, e.Message = body.Code, body.Message
		}
		return nil, e
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return nil, fmt.Errorf("GET /v1/events: Content-Type %q, want text/event-stream", ct)
	}
	return &EventStream{body: resp.Body, rd: bufio.NewReaderSize(resp.Body, 64<<10), LastID: lastID}, nil
}

// Next reads the next event (comments and retry lines are skipped). It
// returns io.EOF when the server ends the stream.
func (s *EventStream) Next() (StreamEvent, error) {
	var ev StreamEvent
	var data []byte
	for {
		line, err := s.rd.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return ev, errors.New("event stream: a line over 64 KiB")
			}
			return ev, err
		}
		line = line[:len(line)-1]
		switch {
		case len(line) == 0: // the end of an event
			if data == nil {
				continue
			}
			if err := json.Unmarshal(data, &ev.EventData); err != nil {
				return ev, fmt.Errorf("event %s: %w", ev.Seq, err)
			}
			if ev.Seq != "" {
				s.LastID = ev.Seq
			}
			return ev, nil
		case line[0] == ':':
		default:
			field, value, _ := strings.Cut(string(line), ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.Seq = value
			case "data":
				data = append(data, value...)
			}
		}
	}
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }
