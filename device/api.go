package device

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Options configure a Device. ID, Broker, one of StateDir and Journal, and
// Actions are required; everything else has a default.
type Options struct {
	// ID is the device id: [A-Za-z0-9._-]{1,64}, not starting with
	// "controller-". It is also the MQTT client id.
	ID string

	// Broker is the broker's URL: tcp://host:1883 (or mqtt://), or
	// ssl://host:8883 (or tls://, mqtts://) for TLS.
	Broker string
	// Username defaults to ID (the secure broker profile's account name).
	Username string
	// Password, or PasswordFile: a file holding it (a trailing newline is
	// ignored). Leave both empty for an anonymous broker.
	Password     string
	PasswordFile string
	// CAFile is a PEM file of the CA that signed the broker's certificate,
	// for ssl:// URLs; TLSConfig, if set, is used instead (it may carry a
	// client certificate). Neither: the system's roots.
	CAFile    string
	TLSConfig *tls.Config
	// TopicRoot is the root of the device's topics (default "fleet").
	TopicRoot string

	// StateDir holds the device's durable record (created if missing). A
	// device opens its own Journal there; set Journal instead to share one
	// among the devices of a process (then StateDir is not used).
	StateDir string
	Journal  *Journal

	// Capabilities the device announces; nil means {Dedupe: true, Query:
	// true}. Only legacy hardware declares less (see Capabilities).
	Capabilities *Capabilities

	// Actions holds one Handler per action name. A command for an action
	// not listed is rejected with error "unsupported_action".
	Actions map[string]Handler
	// Accept, if set, is asked about every new command before it is
	// accepted (after the dedupe and expiry checks). An error rejects the
	// command: one receipt, "rejected" with the error's text (for example
	// "invalid_params"), seq 1; nothing runs and the command's operation
	// stays free. It must not block.
	Accept func(cmd Command) error
	// Resolve decides, at boot, what became of a command whose handler was
	// running when the process died. Without it such a command is failed
	// with error "interrupted" and its operation stays taken (the action
	// may have run). It is never run again either way.
	Resolve Resolver

	// Retention is how long a command's record is kept past its expires_at
	// (default 24h): repeats and queries within it are answered from it.
	Retention time.Duration
	// Clock is the device's clock (default time.Now). Expiry is checked
	// and every "at" written by it; tests use it to skew the clock.
	Clock func() time.Time
	// Logger gets the device's log (default: nothing).
	Logger *slog.Logger

	// KeepAlive is the MQTT keepalive (default 30s): the broker publishes
	// the last will of a silent device after 1.5 times it.
	KeepAlive time.Duration
	// ConnectTimeout bounds a connection attempt (default 10s), and
	// PublishTimeout a subscription, the birth, and the wait for
	// acknowledgements at a clean stop (default 10s).
	ConnectTimeout time.Duration
	PublishTimeout time.Duration
	// MaxReconnectInterval caps the wait between reconnection attempts
	// (default 10s).
	MaxReconnectInterval time.Duration

	// Hooks are seams for simulators and tests (see Hooks). Firmware
	// leaves them nil.
	Hooks *Hooks
}

// Capabilities are what a device announces in its birth.
type Capabilities struct {
	// Dedupe: the device never runs a repeated command_id, nor a second
	// command of one operation_id. Without it (legacy hardware) the
	// device runs every delivery of a command, and its receipts continue
	// the command's seq (4, 5, 6...); the controller then sends each
	// command once, at QoS 0.
	Dedupe bool `json:"dedupe"`
	// Query: the device answers queries. Without it queries are ignored.
	Query bool `json:"query"`
}

// Handler runs one action. It is called at most once per command (for a
// dedupe:false device, once per delivery), one command at a time per
// device, after the "executing" receipt is durable. It returns the result,
// which must encode to a JSON object (a json.RawMessage is used as it is;
// nil sends none), or an error: the command is then "failed" with the
// error's text. ctx is cancelled when the device stops cleanly; a handler
// that returns an error wrapping ErrNotStarted says that the action did
// not start (the command fails "interrupted" and its operation is free
// again). A result larger than the protocol's 32 KiB is replaced by the
// protocol's {"result_too_large":{"bytes":N,"limit":32768}} marker, an
// error text cut at 1 KiB. A panic fails the command.
type Handler func(ctx context.Context, cmd *Command) (result any, err error)

// Resolver decides, at boot, the outcome of a command whose handler was
// running when the process died: ran false means the action never started
// (the command fails "interrupted" and its operation is free again); ran
// true gives the outcome, as a Handler's (to say that it cannot tell,
// return true and ErrInterrupted). It runs before the device connects.
type Resolver func(ctx context.Context, cmd Command) (ran bool, result any, err error)

// Command is a command as a handler sees it.
type Command struct {
	ID          string          // command_id
	OperationID string          // operation_id
	Action      string          // action
	Params      json.RawMessage // params, as the caller sent them ({} or null when none)
	IssuedAt    time.Time
	ExpiresAt   time.Time // zero: never expires
	Attempt     int

	// dev and run identify the handler's run that Progress belongs to
	// (nil outside a running handler).
	dev *Device
	run uint64
}

// Progress publishes an "executing" receipt carrying partial (encoded like
// a result), once it is durable as the command's latest receipt: a repeat
// or a query gets it until the next one. It may be called only while the
// handler runs; it blocks until the receipt is durable (not until the
// broker has it).
func (c *Command) Progress(partial any) error {
	if c.dev == nil {
		return errors.New("device: Progress outside a running handler")
	}
	return c.dev.progress(c.run, partial)
}

// Status is a receipt's status.
type Status string

// The statuses of receipts.
const (
	Received  Status = "received"
	Executing Status = "executing"
	Succeeded Status = "succeeded"
	Failed    Status = "failed"
	Rejected  Status = "rejected"
	Unknown   Status = "unknown" // the answer to a query about a command never seen
)

// Final reports whether s ends a command.
func (s Status) Final() bool { return s == Succeeded || s == Failed || s == Rejected }

// Receipt is a receipt as the device publishes it.
type Receipt struct {
	CommandID   string          `json:"command_id"`
	OperationID string          `json:"operation_id"`
	Status      Status          `json:"status"`
	Seq         int             `json:"seq"`
	At          time.Time       `json:"at"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       string          `json:"error,omitempty"`
	QueryID     string          `json:"query_id,omitempty"`
}

// Query is a query as Hooks.Query sees it.
type Query struct {
	ID          string // query_id
	CommandID   string
	OperationID string
}

// Error texts of the receipts the library makes itself.
const (
	ErrorExpired           = "expired"
	ErrorUnsupportedAction = "unsupported_action"
	ErrorInvalidParams     = "invalid_params"
	ErrorInterrupted       = "interrupted"
	ErrorInvalidResult     = "invalid_result"
)

var (
	// ErrNotStarted, wrapped in a handler's error, says that the action did
	// not start.
	ErrNotStarted = errors.New("device: action not started")
	// ErrInterrupted fails a command with error "interrupted".
	ErrInterrupted = errors.New(ErrorInterrupted)
	// ErrKilled is what Run returns after Kill.
	ErrKilled = errors.New("device: killed")
	// ErrNotDurable wraps the error Run returns when the device could not
	// make its record durable: it stopped as a crash does, announcing
	// nothing it could not record. Run it again to recover.
	ErrNotDurable = errors.New("device: record not durable")
)

// Point names a point of a command's handling, where Hooks.Point runs.
type Point string

// The points of a command's handling, in order.
const (
	// PointCommand: a command arrived and was decoded; nothing recorded.
	PointCommand Point = "command"
	// PointReceived: its "received" record is durable; it is not yet
	// acknowledged to the broker (PUBACK) and no receipt is published.
	PointReceived Point = "received"
	// PointExecuting: its "executing" record is durable; the receipt is not
	// published and the handler not called.
	PointExecuting Point = "executing"
	// PointExecuted: the handler returned; its outcome is not recorded.
	PointExecuted Point = "executed"
	// PointFinal: the final record is durable; the receipt is not published.
	PointFinal Point = "final"
)

// Hooks are the seams a simulator (devicesim) or a test uses to inject
// faults into a Device without re-implementing the protocol's rules: every
// rule stays the library's, the hooks only decide what happens to messages
// and when the device dies. Each hook is optional and must not block for
// long; it runs with nothing of the device locked, so it may call the
// device's methods (Kill, DropConnection).
//
// Faults map to hooks as follows: a dropped, duplicated, delayed or
// reordered receipt is Receipt; a dropped command is Command (and a
// repeat answered from the record is seen by Repeat); an ignored
// query is Query; a crash at a point is Point calling Kill (and starting a
// new Device on the same Journal to boot again); a dropped connection is
// DropConnection (from Point, or from a timer), kept offline a while by
// Connect; a slow, failing or rejecting action wraps the Handler (or sets
// Options.Accept); legacy hardware is Options.Capabilities (changed at run
// time by SetCapabilities); clock skew is Options.Clock; an execution's
// witness line is SaveLine (with its effect, saved by SaveApp), a published
// receipt's is Journal.AppendLine from Published; connections are counted
// by Online.
type Hooks struct {
	// Receipt is given every receipt once it is durable, in place of
	// publishing it: send publishes one (QoS 1; kept for the next
	// connection while offline). It may call send never (a lost receipt:
	// it stays the command's latest, so a repeat or a query gets it), more
	// than once, or later from another goroutine. send does nothing after
	// the device has ended.
	Receipt func(r Receipt, send func(Receipt))
	// Published runs when the broker acknowledged a receipt on the
	// connection it was sent on.
	Published func(r Receipt)
	// Command sees every decoded command first; true drops it: it is
	// acknowledged, not recorded and not answered.
	Command func(cmd Command) (drop bool)
	// Repeat runs when a command is answered from the record without
	// running (a repeated command_id, or a new command of an operation
	// already taken), with the answer, before the answer goes to Receipt.
	Repeat func(cmd Command, answer Receipt)
	// Query sees every decoded query; true leaves it unanswered (a device
	// without the query capability leaves it unanswered anyway).
	Query func(q Query) (ignore bool)
	// Point runs at each Point of a command's handling.
	Point func(p Point, cmd Command)
	// SaveApp returns the application's own state, saved durably with
	// every change of the device's record (so an action's effect is
	// durable with its final receipt); LoadApp gets it back at boot.
	SaveApp func() json.RawMessage
	LoadApp func(json.RawMessage)
	// SaveLine runs at each save of the device's record, before SaveApp;
	// a line it returns (file set) is appended to file in the same batch
	// as the record and made durable before it, so the record never
	// outlives the line: a simulator's witness of an execution, returned
	// with the execution's effect on the state SaveApp then returns.
	SaveLine func() (file string, line []byte)
	// Connect runs before each dial of the broker (the first connection
	// and every reconnection); it may block while the device is meant to
	// stay offline (a simulated outage), and false refuses the attempt
	// (another follows). done is closed when the device ends.
	Connect func(done <-chan struct{}) bool
	// Online runs each time the device is online: subscribed, its birth
	// published, with the session number.
	Online func(session int64)
}

func toCommand(c wire.Command) Command {
	return Command{ID: c.CommandID, OperationID: c.OperationID, Action: c.Action, Params: c.Params,
		IssuedAt: c.IssuedAt, ExpiresAt: c.ExpiresAt, Attempt: c.Attempt}
}

func toReceipt(r wire.Receipt) Receipt {
	return Receipt{CommandID: r.CommandID, OperationID: r.OperationID, Status: Status(r.Status), Seq: r.Seq,
		At: r.At, Result: r.Result, Error: r.Error, QueryID: r.QueryID}
}

func fromReceipt(r Receipt) wire.Receipt {
	return wire.Receipt{CommandID: r.CommandID, OperationID: r.OperationID, Status: wire.ReceiptStatus(r.Status), Seq: r.Seq,
		At: r.At, Result: r.Result, Error: r.Error, QueryID: r.QueryID}
}
