package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is a child the bench started, in a process group of its own so
// that a Ctrl-C at the terminal reaches only the bench, which then stops
// its children in order (the controller and the devices before the broker).
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess starts args with its output in logPath. onLine, if set,
// sees every line of the child's stderr (stdout goes to the log only).
func startProcess(name, logPath string, args []string, onLine func(string)) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout = log
	var pipe io.ReadCloser
	if onLine == nil {
		cmd.Stderr = log
	} else if pipe, err = cmd.StderrPipe(); err != nil {
		log.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	var copied sync.WaitGroup
	if pipe != nil {
		copied.Add(1)
		go func() {
			defer copied.Done()
			sc := bufio.NewScanner(pipe)
			for sc.Scan() {
				line := sc.Text()
				fmt.Fprintln(log, line)
				onLine(line)
			}
		}()
	}
	go func() {
		copied.Wait() // Wait closes the pipe: read it to its end first
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits up to timeout, then kills.
func (p *process) stop(timeout time.Duration) {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// failure describes an early exit with the end of the child's log.
func (p *process) failure() error {
	return fmt.Errorf("%s exited (%v); the end of its log %s:\n%s", p.name, p.err, p.log, tail(p.log, 20))
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startBroker renders the project's Mosquitto template (as
// internal/testenv does: @PORT@, @DATA@, @AUTOSAVE@ 1, @USER@) into dir and
// starts the broker on a free loopback port; it returns once the port
// accepts connections.
func startBroker(ctx context.Context, mosquitto, template, dir string) (*process, string, error) {
	tmpl, err := os.ReadFile(template)
	if err != nil {
		return nil, "", fmt.Errorf("broker config template: %w", err)
	}
	if _, err := os.Stat(mosquitto); err != nil {
		return nil, "", fmt.Errorf("mosquitto is not installed at %s: run 'make deps' or 'apt-get install -y mosquitto'", mosquitto)
	}
	me, err := user.Current()
	if err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, "", err
	}
	conf := strings.NewReplacer("@PORT@", strconv.Itoa(port), "@DATA@", data, "@AUTOSAVE@", "1",
		"@USER@", me.Username).Replace(string(tmpl))
	confPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	p, err := startProcess("mosquitto", filepath.Join(dir, "mosquitto.log"), []string{mosquitto, "-c", confPath}, nil)
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	err = waitUntil(ctx, p, 10*time.Second, "mosquitto to listen on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if err != nil {
		p.stop(5 * time.Second)
		return nil, "", err
	}
	return p, "tcp://" + addr, nil
}

// waitUntil polls cond every 50 ms until it holds, failing when timeout
// passes, ctx ends or p (if not nil) exits.
func waitUntil(ctx context.Context, p *process, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var exited <-chan struct{}
	if p != nil {
		exited = p.done
	}
	for !cond() {
		select {
		case <-tick.C:
		case <-exited:
			return p.failure()
		case <-deadline.C:
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
	return nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// cpuTime is a process's user plus system CPU time so far.
func cpuTime(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// utime and stime are fields 14 and 15.
	return ticks(f, 11, 12)
}

// peakRSS is a process's VmHWM, its resident set's high-water mark, in MiB.
func peakRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// maxLogProblems bounds the log lines kept per controller.
const maxLogProblems = 10

// logProblems counts a log's WARN and ERROR lines (slog's text format)
// and returns the first max of them.
func logProblems(path string, max int) (int, []string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil
	}
	defer f.Close()
	n := 0
	var first []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			continue
		}
		n++
		if len(first) < max {
			first = append(first, line)
		}
	}
	return n, first
}

// statFields are a /proc/<pid>/stat's fields after the command name
// (field 3, the state, first).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return nil, errors.New("malformed /proc stat")
	}
	return f, nil
}

// ticks adds up stat fields (clock ticks) as a duration.
func ticks(f []string, idx ...int) (time.Duration, error) {
	var sum int64
	for _, i := range idx {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return time.Duration(sum) * time.Second / clockTicks, nil
}

// treeCPUTime is the CPU time of pid, of its children that ended (cutime,
// cstime: reaped ones) and of its live children: a PostgreSQL server's
// postmaster and its backends.
func treeCPUTime(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// utime, stime, cutime, cstime are fields 14-17.
	total, err := ticks(f, 11, 12, 13, 14)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	want := strconv.Itoa(pid)
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		cf, err := statFields(child)
		if err != nil || cf[1] != want { // field 4, the parent
			continue
		}
		if t, err := ticks(cf, 11, 12); err == nil {
			total += t
		}
	}
	return total, nil
}

// localPostgres finds the postmaster of a postgres:// URL's server when
// it runs on this host (a loopback address): the process of the postgres
// binary started with -p PORT (as scripts/throwaway-postgres and the tests'
// clusters start it). 0 and no error: not PostgreSQL, or not on loopback.
func localPostgres(db string) (int, error) {
	if Backend(db) != "postgres" {
		return 0, nil
	}
	u, err := url.Parse(db)
	if err != nil {
		return 0, err
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return 0, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "postgres" {
			continue
		}
		for i, a := range argv {
			if a == "-p"+port || (a == "-p" && i+1 < len(argv) && argv[i+1] == port) {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no postgres process started with -p %s on this host", port)
}
