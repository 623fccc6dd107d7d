// Package e2e tests the controller binary end to end, against a real
// Mosquitto, a real SQLite file and the device simulator.
package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// TestMain: the tests run in a scratch directory; whatever a test leaves
// behind (files, processes, goroutines) fails the run (testenv.Main).
func TestMain(m *testing.M) { testenv.Main(m) }

// backends are the stores the tests of leases, takeover, kill -9, broker
// restart and the task walkthrough run on, each as a subtest named after it.
var backends = []string{"sqlite", "postgres"}

// backendEnv names the backend of every test that does not choose one
// (scenarios/run sets it from SCENARIO_DB): sqlite by default, or postgres.
const backendEnv = "FLEETCTL_TEST_BACKEND"

func eachBackend(t *testing.T, test func(t *testing.T, be string)) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			test(t, be)
		})
	}
}

// bundle is one test's running system.
type bundle struct {
	t        testing.TB
	broker   *testenv.Broker
	fleet    *sim.Fleet
	ctl      *testenv.Controller
	client   *client.Client
	db       string
	stateDir string
	creds    string // the accounts' directory (creds.Write), with secure
}

type setupOpts struct {
	backend string // "sqlite" (the default) or "postgres"
	db      string // a database URL of the test's own, instead of a new one
	devices int
	ids     []string // device ids instead of numbered ones
	env     []string
	args    []string
	faults  sim.Profile
	token   string // the bundle's API token, when the controller runs with --tokens
	// secure runs on the secure broker profile over TLS: an account for
	// each device, for the controller (instance i1) and for spareDevices,
	// which no simulated device uses (security_test.go).
	secure bool
	// controllers and accounts are more controller instances' and device
	// accounts' credentials, with secure (beside i1's and the fleet's).
	controllers, accounts []string
}

func setup(t testing.TB, o setupOpts) *bundle {
	t.Helper()
	if o.devices == 0 {
		o.devices = 3
	}
	b := &bundle{t: t, stateDir: t.TempDir()}
	var login sim.Config // the devices' passwords and TLS, with secure
	if o.secure {
		b.creds = t.TempDir()
		ids := o.ids
		for i := 1; len(o.ids) == 0 && i <= o.devices; i++ {
			ids = append(ids, fmt.Sprintf("%s%d", sim.DefaultIDPrefix, i))
		}
		res, err := creds.Write(creds.Options{Dir: b.creds, Devices: append(append(ids, spareDevices...), o.accounts...),
			Controllers: append([]string{"i1"}, o.controllers...)})
		require.NoError(t, err)
		b.broker = testenv.StartSecureBroker(t, b.creds)
		login.Passwords = creds.Passwords(res.Accounts)
		login.TLS, err = mqttx.ClientTLS(b.broker.TLS.CA)
		require.NoError(t, err)
		o.args = append([]string{"--mqtt-password-file", creds.PasswordFile(b.creds, "i1"), "--mqtt-ca", b.broker.TLS.CA}, o.args...)
	} else {
		b.broker = testenv.StartBroker(t)
	}
	b.db = filepath.Join(t.TempDir(), "controller.db")
	if o.backend == "" {
		o.backend = os.Getenv(backendEnv)
	}
	switch {
	case o.db != "":
		b.db = o.db
	case o.backend == "postgres":
		b.db = testenv.SharedPostgres(t).NewDatabase(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fleet, err := sim.Start(context.Background(), sim.Config{
		MQTT: b.broker.URL(), Devices: o.devices, IDs: o.ids, StateDir: b.stateDir, Faults: o.faults,
		Passwords: login.Passwords, TLS: login.TLS,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	t.Cleanup(fleet.Stop)
	require.NoError(t, fleet.WaitOnline(ctx))
	b.fleet = fleet
	b.ctl = testenv.StartController(t, testenv.ControllerOpts{
		DB: b.db, MQTT: b.broker.URL(), Env: o.env,
		Args: append([]string{"--ack-timeout", "1s", "--sweep-interval", "100ms"}, o.args...),
	})
	if dir := os.Getenv(reportDirEnv); dir != "" {
		// The first cleanup to run: the report shows the system as the test
		// left it, still running, as its last verify saw it. After the
		// teardown it would show the fleet's shutdown receipts, published
		// to a controller already killed, as receipts not reflected.
		t.Cleanup(func() { b.writeReport(dir) })
	}
	b.client = client.New(b.ctl.URL, o.token)
	b.waitFleetSeen()
	// The pass after the connect asks about every open command: a command
	// submitted before it listed them would be asked about too, and the
	// device's answer recorded as a duplicate receipt.
	eventually(t, "the controller's pass after its connect", 30*time.Second, func() bool {
		return b.metric("controller_reconciles_total") >= 1
	})
	return b
}

// waitFleetSeen waits until the controller has ingested every device's
// current birth: GET /v1/devices/{id} shows it seen, online, with the
// session the device connected with. A device the controller has not seen
// yet reads as offline by default, so without this wait a test that drops a
// device and waits for "offline" could go on before the retained birth
// lands, and then see the device come online after all.
func (b *bundle) waitFleetSeen() {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pending := b.fleet.Devices()
	for {
		rest := pending[:0]
		for _, d := range pending {
			got, err := b.client.Device(ctx, d.ID())
			if err != nil || !got.Seen || !got.Online || got.Session != d.Session() {
				rest = append(rest, d)
			}
		}
		pending = rest
		if len(pending) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			d := pending[0]
			got, err := b.client.Device(context.Background(), d.ID())
			b.t.Fatalf("the controller has not seen %d devices' births within 30s; %s (session %d) reads %+v (err %v)\n%s",
				len(pending), d.ID(), d.Session(), got, err, b.ctl.Output())
		case <-time.After(20 * time.Millisecond): // poll interval of a deadline-bounded wait
		}
	}
}

func (b *bundle) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	b.t.Cleanup(cancel)
	return ctx
}

func req(task, target string) apiwire.SubmitRequest {
	return apiwire.SubmitRequest{TaskID: task, Step: "restart", Target: target, BusinessVersion: "v1", Action: "restart",
		Params: []byte(`{"reason":"stuck"}`)}
}

// waitFinal waits until the operation leaves started.
func (b *bundle) waitFinal(id string) apiwire.Operation {
	b.t.Helper()
	return b.waitFinalAt(b.client, id)
}

// waitFinalAt is waitFinal through the instance c serves.
func (b *bundle) waitFinalAt(c *client.Client, id string) apiwire.Operation {
	b.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		op, err := c.Operation(b.ctx(), id, 10*time.Second)
		if err == nil && op.Status != "started" {
			return op
		}
	}
	b.t.Fatalf("operation %s still started after 45s\n%s", id, b.ctl.Output())
	return apiwire.Operation{}
}

// executions counts the device witness lines per operation_id.
func (b *bundle) executions() map[string]int {
	b.t.Helper()
	ex, err := witness.ReadExecutions(b.stateDir)
	require.NoError(b.t, err)
	out := map[string]int{}
	for _, e := range ex {
		out[e.OperationID]++
	}
	return out
}

// rows reads the database directly (read-only), as a witness independent of the API.
func (b *bundle) rows(query string, args ...any) []string {
	b.t.Helper()
	driver, dsn := "sqlite3", "file:"+b.db+"?mode=ro&_busy_timeout=5000"
	if testenv.MadeDatabase(b.db) {
		driver, dsn = "pgx", b.db
		for n := 1; strings.Contains(query, "?"); n++ {
			query = strings.Replace(query, "?", fmt.Sprintf("$%d", n), 1)
		}
	}
	db, err := sql.Open(driver, dsn)
	require.NoError(b.t, err)
	defer db.Close()
	rs, err := db.Query(query, args...)
	require.NoError(b.t, err)
	defer rs.Close()
	cols, _ := rs.Columns()
	var out []string
	for rs.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(b.t, rs.Scan(ptrs...))
		parts := make([]string, len(vals))
		for i, v := range vals {
			if bs, ok := v.([]byte); ok {
				v = string(bs)
			}
			parts[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(parts, "|"))
	}
	require.NoError(b.t, rs.Err())
	return out
}

// metric returns one series of the controller's /metrics (metricAt).
func (b *bundle) metric(name string) float64 {
	b.t.Helper()
	return metricAt(b.t, b.ctl.URL, name)
}

// eventually waits for cond with a deadline.
func eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
}

// policyArgs writes a policy file and returns the --policy flag for it.
func policyArgs(t *testing.T, policy string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(path, []byte(policy), 0o600))
	return []string{"--policy", path}
}

// startRaw starts a second controller process on b's database, same instance id, without waiting.
func startRaw(t *testing.T, b *bundle, env ...string) *testenv.Controller {
	return testenv.StartControllerNoWait(t, testenv.ControllerOpts{DB: b.db, MQTT: b.broker.URL(), Env: env})
}
