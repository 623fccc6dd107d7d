package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/tlsgen"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// The secure broker profile (mosquitto/secure.conf.tmpl) against the real
// Mosquitto, driven with Debian's own clients (mosquitto_pub, mosquitto_sub)
// as an intruder would. A device account that no simulated device uses
// (spareDevices) plays the intruder: with use_username_as_clientid, a
// second connection of a live device's account would take over that
// device's session. What the broker drops is checked where it would have
// landed: in the controller's state, its receipt log and its /metrics.

// spareDevices are accounts the secure setup makes beside the fleet's.
var spareDevices = []string{"spare-1", "spare-2"}

func requireMosquittoClients(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"mosquitto_pub", "mosquitto_sub"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: the security tests drive the broker with Debian's Mosquitto clients; run 'make deps' (apt-get install -y mosquitto-clients)", bin)
		}
	}
}

// password is an account's password from the bundle's credentials.
func (b *bundle) password(user string) string {
	b.t.Helper()
	accounts, err := creds.Load(filepath.Join(b.creds, creds.CredentialsFile))
	require.NoError(b.t, err)
	pw := creds.Passwords(accounts)[user]
	require.NotEmpty(b.t, pw, "no account %s", user)
	return pw
}

// mosqArgs are the connection flags of mosquitto_pub/sub for the bundle's
// broker: TLS with its CA, MQTT 3.1.1, and user's account ("" for none).
func (b *bundle) mosqArgs(user string, extra ...string) []string {
	args := []string{"-h", "127.0.0.1", "-p", fmt.Sprint(b.broker.Port), "--cafile", b.broker.TLS.CA, "-V", "mqttv311"}
	if user != "" {
		args = append(args, "-u", user, "-P", b.password(user))
	}
	return append(args, extra...)
}

// mosquittoPub runs mosquitto_pub once and returns its output and exit code.
func mosquittoPub(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "mosquitto_pub", args...).CombinedOutput()
	if err == nil {
		return string(out), 0
	}
	ee, ok := err.(*exec.ExitError)
	require.True(t, ok, "mosquitto_pub: %v\n%s", err, out)
	require.NoError(t, ctx.Err(), "mosquitto_pub did not end within 15s\n%s", out)
	return string(out), ee.ExitCode()
}

// subscriber is a mosquitto_sub process (-d -v): its SUBACKs and the
// messages it got, as lines.
type subscriber struct {
	mu    sync.Mutex
	lines []string
}

func (s *subscriber) add(l string) {
	s.mu.Lock()
	s.lines = append(s.lines, l)
	s.mu.Unlock()
}

// grep returns the lines that start with prefix.
func (s *subscriber) grep(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lines {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (s *subscriber) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// mosquittoSub starts mosquitto_sub with args (killed when the test ends)
// and waits for its SUBACK.
func mosquittoSub(t *testing.T, args ...string) *subscriber {
	t.Helper()
	// Line-buffered: mosquitto_sub's stdio would hold a pipe's output back.
	cmd := exec.Command("stdbuf", append([]string{"-oL", "mosquitto_sub", "-d", "-v"}, args...)...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	s := &subscriber{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.add(sc.Text())
		}
	}()
	testenv.StartProcess(t, cmd) // its cleanup kills the process
	t.Cleanup(func() { pw.Close(); <-done })
	eventually(t, "mosquitto_sub's SUBACK", 30*time.Second, func() bool { return len(s.grep("Subscribed (mid:")) > 0 })
	return s
}

// receiptsTotal sums controller_receipts_total over its effects, and
// returns the applied ones apart.
func receiptsTotal(t testing.TB, url string) (all, applied float64) {
	t.Helper()
	family, ok := scrape(t, url)["controller_receipts_total"]
	require.True(t, ok, "the controller exposes controller_receipts_total")
	for _, m := range family.GetMetric() {
		all += valueOf(m)
		if labelsOf(m)["effect"] == "applied" {
			applied += valueOf(m)
		}
	}
	return all, applied
}

func receiptJSON(t *testing.T, r wire.Receipt) string {
	t.Helper()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	return string(b)
}

// A device's credentials cannot report on another device's command: the
// receipt it publishes on that device's topic is dropped by the broker,
// which still acknowledges it (mosquitto_pub exits 0), and the controller
// never sees it; the same account's receipt on its own topic is applied,
// and one on its own topic about the other device's command is a mismatch.
func TestSecureForgedReceiptOnAnotherDevicesTopicNeverReachesTheController(t *testing.T) {
	t.Parallel()
	requireMosquittoClients(t)
	// device-2's action takes a minute, so that its command sits in
	// executing while the forgery is tried, however slow the machine (the
	// teardown interrupts it); a long ack timeout keeps the controller's
	// queries, and their answers, out of the counts.
	b := setup(t, setupOpts{secure: true, args: []string{"--ack-timeout", "2m"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
			SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(time.Minute)}}}}}})
	victim, _, err := b.client.Submit(b.ctx(), req("forge", "device-2"), "")
	require.NoError(t, err)
	b.waitCommand(victim.CommandID, "executing")
	own, _, err := b.client.Submit(b.ctx(), req("forge", "spare-1"), "")
	require.NoError(t, err)
	b.waitCommand(own.CommandID, "waiting_device") // spare-1 was never seen: offline
	allBefore, appliedBefore := receiptsTotal(t, b.ctl.URL)

	now := time.Now().UTC()
	forged := receiptJSON(t, wire.Receipt{CommandID: victim.CommandID, OperationID: victim.OperationID,
		Status: wire.ReceiptSucceeded, Seq: 7, At: now, Result: json.RawMessage(`{"forged_by":"spare-1"}`)})
	out, code := mosquittoPub(t, b.mosqArgs("spare-1", "-q", "1", "-t", "fleet/device-2/receipts", "-m", forged)...)
	require.Equal(t, 0, code, "the broker acknowledges the forged receipt all the same: %s", out)
	// Then the same account on its own topic: once this one is applied, the
	// forged one, published before it, would have been delivered too.
	genuine := receiptJSON(t, wire.Receipt{CommandID: own.CommandID, OperationID: own.OperationID,
		Status: wire.ReceiptSucceeded, Seq: 1, At: now, Result: json.RawMessage(`{"by":"spare-1"}`)})
	out, code = mosquittoPub(t, b.mosqArgs("spare-1", "-q", "1", "-t", "fleet/spare-1/receipts", "-m", genuine)...)
	require.Equal(t, 0, code, out)
	require.Equal(t, "succeeded", b.waitFinal(own.OperationID).Status, "the account's receipt on its own topic is applied")
	// The receipt's effect is counted right after its commit, which a
	// ?wait= poll may see first on a loaded machine.
	var allAfter, appliedAfter float64
	eventually(t, "the genuine receipt counted", 10*time.Second, func() bool {
		allAfter, appliedAfter = receiptsTotal(t, b.ctl.URL)
		return appliedAfter-appliedBefore >= 1
	})
	require.Equal(t, 1.0, allAfter-allBefore, "one receipt reached the controller (of every effect)")
	require.Equal(t, 1.0, appliedAfter-appliedBefore)

	// What the account may publish, on its own topic, about device-2's
	// command: it arrives, is recorded as a mismatch, and changes nothing.
	mismatched := strings.Replace(forged, `"seq":7`, `"seq":8`, 1)
	out, code = mosquittoPub(t, b.mosqArgs("spare-1", "-q", "1", "-t", "fleet/spare-1/receipts", "-m", mismatched)...)
	require.Equal(t, 0, code, out)
	mismatch := `controller_receipts_total{effect="mismatch"}`
	eventually(t, "the mismatch counted", 30*time.Second, func() bool { return b.metric(mismatch) == 1 })
	cmd, err := b.client.Command(b.ctx(), victim.CommandID)
	require.NoError(t, err)
	require.Equal(t, "executing", cmd.Status, "neither changed device-2's command")
	mismatches := 0
	for _, r := range cmd.Receipts {
		require.NotEqual(t, 7, r.Seq, "the forged receipt is not in the receipt log: %+v", r)
		if r.Effect == "mismatch" {
			mismatches++
			require.Equal(t, 8, r.Seq)
			continue
		}
		require.NotContains(t, string(r.Result), "forged_by", "%+v", r)
	}
	require.Equal(t, 1, mismatches, "the receipt from spare-1's own topic, kept as a mismatch")
	t.Logf("forged receipt on device-2's topic: PUBACKed (mosquitto_pub exit 0) and dropped; receipts at the controller +%.0f (applied +%.0f, the genuine one); "+
		"the same forgery on spare-1's own topic: mismatch %.0f; victim's receipts %d, none applied from spare-1",
		allAfter-allBefore, appliedAfter-appliedBefore, b.metric(mismatch), len(cmd.Receipts))
}

// A device subscribed to another device's commands (even to #) gets its
// SUBACK, and then only its own messages: Mosquitto checks read access on
// each message it delivers.
func TestSecureDeviceReadsOnlyItsOwnCommands(t *testing.T) {
	t.Parallel()
	requireMosquittoClients(t)
	b := setup(t, setupOpts{secure: true})
	// spare-1's birth (its own presence topic), so that the controller
	// sends it commands; published before the subscriber connects, since
	// one account has one connection.
	birth := `{"online":true,"session":1,"capabilities":{"dedupe":true,"query":true},"at":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`
	out, code := mosquittoPub(t, b.mosqArgs("spare-1", "-q", "1", "-r", "-t", "fleet/spare-1/presence", "-m", birth)...)
	require.Equal(t, 0, code, out)
	b.waitDevice("spare-1", true)

	snoop := mosquittoSub(t, b.mosqArgs("spare-1", "-q", "1",
		"-t", "fleet/device-2/commands", "-t", "fleet/device-2/queries", "-t", "fleet/+/commands", "-t", "#",
		"-t", "fleet/spare-1/commands")...)
	require.Equal(t, []string{"Subscribed (mid: 1): 1, 1, 1, 1, 1"}, snoop.grep("Subscribed (mid:"),
		"Mosquitto grants every filter at SUBSCRIBE time")

	theirs, _, err := b.client.Submit(b.ctx(), req("snoop", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(theirs.OperationID).Status, "device-2 got its command")
	mine, _, err := b.client.Submit(b.ctx(), req("snoop", "spare-1"), "")
	require.NoError(t, err)
	eventually(t, "spare-1's own command at the snooper", 30*time.Second, func() bool {
		return len(snoop.grep("fleet/spare-1/commands ")) > 0
	})
	got := snoop.grep("fleet/")
	for _, l := range got {
		require.True(t, strings.HasPrefix(l, "fleet/spare-1/"), "only spare-1's own topics: %s", l)
		require.NotContains(t, l, theirs.CommandID)
	}
	require.Contains(t, snoop.grep("fleet/spare-1/commands ")[0], mine.CommandID)
	t.Logf("snooper subscribed to 5 filters (granted QoS 1 each); messages delivered: %d, all on fleet/spare-1/ (device-2's command %s never)",
		len(got), theirs.CommandID)
}

// No account, a wrong password, an unknown user: refused at CONNECT.
func TestSecureRefusesAnonymousAndWrongPassword(t *testing.T) {
	t.Parallel()
	requireMosquittoClients(t)
	b := setup(t, setupOpts{secure: true, devices: 1})
	probe := []string{"-q", "1", "-t", "probe", "-m", "x"}
	out, code := mosquittoPub(t, b.mosqArgs("", probe...)...)
	require.Equal(t, 5, code, "anonymous: CONNACK 5, not authorised: %s", out)
	require.Contains(t, out, "not authorised")

	wrong := append(b.mosqArgs(""), "-u", "spare-2", "-P", "not-"+b.password("spare-2"))
	out, code = mosquittoPub(t, append(wrong, probe...)...)
	require.Equal(t, 5, code, "wrong password: %s", out)
	out, code = mosquittoPub(t, append(append(b.mosqArgs(""), "-u", "nobody", "-P", "x"), probe...)...)
	require.Equal(t, 5, code, "unknown user: %s", out)

	// The right password connects (the publish to a topic it may not write
	// is dropped, and acknowledged).
	out, code = mosquittoPub(t, b.mosqArgs("spare-2", probe...)...)
	require.Equal(t, 0, code, out)
	log := b.broker.Log()
	require.Equal(t, 3, strings.Count(log, "disconnected, not authorised"), "%s", log)

	// The Go client (the controller's transport) is refused the same way,
	// and says why.
	var logs subscriber
	c := mqttx.New(mqttx.Config{URL: b.broker.URL(), ClientID: "anon", TLS: clientTLS(t, b.broker.TLS.CA), Timeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(lineWriter{&logs}, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- c.Start(ctx) }()
	eventually(t, "the Go client's refusal", 20*time.Second, func() bool { return len(logs.grep("")) > 0 })
	cancel()
	require.Error(t, <-started, "never connected")
	c.Stop()
	require.Contains(t, logs.String(), `msg="mqtt connect failed; retrying"`)
	require.Contains(t, logs.String(), "not Authorized")
	t.Logf("anonymous, wrong password, unknown user: mosquitto_pub exit 5 each; right password: exit 0; Go client: %s", logs.String())
}

// lineWriter adds each write (one log record) to a subscriber's lines.
type lineWriter struct{ s *subscriber }

func (w lineWriter) Write(p []byte) (int, error) {
	w.s.add(strings.TrimSpace(string(p)))
	return len(p), nil
}

func clientTLS(t *testing.T, ca string) *tls.Config {
	t.Helper()
	c, err := mqttx.ClientTLS(ca)
	require.NoError(t, err)
	return c
}

// A client that does not trust the broker's CA cannot connect: not with
// another CA, not with the system's roots, not in plain TCP; and neither
// can a simulated device or the controller given another CA.
func TestSecureTLSRefusesClientsWithoutTheCA(t *testing.T) {
	t.Parallel()
	requireMosquittoClients(t)
	b := setup(t, setupOpts{secure: true, devices: 1})
	other, err := tlsgen.Write(t.TempDir(), time.Hour)
	require.NoError(t, err)
	login := []string{"-h", "127.0.0.1", "-p", fmt.Sprint(b.broker.Port), "-V", "mqttv311", "-u", "spare-1", "-P", b.password("spare-1"),
		"-q", "1", "-t", "probe", "-m", "x"}
	for name, extra := range map[string][]string{
		"another CA":       {"--cafile", other.CA},
		"the system roots": {"--capath", "/etc/ssl/certs"},
		"plain TCP":        nil,
	} {
		out, code := mosquittoPub(t, append(extra, login...)...)
		require.NotEqual(t, 0, code, "%s: %s", name, out)
		t.Logf("%s: mosquitto_pub exit %d: %s", name, code, strings.TrimSpace(out))
	}
	out, code := mosquittoPub(t, append([]string{"--cafile", b.broker.TLS.CA}, login...)...)
	require.Equal(t, 0, code, "the broker's CA: %s", out)
	require.Contains(t, b.broker.Log(), "unknown ca")

	// A simulated device given another CA never comes online.
	fleet, err := sim.Start(context.Background(), sim.Config{MQTT: b.broker.URL(), IDs: []string{"spare-2"}, StateDir: t.TempDir(),
		Passwords: map[string]string{"spare-2": b.password("spare-2")}, TLS: clientTLS(t, other.CA),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	require.Error(t, fleet.WaitOnline(ctx), "a device that does not trust the CA stays offline")
	cancel()
	fleet.Stop()

	// A controller given another CA never gets its broker connection (its
	// API answers, its MQTT side does not start).
	ctl := testenv.StartController(t, testenv.ControllerOpts{DB: filepath.Join(t.TempDir(), "c.db"), MQTT: b.broker.URL(),
		Args: []string{"--mqtt-password-file", creds.PasswordFile(b.creds, "i1"), "--mqtt-ca", other.CA}})
	eventually(t, "the controller's connect failure logged", 30*time.Second, func() bool {
		return strings.Contains(ctl.Output(), "mqtt connect failed")
	})
	require.Contains(t, ctl.Output(), "certificate signed by unknown authority")
	require.NotContains(t, ctl.Output(), "mqtt connected")
}

// A device's account connecting with client id controller-i1 gets its own
// user name as client id (use_username_as_clientid): the controller's
// session stays its own, it keeps its connection and serves operations.
// Against the anonymous profile the same client id takes the controller's
// session over, which the controller counts.
func TestSecureControllerClientIDNeedsTheControllersAccount(t *testing.T) {
	t.Parallel()
	requireMosquittoClients(t)
	b := setup(t, setupOpts{secure: true})
	spoof := mosquittoSub(t, b.mosqArgs("spare-1", "-i", "controller-i1", "-q", "1", "-t", "fleet/+/receipts")...)
	require.Regexp(t, `New client connected from 127\.0\.0\.1:\d+ as spare-1 \(p\d, c1, k60, u'spare-1'\)`, b.broker.Log(),
		"the broker replaced the client id controller-i1 by the account's name")
	for i := 1; i <= 3; i++ {
		op, _, err := b.client.Submit(b.ctx(), req("spoof", fmt.Sprintf("device-%d", i)), "")
		require.NoError(t, err)
		require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	}
	require.Empty(t, spoof.grep("fleet/"), "the spoofer reads no receipts")
	for _, cause := range []mqttx.Loss{mqttx.LossTakenOver, mqttx.LossClosed, mqttx.LossError} {
		require.Zero(t, b.metric(`controller_mqtt_connections_lost_total{cause="`+string(cause)+`"}`), cause)
	}
	require.Equal(t, 1, strings.Count(b.ctl.Output(), "mqtt connected"), "the controller kept its one connection")

	// The anonymous loopback profile has nothing to stop it: a client with
	// the controller's client id takes its session over, and the controller,
	// reconnecting at once, takes it back and counts it.
	a := setup(t, setupOpts{devices: 1})
	rawClient(t, a.broker.URL(), "controller-i1")
	eventually(t, "the takeover counted", 15*time.Second, func() bool {
		return a.metric(`controller_mqtt_connections_lost_total{cause="session_taken_over"}`) >= 1
	})
	require.Contains(t, a.ctl.Output(), "mqtt session taken over")
	op, _, err := a.client.Submit(a.ctx(), req("spoof", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", a.waitFinal(op.OperationID).Status)
	t.Logf("secure: spoofer connected as spare-1, controller lost 0 connections, 3 operations succeeded; anonymous: takeovers counted %.0f",
		a.metric(`controller_mqtt_connections_lost_total{cause="session_taken_over"}`))
}

// The whole system on the secure profile over TLS: 10 devices, each with
// its own account, and the controller with its own.
func TestSecureFleetOverTLS(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{secure: true, devices: 10})
	require.True(t, strings.HasPrefix(b.broker.URL(), "ssl://"))
	start := time.Now()
	ids := make([]string, 10)
	for i := range ids {
		op, status, err := b.client.Submit(b.ctx(), req("tls", fmt.Sprintf("device-%d", i+1)), "")
		require.NoError(t, err)
		require.Equal(t, 201, status)
		ids[i] = op.OperationID
	}
	for _, id := range ids {
		require.Equal(t, "succeeded", b.waitFinal(id).Status, id)
	}
	elapsed := time.Since(start)
	ex := b.executions()
	for _, id := range ids {
		require.Equal(t, 1, ex[id], "%s executed once", id)
	}
	_, applied := receiptsTotal(t, b.ctl.URL)
	require.GreaterOrEqual(t, applied, 30.0, "received, executing and succeeded of each")
	// Births (the controller saw every device), commands, receipts: the
	// ACL let every legitimate message through, and no login was refused.
	log := b.broker.Log()
	require.NotContains(t, log, "not authorised")
	for i := 1; i <= 10; i++ {
		require.Contains(t, log, fmt.Sprintf(" as device-%d (p2, c0, k5, u'device-%d')", i, i), "device-%d logged in with its account", i)
	}
	require.Contains(t, log, "u'controller-i1'")
	t.Logf("10 operations succeeded over TLS in %s, %.0f receipts applied, 10 executions", elapsed.Round(time.Millisecond), applied)
}
