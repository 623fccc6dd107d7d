// Package controller wires the daemon behind `controller serve`: the store,
// the MQTT transport, the receipt ingestor, the dispatcher and sweeper, the
// lease heartbeat and the HTTP API.
package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/lease"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/receipt"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/task"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Config is everything `controller serve` takes.
type Config struct {
	DB            string
	MQTT          string
	HTTP          string
	TopicRoot     string
	AckTimeout    time.Duration
	CommandTTL    time.Duration
	MaxAttempts   int
	Offline       string
	PolicyFile    string
	LeaseTTL      time.Duration
	InstanceID    string
	Tokens        string
	FourEyes      bool
	SweepInterval time.Duration
}

// DefaultConfig holds the contract's defaults.
func DefaultConfig() Config {
	return Config{
		DB: "controller.db", MQTT: "tcp://127.0.0.1:1883", HTTP: "127.0.0.1:8080", TopicRoot: wire.DefaultTopicRoot,
		AckTimeout: 5 * time.Second, CommandTTL: 10 * time.Minute, MaxAttempts: 5, Offline: "wait",
		LeaseTTL: 10 * time.Second, FourEyes: true, SweepInterval: 500 * time.Millisecond,
	}
}

// Validate checks a Config.
func (c Config) Validate() error {
	switch {
	case c.DB == "":
		return errors.New("--db is required")
	case c.InstanceID == "":
		return errors.New("--instance-id is required")
	case !instancePattern.MatchString(c.InstanceID):
		return fmt.Errorf("--instance-id %q: use [A-Za-z0-9._-]{1,64}", c.InstanceID)
	case c.Offline != "wait" && c.Offline != "fail":
		return fmt.Errorf("--offline %q: want wait or fail", c.Offline)
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("--lease-ttl %s: at least 1s", c.LeaseTTL)
	}
	return c.basePolicy().Validate()
}

// basePolicy is the policy the flags give every action.
func (c Config) basePolicy() command.Policy {
	return command.Policy{AckTimeout: c.AckTimeout, MaxAttempts: c.MaxAttempts, TTL: c.CommandTTL, Offline: c.Offline,
		OnUnknown: command.UnknownNeedsAttention, Approval: command.ApprovalNone}
}

var instancePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ErrInstanceRunning: another live process holds this instance id.
var ErrInstanceRunning = errors.New("an instance with this id is already running")

// Controller is one running instance.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	fp      *failpoint.Set
	met     *metrics.Metrics
	store   store.Store
	mqtt    *mqttx.Client
	disp    *command.Dispatcher
	runner  *task.Runner
	api     *api.Server
	lock    *os.File
	httpLn  net.Listener
	mu      sync.Mutex
	connect chan struct{}
}

// New opens the store, takes the instance lock and builds every part; Run
// starts them.
func New(ctx context.Context, cfg Config, log *slog.Logger, stderr io.Writer) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	fp, err := failpoint.FromEnv(failpoint.Known)
	if err != nil {
		return nil, err
	}
	if err := fp.WriteArmed(stderr); err != nil {
		return nil, err
	}
	if cfg.Tokens == "" && !loopback(cfg.HTTP) {
		return nil, fmt.Errorf("--http %s: without --tokens the API listens on loopback only", cfg.HTTP)
	}
	c := &Controller{cfg: cfg, log: log, fp: fp, met: metrics.New(), connect: make(chan struct{}, 1)}
	fp.OnHit(func(name string) { c.met.FailpointHits.WithLabelValues(name).Inc() })

	// The OS lock proves that no other process runs as this instance; the
	// kernel drops it when the holder dies, kill -9 included.
	lockPath := cfg.DB + ".instance-" + cfg.InstanceID + ".lock"
	c.lock, err = os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("instance lock %s: %w", lockPath, err)
	}
	if err := syscall.Flock(int(c.lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		c.lock.Close()
		return nil, fmt.Errorf("instance %q (lock %s): %w", cfg.InstanceID, filepath.Base(lockPath), ErrInstanceRunning)
	}

	c.store, err = store.Open(ctx, store.Config{Path: cfg.DB, Instance: cfg.InstanceID, Observer: c.met})
	if err != nil {
		c.lock.Close()
		return nil, err
	}
	// Whatever this instance held before it restarted is taken over with new tokens.
	n, err := c.store.ReclaimOwn(ctx, cfg.InstanceID, cfg.LeaseTTL)
	if err != nil {
		c.Close()
		return nil, err
	}
	if n > 0 {
		log.Info("reclaimed operations held before restart", "count", n)
	}

	policies, err := command.LoadPolicies(cfg.PolicyFile, cfg.basePolicy())
	if err != nil {
		c.Close()
		return nil, err
	}
	policy := policies.For
	c.mqtt = mqttx.New(mqttx.Config{
		URL: cfg.MQTT, ClientID: "controller-" + cfg.InstanceID, Logger: log,
		Subscriptions: map[string]byte{
			wire.Wildcard(cfg.TopicRoot, wire.KindReceipts): 1,
			wire.Wildcard(cfg.TopicRoot, wire.KindPresence): 1,
		},
		OnConnect: func() {
			select {
			case c.connect <- struct{}{}:
			default:
			}
		},
	})
	c.disp = command.New(command.Config{
		Store: c.store, Publisher: c.mqtt, Instance: cfg.InstanceID, TopicRoot: cfg.TopicRoot, Policy: policy,
		TrustMargin: lease.TrustMargin(cfg.LeaseTTL), SweepInterval: cfg.SweepInterval, Failpoints: fp, Metrics: c.met,
		Logger: log, Changed: func(id string) { c.api.Changed(id) },
	})
	var auth *api.Auth
	if cfg.Tokens != "" {
		if auth, err = api.LoadTokens(cfg.Tokens); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.api = api.New(api.Config{
		Store: c.store, Instance: cfg.InstanceID, Policy: policy, LeaseTTL: cfg.LeaseTTL, Failpoints: fp,
		Logger: log, Metrics: c.met.Handler(), Submitted: c.disp.Kick, Auth: auth, FourEyes: cfg.FourEyes,
	})
	c.runner = task.New(task.Config{Store: c.store, API: c.api, Instance: cfg.InstanceID, EnforceGrants: auth.Enabled(),
		Failpoints: fp, Kick: c.disp.Kick, Interval: cfg.SweepInterval, Logger: log})
	c.httpLn, err = net.Listen("tcp", cfg.HTTP)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("listen %s: %w", cfg.HTTP, err)
	}
	return c, nil
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// HTTPAddr is the address the API listens on.
func (c *Controller) HTTPAddr() string { return c.httpLn.Addr().String() }

// Run serves until ctx ends, then shuts down in order.
func (c *Controller) Run(ctx context.Context) error {
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	srv := &http.Server{Handler: c.api, ReadHeaderTimeout: 10 * time.Second}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(c.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("http server", "err", err)
			cancel()
		}
	}()
	c.log.Info("controller serving", "http", c.HTTPAddr(), "mqtt", c.cfg.MQTT, "instance", c.cfg.InstanceID, "db", c.cfg.DB)

	if err := c.mqtt.Start(ctx); err != nil {
		return err
	}
	ing := receipt.New(receipt.Config{
		Store: c.store, Source: c.mqtt, TopicRoot: c.cfg.TopicRoot, Failpoints: c.fp, Metrics: c.met, Logger: c.log,
		OnReceipt: func(out store.ReceiptOutcome) {
			if out.OperationID != "" {
				c.api.Changed(out.OperationID)
			}
			if out.Unknown && out.CommandID != "" {
				c.disp.Kick(out.CommandID) // the device never saw it: the holder decides what follows
			}
		},
		OnPresence: func(out store.PresenceOutcome) { c.disp.DeviceChanged(ctx, out.Device.DeviceID) },
	})
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	run(func() { ing.Run(ctx) })
	run(func() { c.disp.Run(ctx) })
	keeper := lease.New(lease.Config{Store: c.store, Instance: c.cfg.InstanceID, TTL: c.cfg.LeaseTTL,
		Failpoints: c.fp, Metrics: c.met, Logger: c.log})
	run(func() { keeper.Run(ctx) })
	run(func() { c.runner.Run(ctx) })
	run(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.connect:
				if err := c.store.UnconfirmAll(ctx); err != nil && ctx.Err() == nil {
					c.log.Error("unconfirm devices", "err", err)
				}
				c.disp.Reconcile(ctx)
			}
		}
	})

	<-ctx.Done()
	shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	_ = srv.Shutdown(shutdown)
	c.mqtt.Stop()
	wg.Wait()
	c.log.Info("controller stopped")
	return nil
}

// Close releases the store and the instance lock.
func (c *Controller) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.httpLn != nil {
		c.httpLn.Close()
		c.httpLn = nil
	}
	if c.store != nil {
		c.store.Close()
		c.store = nil
	}
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
}
