// Package client is the Go client of the controller's HTTP API, used by the
// `controller` client subcommands and by the tests.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Client talks to one controller.
type Client struct {
	Server string // e.g. http://127.0.0.1:8080
	Token  string
	HTTP   *http.Client
	// Via, if not "", is sent as apiwire.ViaHeader on every request: the
	// channel a submit through this client came by ("mcp").
	Via string
}

// New returns a client for server with a 90 s request timeout (above the
// API's 60 s wait cap).
func New(server, token string) *Client {
	return &Client{Server: strings.TrimRight(server, "/"), Token: token, HTTP: &http.Client{Timeout: 90 * time.Second}}
}

// Error is an error answer of the API.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// UnreachableError: the request never reached the controller (nothing
// listens at Server, or the name does not resolve). Nothing was sent, so
// the same request may be repeated once the daemon is up.
type UnreachableError struct {
	Server string
	Err    error // the transport's error (a *url.Error around a *net.OpError)
}

func (e *UnreachableError) Error() string {
	var op *net.OpError
	if errors.As(e.Err, &op) {
		return fmt.Sprintf("cannot reach the controller at %s: %v", e.Server, op)
	}
	return fmt.Sprintf("cannot reach the controller at %s: %v", e.Server, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Code returns the API error code of err, or "".
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Do sends one request; out (if not nil) receives a 2xx JSON body. It
// returns the HTTP status.
func (c *Client) Do(ctx context.Context, method, path string, header http.Header, body, out any) (int, error) {
	status, _, err := c.do(ctx, method, path, header, body, out)
	return status, err
}

// do is Do that also returns the answer's headers.
func (c *Client) do(ctx context.Context, method, path string, header http.Header, body, out any) (int, http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := wire.Encode(body) // no HTML escaping: params go as the caller wrote them
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if c.Via != "" {
		req.Header.Set(apiwire.ViaHeader, c.Via)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return 0, nil, &UnreachableError{Server: c.Server, Err: err}
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, resp.Header, err
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		var body apiwire.Error
		if json.Unmarshal(raw, &body) == nil && body.Code != "" {
			e.Code, e.Message = body.Code, body.Message
		} else {
			e.Code, e.Message = "http_"+fmt.Sprint(resp.StatusCode), strings.TrimSpace(string(raw))
		}
		return resp.StatusCode, resp.Header, e
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, resp.Header, fmt.Errorf("decode %s %s answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, resp.Header, nil
}

// Submit posts an operation. key, if not empty, is sent as Idempotency-Key.
func (c *Client) Submit(ctx context.Context, req apiwire.SubmitRequest, key string) (apiwire.Operation, int, error) {
	var op apiwire.Operation
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	status, err := c.Do(ctx, http.MethodPost, "/v1/operations", h, req, &op)
	return op, status, err
}

// Operation reads an operation; wait > 0 blocks until it leaves started.
func (c *Client) Operation(ctx context.Context, id string, wait time.Duration) (apiwire.Operation, error) {
	var op apiwire.Operation
	path := "/v1/operations/" + url.PathEscape(id)
	if wait > 0 {
		path += "?wait=" + wait.String()
	}
	_, err := c.Do(ctx, http.MethodGet, path, nil, nil, &op)
	return op, err
}

// Command reads a command with its receipts and events.
func (c *Client) Command(ctx context.Context, id string) (apiwire.Command, error) {
	var cmd apiwire.Command
	_, err := c.Do(ctx, http.MethodGet, "/v1/commands/"+url.PathEscape(id), nil, nil, &cmd)
	return cmd, err
}

// Devices lists every device, following the pages.
func (c *Client) Devices(ctx context.Context) ([]apiwire.Device, error) {
	return c.ListDevices(ctx, DeviceQuery{})
}

// DeviceQuery filters GET /v1/devices and sets its page size.
type DeviceQuery struct {
	Online *bool // nil: online and offline
	Limit  int   // devices per request; 0: the server's default
}

func (q DeviceQuery) path() string {
	v := url.Values{}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Online != nil {
		v.Set("online", strconv.FormatBool(*q.Online))
	}
	return withQuery("/v1/devices", v)
}

// ListDevices lists every device that matches q, following the Link
// header from page to page.
func (c *Client) ListDevices(ctx context.Context, q DeviceQuery) ([]apiwire.Device, error) {
	return listAll[apiwire.Device](ctx, c, q.path())
}

// DevicesPage reads one page of devices at path (a list path, such as
// "/v1/devices?limit=10" or a previous page's Next).
func (c *Client) DevicesPage(ctx context.Context, path string) ([]apiwire.Device, Page, error) {
	return listPage[apiwire.Device](ctx, c, path)
}

// Device reads one device: its presence, and its commands in flight and
// queued.
func (c *Client) Device(ctx context.Context, id string) (apiwire.DeviceDetail, error) {
	var d apiwire.DeviceDetail
	_, err := c.Do(ctx, http.MethodGet, "/v1/devices/"+url.PathEscape(id), nil, nil, &d)
	return d, err
}

// ResetPresence forgets a device's presence rank (admin).
func (c *Client) ResetPresence(ctx context.Context, id string) (apiwire.Device, error) {
	var d apiwire.Device
	_, err := c.Do(ctx, http.MethodPost, "/v1/devices/"+url.PathEscape(id)+"/presence/reset", nil, nil, &d)
	return d, err
}

// Cancel cancels a command that was never published.
func (c *Client) Cancel(ctx context.Context, id string) (apiwire.Command, error) {
	var cmd apiwire.Command
	_, err := c.Do(ctx, http.MethodPost, "/v1/commands/"+url.PathEscape(id)+"/cancel", nil, nil, &cmd)
	return cmd, err
}

// Resolve records a person's outcome for a needs_attention command.
func (c *Client) Resolve(ctx context.Context, id, outcome, note string) (apiwire.Command, error) {
	var cmd apiwire.Command
	_, err := c.Do(ctx, http.MethodPost, "/v1/commands/"+url.PathEscape(id)+"/resolve", nil,
		apiwire.ResolveRequest{Outcome: outcome, Note: note}, &cmd)
	return cmd, err
}

// CreateTask posts a task with plan version 1; the status is 201 for a new
// task, 200 for a replay of the same request.
func (c *Client) CreateTask(ctx context.Context, req apiwire.TaskRequest) (apiwire.TaskView, int, error) {
	var t apiwire.TaskView
	status, err := c.Do(ctx, http.MethodPost, "/v1/tasks", nil, req, &t)
	return t, status, err
}

// UpdatePlan proposes a new plan version.
func (c *Client) UpdatePlan(ctx context.Context, taskID string, req apiwire.PlanRequest) (apiwire.TaskView, error) {
	var t apiwire.TaskView
	_, err := c.Do(ctx, http.MethodPut, "/v1/tasks/"+url.PathEscape(taskID)+"/plan", nil, req, &t)
	return t, err
}

// Approve approves one plan version; the status is 201 for a new approval,
// 200 for an exact replay.
func (c *Client) Approve(ctx context.Context, taskID string, req apiwire.ApprovalRequest) (apiwire.ApprovalV, int, error) {
	var a apiwire.ApprovalV
	status, err := c.Do(ctx, http.MethodPost, "/v1/tasks/"+url.PathEscape(taskID)+"/approvals", nil, req, &a)
	return a, status, err
}

// Reject rejects a task before it runs.
func (c *Client) Reject(ctx context.Context, taskID, reason string) (apiwire.TaskView, error) {
	var t apiwire.TaskView
	_, err := c.Do(ctx, http.MethodPost, "/v1/tasks/"+url.PathEscape(taskID)+"/rejections", nil,
		apiwire.RejectionRequest{Reason: reason}, &t)
	return t, err
}

// Task reads a task: status, plan, steps with their operation ids, history.
func (c *Client) Task(ctx context.Context, taskID string) (apiwire.TaskView, error) {
	var t apiwire.TaskView
	_, err := c.Do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(taskID), nil, nil, &t)
	return t, err
}

// CreateGrant grants; the status is 201 for a new grant, 200 when the same
// live grant exists.
func (c *Client) CreateGrant(ctx context.Context, req apiwire.GrantRequest) (apiwire.GrantView, int, error) {
	var g apiwire.GrantView
	status, err := c.Do(ctx, http.MethodPost, "/v1/grants", nil, req, &g)
	return g, status, err
}

// Grants lists the live grants, and with all the revoked ones too,
// following the pages.
func (c *Client) Grants(ctx context.Context, all bool) ([]apiwire.GrantView, error) {
	path := "/v1/grants"
	if all {
		path += "?all=1"
	}
	return listAll[apiwire.GrantView](ctx, c, path)
}

// RevokeGrant revokes a grant (again: the same answer).
func (c *Client) RevokeGrant(ctx context.Context, grantID string) (apiwire.GrantView, error) {
	var g apiwire.GrantView
	_, err := c.Do(ctx, http.MethodDelete, "/v1/grants/"+url.PathEscape(grantID), nil, nil, &g)
	return g, err
}
