package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the pgx driver for database/sql
	"golang.org/x/sys/unix"
)

// A throwaway PostgreSQL cluster for tests: initdb into a fresh directory
// under $TMPDIR (as root, under /tmp when the postgres OS user cannot
// reach $TMPDIR: see pgDataDir), one server on a free loopback port, trust authentication
// for the superuser postgres, fsync and synchronous_commit on (the same
// durability as a real server: figures measured against it mean something).
// PostgreSQL refuses to run as root, so as root every PostgreSQL program
// runs as the postgres OS user (runuser); otherwise as the current user.
//
// Nothing is left running or on disk when the test process ends:
//   - a test's own cluster (StartPostgres) is stopped and removed by its
//     cleanup, the shared one (SharedPostgres) by Close (testenv.Main);
//   - on SIGINT or SIGTERM the handler of Setup stops and removes every
//     cluster before it exits;
//   - when the process dies without any of that (a panic, the -timeout of
//     go test, SIGKILL), each cluster's watchdog does it: a shell started
//     in its own process group that waits for EOF on a pipe only this
//     process holds open.

// PostgresBin is where Debian's postgresql package (PostgreSQL 15) installs
// the server's programs.
const PostgresBin = "/usr/lib/postgresql/15/bin"

// pgNotInstalled is the failure when the programs are missing.
const pgNotInstalled = "postgresql is not installed: run 'make deps' or 'apt-get install -y postgresql'"

// pgWait bounds each pg_ctl start or stop (pg_ctl -w waits for the server to
// be ready or gone, -t is its deadline) and each administrative statement.
const pgWait = 60 * time.Second

// Postgres is one PostgreSQL server on 127.0.0.1:Port with its data
// directory Dir, which also holds the server's log (Dir/log) and its Unix
// socket (psql -h Dir -p Port -U postgres). Stop and Start keep both.
type Postgres struct {
	Port int
	Dir  string

	shared bool
	// Guarded by pgMu.
	running bool
	removed bool

	watchdog *exec.Cmd
	wdPipe   *os.File // the write end of the watchdog's stdin
}

var (
	// pgMu serialises every start, stop and removal of a cluster (and so
	// the interrupt handler, which takes it and never gives it back, with
	// all of them), and guards the registry of clusters not yet removed.
	pgMu          sync.Mutex
	pgClusters    = map[*Postgres]struct{}{}
	pgInterrupted bool

	// sharedMu guards the shared cluster; it is held while the first
	// caller starts it.
	sharedMu  sync.Mutex
	sharedPG  *Postgres
	sharedErr error

	// scratchMu guards whether Setup is in force, and the temporary
	// directory before it pointed TMPDIR at its scratch directory.
	scratchMu    sync.Mutex
	scratchOn    bool
	userTempRoot string

	dbSeq atomic.Int64
)

// StartPostgres starts a cluster of the test's own, and stops (as a crash
// would: pg_ctl stop -m immediate) and removes it when the test ends.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	began := time.Now()
	p, err := startCluster(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres: %s on port %d, ready in %v", p.Dir, p.Port, time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("postgres log (%s):\n%s", p.Dir, p.logTail())
		}
		if err := p.remove(); err != nil {
			t.Errorf("postgres: remove the cluster in %s: %v", p.Dir, err)
		}
	})
	return p
}

// SharedPostgres returns the test binary's one shared cluster, started by
// the first call. The package's TestMain must be testenv.Main (or Setup and
// Close), which stops and removes it when the tests are over; tests keep
// apart by each using its own database (NewDatabase).
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	scratchMu.Lock()
	on := scratchOn
	scratchMu.Unlock()
	if !on {
		t.Fatal("testenv.SharedPostgres needs testenv.Main as the package's TestMain " +
			"(func TestMain(m *testing.M) { testenv.Main(m) }): it stops and removes the shared cluster when the tests end")
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedPG == nil && sharedErr == nil {
		began := time.Now()
		sharedPG, sharedErr = startCluster(true)
		if sharedErr == nil {
			t.Logf("postgres (shared): %s on port %d, ready in %v", sharedPG.Dir, sharedPG.Port, time.Since(began).Round(time.Millisecond))
		}
	}
	if sharedErr != nil {
		t.Fatalf("shared postgres: %v", sharedErr)
	}
	return sharedPG
}

// URL is the address of database db for the superuser postgres.
func (p *Postgres) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, url.PathEscape(db))
}

// NewDatabase creates an empty database with a name of its own, drops it
// (WITH (FORCE): open connections are ended) when the test ends, and
// returns its URL.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	name := dbName(t.Name())
	if err := p.admin("CREATE DATABASE " + quoteIdent(name)); err != nil {
		t.Fatalf("postgres: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		pgMu.Lock()
		running := p.running
		pgMu.Unlock()
		if !running {
			if p.shared {
				t.Errorf("postgres: cannot drop database %s: the shared cluster is stopped", name)
			}
			return // a test's own cluster, removed next with everything in it
		}
		if err := p.admin("DROP DATABASE IF EXISTS " + quoteIdent(name) + " WITH (FORCE)"); err != nil {
			t.Errorf("postgres: drop database %s: %v", name, err)
		}
	})
	made.Store(p.URL(name), true)
	return p.URL(name)
}

// made holds the URLs NewDatabase returned.
var made sync.Map

// MadeDatabase reports whether dsn is a PostgreSQL database NewDatabase
// made: what a test helper asks instead of parsing a --db value (the
// store's backend package is the one place that does).
func MadeDatabase(dsn string) bool {
	_, ok := made.Load(dsn)
	return ok
}

// Stop ends the server as a crash would (pg_ctl stop -m immediate: no
// shutdown checkpoint, the next start replays the WAL). A shared cluster
// the test leaves stopped is started again when the test ends.
func (p *Postgres) Stop(t testing.TB) {
	t.Helper()
	pgMu.Lock()
	defer pgMu.Unlock()
	if p.removed || !p.running {
		t.Fatalf("postgres: stop: the server on port %d is not running", p.Port)
	}
	if err := p.stopLocked(); err != nil {
		t.Fatalf("postgres: %v", err)
	}
	if p.shared {
		t.Cleanup(func() {
			pgMu.Lock()
			defer pgMu.Unlock()
			if !p.running && !p.removed {
				if err := p.startLocked(); err != nil {
					t.Errorf("postgres: start the shared cluster the test left stopped: %v", err)
				}
			}
		})
	}
}

// Start starts the server again after Stop, on the same port with the same
// data directory, and returns once it accepts connections.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	pgMu.Lock()
	defer pgMu.Unlock()
	if p.removed || p.running {
		t.Fatalf("postgres: start: the server on port %d is running or removed", p.Port)
	}
	if err := p.startLocked(); err != nil {
		t.Fatalf("postgres: %v", err)
	}
}

// startCluster makes the directory, starts its watchdog, runs initdb and
// starts the server on a free port (another if that one was taken meanwhile).
func startCluster(shared bool) (*Postgres, error) {
	if _, err := os.Stat(filepath.Join(PostgresBin, "initdb")); err != nil {
		return nil, errors.New(pgNotInstalled)
	}
	owner, err := pgOwner()
	if err != nil {
		return nil, err
	}
	dir, err := pgDataDir(owner)
	if err != nil {
		return nil, err
	}
	p := &Postgres{Dir: dir, shared: shared}
	becomeSubreaper()
	pgMu.Lock()
	if pgInterrupted {
		pgMu.Unlock()
		os.RemoveAll(dir)
		return nil, errInterrupted
	}
	if err := p.startWatchdog(); err != nil {
		pgMu.Unlock()
		os.RemoveAll(dir)
		return nil, err
	}
	pgClusters[p] = struct{}{}
	pgMu.Unlock()
	fail := func(err error) (*Postgres, error) {
		if rerr := p.remove(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	// pg_ctl puts the directory in a shell command line, unquoted in -o.
	if !safePath.MatchString(dir) {
		return fail(fmt.Errorf("postgres: the data directory %q has characters pg_ctl cannot pass on: set TMPDIR to a plain path", dir))
	}
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			return fail(fmt.Errorf("postgres: chown %s: %w", dir, err))
		}
	}
	if out, err := pgRun("initdb", "-D", dir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale",
		"--no-sync", "--no-instructions"); err != nil {
		return fail(fmt.Errorf("postgres: initdb %s: %v\n%s", dir, err, out))
	}
	pgMu.Lock()
	defer pgMu.Unlock()
	if p.removed { // interrupted meanwhile
		return nil, errInterrupted
	}
	for attempt := 1; ; attempt++ {
		if p.Port, err = freePort(); err != nil {
			break
		}
		if err = p.startLocked(); err == nil {
			return p, nil
		}
		if attempt == 5 || !strings.Contains(p.logTail(), "Address already in use") {
			break
		}
	}
	if rerr := p.removeLocked(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return nil, err
}

var safePath = regexp.MustCompile(`^[A-Za-z0-9/._+-]+$`)

// startLocked runs pg_ctl start -w: it returns once the server is ready.
func (p *Postgres) startLocked() error {
	sock := p.Dir
	if len(sock)+len("/.s.PGSQL.65535") > 107 { // a Unix socket path's limit: TCP only then
		sock = "''"
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=200 -c fsync=on -c synchronous_commit=on",
		p.Port, sock)
	out, err := pgRun("pg_ctl", "start", "-D", p.Dir, "-l", filepath.Join(p.Dir, "log"), "-w", "-t", fmt.Sprint(int(pgWait.Seconds())), "-o", opts)
	if err != nil {
		return fmt.Errorf("pg_ctl start (port %d) failed: %v\n%s\nserver log:\n%s", p.Port, err, out, p.logTail())
	}
	p.running = true
	return nil
}

// stopLocked runs pg_ctl stop -m immediate -w; if that fails, it kills the
// postmaster (its children notice and exit). Then it reaps the postmaster.
func (p *Postgres) stopLocked() error {
	pid := p.postmasterPID()
	out, err := pgRun("pg_ctl", "stop", "-D", p.Dir, "-m", "immediate", "-w", "-t", fmt.Sprint(int(pgWait.Seconds())))
	if err != nil {
		err = fmt.Errorf("pg_ctl stop (port %d) failed: %v\n%s", p.Port, err, out)
		if pid > 0 {
			if kerr := syscall.Kill(pid, syscall.SIGKILL); kerr == nil {
				err = fmt.Errorf("%w (postmaster %d killed)", err, pid)
			}
		}
	}
	if pid > 0 {
		reap(pid)
	}
	p.running = false
	return err
}

// pg_ctl start leaves the postmaster without a parent once it returns, and
// an orphan goes to the nearest subreaper, else to PID 1, which may be slow
// to reap it: a dead server would linger as a zombie (pgrep lists it). So
// the test process is a subreaper from its first cluster on, and reaps each
// postmaster it stops; a descendant that is not a postmaster and is left
// without its parent stays a zombie of the test process until it exits.
var subreaper sync.Once

func becomeSubreaper() {
	subreaper.Do(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })
}

// reap reaps pid once it has exited if it is this process's child (it is
// someone else's to reap otherwise). pg_ctl stop -w has returned, so the
// postmaster has removed its pid file and is exiting; still, reap waits
// for that (on a pidfd) at most pgWait, and never for a live process.
func reap(pid int) {
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		deadline := time.Now().Add(pgWait)
		for left := time.Until(deadline); left > 0; left = time.Until(deadline) {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
			if n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
				break
			}
		}
		unix.Close(fd)
	}
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}

// remove stops the server, removes the directory and ends the watchdog.
func (p *Postgres) remove() error {
	pgMu.Lock()
	defer pgMu.Unlock()
	return p.removeLocked()
}

func (p *Postgres) removeLocked() error {
	if p.removed {
		return nil
	}
	p.removed = true
	delete(pgClusters, p)
	var err error
	if p.running || p.postmasterPID() > 0 { // also a start that failed half-way
		err = p.stopLocked()
	}
	if rerr := os.RemoveAll(p.Dir); rerr != nil {
		err = errors.Join(err, rerr)
	}
	// The directory is gone: the watchdog wakes, finds nothing and exits.
	p.wdPipe.Close()
	_ = p.watchdog.Wait()
	return err
}

// watchdogScript stops the server and removes the directory ($1) once its
// stdin reaches EOF, which is when this process closes the pipe or dies.
// The rest of its arguments are the pg_ctl command.
const watchdogScript = `d=$1; shift
read -r _
[ -d "$d" ] || exit 0
[ -f "$d/postmaster.pid" ] && "$@" stop -D "$d" -m immediate -w -t 60
rm -rf "$d"`

func (p *Postgres) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("postgres: watchdog pipe: %w", err)
	}
	args := append([]string{"-c", watchdogScript, "pg-watchdog", p.Dir}, pgArgv("pg_ctl")...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Stdin, cmd.Dir, cmd.Env = r, "/", pgEnv()
	// Its own process group: a Ctrl-C or a kill of the test's process
	// group must not end it before it has done its work.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return fmt.Errorf("postgres: start the watchdog: %w", err)
	}
	p.watchdog, p.wdPipe = cmd, w
	return nil
}

// interruptPostgres is for the interrupt handler: it stops and removes
// every cluster, and keeps pgMu so that nothing starts afterwards.
func interruptPostgres() int {
	pgMu.Lock()
	pgInterrupted = true
	n := 0
	for p := range pgClusters {
		if p.running {
			n++
		}
		_ = p.removeLocked()
	}
	return n
}

// closePostgres is for Close: it stops and removes the shared cluster, and
// any other still there (which a test left behind: it is named in left).
func closePostgres() (left []string, err error) {
	scratchMu.Lock()
	scratchOn = false
	scratchMu.Unlock()
	sharedMu.Lock()
	shared := sharedPG
	sharedPG, sharedErr = nil, nil
	sharedMu.Unlock()
	if shared != nil {
		if rerr := shared.remove(); rerr != nil {
			err = fmt.Errorf("postgres: remove the shared cluster in %s: %w", shared.Dir, rerr)
		}
	}
	pgMu.Lock()
	defer pgMu.Unlock()
	for p := range pgClusters {
		left = append(left, fmt.Sprintf("postgres cluster %s (port %d)", p.Dir, p.Port))
		if rerr := p.removeLocked(); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	return left, err
}

// admin runs one statement in the postgres database.
func (p *Postgres) admin(stmt string) error {
	db, err := sql.Open("pgx", p.URL("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pgWait)
	defer cancel()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// postmasterPID is the first line of postmaster.pid, 0 without one.
func (p *Postgres) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(p.Dir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// logTail is the end of the server's log.
func (p *Postgres) logTail() string {
	b, err := os.ReadFile(filepath.Join(p.Dir, "log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

type pgUser struct{ uid, gid int }

// pgOwner is the postgres OS user when running as root, nil otherwise.
func pgOwner() (*pgUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("postgres: running as root needs the postgres OS user (%v): %s", err, pgNotInstalled)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &pgUser{uid, gid}, nil
}

// pgArgv is the command line that runs a PostgreSQL program: as root
// through runuser as the postgres OS user.
func pgArgv(prog string) []string {
	path := filepath.Join(PostgresBin, prog)
	if os.Geteuid() != 0 {
		return []string{path}
	}
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		runuser = "/usr/sbin/runuser"
	}
	return []string{runuser, "-u", "postgres", "--", path}
}

// pgRun runs a PostgreSQL program to its end (pg_ctl start returns once
// the server is ready, the server itself writes only to its log).
func pgRun(prog string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pgWait+10*time.Second)
	defer cancel()
	argv := append(pgArgv(prog), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = "/", pgEnv() // postgres may not be able to enter the test's directory
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}

// pgEnv is the environment without PG* variables, which would otherwise
// point the programs elsewhere.
func pgEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// pgFallbackBases are where a cluster goes when the postgres OS user
// cannot reach $TMPDIR (see pgDataDir), the first whose path it can search.
var pgFallbackBases = []string{"/tmp", "/var/tmp"}

// pgDataDir makes the cluster's directory: a new one under $TMPDIR, which
// as root (owner != nil) the postgres OS user must be able to reach
// (pgReachable). When it cannot, because a directory above the temporary
// directory the test process was given is not searchable by others (as
// with TMPDIR=$(mktemp -d) make test: .ci/gotest's scratch directory is
// inside that private directory), the cluster goes in a new private
// directory under /tmp (or /var/tmp) instead, which startCluster hands to
// postgres; it is stopped and removed like any other (remove, the
// interrupt handler, Close, the watchdog). Nothing above the temporary
// directory is ever changed.
func pgDataDir(owner *pgUser) (string, error) {
	dir, err := os.MkdirTemp("", "pg")
	if err != nil {
		return "", fmt.Errorf("postgres: data directory: %w", err)
	}
	if owner == nil {
		return dir, nil
	}
	err = pgReachable(dir)
	if err == nil {
		return dir, nil
	}
	os.RemoveAll(dir)
	if !errors.Is(err, errPGUnreachable) {
		return "", err
	}
	for _, base := range pgFallbackBases {
		if pgUnsearchable(base) != "" {
			continue
		}
		fallback, ferr := os.MkdirTemp(base, "fleetctl-pg")
		if ferr != nil {
			return "", fmt.Errorf("postgres: data directory: %w (and under %s: %v)", err, base, ferr)
		}
		return fallback, nil
	}
	return "", fmt.Errorf("%w; and none of %s is reachable either", err, strings.Join(pgFallbackBases, ", "))
}

// errPGUnreachable is pgReachable's answer when a directory above the test
// process's temporary directory keeps the postgres OS user out.
var errPGUnreachable = errors.New("not searchable by others")

// pgReachable lets the postgres OS user reach dir: every directory above
// it, up to and including the temporary directory the test process was
// given, gets search permission for group and others (not read: no one
// else can list it). Above that nothing is changed: when a directory there
// is not searchable by others, it returns errPGUnreachable before it
// changes anything.
func pgReachable(dir string) error {
	top := filepath.Clean(pgTempRoot())
	under := func(d string) bool { return d == top || strings.HasPrefix(d, top+string(filepath.Separator)) }
	var open []string
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if !under(d) {
				return fmt.Errorf("postgres: the postgres OS user cannot reach %s: %s is %w", dir, d, errPGUnreachable)
			}
			open = append(open, d)
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	for _, d := range open {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		mode := fi.Mode() & (os.ModePerm | os.ModeSticky | os.ModeSetgid | os.ModeSetuid)
		if err := os.Chmod(d, mode|0o011); err != nil {
			return fmt.Errorf("postgres: let the postgres OS user through %s: %w", d, err)
		}
	}
	return nil
}

// pgUnsearchable is the first directory of dir's path (dir included) that
// others cannot search, "" when there is none and dir is a directory.
func pgUnsearchable(dir string) string {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o001 == 0 {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// pgTempRoot is the temporary directory before Setup pointed TMPDIR at its
// scratch directory.
func pgTempRoot() string {
	scratchMu.Lock()
	defer scratchMu.Unlock()
	if scratchOn {
		return userTempRoot
	}
	return os.TempDir()
}

// dbName is a database name made of the test's name (lower case, letters,
// digits and _, at most 63 bytes) and a number unique in this process.
func dbName(test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	return fmt.Sprintf("t_%s_%d", s, dbSeq.Add(1))
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
