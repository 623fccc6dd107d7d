package benchwire

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/oklog/ulid/v2"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// CommandTTL is the expires_at a Commander gives its commands, from their
// issue time (the controller's default --command-ttl).
const CommandTTL = 10 * time.Minute

// ErrNotSucceeded: the device's final receipt is failed or rejected.
var ErrNotSucceeded = errors.New("the device did not succeed")

// Commander is a plain MQTT client in the controller's seat: no database,
// no state machine, no retries. It publishes commands and matches the
// receipts that come back on {root}/+/receipts by command_id.
type Commander struct {
	root   string
	client mqtt.Client

	mu      sync.Mutex
	waiting map[string]chan wire.Receipt

	receipts, unmatched, malformed atomic.Int64
}

// CommanderStats counts the receipts a Commander saw.
type CommanderStats struct {
	Receipts  int64 `json:"receipts"`  // every receipt decoded
	Unmatched int64 `json:"unmatched"` // a final receipt for a command nobody waits for (a duplicate, or one timed out)
	Malformed int64 `json:"malformed"`
}

// DialCommander connects a Commander with client id clientID (clean
// session) and subscribes to {root}/+/receipts at QoS 1, as the controller
// does.
func DialCommander(ctx context.Context, brokerURL, root, clientID string) (*Commander, error) {
	c := &Commander{root: root, waiting: map[string]chan wire.Receipt{}}
	subscribed := make(chan error, 1)
	o := mqtt.NewClientOptions().
		AddBroker(brokerURL).
		SetClientID(clientID).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetKeepAlive(keepAlive).
		SetPingTimeout(keepAlive).
		SetConnectTimeout(connectTimeout).
		SetWriteTimeout(publishTimeout).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(time.Second).
		SetOrderMatters(true).
		SetDefaultPublishHandler(c.onMessage).
		SetOnConnectHandler(func(cl mqtt.Client) {
			err := waitToken(context.Background(), cl.Subscribe(wire.Wildcard(root, wire.KindReceipts), 1, nil), publishTimeout)
			select {
			case subscribed <- err:
			default:
			}
		})
	c.client = mqtt.NewClient(o)
	if err := waitToken(ctx, c.client.Connect(), connectTimeout); err != nil {
		return nil, fmt.Errorf("benchwire: commander connect: %w", err)
	}
	select {
	case err := <-subscribed:
		if err != nil {
			c.client.Disconnect(0)
			return nil, fmt.Errorf("benchwire: commander subscribe: %w", err)
		}
	case <-ctx.Done():
		c.client.Disconnect(0)
		return nil, ctx.Err()
	}
	return c, nil
}

// onMessage never blocks: a final receipt goes to its waiter's buffered
// channel, anything else is counted and dropped.
func (c *Commander) onMessage(_ mqtt.Client, m mqtt.Message) {
	var r wire.Receipt
	if err := wire.Decode(m.Payload(), &r); err != nil || r.CommandID == "" {
		c.malformed.Add(1)
		return
	}
	c.receipts.Add(1)
	if !r.Status.Final() {
		return
	}
	c.mu.Lock()
	ch, ok := c.waiting[r.CommandID]
	delete(c.waiting, r.CommandID)
	c.mu.Unlock()
	if !ok {
		c.unmatched.Add(1)
		return
	}
	ch <- r
}

// Do publishes one command (QoS 1) to device and waits for its final
// receipt: nil for succeeded, an error wrapping ErrNotSucceeded for failed
// or rejected, ctx's error if it ends first, or the publish's error.
func (c *Commander) Do(ctx context.Context, device, operationID, action string, params json.RawMessage) (wire.Receipt, error) {
	now := time.Now().UTC()
	cmd := wire.Command{CommandID: "c-" + ulid.MustNew(ulid.Timestamp(now), rand.Reader).String(),
		OperationID: operationID, Action: action, Params: params, IssuedAt: now, ExpiresAt: now.Add(CommandTTL), Attempt: 1}
	payload, err := wire.Encode(cmd)
	if err != nil {
		return wire.Receipt{}, err
	}
	ch := make(chan wire.Receipt, 1)
	c.mu.Lock()
	c.waiting[cmd.CommandID] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.waiting, cmd.CommandID)
		c.mu.Unlock()
	}
	tok := c.client.Publish(wire.Topic(c.root, device, wire.KindCommands), 1, false, payload)
	acked := tok.Done()
	for {
		select {
		case <-acked:
			if err := tok.Error(); err != nil {
				forget()
				return wire.Receipt{}, fmt.Errorf("publish to %s: %w", device, err)
			}
			acked = nil
		case r := <-ch:
			if r.Status != wire.ReceiptSucceeded {
				return r, fmt.Errorf("%s %s: %w: %s %s", device, cmd.CommandID, ErrNotSucceeded, r.Status, r.Error)
			}
			return r, nil
		case <-ctx.Done():
			forget()
			return wire.Receipt{}, ctx.Err()
		}
	}
}

// Stats returns the Commander's counters.
func (c *Commander) Stats() CommanderStats {
	return CommanderStats{Receipts: c.receipts.Load(), Unmatched: c.unmatched.Load(), Malformed: c.malformed.Load()}
}

// Close disconnects.
func (c *Commander) Close() { c.client.Disconnect(250) }
