// Command bench is `make bench`: it measures the controller beside the
// pass-through (the same job with no database) in one run on one broker
// and one fleet, and writes bench/out/latest.json and latest.html (see
// internal/bench). `bench passthrough` is the pass-through itself, which
// the run starts as a process of its own.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/fleetctl/fleetctl/internal/bench"
)

const usage = `Usage: bench [flags]

       bench passthrough --mqtt URL [--http ADDR] [--topic-root R] [--client-id ID] [--log FILE]

Starts its own Mosquitto (from mosquitto/anonymous-loopback.conf.tmpl, on a free
loopback port, in a temporary directory removed at the end) and measures,
one phase after another: the MQTT-only ceiling (a plain client and an
in-memory fleet, a reference), then devicesim's N devices, the fleet of
every phase that follows (the plain client on them first, a reference); the
pass-through (this program's "passthrough" mode, its own process: the two
routes of the load client, one QoS 1 command per operation, no database)
saturated; the controller saturated and at half that rate R; the
pass-through at R; the durable floor at R (a reference: the pass-through
with --log, syncing each command and final receipt to a file before it
answers); the controller on a fresh database with every action serial,
saturated. One HTTP load client drives every target. It prints a
table and writes latest.json and latest.html in --out. Run it from the
repository's root.

Environment (the flags win): BENCH_DEVICES (default 100), BENCH_SECONDS (each
measured phase, default 10; seconds or a Go duration), BENCH_DB (an SQLite
file, kept; or a postgres:// URL, passed to the controller's --db as is;
default a temporary file), BENCH_CONCURRENCY (default 256), BENCH_INSTANCES
(controller processes in the controller phases, default 1: bench-1..bench-N,
each its own HTTP port on the same --db and broker, operation k submitted to
instance k%N and waited for there; more than 1 needs a postgres:// BENCH_DB),
BENCH_NAME (also write NAME.json and NAME.html in --out), BENCH_PROFILE (set:
write a CPU profile of each controller phase in --out),
BENCH_FLEET_DIR (where devicesim keeps its devices' files, in a directory
made and removed by the run; default /dev/shm when it is a tmpfs, so that
the fleet's fsyncs do not share the controller's disk).

Flags:
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "passthrough" {
		os.Exit(bench.PassthroughMain(os.Args[2:], os.Stderr))
	}
	cfg := bench.Config{Out: os.Stdout, Log: os.Stderr}
	devices, err := envInt("BENCH_DEVICES", bench.DefaultDevices)
	exitOn(err)
	window, err := envSeconds("BENCH_SECONDS", bench.DefaultWindow)
	exitOn(err)
	conc, err := envInt("BENCH_CONCURRENCY", bench.DefaultConcurrency)
	exitOn(err)
	instances, err := envInt("BENCH_INSTANCES", 1)
	exitOn(err)
	flag.StringVar(&cfg.Bin, "bin", "bin", "directory holding the controller and devicesim binaries")
	flag.StringVar(&cfg.OutDir, "out", "bench/out", "directory for latest.json and latest.html")
	flag.StringVar(&cfg.Mosquitto, "mosquitto", bench.DefaultMosquitto, "the Mosquitto binary")
	flag.StringVar(&cfg.BrokerTemplate, "broker-config", "mosquitto/anonymous-loopback.conf.tmpl", "the broker config template")
	flag.IntVar(&cfg.Devices, "devices", devices, "devices (env BENCH_DEVICES)")
	flag.DurationVar(&cfg.Window, "seconds", window, "length of each measured phase (env BENCH_SECONDS)")
	flag.IntVar(&cfg.Concurrency, "concurrency", conc, "callers in flight in the closed loops (env BENCH_CONCURRENCY)")
	flag.StringVar(&cfg.FleetDir, "fleet-dir", os.Getenv("BENCH_FLEET_DIR"), "where devicesim keeps its devices' files, in a directory made and removed by the run (env BENCH_FLEET_DIR; default /dev/shm when it is a tmpfs)")
	flag.StringVar(&cfg.DB, "db", os.Getenv("BENCH_DB"), "the controller's --db (env BENCH_DB; default a temporary SQLite file)")
	flag.IntVar(&cfg.Instances, "instances", instances, "controller processes sharing the --db (env BENCH_INSTANCES; more than 1 needs postgres://)")
	flag.StringVar(&cfg.Doc, "doc", os.Getenv("BENCH_DOC"), "also write the figures as a Markdown page of the docs (env BENCH_DOC)")
	flag.StringVar(&cfg.Name, "name", os.Getenv("BENCH_NAME"), "also write NAME.json and NAME.html in --out (env BENCH_NAME)")
	flag.StringVar(&cfg.TopicRoot, "topic-root", "fleet", "MQTT topic root")
	flag.BoolVar(&cfg.Profile, "profile", os.Getenv("BENCH_PROFILE") != "", "write a CPU profile of each controller phase in --out (env BENCH_PROFILE)")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), usage)
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	start := time.Now()
	_, err = bench.Run(ctx, cfg)
	interrupted := ctx.Err() != nil
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if interrupted {
			os.Exit(130)
		}
		os.Exit(1)
	}
	also := ""
	if cfg.Name != "" {
		also = fmt.Sprintf(", %s.json and %s.html", cfg.Name, cfg.Name)
	}
	fmt.Fprintf(os.Stderr, "bench: done in %s; wrote %s/latest.json and latest.html%s\n", time.Since(start).Round(time.Second), cfg.OutDir, also)
}

func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}

// envSeconds reads seconds ("10", "2.5") or a Go duration ("90s").
func envSeconds(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second)), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	return 0, fmt.Errorf("%s=%q: want seconds or a Go duration", name, v)
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
}
