package device_test

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// On the secure broker profile (TLS, passwords, ACL) a device connects with
// its password file and the CA; with a wrong password it never comes online.
func TestSecureBroker(t *testing.T) {
	dir := t.TempDir()
	res, err := creds.Write(creds.Options{Dir: dir, Devices: []string{"dev-1"}})
	require.NoError(t, err)
	broker := testenv.StartSecureBroker(t, dir)
	pw := creds.Passwords(res.Accounts)["dev-1"]
	require.NotEmpty(t, pw)
	good := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(good, []byte(pw+"\n"), 0o600))

	var runs atomic.Int64
	e := &env{broker: broker, dir: t.TempDir()}
	o := e.options("dev-1", &runs)
	o.PasswordFile, o.CAFile = good, broker.TLS.CA
	start(t, o)

	bad := o
	bad.PasswordFile, bad.Password, bad.StateDir = "", "wrong", t.TempDir()
	bad.ID = "dev-1"
	d, err := device.New(bad)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer wcancel()
	require.ErrorIs(t, d.WaitOnline(wctx), context.DeadlineExceeded, "a wrong password never gets online")
	cancel()
	require.NoError(t, <-done)
}
