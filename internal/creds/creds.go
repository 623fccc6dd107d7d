// Package creds makes a fleet's broker accounts for Mosquitto's secure
// profile (mosquitto/secure.conf.tmpl): one account per device (user name =
// device id) and one per controller instance (user name controller-{id}),
// each with a random password, written as
//
//   - passwd: Mosquitto's password_file, hashed the way mosquitto_passwd of
//     Mosquitto 2 does it: user:$7$<iterations>$<base64 salt>$<base64 hash>,
//     PBKDF2-HMAC-SHA512 over a random 12-byte salt, 64 bytes (mode 0600);
//   - acl: Mosquitto's acl_file, patterns that let a device read only
//     {root}/%u/commands and {root}/%u/queries and write only
//     {root}/%u/receipts and {root}/%u/presence, and the controllers'
//     rights over every device's topics (mode 0644);
//   - credentials.json: [{"username","password"}], devices and controllers,
//     the plain passwords for the clients (mode 0600);
//   - controller-{id}.password: each controller's password alone, for
//     `controller serve --mqtt-password-file` (mode 0600).
//
// Writing into a directory that already holds credentials.json adds the
// accounts it lacks and keeps every existing password, so the command can be
// run again to grow a fleet (or with another id prefix) without breaking the
// devices already deployed; passwd and acl are rewritten from the whole set.
package creds

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// File names inside a credentials directory.
const (
	PasswdFile      = "passwd"
	ACLFile         = "acl"
	CredentialsFile = "credentials.json"
)

// ControllerPrefix starts every controller account's user name (and, under
// the secure profile's use_username_as_clientid, its client id). Device ids
// never start with it (wire.ValidDeviceID).
const ControllerPrefix = "controller-"

// hashIterations is the PBKDF2 iteration count of the hashes, Mosquitto 2's own
// default (mosquitto_passwd writes $7$101$). The broker pays it on every
// CONNECT, so a fleet of 10,000 devices reconnecting after a broker restart
// pays it 10,000 times; the passwords are 192 random bits, which no number
// of iterations would make easier or harder to guess.
const hashIterations = 101

// Account is one broker account, as credentials.json holds it.
type Account struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// Controller reports whether the account is a controller instance's.
func (a Account) Controller() bool { return strings.HasPrefix(a.Username, ControllerPrefix) }

// ControllerUser is the account name of a controller instance.
func ControllerUser(instanceID string) string { return ControllerPrefix + instanceID }

// PasswordFile is where Write puts a controller instance's password.
func PasswordFile(dir, instanceID string) string {
	return filepath.Join(dir, ControllerUser(instanceID)+".password")
}

// Options says which accounts a credentials directory should hold.
type Options struct {
	Dir         string
	Devices     []string // device ids
	Controllers []string // controller instance ids
	TopicRoot   string   // default wire.DefaultTopicRoot
}

// Result is what Write did.
type Result struct {
	Accounts []Account // every account in the directory, sorted by name
	Added    int       // accounts new in this run
}

// Write makes or completes the credentials directory o.Dir (see the package
// documentation).
func Write(o Options) (Result, error) {
	if o.TopicRoot == "" {
		o.TopicRoot = wire.DefaultTopicRoot
	}
	if err := validTopicRoot(o.TopicRoot); err != nil {
		return Result{}, err
	}
	want := make([]string, 0, len(o.Devices)+len(o.Controllers))
	for _, id := range o.Devices {
		if !wire.ValidDeviceID(id) {
			return Result{}, fmt.Errorf("device id %q: %w", id, wire.ErrInvalidDeviceID)
		}
		want = append(want, id)
	}
	for _, id := range o.Controllers {
		if !validInstance(id) {
			return Result{}, fmt.Errorf("controller instance id %q: use [A-Za-z0-9._-]{1,64}", id)
		}
		want = append(want, ControllerUser(id))
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Result{}, err
	}
	have := map[string]Account{}
	existing, err := Load(filepath.Join(o.Dir, CredentialsFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return Result{}, err
	default:
		for _, a := range existing {
			have[a.Username] = a
		}
	}
	var res Result
	for _, user := range want {
		if _, ok := have[user]; ok {
			continue
		}
		have[user] = Account{Username: user, Password: newPassword()}
		res.Added++
	}
	for _, a := range have {
		res.Accounts = append(res.Accounts, a)
	}
	sort.Slice(res.Accounts, func(i, j int) bool { return res.Accounts[i].Username < res.Accounts[j].Username })

	passwd, err := renderPasswd(res.Accounts)
	if err != nil {
		return Result{}, err
	}
	js, err := json.MarshalIndent(res.Accounts, "", "  ")
	if err != nil {
		return Result{}, err
	}
	// credentials.json first: a run that fails half way leaves passwords
	// that the next run keeps, never hashes of passwords nobody knows.
	if err := writeFile(filepath.Join(o.Dir, CredentialsFile), append(js, '\n'), 0o600); err != nil {
		return Result{}, err
	}
	for _, a := range res.Accounts {
		if a.Controller() {
			id := strings.TrimPrefix(a.Username, ControllerPrefix)
			if err := writeFile(PasswordFile(o.Dir, id), []byte(a.Password+"\n"), 0o600); err != nil {
				return Result{}, err
			}
		}
	}
	if err := writeFile(filepath.Join(o.Dir, PasswdFile), passwd, 0o600); err != nil {
		return Result{}, err
	}
	if err := writeFile(filepath.Join(o.Dir, ACLFile), renderACL(o.TopicRoot, res.Accounts), 0o644); err != nil {
		return Result{}, err
	}
	return res, nil
}

// Load reads a credentials.json.
func Load(file string) ([]Account, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var accounts []Account
	if err := json.Unmarshal(b, &accounts); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	seen := map[string]bool{}
	for i, a := range accounts {
		switch {
		case a.Username == "" || a.Password == "":
			return nil, fmt.Errorf("%s: entry %d: username and password are required", file, i)
		case seen[a.Username]:
			return nil, fmt.Errorf("%s: %q given twice", file, a.Username)
		}
		seen[a.Username] = true
	}
	return accounts, nil
}

// Passwords maps each account's user name to its password.
func Passwords(accounts []Account) map[string]string {
	m := make(map[string]string, len(accounts))
	for _, a := range accounts {
		m[a.Username] = a.Password
	}
	return m
}

// newPassword returns 192 random bits from crypto/rand, base64url (32
// characters, none of them ':' or whitespace).
func newPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Hash returns a password_file hash of password in Mosquitto 2's format:
// $7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>.
func Hash(password string) (string, error) {
	salt := make([]byte, 12)
	_, _ = rand.Read(salt)
	return hashWith(password, salt, hashIterations)
}

func hashWith(password string, salt []byte, iterations int) (string, error) {
	key, err := pbkdf2.Key(sha512.New, password, salt, iterations, sha512.Size)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("$7$%d$%s$%s", iterations, base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(key)), nil
}

// renderPasswd renders a password_file: one user:hash line per account.
func renderPasswd(accounts []Account) ([]byte, error) {
	var b strings.Builder
	for _, a := range accounts {
		if strings.ContainsAny(a.Username, ":\n\r") || strings.ContainsAny(a.Password, "\n\r") {
			return nil, fmt.Errorf("account %q: a user name without ':' or line breaks, a password without line breaks", a.Username)
		}
		h, err := Hash(a.Password)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "%s:%s\n", a.Username, h)
	}
	return []byte(b.String()), nil
}

// renderACL renders the acl_file for the accounts under topic root.
//
// How Mosquitto 2 reads it (checked against 2.0.11): the acl_file is not
// consulted at SUBSCRIBE time, so any filter is granted (a device may
// subscribe to {root}/+/commands or #), and every message is checked for
// read access on its own topic when it is delivered; a message the
// subscriber may not read is not sent to it. That holds for shared
// subscriptions too, and is why the controllers use none: a device account
// may join any $share group, and the broker then drops, for the whole
// group, each message it picks that member for (see package peers). A
// publish without write access is dropped, and (MQTT 3.1.1) still
// acknowledged: the publisher cannot tell.
//
// Each controller may write its own receipts topic,
// {root}/controller-{id}/receipts (no device id starts with controller-),
// where it publishes a probe to itself after each connect to prove that
// its receipt subscription delivers.
func renderACL(root string, accounts []Account) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `# Mosquitto acl_file for the fleet under topic root %q, written by
# "devicesim creds". Every account not listed below has only the patterns:
# a device (user name = device id) reads its own commands and queries and
# writes its own receipts and presence (its birth, its will), nothing else.
pattern read %s/%%u/commands
pattern read %s/%%u/queries
pattern write %s/%%u/receipts
pattern write %s/%%u/presence
`, root, root, root, root, root)
	for _, a := range accounts {
		if !a.Controller() {
			continue
		}
		fmt.Fprintf(&b, `
user %s
topic read %s/+/receipts
topic write %s/%s/receipts
topic read %s/+/presence
topic write %s/+/commands
topic write %s/+/queries
`, a.Username, root, root, a.Username, root, root, root)
	}
	return []byte(b.String())
}

// validTopicRoot checks that root can stand in topics and ACL lines.
func validTopicRoot(root string) error {
	if root == "" || strings.ContainsAny(root, "+# \t\r\n") || strings.HasPrefix(root, "$") ||
		strings.HasPrefix(root, "/") || strings.HasSuffix(root, "/") || strings.Contains(root, "//") {
		return fmt.Errorf("topic root %q: non-empty, no wildcards, spaces, leading $ or empty levels", root)
	}
	return nil
}

func validInstance(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// writeFile replaces file atomically with data at mode perm.
func writeFile(file string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
