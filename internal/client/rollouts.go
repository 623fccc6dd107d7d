package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// CreateRollout posts a rollout; the status is 201 for a new rollout, 200
// for a replay of the same request.
func (c *Client) CreateRollout(ctx context.Context, req apiwire.RolloutRequest) (apiwire.RolloutView, int, error) {
	var r apiwire.RolloutView
	status, err := c.Do(ctx, http.MethodPost, "/v1/rollouts", nil, req, &r)
	return r, status, err
}

// Rollout reads a rollout: status, counts, rate, abort state, history.
func (c *Client) Rollout(ctx context.Context, id string) (apiwire.RolloutView, error) {
	var r apiwire.RolloutView
	_, err := c.Do(ctx, http.MethodGet, "/v1/rollouts/"+url.PathEscape(id), nil, nil, &r)
	return r, err
}

// Rollouts lists every rollout (status "" for all), following the pages.
func (c *Client) Rollouts(ctx context.Context, status string) ([]apiwire.RolloutView, error) {
	v := url.Values{}
	if status != "" {
		v.Set("status", status)
	}
	return listAll[apiwire.RolloutView](ctx, c, withQuery("/v1/rollouts", v))
}

// RolloutDevices lists a rollout's devices (status "" for all), following
// the pages; limit is the page size (0: the server's default).
func (c *Client) RolloutDevices(ctx context.Context, id, status string, limit int) ([]apiwire.RolloutDeviceView, error) {
	v := url.Values{}
	if status != "" {
		v.Set("status", status)
	}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	return listAll[apiwire.RolloutDeviceView](ctx, c, withQuery("/v1/rollouts/"+url.PathEscape(id)+"/devices", v))
}

// MoveRollout posts pause, resume or cancel.
func (c *Client) MoveRollout(ctx context.Context, id, action string) (apiwire.RolloutView, error) {
	var r apiwire.RolloutView
	_, err := c.Do(ctx, http.MethodPost, "/v1/rollouts/"+url.PathEscape(id)+"/"+action, nil, nil, &r)
	return r, err
}

// ApproveRollout approves a rollout's version; 201 first, 200 an exact replay.
func (c *Client) ApproveRollout(ctx context.Context, id string, version int) (apiwire.RolloutView, int, error) {
	var r apiwire.RolloutView
	status, err := c.Do(ctx, http.MethodPost, "/v1/rollouts/"+url.PathEscape(id)+"/approvals", nil,
		apiwire.RolloutApprovalRequest{Version: version}, &r)
	return r, status, err
}
