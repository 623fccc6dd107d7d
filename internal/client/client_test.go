package client

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	server := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())

	_, err = New(server+"/", "").Task(t.Context(), "t-1")
	var u *UnreachableError
	require.ErrorAs(t, err, &u)
	require.Equal(t, server, u.Server)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Equal(t, "cannot reach the controller at "+server+": dial tcp "+ln.Addr().String()+": connect: connection refused", err.Error())
}

func TestAPIErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/grants/g-1" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"not_found","message":"no grant g-1"}`))
			return
		}
		http.Error(w, "upstream down", http.StatusBadGateway)
	}))
	t.Cleanup(srv.Close)
	c := New(srv.URL, "")
	_, err := c.RevokeGrant(t.Context(), "g-1")
	require.EqualError(t, err, "404 not_found: no grant g-1")
	require.Equal(t, "not_found", Code(err))
	var u *UnreachableError
	require.False(t, errors.As(err, &u))
	_, err = c.Grants(t.Context(), true)
	require.EqualError(t, err, "502 http_502: upstream down")
}
