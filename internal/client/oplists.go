package client

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// OperationQuery filters GET /v1/operations (newest first) and sets its
// page size; zero fields filter nothing.
type OperationQuery struct {
	Statuses    []string // any of them; "open" is every state that is not terminal
	Device      string
	Action      string
	TaskID      string
	SubmittedBy string
	Since       time.Time // start >= Since
	Until       time.Time // start < Until
	Limit       int       // per request; 0: the server's default (100)
}

// CommandQuery filters GET /v1/commands (newest first) and sets its page
// size; zero fields filter nothing.
type CommandQuery struct {
	Statuses    []string
	Device      string
	Action      string
	OperationID string
	Since       time.Time
	Until       time.Time
	Limit       int
}

// operatorPath is an operator list's first page.
func operatorPath(path string, statuses []string, limit int, since, until time.Time, filters ...string) string {
	v := url.Values{}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	if len(statuses) > 0 {
		v.Set("status", strings.Join(statuses, ","))
	}
	for i := 0; i+1 < len(filters); i += 2 {
		if filters[i+1] != "" {
			v.Set(filters[i], filters[i+1])
		}
	}
	if !since.IsZero() {
		v.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	if !until.IsZero() {
		v.Set("until", until.UTC().Format(time.RFC3339Nano))
	}
	return withQuery(path, v)
}

// Path is the query's first page.
func (q OperationQuery) Path() string {
	return operatorPath("/v1/operations", q.Statuses, q.Limit, q.Since, q.Until,
		"device", q.Device, "action", q.Action, "task_id", q.TaskID, "submitted_by", q.SubmittedBy)
}

// Path is the query's first page.
func (q CommandQuery) Path() string {
	return operatorPath("/v1/commands", q.Statuses, q.Limit, q.Since, q.Until,
		"device", q.Device, "action", q.Action, "operation_id", q.OperationID)
}

// ListOperations lists every operation that matches q, newest first,
// following the Link header from page to page. Each operation that
// existed when the first page was read is listed once; ones submitted
// meanwhile are newer than the pages still to come and are not.
func (c *Client) ListOperations(ctx context.Context, q OperationQuery) ([]apiwire.Operation, error) {
	return listAll[apiwire.Operation](ctx, c, q.Path())
}

// OperationsPage reads one page of operations at path (a query's Path or a
// previous page's Next).
func (c *Client) OperationsPage(ctx context.Context, path string) ([]apiwire.Operation, Page, error) {
	return listPage[apiwire.Operation](ctx, c, path)
}

// ListCommands lists every command that matches q, newest first,
// following the Link header from page to page.
func (c *Client) ListCommands(ctx context.Context, q CommandQuery) ([]apiwire.Command, error) {
	return listAll[apiwire.Command](ctx, c, q.Path())
}

// CommandsPage reads one page of commands at path (a query's Path or a
// previous page's Next).
func (c *Client) CommandsPage(ctx context.Context, path string) ([]apiwire.Command, Page, error) {
	return listPage[apiwire.Command](ctx, c, path)
}
