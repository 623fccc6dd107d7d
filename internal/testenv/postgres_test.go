package testenv

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestMain is Main, which SharedPostgres needs. With TESTENV_PG_CHILD=1
// the test binary is instead a process that starts a cluster and is killed
// (TestPostgresIsRemovedWhenTheTestProcessIsKilled).
func TestMain(m *testing.M) {
	if os.Getenv("TESTENV_PG_CHILD") == "1" {
		killedWithACluster()
	}
	Main(m)
}

// The shared cluster: one per test binary; two databases of one test are
// apart; the server commits synchronously with fsync on; a commit survives
// a crash (pg_ctl stop -m immediate) and a restart; the test's cleanup
// drops its databases.
func TestSharedPostgresDatabasesAreApartDurableAndDropped(t *testing.T) {
	p := SharedPostgres(t)
	require.Same(t, p, SharedPostgres(t), "one cluster per test binary")
	require.Equal(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x?sslmode=disable", p.Port), p.URL("x"))

	var names []string
	t.Run("crash and restart", func(t *testing.T) {
		a, b := p.NewDatabase(t), p.NewDatabase(t)
		require.NotEqual(t, a, b)
		dbA, dbB := openPG(t, a), openPG(t, b)
		ctx := pgCtx(t)

		_, err := dbA.ExecContext(ctx, `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)`)
		require.NoError(t, err)
		_, err = dbA.ExecContext(ctx, `INSERT INTO items VALUES (1, 'kept')`)
		require.NoError(t, err)
		require.Equal(t, "kept", itemName(t, dbA))

		var tables int
		require.NoError(t, dbB.QueryRowContext(ctx,
			`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
		require.Zero(t, tables, "the second database has none of the first one's tables")

		for _, setting := range []string{"synchronous_commit", "fsync"} {
			var v string
			require.NoError(t, dbA.QueryRowContext(ctx, "SHOW "+setting).Scan(&v))
			require.Equal(t, "on", v, setting)
		}
		for _, db := range []*sql.DB{dbA, dbB} {
			var name string
			require.NoError(t, db.QueryRowContext(ctx, `SELECT current_database()`).Scan(&name))
			names = append(names, name)
		}

		p.Stop(t)
		require.Error(t, dbA.PingContext(ctx), "the server is down after Stop")
		p.Start(t)
		require.Equal(t, "kept", itemName(t, openPG(t, a)), "a committed row survives a crash and a restart")
	})

	var left int
	require.NoError(t, openPG(t, p.URL("postgres")).QueryRowContext(pgCtx(t),
		`SELECT count(*) FROM pg_database WHERE datname = ANY($1)`, names).Scan(&left))
	require.Len(t, names, 2)
	require.Zero(t, left, "the test's cleanup dropped %v", names)
}

// A test's own cluster is stopped and its directory removed when the test
// ends.
func TestStartPostgresRemovesItsClusterWhenTheTestEnds(t *testing.T) {
	var dir string
	var postmaster int
	t.Run("own cluster", func(t *testing.T) {
		p := StartPostgres(t)
		require.NotSame(t, p, SharedPostgres(t))
		dir = p.Dir
		pid := p.postmasterPID()
		require.Positive(t, pid)
		postmaster = openPidfd(t, pid)
		require.NoError(t, openPG(t, p.NewDatabase(t)).PingContext(pgCtx(t)))
	})
	waitExited(t, postmaster, "the postmaster")
	_, err := os.Stat(dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "the data directory is removed")
}

// As root, with TMPDIR inside a private directory (TMPDIR=$(mktemp -d) make
// test: .ci/gotest's scratch directory, the test process's temporary
// directory, is inside a 0700 directory the postgres OS user cannot
// search), a cluster starts in a private directory of postgres's under
// /tmp instead, the private directory untouched, and is removed when the
// test ends.
//
// Not as root the programs run as the test's own user, who reaches its
// private directory: the cluster then only has to start and be removed.
func TestPostgresStartsWhenTMPDIRIsPrivate(t *testing.T) {
	asRoot := os.Geteuid() == 0
	private, err := os.MkdirTemp("", "private") // 0700, as mktemp -d makes it
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(private) })
	tmp := filepath.Join(private, "fct")
	require.NoError(t, os.Mkdir(tmp, 0o700))
	t.Setenv("TMPDIR", tmp)
	// The temporary directory testenv.Setup found, as it would in that test process.
	scratchMu.Lock()
	root := userTempRoot
	userTempRoot = tmp
	scratchMu.Unlock()
	t.Cleanup(func() {
		scratchMu.Lock()
		userTempRoot = root
		scratchMu.Unlock()
	})

	var dir string
	var postmaster int
	t.Run("own cluster", func(t *testing.T) {
		p := StartPostgres(t)
		dir = p.Dir
		postmaster = openPidfd(t, p.postmasterPID())
		require.NoError(t, openPG(t, p.NewDatabase(t)).PingContext(pgCtx(t)))
		if !asRoot {
			return
		}
		require.False(t, strings.HasPrefix(dir, private+"/"), "the cluster is not under the private %s: %s", private, dir)
		fi, err := os.Stat(dir)
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "%s is private", dir)
		owner, err := pgOwner()
		require.NoError(t, err)
		require.Equal(t, uint32(owner.uid), fi.Sys().(*syscall.Stat_t).Uid, "%s belongs to postgres", dir)
	})
	waitExited(t, postmaster, "the postmaster")
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "the data directory is removed")
	for _, d := range []string{private, tmp} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "%s is left as it was", d)
	}
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing is left in TMPDIR")
}

// A test process that dies without any cleanup (SIGKILL; a panic and the
// -timeout of go test are the same to it) leaves nothing behind either:
// the watchdog stops the server and removes its directory.
func TestPostgresIsRemovedWhenTheTestProcessIsKilled(t *testing.T) {
	becomeSubreaper() // the child's orphans come to this process: reaped below
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TESTENV_PG_CHILD=1", "TESTENV_PG_TEMPROOT="+pgTempRoot())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})

	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "child: %s", stderr.String())
	var dir string
	var postmaster, watchdog int
	_, err = fmt.Sscanf(line, "%s %d %d", &dir, &postmaster, &watchdog)
	require.NoError(t, err, "child said %q", line)
	pmFD, wdFD := openPidfd(t, postmaster), openPidfd(t, watchdog)
	_, err = os.Stat(dir)
	require.NoError(t, err)

	require.NoError(t, stdin.Close()) // the child kills itself
	err = cmd.Wait()
	waited = true
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	ws, _ := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child: %v\n%s", err, stderr.String())

	waitExited(t, pmFD, "the postmaster of the killed process")
	waitExited(t, wdFD, "the watchdog")
	reap(postmaster)
	reap(watchdog)
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "the watchdog removed the data directory")
}

// killedWithACluster starts a cluster, says where it is, and kills itself
// by SIGKILL once its stdin is closed: no cleanup of any kind runs.
func killedWithACluster() {
	scratchMu.Lock()
	scratchOn, userTempRoot = true, os.Getenv("TESTENV_PG_TEMPROOT") // reach its directory as the parent would
	scratchMu.Unlock()
	p, err := startCluster(false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("%s %d %d\n", p.Dir, p.postmasterPID(), p.watchdog.Process.Pid)
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestDatabaseNamesAreValidAndUnique(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	long := strings.Repeat("TestAVeryLongName/with subtests and spaces", 5)
	a, b := dbName(long), dbName(long)
	require.NotEqual(t, a, b)
	for _, n := range []string{a, b, dbName("T/é x")} {
		require.Regexp(t, valid, n)
	}
}

func openPG(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func itemName(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	require.NoError(t, db.QueryRowContext(pgCtx(t), `SELECT name FROM items WHERE id = 1`).Scan(&name))
	return name
}

func pgCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openPidfd opens a pidfd of a process that need not be a child, to wait
// for its end; -1 if it has already ended.
func openPidfd(t *testing.T, pid int) int {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return -1
	}
	require.NoError(t, err, "pidfd_open %d", pid)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// waitExited waits up to 30 s for the process behind a pidfd to end (the
// pidfd becomes readable).
func waitExited(t *testing.T, fd int, what string) {
	t.Helper()
	if fd < 0 {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%s is still running after 30 s", what)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		require.NoError(t, err)
		if n > 0 {
			return
		}
	}
}
