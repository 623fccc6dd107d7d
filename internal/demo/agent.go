package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetctl/fleetctl/internal/mcpserver"
	"github.com/fleetctl/fleetctl/internal/mcpserver/mcptest"
)

// agent is the walkthrough's AI agent: an MCP client of the controller's
// /mcp (streamable HTTP, its bearer token), as an agent host would
// register it. Like a host whose answers get lost, it sends every tool
// call twice and loses the first answer of about half of them; it keeps
// the second, which is the same record.
type agent struct {
	*mcptest.Agent
}

// bearer adds the agent's token to each request of the MCP transport.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func connectAgent(ctx context.Context, apiURL, token string) (*agent, error) {
	lossy := &mcptest.Lossy{Transport: &mcp.StreamableClientTransport{Endpoint: apiURL + "/mcp",
		HTTPClient: &http.Client{Timeout: 90 * time.Second, Transport: bearer{token: token}}, DisableStandaloneSSE: true}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "demo-agent", Version: "v1"}, nil).Connect(ctx, lossy, nil)
	if err != nil {
		return nil, fmt.Errorf("connect to %s/mcp: %w", apiURL, err)
	}
	return &agent{&mcptest.Agent{Session: cs, Lossy: lossy, Rand: rand.New(rand.NewPCG(88, 1)), P: 0.5}}, nil
}

func (a *agent) close() error { return a.Session.Close() }

// toolError is a tool call that failed: the API's status and code.
type toolError struct{ mcpserver.ToolError }

func (e *toolError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// errCode is the code of a tool error, "" for any other error.
func errCode(err error) string {
	if te, ok := err.(*toolError); ok {
		return te.Code
	}
	return ""
}

// call sends one tool call (twice) and decodes the kept answer into T; a
// tool error comes back as a *toolError.
func call[T any](ctx context.Context, a *agent, name string, args any) (T, error) {
	var zero T
	res, _, err := a.Call(ctx, name, args)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", name, err)
	}
	if res.IsError {
		f, err := mcptest.Decode[mcpserver.Failure](res)
		if err != nil || f.Error == nil {
			return zero, fmt.Errorf("%s: %s", name, mcptest.Text(res))
		}
		return zero, &toolError{*f.Error}
	}
	return mcptest.Decode[T](res)
}
