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
)

// MosquittoBin is where Debian installs the broker.
const MosquittoBin = "/usr/sbin/mosquitto"

// Broker is a Mosquitto process on a loopback port, with persistence in its
// own directory. Restart keeps the port and the data directory.
type Broker struct {
	t    testing.TB
	Port int
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// URL is the broker's address for MQTT clients.
func (b *Broker) URL() string { return fmt.Sprintf("tcp://127.0.0.1:%d", b.Port) }

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

// StartBroker starts Mosquitto from the project's config template on a free
// port and stops it when the test ends. A missing broker fails the test with
// the command that installs it.
func StartBroker(t testing.TB) *Broker {
	t.Helper()
	if _, err := os.Stat(MosquittoBin); err != nil {
		t.Fatalf("mosquitto is not installed at %s: run 'make deps' or 'apt-get install -y mosquitto'", MosquittoBin)
	}
	b := &Broker{t: t, Port: FreePort(t), Dir: t.TempDir()}
	tmpl, err := os.ReadFile(filepath.Join(RepoRoot(), "mosquitto", "mosquitto.conf.tmpl"))
	if err != nil {
		t.Fatalf("read broker config template: %v", err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatalf("current user: %v", err)
	}
	conf := strings.NewReplacer("@PORT@", fmt.Sprint(b.Port), "@DATA@", filepath.Join(b.Dir, "data"), "@AUTOSAVE@", "1",
		"@USER@", me.Username).Replace(string(tmpl))
	if err := os.MkdirAll(filepath.Join(b.Dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.Dir, "mosquitto.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b.start()
	t.Cleanup(func() { b.Stop() })
	return b
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
