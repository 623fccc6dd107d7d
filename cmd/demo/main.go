// Command demo is `make demo`: broker, controller and a simulated fleet on
// loopback, a batch of operations through injected faults, and a summary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetctl/fleetctl/internal/demo"
)

const usage = `Usage: demo [flags]

Starts Mosquitto, the controller and a simulated fleet on free loopback
ports, prints the dashboard's URL, runs a batch of operations through
injected faults, prints a summary and the task-88 walkthrough (its agent
speaks MCP), then leaves everything running, the dashboard live, until
Ctrl-C (exit 0), and stops everything. With DEMO_EXIT=1 in the
environment it stops right after the walkthrough, for scripts. Run it from the
repository's root (it uses mosquitto/broker.sh). The broker runs the secure
profile: TLS with a CA and certificate made for the run, an account for
every device and for the controller, an ACL that keeps each device to its
own topics.

The run's files (logs, the controller's database, the broker's and the
devices' state) go in a new directory under $TMPDIR (/tmp if unset), which
is removed when the demo ends, also when it fails or is interrupted
(Ctrl-C, SIGTERM or SIGHUP before the walkthrough ends: the demo stops its
processes, removes its files, and exits 130), or when its output goes
away (` + "`demo | tee demo.log`" + ` whose tee is gone: the same, exit 141). If the
demo is killed (kill -9), its processes die with it and a watchdog stops
the broker and removes the files. With --keep, or --dir, the files are
kept and the demo prints where they are.

Flags:
`

func main() {
	cfg := demo.Config{Out: os.Stdout}
	var keep bool
	flag.StringVar(&cfg.Bin, "bin", "bin", "directory holding the controller and devicesim binaries")
	flag.StringVar(&cfg.Dir, "dir", "", "keep the run's files in this directory (created if missing); implies --keep")
	flag.BoolVar(&keep, "keep", false, "keep the run's files when the demo ends (in a new directory under $TMPDIR unless --dir is given) and print where they are")
	flag.IntVar(&cfg.Devices, "devices", 20, "simulated devices")
	flag.IntVar(&cfg.Operations, "operations", 200, "operations to run")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), usage)
		flag.PrintDefaults()
	}
	flag.Parse()
	// Interactive by default: the dashboard stays up until Ctrl-C.
	cfg.Linger = os.Getenv("DEMO_EXIT") != "1"
	if keep && cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "fleetctl-demo-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo failed:", err)
			os.Exit(1)
		}
		cfg.Dir = dir
	}
	keep = cfg.Dir != ""
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	// SIGPIPE is caught (and dropped) so that a write to a closed stdout or
	// stderr returns EPIPE instead of ending the demo before it stops its
	// processes: Run stops when its output fails. Caught, not ignored: an
	// ignored signal would stay ignored in the broker and the fleet.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// Run stops its processes and, unless the files are kept, removes them
	// before it returns, however it ends.
	err := demo.Run(ctx, cfg)
	interrupted := ctx.Err() != nil
	stop()
	if err == nil {
		return
	}
	kept := ""
	if keep {
		kept = "; its files are in " + cfg.Dir
	}
	if interrupted {
		fmt.Fprintf(os.Stderr, "demo interrupted (%v)%s\n", err, kept)
		os.Exit(130)
	}
	if errors.Is(err, syscall.EPIPE) {
		fmt.Fprintf(os.Stderr, "demo stopped: its output is closed (%v)%s\n", err, kept)
		os.Exit(128 + int(syscall.SIGPIPE))
	}
	fmt.Fprintf(os.Stderr, "demo failed: %v%s\n", err, kept)
	if !keep {
		fmt.Fprintln(os.Stderr, "(its files are removed: run it again with --keep to keep the logs and the database)")
	}
	os.Exit(1)
}
