// Package testenv starts the real parts that integration tests run against:
// a Mosquitto broker on a free loopback port, throwaway PostgreSQL clusters
// (postgres.go), and the project's binaries.
package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/tlsgen"
)

// MosquittoBin is where Debian installs the broker.
const MosquittoBin = "/usr/sbin/mosquitto"

// Broker is a Mosquitto process on a loopback port, with persistence in its
// own directory. Restart keeps the port and the data directory.
type Broker struct {
	t    testing.TB
	Port int
	Dir  string
	// TLS, for a broker of the secure profile (StartSecureBroker), names
	// its CA (what clients trust), certificate and key; zero otherwise.
	TLS  tlsgen.Files
	cmd  *exec.Cmd
	done chan struct{}
}

// URL is the broker's address for MQTT clients: ssl:// for the secure
// profile, tcp:// for the anonymous loopback one.
func (b *Broker) URL() string {
	if b.TLS.CA != "" {
		return fmt.Sprintf("ssl://127.0.0.1:%d", b.Port)
	}
	return fmt.Sprintf("tcp://127.0.0.1:%d", b.Port)
}

// Addr is host:port.
func (b *Broker) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.Port) }

// RepoRoot returns the repository's top directory (the one with go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Broker config templates in mosquitto/.
const (
	// AnonymousTemplate is the anonymous loopback profile: plain TCP, no
	// accounts (StartBroker).
	AnonymousTemplate = "anonymous-loopback.conf.tmpl"
	// SecureTemplate is the secure profile: accounts, ACL, TLS
	// (StartSecureBroker).
	SecureTemplate = "secure.conf.tmpl"
)

// StartBroker starts Mosquitto from the anonymous loopback profile on a free
// port and stops it when the test ends. A missing broker fails the test with
// the command that installs it.
func StartBroker(t testing.TB) *Broker {
	t.Helper()
	b := &Broker{t: t, Port: FreePort(t), Dir: t.TempDir()}
	b.render(AnonymousTemplate, nil)
	b.start()
	t.Cleanup(func() { b.Stop() })
	return b
}

// StartSecureBroker starts Mosquitto from the secure profile on a free
// port, with the accounts and ACL of credsDir (creds.Write: passwd, acl)
// and a CA and broker certificate made now, valid for an hour, in the
// broker's directory (b.TLS; clients trust b.TLS.CA). Its URL is ssl://.
func StartSecureBroker(t testing.TB, credsDir string) *Broker {
	t.Helper()
	b := &Broker{t: t, Port: FreePort(t), Dir: t.TempDir()}
	files, err := tlsgen.Write(filepath.Join(b.Dir, "tls"), time.Hour)
	if err != nil {
		t.Fatalf("broker certificate: %v", err)
	}
	b.TLS = files
	for _, f := range []string{creds.PasswdFile, creds.ACLFile} {
		if _, err := os.Stat(filepath.Join(credsDir, f)); err != nil {
			t.Fatalf("secure broker: %v (write the credentials first: creds.Write)", err)
		}
	}
	b.render(SecureTemplate, []string{
		"@PASSWD@", filepath.Join(credsDir, creds.PasswdFile), "@ACL@", filepath.Join(credsDir, creds.ACLFile),
		"@CAFILE@", files.CA, "@CERTFILE@", files.Cert, "@KEYFILE@", files.Key,
	})
	b.start()
	t.Cleanup(func() { b.Stop() })
	return b
}

// render writes b.Dir/mosquitto.conf from a template in mosquitto/, with
// the port, the data directory and the user filled in, and extra pairs.
func (b *Broker) render(template string, extra []string) {
	b.t.Helper()
	if _, err := os.Stat(MosquittoBin); err != nil {
		b.t.Fatalf("mosquitto is not installed at %s: run 'make deps' or 'apt-get install -y mosquitto'", MosquittoBin)
	}
	tmpl, err := os.ReadFile(filepath.Join(RepoRoot(), "mosquitto", template))
	if err != nil {
		b.t.Fatalf("read broker config template: %v", err)
	}
	me, err := user.Current()
	if err != nil {
		b.t.Fatalf("current user: %v", err)
	}
	pairs := append([]string{"@PORT@", fmt.Sprint(b.Port), "@DATA@", filepath.Join(b.Dir, "data"), "@AUTOSAVE@", "1",
		"@USER@", me.Username}, extra...)
	conf := strings.NewReplacer(pairs...).Replace(string(tmpl))
	if strings.Contains(conf, "@") {
		b.t.Fatalf("broker config %s: a placeholder left unfilled:\n%s", template, conf)
	}
	if err := os.MkdirAll(filepath.Join(b.Dir, "data"), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.Dir, "mosquitto.conf"), []byte(conf), 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func (b *Broker) start() {
	b.t.Helper()
	log, err := os.OpenFile(filepath.Join(b.Dir, "mosquitto.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		b.t.Fatal(err)
	}
	cmd := exec.Command(MosquittoBin, "-c", filepath.Join(b.Dir, "mosquitto.conf"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := startTracked(cmd); err != nil {
		log.Close()
		b.t.Fatalf("start mosquitto: %v", err)
	}
	b.cmd, b.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); forget(cmd); log.Close(); close(b.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", b.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-b.done:
			out, _ := os.ReadFile(filepath.Join(b.Dir, "mosquitto.log"))
			b.t.Fatalf("mosquitto exited at start:\n%s", out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	b.t.Fatalf("mosquitto did not listen on %s within 10s", b.Addr())
}

// Stop ends the broker cleanly (SIGTERM: it saves its persistence file).
func (b *Broker) Stop() { b.signal(syscall.SIGTERM) }

// Kill ends the broker with SIGKILL: whatever it had not autosaved is lost.
func (b *Broker) Kill() { b.signal(syscall.SIGKILL) }

// Restart stops the broker (cleanly, or by kill -9 when hard) and starts it
// again on the same port with the same data directory.
func (b *Broker) Restart(hard bool) {
	b.t.Helper()
	if hard {
		b.Kill()
	} else {
		b.Stop()
	}
	b.start()
}

func (b *Broker) signal(sig syscall.Signal) {
	if b.cmd == nil {
		return
	}
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Signal(sig)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

// Log is what the broker wrote to its log so far (all its runs).
func (b *Broker) Log() string {
	out, _ := os.ReadFile(filepath.Join(b.Dir, "mosquitto.log"))
	return string(out)
}
