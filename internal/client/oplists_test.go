package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOperatorQueryPaths(t *testing.T) {
	t.Parallel()
	require.Equal(t, "/v1/operations", OperationQuery{}.Path())
	since := time.Date(2026, 12, 5, 21, 0, 0, 0, time.FixedZone("x", 3600))
	require.Equal(t, "/v1/operations?action=restart&device=device-1&limit=5&since=2026-12-05T20%3A00%3A00Z&status=open%2Cfailed_final&submitted_by=alice&task_id=t-1",
		OperationQuery{Statuses: []string{"open", "failed_final"}, Device: "device-1", Action: "restart", TaskID: "t-1",
			SubmittedBy: "alice", Since: since, Limit: 5}.Path())
	require.Equal(t, "/v1/commands?operation_id=a%3Ab&status=needs_attention&until=2026-12-05T20%3A00%3A00Z",
		CommandQuery{Statuses: []string{"needs_attention"}, OperationID: "a:b", Until: since}.Path())
}
