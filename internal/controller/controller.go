// Package controller wires the daemon behind `controller serve`: the store,
// the MQTT transport, the receipt ingestor, the dispatcher and sweeper, the
// lease heartbeat and the HTTP API.
package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/feed"
	"github.com/fleetctl/fleetctl/internal/lease"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/peers"
	"github.com/fleetctl/fleetctl/internal/receipt"
	"github.com/fleetctl/fleetctl/internal/rollout"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/task"
	"github.com/fleetctl/fleetctl/internal/ui"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Config is everything `controller serve` takes.
type Config struct {
	DB          string
	MQTT        string
	HTTP        string
	TopicRoot   string
	AckTimeout  time.Duration
	CommandTTL  time.Duration
	MaxAttempts int
	Offline     string
	PolicyFile  string
	LeaseTTL    time.Duration
	InstanceID  string
	Tokens      string
	FourEyes    bool
	// MaxCommandBytes bounds an encoded command (413 too_large at submit).
	MaxCommandBytes int
	SweepInterval   time.Duration
	// MQTTUser and MQTTPasswordFile log in to the broker (the secure
	// profile); the user defaults to controller-{instance_id} when a
	// password file is given. MQTTCA is the CA PEM for ssl:// URLs.
	MQTTUser, MQTTPasswordFile, MQTTCA string
	// ReceiptRate is each device's receipts a second (--receipt-rate),
	// with a burst of twice that; 0 turns the limit off. Presence has a
	// bucket of its own (receipt.DefaultPresenceRate).
	ReceiptRate float64
	// HTTPHosts are more names the API answers to (--http-host), besides
	// its listen address.
	HTTPHosts []string
}

// DefaultConfig holds the contract's defaults.
func DefaultConfig() Config {
	return Config{
		DB: "controller.db", MQTT: "tcp://127.0.0.1:1883", HTTP: "127.0.0.1:8080", TopicRoot: wire.DefaultTopicRoot,
		AckTimeout: 5 * time.Second, CommandTTL: 10 * time.Minute, MaxAttempts: 5, Offline: "wait",
		LeaseTTL: 10 * time.Second, FourEyes: true, SweepInterval: 500 * time.Millisecond, MaxCommandBytes: ops.DefaultMaxCommandBytes,
		ReceiptRate: 50,
	}
}

// Validate checks a Config.
func (c Config) Validate() error {
	brokerErr := mqttx.CheckURL(c.MQTT)
	switch {
	case c.DB == "":
		return errors.New("--db is required")
	case c.InstanceID == "":
		return errors.New("--instance-id is required")
	case !wire.IDChars(c.InstanceID, 64, false):
		return fmt.Errorf("--instance-id %q: use [A-Za-z0-9._-]{1,64}", c.InstanceID)
	case c.Offline != "wait" && c.Offline != "fail":
		return fmt.Errorf("--offline %q: want wait or fail", c.Offline)
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("--lease-ttl %s: at least 1s", c.LeaseTTL)
	case c.MaxCommandBytes < 1024 || c.MaxCommandBytes > wire.MaxPayload:
		return fmt.Errorf("--max-command-bytes %d: between 1024 and %d (what devices accept)", c.MaxCommandBytes, wire.MaxPayload)
	case brokerErr != nil:
		return fmt.Errorf("--mqtt %q: %v", c.MQTT, brokerErr)
	case c.MQTTCA != "" && !tlsURL(c.MQTT):
		return fmt.Errorf("--mqtt-ca is for ssl:// broker URLs; %s is plain TCP", c.MQTT)
	case c.ReceiptRate < 0:
		return fmt.Errorf("--receipt-rate %g: receipts a second per device, 0 for no limit", c.ReceiptRate)
	}
	if _, err := api.NewHostPolicy(c.HTTP, c.HTTPHosts); err != nil {
		return fmt.Errorf("--http %s, --http-host: %w", c.HTTP, err)
	}
	return c.basePolicy().Validate()
}

// tlsURL: a broker URL that paho dials with TLS.
func tlsURL(u string) bool {
	scheme, _, _ := strings.Cut(u, "://")
	return wire.TLSScheme(scheme)
}

// mqttLogin returns the broker user name, password and TLS configuration
// the flags give: the password from its file (one trailing newline
// trimmed), the user controller-{instance_id} unless named.
func (c Config) mqttLogin() (user, password string, tc *tls.Config, err error) {
	user = c.MQTTUser
	if c.MQTTPasswordFile != "" {
		b, err := os.ReadFile(c.MQTTPasswordFile)
		if err != nil {
			return "", "", nil, fmt.Errorf("--mqtt-password-file: %w", err)
		}
		password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if password == "" {
			return "", "", nil, fmt.Errorf("--mqtt-password-file %s is empty", c.MQTTPasswordFile)
		}
		if user == "" {
			user = "controller-" + c.InstanceID
		}
	}
	if c.MQTTCA != "" {
		if tc, err = mqttx.ClientTLS(c.MQTTCA); err != nil {
			return "", "", nil, fmt.Errorf("--mqtt-ca: %w", err)
		}
	}
	return user, password, tc, nil
}

// basePolicy is the policy the flags give every action.
func (c Config) basePolicy() command.Policy {
	return command.Policy{AckTimeout: c.AckTimeout, MaxAttempts: c.MaxAttempts, TTL: c.CommandTTL, Offline: c.Offline,
		OnUnknown: command.UnknownNeedsAttention, Approval: command.ApprovalNone,
		Concurrency: command.ConcurrencyParallel}
}

// ErrInstanceRunning: another live process holds this instance id.
var ErrInstanceRunning = store.ErrInstanceRunning

// Controller is one running instance: every part is built by New, Run
// starts them under one errgroup (the first error stops them all).
type Controller struct {
	cfg    Config
	log    *slog.Logger
	store  store.Store
	mqtt   *mqttx.Client
	ingest *receipt.Ingestor
	disp   *command.Dispatcher
	keeper *lease.Keeper
	runner *task.Runner
	sched  *rollout.Scheduler
	api    *api.Server
	http   *http.Server
	inst   *store.Instance
	bus    *events.Bus
	feed   *feed.Feed      // the store's facts, routed by route
	peers  *peers.Division // nil: this instance applies every receipt
	probe  *receiptProbe
	gauges *stateGauges // controller_operations{status}, controller_commands{status}
	remote chan string  // operations other instances finished, for the bus
	httpLn net.Listener
	ready  chan struct{}
	close  sync.Once
}

// New takes the instance lock, opens the store and builds every part; Run
// starts them. On error nothing stays open.
func New(ctx context.Context, cfg Config, log *slog.Logger, stderr io.Writer) (_ *Controller, err error) {
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
	var auth *api.Auth
	if cfg.Tokens != "" {
		if auth, err = api.LoadTokens(cfg.Tokens); err != nil {
			return nil, err
		}
	}
	policies, err := command.LoadPolicies(cfg.PolicyFile, cfg.basePolicy())
	if err != nil {
		return nil, err
	}
	met := metrics.New()
	fp.OnHit(func(name string) { met.FailpointHits.WithLabelValues(name).Inc() })
	c := &Controller{cfg: cfg, log: log, ready: make(chan struct{}), remote: make(chan string, 1024)}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()

	// The dashboard's event stream. The store counts each change for the
	// metrics and publishes it, with every wake-up it computes, into the
	// feed, which route sends to the services once they all exist (the
	// facts before that, a reclaim's, are kept for it).
	c.bus = events.New(events.Config{First: uint64(time.Now().UnixMicro())})
	met.Registry.MustRegister(c.bus.Collectors()...)
	c.feed = feed.New()
	db, err := backend.Open(ctx, store.Config{Path: cfg.DB, Instance: cfg.InstanceID, Observer: met, Feed: c.feed,
		BeforeListMove: func() error { return fp.Hit(failpoint.BeforeDeviceListMove) }})
	if err != nil {
		return nil, err
	}
	c.store = db
	met.CountRoundTrips(db.RoundTrips)
	c.gauges = &stateGauges{count: db.CountByStatus, ops: met.Operations, cmds: met.Commands, log: log, every: stateRefresh}
	// The instance lock (an flock beside an SQLite file, a session advisory
	// lock in PostgreSQL) proves that no other process runs as this
	// instance; it is dropped when the holder dies, kill -9 included.
	if c.inst, err = db.LockInstance(ctx, cfg.InstanceID); err != nil {
		return nil, err
	}
	// Whatever this instance held before it restarted is taken over with new tokens.
	n, err := reclaim(ctx, c.store, cfg.InstanceID, cfg.LeaseTTL)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		log.Info("reclaimed operations held before restart", "count", n)
	}

	policy := policies.For
	// With a database of one writer (SQLite) one instance applies every
	// receipt, from a persistent session that keeps them while it is away.
	// When several instances may share the database (the backend's
	// SharedWriters, PostgreSQL): each subscribes to every receipt
	// with a clean session and applies those of the devices it owns
	// (package peers: a division the controllers compute, not a broker's
	// shared group that any device account could join); a receipt lost
	// with a dying instance is found again by the query path (the lease's
	// taker-over asks first). Presence goes to every instance: its rank
	// makes all but the first application stale.
	receipts := wire.Wildcard(cfg.TopicRoot, wire.KindReceipts)
	caps := db.Capabilities()
	shared := caps.SharedWriters
	if shared {
		c.peers = peers.New(peers.Config{Self: cfg.InstanceID, Store: db, Logger: log})
		db.SetAlone(c.peers.Alone)
		met.ShowDivision(func() int { return len(c.peers.Members()) }, c.peers.Overlapping)
	} else {
		met.ShowDivision(func() int { return 1 }, func() int { return 0 }) // one instance applies every receipt
	}
	c.probe = newReceiptProbe(wire.Topic(cfg.TopicRoot, "controller-"+cfg.InstanceID, wire.KindReceipts), met, log)
	mqttUser, mqttPassword, mqttTLS, err := cfg.mqttLogin()
	if err != nil {
		return nil, err
	}
	if mqttPassword != "" && !tlsURL(cfg.MQTT) && !loopbackURL(cfg.MQTT) {
		log.Warn("the MQTT password goes over plain TCP to a host off loopback: use an ssl:// URL", "mqtt", cfg.MQTT)
	}
	// A lost broker connection, by cause (mqttx.Loss): session_taken_over
	// says another client connected with this instance's client id.
	lost := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "controller_mqtt_connections_lost_total",
		Help: "Broker connections lost, by cause (session_taken_over, closed_by_broker, error), counted at the reconnect.",
	}, []string{"cause"})
	for _, l := range []mqttx.Loss{mqttx.LossTakenOver, mqttx.LossClosed, mqttx.LossError} {
		lost.WithLabelValues(string(l))
	}
	met.Registry.MustRegister(lost)
	c.mqtt = mqttx.New(mqttx.Config{
		URL: cfg.MQTT, ClientID: "controller-" + cfg.InstanceID, Logger: log, CleanSession: shared,
		Username: mqttUser, Password: mqttPassword, TLS: mqttTLS,
		OnLoss: func(l mqttx.Loss) { lost.WithLabelValues(string(l)).Inc() },
		Subscriptions: map[string]byte{
			receipts: 1,
			wire.Wildcard(cfg.TopicRoot, wire.KindPresence): 1,
		},
	})
	c.disp = command.New(command.Config{
		Store: c.store, Publisher: c.mqtt, Instance: cfg.InstanceID, TopicRoot: cfg.TopicRoot, Policy: policy,
		TrustMargin: lease.TrustMargin(cfg.LeaseTTL), SweepInterval: cfg.SweepInterval, Failpoints: fp, Metrics: met,
		Logger: log,
	})
	svc := ops.New(ops.Config{
		Store: c.store, Instance: cfg.InstanceID, LeaseTTL: cfg.LeaseTTL, Policy: policy, Failpoints: fp,
		EnforceGrants: auth.Enabled(), FourEyes: cfg.FourEyes && auth.Enabled(), MaxCommandBytes: cfg.MaxCommandBytes,
	})
	if c.httpLn, err = net.Listen("tcp", cfg.HTTP); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.HTTP, err)
	}
	// The Host rule knows the port as bound (--http 127.0.0.1:0 included).
	listenHost, _, _ := net.SplitHostPort(cfg.HTTP)
	_, boundPort, _ := net.SplitHostPort(c.httpLn.Addr().String())
	hosts, err := api.NewHostPolicy(net.JoinHostPort(listenHost, boundPort), cfg.HTTPHosts)
	if err != nil {
		return nil, err
	}
	// Other instances' changes: with the backend's Notifications
	// (PostgreSQL's NOTIFY) their wake-ups arrive by notification and
	// polling is the rare fallback; instances sharing an SQLite file have
	// only the polling.
	waitPoll := 250 * time.Millisecond
	if caps.Notifications {
		waitPoll = 2 * time.Second
	}
	// Rollouts: the service for the API, the scheduler that drives them
	// under a lease per rollout, re-checking four-eyes and grants before
	// each start.
	fourEyes := cfg.FourEyes && auth.Enabled()
	c.sched = rollout.NewScheduler(rollout.SchedulerConfig{Store: c.store, Ops: svc, Policy: policy, Instance: cfg.InstanceID,
		LeaseTTL: cfg.LeaseTTL, Checks: store.RolloutChecks{EnforceGrants: auth.Enabled(), FourEyes: fourEyes},
		Metrics: rollout.NewMetrics(met.Registry, c.store), Logger: log})
	rollouts := rollout.NewService(rollout.Config{Store: c.store, Ops: svc, Policy: policy, Instance: cfg.InstanceID,
		LeaseTTL: cfg.LeaseTTL, FourEyes: fourEyes})
	c.api = api.New(api.Config{Service: svc, Store: c.store, Instance: cfg.InstanceID, Logger: log,
		Metrics: met.Handler(), Auth: auth, Failpoints: fp, Hosts: hosts, WaitPoll: waitPoll,
		Events: c.bus, UI: ui.Handler(), Rollouts: rollouts, Health: db.Err,
		Refused: func(reason string) { met.InputRefused(metrics.SourceHTTP, reason) }})
	// /mcp: the MCP tools, each a request to this API in process as the caller.
	c.api.MountMCP(mcpserver.HTTPHandler(mcpserver.HTTPConfig{Addr: c.HTTPAddr, Logger: log, API: c.api}))
	c.http = &http.Server{Handler: c.api, ReadHeaderTimeout: 10 * time.Second}
	c.http.RegisterOnShutdown(c.bus.Close) // the streams end, so Shutdown finds their connections idle
	c.ingest = receipt.New(receipt.Config{
		Store: c.store, Source: c.mqtt, TopicRoot: cfg.TopicRoot, Failpoints: fp, Metrics: met, Logger: log,
		ReceiptRate: receipt.ReceiptRate(cfg.ReceiptRate), PresenceRate: receipt.DefaultPresenceRate,
		GroupReceipts: caps.GroupReceipts, Linger: receipt.DefaultLinger, Owns: c.owns(), ProbeTopic: c.probe.topic,
		OnProbe: c.probe.arrived,
	})
	c.keeper = lease.New(lease.Config{Store: c.store, Instance: cfg.InstanceID, TTL: cfg.LeaseTTL,
		Failpoints: fp, Metrics: met, Logger: log})
	c.runner = task.New(task.Config{Store: c.store, Ops: svc, Instance: cfg.InstanceID, EnforceGrants: auth.Enabled(),
		Failpoints: fp, Interval: cfg.SweepInterval, LeaseTTL: cfg.LeaseTTL, Logger: log})
	// Every consumer of the store's facts exists from here on
	// (feed.Consumers.Route says which fact goes where).
	c.feed.Route((&feed.Consumers{Waiters: c.api, Dispatcher: c.disp, Scheduler: c.sched, Tasks: c.runner, Stream: c.bus,
		Remote: c.remoteEvent, Logger: log}).Route)
	return c, nil
}

// owns is the ingestor's rule for which devices' receipts this instance
// applies: all of them, unless instances divide them.
func (c *Controller) owns() func(device string) bool {
	if c.peers == nil {
		return nil
	}
	return c.peers.Owns
}

// reclaim takes over what this instance held before it restarted, trying
// again for a while when the shared transaction fails (with PostgreSQL, a
// deadlock with another instance's batch, or the server restarting).
func reclaim(ctx context.Context, st store.Store, instance string, ttl time.Duration) (int64, error) {
	deadline := time.Now().Add(30 * time.Second)
	delay := 100 * time.Millisecond
	for {
		n, err := st.ReclaimOwn(ctx, instance, ttl)
		var be *store.BatchError
		if err == nil || !errors.As(err, &be) || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// loopbackURL: a broker URL whose host is a loopback address.
func loopbackURL(u string) bool {
	_, hostport, _ := strings.Cut(u, "://")
	hostport, _, _ = strings.Cut(hostport, "/")
	return loopback(hostport)
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

// Ready is closed once every part runs: the API serves and the first
// broker connection is up.
func (c *Controller) Ready() <-chan struct{} { return c.ready }

// Run serves until ctx ends or a part fails (its error is returned), then
// stops every part and closes the store and the lock.
func (c *Controller) Run(ctx context.Context) error {
	defer c.Close()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := c.http.Serve(c.httpLn); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		return c.http.Shutdown(shutdown)
	})
	g.Go(func() error { return c.mqtt.Run(ctx) })
	g.Go(func() error { return c.watch(ctx) })
	g.Go(func() error { return c.remoteEvents(ctx) })
	g.Go(func() error { return c.probe.run(ctx, c.mqtt) })
	g.Go(func() error { return c.gauges.run(ctx) })
	if c.peers != nil {
		g.Go(func() error { return c.peers.Run(ctx) })
	}
	c.log.Info("controller serving", "http", c.HTTPAddr(), "mqtt", c.cfg.MQTT, "instance", c.cfg.InstanceID, "db", c.cfg.DB)
	select {
	case <-c.mqtt.Ready():
	case <-ctx.Done():
		return g.Wait()
	}
	for _, run := range []func(context.Context) error{c.ingest.Run, c.disp.Run, c.keeper.Run, c.runner.Run, c.sched.Run} {
		g.Go(func() error { return run(ctx) })
	}
	close(c.ready)
	c.log.Info("controller ready")
	err := g.Wait()
	c.log.Info("controller stopped")
	return err
}

// watch runs until ctx ends: after each broker (re)connect, once the
// subscriptions are in place, the dispatcher reconciles and the receipt
// probe runs again. It fails when the instance lock was lost to another
// process.
func (c *Controller) watch(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-c.inst.Lost():
			c.log.Error("instance stops", "err", err)
			return err
		case <-c.mqtt.Connects():
			c.disp.Connected()
			c.probe.connected()
		}
	}
}

// remoteEvent hands an operation another instance finished to
// remoteEvents, while someone reads the stream (no read of the database
// for nobody); otherwise, or when the queue is full, the bus notes the
// miss, so a reader resuming from before it gets a reset.
func (c *Controller) remoteEvent(id string) {
	if c.bus.Subscribers() == 0 {
		c.bus.Missed()
		return
	}
	select {
	case c.remote <- id:
	default:
		c.bus.Missed()
	}
}

// remoteEvents publishes, on this instance's event stream, the operations
// that other instances finished (their wake-ups name the operation, not its
// status: it is read back), until ctx ends.
func (c *Controller) remoteEvents(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case id := <-c.remote:
			op, err := c.store.GetOperation(ctx, id)
			if err != nil {
				c.bus.Missed()
				continue
			}
			c.bus.Publish(events.KindOperation, op.OperationID, string(op.Status), op.UpdatedAt)
		}
	}
}

// Close releases the listener, the store and the instance lock; it is
// safe to call more than once.
func (c *Controller) Close() {
	c.close.Do(func() {
		if c.httpLn != nil {
			c.httpLn.Close()
		}
		if c.store != nil {
			c.store.Close()
		}
		if c.inst != nil {
			c.inst.Close()
		}
	})
}
