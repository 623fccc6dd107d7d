// Package mcptest holds what the tests of the MCP tools share: a client
// transport that loses answers on purpose, and an agent that sends every
// tool call twice, as an agent host whose answer got lost does.
package mcptest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Lossy wraps a client transport: after DropNext, the answer to the next
// tools/call is read off the connection (the server sent it) and never
// delivered, as a response lost on its way back.
type Lossy struct {
	mcp.Transport
	mu    sync.Mutex
	armed chan struct{}
	drop  map[jsonrpc.ID]chan struct{}
}

// DropNext arms the loss of the next tools/call's answer; the channel is
// closed once that answer arrived and was dropped.
func (l *Lossy) DropNext() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = make(chan struct{})
	return l.armed
}

// Connect implements mcp.Transport.
func (l *Lossy) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := l.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Connection: c, l: l}, nil
}

type lossyConn struct {
	mcp.Connection
	l *Lossy
}

func (c *lossyConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if req, ok := m.(*jsonrpc.Request); ok && req.Method == "tools/call" && req.ID.IsValid() {
		c.l.mu.Lock()
		if c.l.armed != nil {
			if c.l.drop == nil {
				c.l.drop = map[jsonrpc.ID]chan struct{}{}
			}
			c.l.drop[req.ID] = c.l.armed
			c.l.armed = nil
		}
		c.l.mu.Unlock()
	}
	return c.Connection.Write(ctx, m)
}

func (c *lossyConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		m, err := c.Connection.Read(ctx)
		if err != nil {
			return m, err
		}
		resp, ok := m.(*jsonrpc.Response)
		if !ok {
			return m, nil
		}
		c.l.mu.Lock()
		dropped, lost := c.l.drop[resp.ID]
		delete(c.l.drop, resp.ID)
		c.l.mu.Unlock()
		if !lost {
			return m, nil
		}
		close(dropped)
	}
}

// ErrNotDropped: the first call ended before its answer could be dropped.
var ErrNotDropped = errors.New("mcptest: the first call ended without its answer being dropped")

// CallTwice sends the same tool call twice. With drop, the first call's
// answer is lost after the server sent it and the call is abandoned (its
// context cancelled, as an agent host that timed out does); first is then
// nil. Without, both answers are returned.
func CallTwice(ctx context.Context, cs *mcp.ClientSession, l *Lossy, p *mcp.CallToolParams, drop bool) (first, second *mcp.CallToolResult, err error) {
	if drop {
		dropped := l.DropNext()
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := cs.CallTool(cctx, p)
			done <- err
		}()
		select {
		case <-dropped:
			cancel()
			<-done
		case err := <-done:
			cancel()
			return nil, nil, fmt.Errorf("%w (%v)", ErrNotDropped, err)
		case <-ctx.Done():
			cancel()
			<-done
			return nil, nil, ctx.Err()
		}
	} else if first, err = cs.CallTool(ctx, p); err != nil {
		return nil, nil, err
	}
	second, err = cs.CallTool(ctx, p)
	return first, second, err
}

// Agent sends every tool call twice and drops the first answer at random
// (a seeded source, so a failing run can be repeated).
type Agent struct {
	Session *mcp.ClientSession
	Lossy   *Lossy
	Rand    *rand.Rand
	P       float64 // the chance that a first answer is dropped
	// Calls, Dropped count the tool calls sent and the answers dropped.
	Calls, Dropped int
}

// Call sends the call twice and returns the answer the agent kept (the
// second), and the first one when it was not dropped.
func (a *Agent) Call(ctx context.Context, name string, args any) (kept, first *mcp.CallToolResult, err error) {
	drop := a.Rand.Float64() < a.P
	a.Calls += 2
	if drop {
		a.Dropped++
	}
	first, kept, err = CallTwice(ctx, a.Session, a.Lossy, &mcp.CallToolParams{Name: name, Arguments: args}, drop)
	return kept, first, err
}

// Decode decodes a result's structured content into T.
func Decode[T any](res *mcp.CallToolResult) (T, error) {
	var v T
	if res == nil {
		return v, errors.New("mcptest: no result")
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(b, &v)
}

// Text is a result's text content, its blocks joined by newlines.
func Text(res *mcp.CallToolResult) string {
	var s string
	for i, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			if i > 0 {
				s += "\n"
			}
			s += t.Text
		}
	}
	return s
}
