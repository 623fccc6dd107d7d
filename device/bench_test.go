package device_test

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

	"github.com/fleetctl/fleetctl/device"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// BenchmarkDevices measures durable command throughput of N devices
// (DEVICE_BENCH_DEVICES, default 100) of one process sharing one Journal,
// on one broker: b.N restart commands, at most 4 in flight per device, each
// three durable records (received, executing, final) before its receipts.
// It is internal/sim's BenchmarkFleetDurability traffic with the same
// driver, so the figures compare:
//
//	go test ./device -run '^$' -bench Devices -benchtime 5000x
//	go test ./internal/sim -run '^$' -bench FleetDurability -benchtime 5000x
func BenchmarkDevices(b *testing.B) {
	n := 100
	if s := os.Getenv("DEVICE_BENCH_DEVICES"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	broker := testenv.StartBroker(b)
	j, err := device.OpenJournal(b.TempDir(), nil)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		require.NoError(b, j.Close())
	}()
	ids := make([]string, n)
	devs := make([]*device.Device, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("device-%d", i+1)
		d, err := device.New(device.Options{
			ID: ids[i], Broker: broker.URL(), Journal: j,
			KeepAlive: 5 * time.Second, MaxReconnectInterval: 100 * time.Millisecond,
			Actions: map[string]device.Handler{"restart": func(context.Context, *device.Command) (any, error) {
				return map[string]bool{"restarted": true}, nil
			}},
		})
		require.NoError(b, err)
		devs[i] = d
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Run(ctx) }()
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer wcancel()
	for _, d := range devs {
		require.NoError(b, d.WaitOnline(wctx))
	}
	drive(b, broker.URL(), ids)
}

// drive sends b.N restart commands to the devices, at most window in flight
// per device, and waits for every final receipt (internal/sim's driver).
func drive(b *testing.B, brokerURL string, ids []string) {
	const window = 4
	devices := len(ids)
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
			Action: "restart", IssuedAt: now, ExpiresAt: now.Add(10 * time.Minute), Attempt: 1}
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
		b.Fatalf("only %d of %d final receipts", finals.Load(), b.N)
	}
	el, cpu := time.Since(start), processCPU(b)-cpu0
	b.StopTimer()
	<-senderDone
	b.ReportMetric(float64(b.N)/el.Seconds(), "cmds/s")
	b.ReportMetric(3*float64(b.N)/el.Seconds(), "steps/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/cmd")
}

// processCPU is the CPU time this process (devices and driver) has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
