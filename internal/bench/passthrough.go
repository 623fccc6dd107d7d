package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/sys/unix"

	"github.com/fleetctl/fleetctl/internal/benchwire"
	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// The pass-through is the job the controller does with nothing durable in
// the way: the two routes the load client uses, one QoS 1 command published
// per operation, the answer at the device's final receipt. No database, no
// retries, no leases, no queue. It is the physical baseline of the job on
// this host: keep it as plain as this, and never slower than it can be.
//
//	POST /v1/operations         decode the submit, publish one command, 201 {operation_id, status: "started"}
//	GET  /v1/operations/{id}    ?wait=: answer at the final receipt, or when the wait ends
//
// An operation is held in memory from its POST until a GET has answered
// its final state (the load client asks once); a POST of an operation_id
// already held gets 409.
//
// With a log (PassthroughConfig.Log, `--log FILE`) it is the durable
// floor, a reference: each submit's command and each final receipt is
// written to the log and fdatasync'd before it is answered or published
// (ptLog), and nothing else changes (a receipt is still acknowledged to
// the broker as it arrives: the floor measures the answers' wait). It is
// the least any durable answer costs on this host: two syncs on an
// operation's path, as the controller's two commits, with none of a
// database's work.

// Operation states the pass-through answers (the controller's names).
const (
	ptStarted   = "started"
	ptSucceeded = "succeeded"
	ptFailed    = "failed_final"
)

// ptMaxWait caps a GET's ?wait= (as the controller caps it).
const ptMaxWait = 60 * time.Second

type passthrough struct {
	root   string
	client mqtt.Client
	log    *ptLog // the durable floor's, or nil

	mu    sync.Mutex
	ops   map[string]*ptOp // by operation_id
	byCmd map[string]*ptOp // by command_id, until its final receipt
}

type ptOp struct {
	id   string
	done chan struct{} // closed when the final receipt arrives
	// status and reason are guarded by passthrough.mu.
	status, reason string
}

// ptRecord is what both routes answer.
type ptRecord struct {
	OperationID string `json:"operation_id"`
	Status      string `json:"status"`
	Reason      string `json:"reason,omitempty"`
}

// PassthroughConfig configures RunPassthrough.
type PassthroughConfig struct {
	BrokerURL, TopicRoot, ClientID string
	// HTTP is the listen address (127.0.0.1:0 picks a free port).
	HTTP string
	// Ready, if set, is called with the address once it listens.
	Ready func(addr string)
	// Log, if set, makes it the durable floor: the file it syncs each
	// command and final receipt to (created or replaced; left in place).
	Log string
}

// RunPassthrough connects to the broker, subscribes to every device's
// receipts (QoS 1) and serves the two routes until ctx ends.
func RunPassthrough(ctx context.Context, cfg PassthroughConfig) error {
	p := &passthrough{root: cfg.TopicRoot, ops: map[string]*ptOp{}, byCmd: map[string]*ptOp{}}
	if cfg.Log != "" {
		l, err := openPtLog(cfg.Log, ptLogSize)
		if err != nil {
			return fmt.Errorf("passthrough: %w", err)
		}
		defer l.start(ctx)()
		p.log = l
	}
	subscribed := make(chan error, 1)
	o := mqtt.NewClientOptions().AddBroker(cfg.BrokerURL).SetClientID(cfg.ClientID).SetProtocolVersion(4).
		SetCleanSession(true).SetAutoReconnect(true).SetConnectTimeout(30 * time.Second).
		SetDefaultPublishHandler(p.onReceipt).
		SetOnConnectHandler(func(c mqtt.Client) {
			// Subscribed in OnConnect (again after a reconnect); its
			// answer is awaited off the handler's goroutine.
			tok := c.Subscribe(wire.Wildcard(cfg.TopicRoot, wire.KindReceipts), 1, nil)
			go func() {
				err := errors.New("no SUBACK within 30s")
				if tok.WaitTimeout(30 * time.Second) {
					err = tok.Error()
				}
				select {
				case subscribed <- err:
				default:
				}
			}()
		})
	p.client = mqtt.NewClient(o)
	if tok := p.client.Connect(); !tok.WaitTimeout(40*time.Second) || tok.Error() != nil {
		return fmt.Errorf("passthrough: connect: %v", tok.Error())
	}
	defer p.client.Disconnect(250)
	if err := <-subscribed; err != nil {
		return fmt.Errorf("passthrough: subscribe: %w", err)
	}
	l, err := net.Listen("tcp", cfg.HTTP)
	if err != nil {
		return fmt.Errorf("passthrough: %w", err)
	}
	srv := &http.Server{Handler: p.handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if cfg.Ready != nil {
		cfg.Ready(l.Addr().String())
	}
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("passthrough: %w", err)
	}
	return nil
}

func (p *passthrough) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/operations", p.submit)
	mux.HandleFunc("GET /v1/operations/{id}", p.get)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// submit publishes one command for the operation and answers 201 once the
// broker acknowledged it (PUBACK).
func (p *passthrough) submit(w http.ResponseWriter, r *http.Request) {
	var b submitBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		ptError(w, http.StatusBadRequest, "invalid_request", "body: "+err.Error())
		return
	}
	id, err := domain.DeriveOperationID(domain.OperationParts{TaskID: b.TaskID, Step: b.Step, Target: b.Target, BusinessVersion: b.BusinessVersion})
	if err != nil || b.Action == "" {
		ptError(w, http.StatusBadRequest, "invalid_request", "task_id, step, target and business_version make the operation_id; action is required")
		return
	}
	now := time.Now().UTC()
	cmd := wire.Command{CommandID: command.NewCommandID(now), OperationID: id,
		Action: b.Action, Params: b.Params, IssuedAt: now, ExpiresAt: now.Add(benchwire.CommandTTL), Attempt: 1}
	payload, err := wire.Encode(cmd)
	if err != nil {
		ptError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	o := &ptOp{id: id, done: make(chan struct{}), status: ptStarted}
	p.mu.Lock()
	if _, dup := p.ops[id]; dup {
		p.mu.Unlock()
		ptError(w, http.StatusConflict, "conflict", "operation "+id+" is already running")
		return
	}
	p.ops[id], p.byCmd[cmd.CommandID] = o, o
	p.mu.Unlock()
	if p.log != nil {
		if err := p.log.append(r.Context(), payload); err != nil {
			p.forget(id, cmd.CommandID)
			ptError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
	}
	tok := p.client.Publish(wire.Topic(p.root, b.Target, wire.KindCommands), 1, false, payload)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		p.forget(id, cmd.CommandID)
		ptError(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("publish: %v", tok.Error()))
		return
	}
	ptJSON(w, http.StatusCreated, p.record(o))
}

// forget drops an operation whose submit failed: it was never answered,
// so the same operation_id may be submitted again.
func (p *passthrough) forget(id, commandID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ops, id)
	delete(p.byCmd, commandID)
}

// get answers the operation's state, waiting up to ?wait= for it to be
// final.
func (p *passthrough) get(w http.ResponseWriter, r *http.Request) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			ptError(w, http.StatusBadRequest, "invalid_request", "wait: a Go duration such as 30s")
			return
		}
		wait = min(d, ptMaxWait)
	}
	id := r.PathValue("id")
	p.mu.Lock()
	o := p.ops[id]
	p.mu.Unlock()
	if o == nil {
		ptError(w, http.StatusNotFound, "not_found", "operation "+id)
		return
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-o.done:
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	rec := p.record(o)
	if rec.Status != ptStarted {
		p.mu.Lock()
		delete(p.ops, id)
		p.mu.Unlock()
	}
	ptJSON(w, http.StatusOK, rec)
}

func (p *passthrough) record(o *ptOp) ptRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ptRecord{OperationID: o.id, Status: o.status, Reason: o.reason}
}

// onReceipt ends the operation of a final receipt; any other message is
// ignored (paho acknowledges it on return). The durable floor logs the
// receipt first, off paho's goroutine.
func (p *passthrough) onReceipt(_ mqtt.Client, m mqtt.Message) {
	var rc wire.Receipt
	if err := wire.Decode(m.Payload(), &rc); err != nil || !rc.Status.Final() {
		return
	}
	if p.log == nil {
		p.end(rc)
		return
	}
	rec := append([]byte(nil), m.Payload()...)
	go func() {
		if p.log.append(context.Background(), rec) == nil {
			p.end(rc)
		}
	}()
}

// end records a final receipt's outcome and releases its waiters.
func (p *passthrough) end(rc wire.Receipt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.byCmd[rc.CommandID]
	if o == nil {
		return
	}
	delete(p.byCmd, rc.CommandID)
	if rc.Status == wire.ReceiptSucceeded {
		o.status = ptSucceeded
	} else {
		o.status, o.reason = ptFailed, fmt.Sprintf("device: %s %s", rc.Status, rc.Error)
	}
	close(o.done)
}

func ptJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func ptError(w http.ResponseWriter, status int, code, msg string) {
	ptJSON(w, status, map[string]string{"error": code, "message": msg})
}

// PassthroughMain is `bench passthrough`: the pass-through as a process of
// its own (so its CPU is read from /proc like the controller's), until
// SIGINT or SIGTERM. It writes "passthrough: listening on ADDR" to stderr
// once it serves. It returns the exit status.
func PassthroughMain(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("passthrough", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg PassthroughConfig
	fs.StringVar(&cfg.BrokerURL, "mqtt", "", "broker URL (tcp://host:port)")
	fs.StringVar(&cfg.HTTP, "http", "127.0.0.1:0", "HTTP listen address")
	fs.StringVar(&cfg.TopicRoot, "topic-root", wire.DefaultTopicRoot, "MQTT topic root")
	fs.StringVar(&cfg.Log, "log", "", "the durable floor: sync each command and final receipt to this file before answering")
	fs.StringVar(&cfg.ClientID, "client-id", fmt.Sprintf("bench-passthrough-%d", os.Getpid()), "MQTT client id")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.BrokerURL == "" {
		fmt.Fprintln(stderr, "passthrough: --mqtt is required")
		return 2
	}
	cfg.Ready = func(addr string) { fmt.Fprintf(stderr, "passthrough: listening on %s\n", addr) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunPassthrough(ctx, cfg); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// ptLogSize is the durable floor's file: records go round it, so it holds
// the last few seconds (a record is a few hundred bytes).
const ptLogSize = 32 << 20

// ptLog is the durable floor's log, as plain as a durable log gets: one
// goroutine takes the records waiting, writes them in one pwrite and
// fdatasyncs (group commit), then answers each caller. The file is written
// through once when it opens, so that a sync flushes the records alone,
// not the file's size or new blocks; at its end the records start again
// from its beginning.
type ptLog struct {
	f    *os.File
	size int64
	off  int64 // the writer's alone
	kick chan struct{}
	// stopped is closed when the writer stops (start's ctx).
	stopped <-chan struct{}
	// beforeWrite, if set (tests), runs before each batch is written.
	beforeWrite func()

	mu      sync.Mutex
	buf     []byte
	waiters []chan error
}

func openPtLog(path string, size int64) (*ptLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for n := int64(0); n < size; n += int64(len(zero)) {
		if _, err := f.Write(zero[:min(int64(len(zero)), size-n)]); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &ptLog{f: f, size: size, kick: make(chan struct{}, 1)}, nil
}

// append returns once rec, a line of the log, is on the disk.
func (l *ptLog) append(ctx context.Context, rec []byte) error {
	done := make(chan error, 1)
	l.mu.Lock()
	l.buf = append(append(l.buf, rec...), '\n')
	l.waiters = append(l.waiters, done)
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-l.stopped:
		return errors.New("log: stopped")
	}
}

// start runs the writer until ctx ends or stop is called; stop (once or
// more) waits for the writer to return and closes the file.
func (l *ptLog) start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	l.stopped = ctx.Done()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		l.run(ctx)
	}()
	return sync.OnceFunc(func() {
		cancel()
		<-ran
		l.f.Close()
	})
}

// run writes and syncs what waits, batch after batch, until ctx ends.
func (l *ptLog) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		}
		l.mu.Lock()
		buf, waiters := l.buf, l.waiters
		l.buf, l.waiters = nil, nil
		l.mu.Unlock()
		if len(waiters) == 0 {
			continue
		}
		if l.beforeWrite != nil {
			l.beforeWrite()
		}
		err := l.write(buf)
		for _, w := range waiters {
			w <- err
		}
	}
}

func (l *ptLog) write(b []byte) error {
	if int64(len(b)) > l.size {
		return fmt.Errorf("log: a batch of %d bytes exceeds the file's %d", len(b), l.size)
	}
	if l.off+int64(len(b)) > l.size {
		l.off = 0
	}
	if _, err := l.f.WriteAt(b, l.off); err != nil {
		return fmt.Errorf("log: %w", err)
	}
	l.off += int64(len(b))
	if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
		return fmt.Errorf("log: fdatasync: %w", err)
	}
	return nil
}
