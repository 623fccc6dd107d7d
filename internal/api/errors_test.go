package api

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
)

// Every domain code has its one HTTP status, and a refusal keeps its code
// and words through the mapping.
func TestEveryDomainCodeMapsToAStatus(t *testing.T) {
	t.Parallel()
	for _, c := range domain.Codes {
		status, ok := codeStatus[c]
		require.True(t, ok, "no HTTP status for %s", c)
		require.GreaterOrEqual(t, status, 400, c)
		ae := toAPIError(fmt.Errorf("context: %w", domain.Errorf(c, "because %s", "reasons")))
		require.Equal(t, string(c), ae.Code)
		require.Equal(t, status, ae.Status)
	}
	require.Len(t, codeStatus, len(domain.Codes))
	ae := toAPIError(fmt.Errorf("task t1: %w", domain.ErrNotFound))
	require.Equal(t, apiErr(http.StatusNotFound, "not_found", "task t1: not found"), ae)
	ae = toAPIError(domain.Errorf(domain.CodeApprovalRequired, "action %s needs an approved task", "restart"))
	require.Equal(t, apiErr(http.StatusForbidden, "approval_required", "action restart needs an approved task"), ae)
}
