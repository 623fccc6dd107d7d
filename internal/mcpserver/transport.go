package mcpserver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetctl/fleetctl/internal/client"
)

// Serve speaks MCP over in and out (stdin and stdout of `controller mcp`)
// until the host closes in or ctx ends; every tool calls the API through
// c, as c's token.
func Serve(ctx context.Context, c *client.Client, in io.ReadCloser, out io.WriteCloser, log *slog.Logger, version string) error {
	s := New(Config{Client: func(*mcp.CallToolRequest) *client.Client { return c }, Logger: log, Version: version})
	return s.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
}

// HTTPConfig configures HTTPHandler.
type HTTPConfig struct {
	// API is the controller's HTTP API: every tool call is one request to
	// it, in process, with the Authorization of the /mcp request.
	API http.Handler
	// Addr returns the API's listen address (host:port), the Host of
	// those requests (an address the API answers to).
	Addr    func() string
	Logger  *slog.Logger
	Version string
}

// HTTPHandler serves MCP over streamable HTTP, for /mcp. It is stateless
// (no session survives a request, so any instance can answer any request)
// and answers in JSON. It expects to be mounted behind the API's bearer
// token check (401 without a valid one): the tools' requests carry the
// caller's Authorization, and each route checks the caller's role.
func HTTPHandler(cfg HTTPConfig) http.Handler {
	s := New(Config{Logger: cfg.Logger, Version: cfg.Version, Client: func(req *mcp.CallToolRequest) *client.Client {
		var auth string
		if req.Extra != nil {
			auth = req.Extra.Header.Get("Authorization")
		}
		c := client.New("http://"+cfg.Addr(), "")
		c.HTTP.Transport = inProcess{api: cfg.API, auth: auth}
		return c
	}})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, Logger: cfg.Logger})
}

// inProcess is an http.RoundTripper that serves each request with the API
// handler itself, as the caller whose Authorization it carries.
type inProcess struct {
	api  http.Handler
	auth string
}

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Del("Authorization")
	if t.auth != "" {
		r.Header.Set("Authorization", t.auth)
	}
	r.Host = r.URL.Host
	r.RequestURI = r.URL.RequestURI()
	if r.Body == nil {
		r.Body = http.NoBody
	}
	w := &recorder{header: http.Header{}}
	t.api.ServeHTTP(w, r)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return &http.Response{
		Status: strconv.Itoa(w.status) + " " + http.StatusText(w.status), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: w.header,
		Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: r,
	}, nil
}

// recorder keeps one answer of the API.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}
