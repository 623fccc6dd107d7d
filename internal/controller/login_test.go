package controller

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/tlsgen"
)

// The broker login the flags give: the password file's one trailing newline
// trimmed, the user controller-{instance} by default, a CA only for ssl://.
func TestMQTTLogin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret \n"), 0o600))
	files, err := tlsgen.Write(dir, 0)
	require.NoError(t, err)

	cfg := DefaultConfig()
	cfg.InstanceID, cfg.MQTTPasswordFile = "c1", pw
	user, password, tc, err := cfg.mqttLogin()
	require.NoError(t, err)
	require.Equal(t, []string{"controller-c1", "s3cret "}, []string{user, password})
	require.Nil(t, tc, "tcp:// is plain")

	cfg.MQTTUser, cfg.MQTT, cfg.MQTTCA = "ops", "ssl://127.0.0.1:8883", files.CA
	require.NoError(t, cfg.Validate())
	user, _, tc, err = cfg.mqttLogin()
	require.NoError(t, err)
	require.Equal(t, "ops", user)
	require.NotNil(t, tc.RootCAs)

	cfg.MQTT = "tcp://127.0.0.1:1883"
	require.ErrorContains(t, cfg.Validate(), "--mqtt-ca is for ssl://")
	for _, bad := range []string{"ws://127.0.0.1:9001", "127.0.0.1:1883", "tcp://"} {
		cfg.MQTT = bad
		require.ErrorContains(t, cfg.Validate(), "--mqtt "+strconv.Quote(bad), bad)
	}

	cfg.MQTT, cfg.MQTTCA = "ssl://127.0.0.1:8883", files.Key // not a certificate
	_, _, _, err = cfg.mqttLogin()
	require.ErrorContains(t, err, "no PEM certificate")

	require.NoError(t, os.WriteFile(pw, []byte("\n"), 0o600))
	cfg.MQTTCA = ""
	_, _, _, err = cfg.mqttLogin()
	require.ErrorContains(t, err, "is empty")
	cfg.MQTTPasswordFile = filepath.Join(dir, "missing")
	_, _, _, err = cfg.mqttLogin()
	require.ErrorContains(t, err, "--mqtt-password-file")

	// Without a password file: anonymous, unless a user is named.
	cfg = DefaultConfig()
	cfg.InstanceID = "c1"
	user, password, _, err = cfg.mqttLogin()
	require.NoError(t, err)
	require.Equal(t, []string{"", ""}, []string{user, password})
}
