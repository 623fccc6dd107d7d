// Command devicesim runs a fleet of simulated devices against an MQTT
// broker, with fault injection. See "devicesim run --help" and the
// documentation of package internal/sim.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	if err := newRootCmd(os.Stdout, os.Stderr).ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}
