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
}

// RunPassthrough connects to the broker, subscribes to every device's
// receipts (QoS 1) and serves the two routes until ctx ends.
func RunPassthrough(ctx context.Context, cfg PassthroughConfig) error {
	p := &passthrough{root: cfg.TopicRoot, ops: map[string]*ptOp{}, byCmd: map[string]*ptOp{}}
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
	tok := p.client.Publish(wire.Topic(p.root, b.Target, wire.KindCommands), 1, false, payload)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		p.mu.Lock()
		delete(p.ops, id)
		delete(p.byCmd, cmd.CommandID)
		p.mu.Unlock()
		ptError(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("publish: %v", tok.Error()))
		return
	}
	ptJSON(w, http.StatusCreated, p.record(o))
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
// ignored (paho acknowledges it on return).
func (p *passthrough) onReceipt(_ mqtt.Client, m mqtt.Message) {
	var rc wire.Receipt
	if err := wire.Decode(m.Payload(), &rc); err != nil || !rc.Status.Final() {
		return
	}
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
