// Command demo is `make demo`: broker, controller and a simulated fleet on
// loopback, a batch of operations through injected faults, and a summary.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fleetctl/fleetctl/internal/demo"
)

func main() {
	cfg := demo.Config{Out: os.Stdout}
	flag.StringVar(&cfg.Bin, "bin", "bin", "directory holding the controller and devicesim binaries")
	flag.StringVar(&cfg.Dir, "dir", "", "working directory (default demo-run/<time>)")
	flag.IntVar(&cfg.Devices, "devices", 20, "simulated devices")
	flag.IntVar(&cfg.Operations, "operations", 200, "operations to run")
	flag.Parse()
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join("demo-run", time.Now().UTC().Format("20060102-150405"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
