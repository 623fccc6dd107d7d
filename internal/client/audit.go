package client

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// AuditQuery filters GET /v1/audit: one principal's changes ("" everyone's),
// at or after Since and before Until (nil: unbounded).
type AuditQuery struct {
	Principal    string
	Since, Until *time.Time
	Limit        int // entries per request; 0: the server's default (100)
}

func (q AuditQuery) path() string {
	v := url.Values{}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Principal != "" {
		v.Set("principal", q.Principal)
	}
	if q.Since != nil {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Until != nil {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	return withQuery("/v1/audit", v)
}

// ListAudit lists every audit entry that matches q, newest first, following
// the Link header from page to page.
func (c *Client) ListAudit(ctx context.Context, q AuditQuery) ([]apiwire.AuditEntry, error) {
	return listAll[apiwire.AuditEntry](ctx, c, q.path())
}

// AuditPage reads one page of the audit log at path (such as
// "/v1/audit?principal=alice&limit=10" or a previous page's Next).
func (c *Client) AuditPage(ctx context.Context, path string) ([]apiwire.AuditEntry, Page, error) {
	return listPage[apiwire.AuditEntry](ctx, c, path)
}
