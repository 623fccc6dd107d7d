package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// /healthz answers 503 with the reason once Health reports one (a lost
// SQLite database), 200 before.
func TestHealthzFailsWithTheReason(t *testing.T) {
	t.Parallel()
	var health error
	s := New(Config{Instance: "i1", Health: func() error { return health }})
	get := func() (int, map[string]string) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		var body map[string]string
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		return rec.Code, body
	}
	code, body := get()
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body["status"])

	health = errors.New("store: a database file is no longer at its path: the database /x/c.db")
	code, body = get()
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, map[string]string{"status": "failing", "instance": "i1", "reason": health.Error()}, body)
}
