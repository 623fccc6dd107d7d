package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// TestPprofFlag: `controller serve --pprof 127.0.0.1:PORT` serves Go's
// profiler there, and so does CONTROLLER_PPROF (what make bench's notes
// use); an address off loopback stops the start, exit 2, before the
// database is opened.
func TestPprofFlag(t *testing.T) {
	t.Parallel()
	broker := testenv.StartBroker(t)
	hc := &http.Client{Timeout: 5 * time.Second}
	for name, how := range map[string]func(addr string) testenv.ControllerOpts{
		"flag": func(addr string) testenv.ControllerOpts {
			return testenv.ControllerOpts{Args: []string{"--pprof", addr}}
		},
		"env": func(addr string) testenv.ControllerOpts {
			return testenv.ControllerOpts{Env: []string{"CONTROLLER_PPROF=" + addr}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			o := how(addr)
			o.DB, o.MQTT = filepath.Join(t.TempDir(), "c.db"), broker.URL()
			testenv.StartController(t, o)
			resp, err := hc.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Contains(t, string(body), "goroutine profile:")
		})
	}

	t.Run("off loopback", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "c.db")
		c := testenv.StartControllerNoWait(t, testenv.ControllerOpts{DB: db, MQTT: broker.URL(),
			Args: []string{"--pprof", "0.0.0.0:6061"}})
		require.Equal(t, 2, c.ExitCode(), c.Output())
		require.Contains(t, c.Output(), `"0.0.0.0" is not a loopback IP address`)
		require.NoFileExists(t, db, "nothing opened")
	})
}
