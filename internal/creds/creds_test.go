package creds

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A line written by Debian's mosquitto_passwd 2.0.11 (`mosquitto_passwd -b
// passwd device-1 pw1`): the same salt gives the same hash here.
func TestHashMatchesMosquittoPasswd(t *testing.T) {
	t.Parallel()
	const line = "device-1:$7$101$1fCNNXsSEtcEnogz$GHmL438ogan3w0ZeLfoJkr44lE5g+eolH9VH9Eghf4Yh7C8cr2q71Y+4Y1EoHeQt3/f4L2BkgNNOr4WqO8Yd+w=="
	_, hash, _ := strings.Cut(line, ":")
	parts := strings.Split(hash, "$") // "", "7", "101", salt, key
	require.Len(t, parts, 5)
	salt, err := base64.StdEncoding.DecodeString(parts[3])
	require.NoError(t, err)
	got, err := hashWith("pw1", salt, 101)
	require.NoError(t, err)
	require.Equal(t, hash, got)

	fresh, err := Hash("pw1")
	require.NoError(t, err)
	require.NotEqual(t, hash, fresh, "a new salt each time")
	require.Regexp(t, `^\$7\$101\$[A-Za-z0-9+/]{16}\$[A-Za-z0-9+/]{86}==$`, fresh)
}

// A second run adds what is missing and keeps every password it had.
func TestWriteMergesAndKeepsPasswords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := Write(Options{Dir: dir, Devices: []string{"device-1", "device-2"}, Controllers: []string{"c1"}})
	require.NoError(t, err)
	require.Equal(t, 3, first.Added)
	before := Passwords(first.Accounts)
	require.Len(t, before, 3)
	for _, p := range before {
		require.Len(t, p, 32)
	}

	second, err := Write(Options{Dir: dir, Devices: []string{"device-2", "device-3"}, Controllers: []string{"c1", "c2"}, TopicRoot: "acme/fleet"})
	require.NoError(t, err)
	require.Equal(t, 2, second.Added)
	after := Passwords(second.Accounts)
	require.Len(t, after, 5)
	for user, p := range before {
		require.Equal(t, p, after[user], "%s keeps its password", user)
	}

	loaded, err := Load(filepath.Join(dir, CredentialsFile))
	require.NoError(t, err)
	require.Equal(t, second.Accounts, loaded)
	for file, mode := range map[string]os.FileMode{CredentialsFile: 0o600, PasswdFile: 0o600, ACLFile: 0o644,
		"controller-c1.password": 0o600, "controller-c2.password": 0o600} {
		st, err := os.Stat(filepath.Join(dir, file))
		require.NoError(t, err, file)
		require.Equal(t, mode, st.Mode().Perm(), file)
	}
	pw, err := os.ReadFile(PasswordFile(dir, "c2"))
	require.NoError(t, err)
	require.Equal(t, after["controller-c2"]+"\n", string(pw))

	passwd, err := os.ReadFile(filepath.Join(dir, PasswdFile))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(passwd)), "\n")
	require.Len(t, lines, 5)
	for _, l := range lines {
		user, _, ok := strings.Cut(l, ":")
		require.True(t, ok)
		require.Contains(t, after, user)
		require.NotContains(t, l, after[user], "no plain password in passwd")
	}

	acl, err := os.ReadFile(filepath.Join(dir, ACLFile))
	require.NoError(t, err)
	for _, want := range []string{
		"pattern read acme/fleet/%u/commands\n", "pattern read acme/fleet/%u/queries\n",
		"pattern write acme/fleet/%u/receipts\n", "pattern write acme/fleet/%u/presence\n",
		"user controller-c1\n", "user controller-c2\n", "topic write acme/fleet/controller-c1/receipts\n",
		"topic write acme/fleet/+/commands\n",
	} {
		require.Contains(t, string(acl), want)
	}
	require.NotContains(t, string(acl), "user device-")
	require.NotContains(t, string(acl), "$share", "the controllers use no shared group")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 5, "no temporary files left")
}

func TestWriteRefusesBadNames(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{Devices: []string{"controller-1"}},
		{Devices: []string{"a/b"}},
		{Controllers: []string{"bad id"}},
		{Devices: []string{"d1"}, TopicRoot: "fleet/#"},
		{Devices: []string{"d1"}, TopicRoot: "$SYS"},
	} {
		o.Dir = t.TempDir()
		_, err := Write(o)
		require.Error(t, err, "%+v", o)
		entries, _ := os.ReadDir(o.Dir)
		require.Empty(t, entries, "nothing written for %+v", o)
	}
}
