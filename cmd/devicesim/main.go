// Command devicesim runs a fleet of simulated devices against an MQTT
// broker, with fault injection. See "devicesim run --help" and the
// documentation of package internal/sim.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runMain runs one command line and returns the process exit status: 0, 1
// for a failed run, 2 for a usage error (package cmdline).
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cmdline.Exit(stderr, cmdline.Execute(ctx, newRootCmd(stdout, stderr), args, stdout, stderr))
}
