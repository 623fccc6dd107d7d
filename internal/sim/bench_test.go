package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// BenchmarkFleetDurability measures durable command throughput of a fleet
// on one disk: b.N restart commands spread over N devices (SIM_BENCH_DEVICES,
// default 100), at most a window of them in flight per device, each one
// three durable state steps (received, executing, final) and one execution
// witness line before its final receipt. It reports commands/s and steps/s,
// from the first publish to the last final receipt, and the CPU time of
// the whole process (devices and driver) per command, the figure to compare
// with BenchmarkFleetCeiling's on a machine too noisy for rates.
//
//	go test ./internal/sim/ -run '^$' -bench FleetDurability -benchtime 5000x
func BenchmarkFleetDurability(b *testing.B) {
	devices := benchDevices(b)
	broker := testenv.StartBroker(b)
	fleet, err := sim.Start(context.Background(), sim.Config{
		MQTT: broker.URL(), Devices: devices, StateDir: b.TempDir(),
		KeepAlive: 5 * time.Second, MaxReconnectInterval: 100 * time.Millisecond,
	})
	require.NoError(b, err)
	defer fleet.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b, fleet.WaitOnline(ctx))

	ids := make([]string, devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%d", i+1)
	}
	drive(b, broker.URL(), ids, func() int64 { return fleet.Stats().FinalReceiptsPublished })
}

// BenchmarkFleetCeiling is BenchmarkFleetDurability's traffic between the
// same driver and plain MQTT clients that answer each command with three
// QoS 1 receipts at once: no state, no disk. It is the ceiling the fleet is
// compared with.
func BenchmarkFleetCeiling(b *testing.B) {
	devices := benchDevices(b)
	broker := testenv.StartBroker(b)
	ids := make([]string, devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%d", i+1)
		id := ids[i]
		var c mqtt.Client
		o := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(id).SetCleanSession(true)
		o.SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			var cmd wire.Command
			if json.Unmarshal(m.Payload(), &cmd) != nil {
				return
			}
			for seq, st := range []wire.ReceiptStatus{wire.ReceiptReceived, wire.ReceiptExecuting, wire.ReceiptSucceeded} {
				r := wire.Receipt{CommandID: cmd.CommandID, OperationID: cmd.OperationID, Status: st, Seq: seq + 1, At: time.Now().UTC()}
				payload, _ := wire.Encode(r)
				c.Publish(wire.Topic(wire.DefaultTopicRoot, id, wire.KindReceipts), 1, false, payload)
			}
		})
		c = mqtt.NewClient(o)
		tok := c.Connect()
		require.True(b, tok.WaitTimeout(10*time.Second) && tok.Error() == nil, "connect %s: %v", id, tok.Error())
		defer c.Disconnect(0)
		tok = c.Subscribe(wire.Topic(wire.DefaultTopicRoot, id, wire.KindCommands), 1, nil)
		require.True(b, tok.WaitTimeout(10*time.Second) && tok.Error() == nil)
	}
	drive(b, broker.URL(), ids, nil)
}

// processCPU is the CPU time this process (devices and driver) has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchDevices(b *testing.B) int {
	if s := os.Getenv("SIM_BENCH_DEVICES"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err)
		return n
	}
	return 100
}

// brokerQueue is the test broker's max_queued_messages
// (mosquitto/anonymous-loopback.conf.tmpl): past it, Mosquitto drops the
// messages queued for a client, silently.
const brokerQueue = 10000

// benchWindow is how many commands drive keeps in flight per device: 4, or
// fewer so that every receipt of the commands in flight (3 each) fits in
// the broker's queue for the driver. Otherwise a driver slowed down by a
// loaded machine has receipts dropped by the broker (its log says
// "Outgoing messages are being dropped for client bench-driver"), and the
// run waits for finals that never come: "only 9087 of 10000 final
// receipts" at 1,000 devices, with the old simulator as with this one.
func benchWindow(devices int) int {
	return max(1, min(4, (brokerQueue*9/10)/(3*devices)))
}

// drive sends b.N restart commands to the devices, at most window in flight
// per device, and waits for every final receipt. published, if set, counts
// the final receipts the devices published (the broker acknowledged them):
// when finals are missing, it tells a device that never published one from
// a receipt the broker did not pass on to the driver (its queue for one
// client is bounded, and it drops silently past it).
func drive(b *testing.B, brokerURL string, ids []string, published func() int64) {
	devices := len(ids)
	window := benchWindow(devices)
	var (
		mu     sync.Mutex
		next   int // commands handed out
		finals atomic.Int64
		done   = make(chan struct{})
		sendq  = make(chan string, devices*window)
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if next >= b.N {
			return false
		}
		next++
		return true
	}
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID("bench-driver").SetCleanSession(true).SetOrderMatters(false)
	o.SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
		var r wire.Receipt
		if json.Unmarshal(m.Payload(), &r) != nil || !r.Status.Final() || r.QueryID != "" {
			return
		}
		if finals.Add(1) == int64(b.N) {
			close(done)
		}
		dev, _, _ := wire.ParseTopic(wire.DefaultTopicRoot, m.Topic())
		if take() {
			sendq <- dev
		}
	})
	c := mqtt.NewClient(o)
	tok := c.Connect()
	require.True(b, tok.WaitTimeout(10*time.Second) && tok.Error() == nil, "driver connect: %v", tok.Error())
	defer c.Disconnect(0)
	tok = c.Subscribe(wire.DefaultTopicRoot+"/+/receipts", 1, nil)
	require.True(b, tok.WaitTimeout(10*time.Second) && tok.Error() == nil)

	var seq atomic.Int64
	publish := func(dev string) {
		n := seq.Add(1)
		now := time.Now().UTC()
		cmd := wire.Command{CommandID: fmt.Sprintf("c-%d", n), OperationID: fmt.Sprintf("op-%d", n),
			Action: sim.ActionRestart, IssuedAt: now, ExpiresAt: now.Add(10 * time.Minute), Attempt: 1}
		payload, _ := wire.Encode(cmd)
		c.Publish(wire.Topic(wire.DefaultTopicRoot, dev, wire.KindCommands), 1, false, payload)
	}
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		for {
			select {
			case dev := <-sendq:
				publish(dev)
			case <-done:
				return
			}
		}
	}()

	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU(b)
	for w := 0; w < window; w++ {
		for _, dev := range ids {
			if take() {
				sendq <- dev
			}
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		if published != nil {
			b.Fatalf("only %d of %d final receipts; the devices published %d", finals.Load(), b.N, published())
		}
		b.Fatalf("only %d of %d final receipts", finals.Load(), b.N)
	}
	el, cpu := time.Since(start), processCPU(b)-cpu0
	b.StopTimer()
	<-senderDone
	b.ReportMetric(float64(b.N)/el.Seconds(), "cmds/s")
	b.ReportMetric(3*float64(b.N)/el.Seconds(), "steps/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/cmd")
}
