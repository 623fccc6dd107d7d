package cli

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheckLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{ // "" accepted, else part of the error
		"":                 "",
		"127.0.0.1:6061":   "",
		"127.0.0.9:6061":   "", // all of 127/8 is loopback
		"[::1]:6061":       "",
		"127.0.0.1:0":      "",
		"0.0.0.0:6061":     "not a loopback IP address",
		"[::]:6061":        "not a loopback IP address",
		"10.1.2.3:6061":    "not a loopback IP address",
		"localhost:6061":   "not a loopback IP address",
		":6061":            "not a loopback IP address",
		"127.0.0.1":        "want a loopback host:port",
		"127.0.0.1:pprof":  `port "pprof" is not a number`,
		"127.0.0.1:65536":  `port "65536" is not a number`,
		"127.0.0.1:-1":     `port "-1" is not a number`,
		"::1:6061":         "want a loopback host:port",
		"http://127.0.0.1": `"http" is not a loopback IP address`,
	} {
		err := checkLoopback(addr)
		if want == "" {
			require.NoError(t, err, addr)
			continue
		}
		require.ErrorContains(t, err, want, addr)
	}
}

// TestServePprofFlagRefusesOffLoopback: a non-loopback --pprof (or
// CONTROLLER_PPROF) is a usage error, exit 2, before anything is opened.
// (--max-attempts 0 is refused later, by the config's validation: without
// the check, serve fails with that error instead of running.)
func TestServePprofFlagRefusesOffLoopback(t *testing.T) { // not parallel: t.Setenv
	code, out, stderr := run(t, "serve", "--db", t.TempDir()+"/c.db", "--max-attempts", "0", "--pprof", "0.0.0.0:6061")
	require.Equal(t, 2, code, stderr)
	require.Empty(t, out)
	require.Contains(t, stderr, `invalid argument "0.0.0.0:6061" for "--pprof" flag: "0.0.0.0" is not a loopback IP address`)

	t.Setenv("CONTROLLER_PPROF", "192.0.2.1:6061")
	code, _, stderr = run(t, "serve", "--db", t.TempDir()+"/c.db", "--max-attempts", "0")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `CONTROLLER_PPROF="192.0.2.1:6061": invalid argument "192.0.2.1:6061" for "--pprof" flag: "192.0.2.1" is not a loopback IP address`)

	require.Contains(t, help(t, "serve"), "--pprof host:port")
	require.Contains(t, help(t, "serve"), "(env CONTROLLER_PPROF)")
}

func TestStartPprofServesTheProfiler(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, stop, err := startPprof("127.0.0.1:0", log)
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	hc := &http.Client{Timeout: 5 * time.Second}
	for path, want := range map[string]string{
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile:",
		"/debug/pprof/cmdline":           "",
	} {
		resp, err := hc.Get("http://" + addr + path)
		require.NoError(t, err, path)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, string(body), want, path)
	}

	// A port in use is an error at start.
	_, _, err = startPprof(addr, log)
	require.ErrorContains(t, err, "--pprof")
	require.ErrorContains(t, err, "address already in use")

	// Stopped, it listens no more.
	stop()
	stopped = true
	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "refused"), err.Error())
}
