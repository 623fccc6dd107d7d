package e2e

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// faultProxy is a toxiproxy TCP proxy on loopback in front of the broker.
type faultProxy struct {
	p *toxiproxy.Proxy
}

func newFaultProxy(t *testing.T, upstream string) *faultProxy {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	srv.Metrics.ProxyMetrics = collectors.NewProxyMetricCollectors()
	p := toxiproxy.NewProxy(srv, "broker", "127.0.0.1:0", upstream)
	require.NoError(t, p.Start())
	t.Cleanup(func() {
		// Stop closes the listener and every connection of the proxy; the
		// goroutines of each link then end on their own, shortly after.
		// Wait for them, so that nothing of the proxy outlives the test.
		p.Stop()
		deadline := time.Now().Add(10 * time.Second)
		for {
			left := toxiproxyGoroutines()
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d toxiproxy goroutines still running 10s after the proxy stopped:\n%s", len(left), strings.Join(left, "\n\n"))
				return
			}
			<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
		}
	})
	return &faultProxy{p: p}
}

// toxiproxyGoroutines are the stacks of the goroutines running toxiproxy
// code. Only one test runs a proxy, so at its end there must be none.
func toxiproxyGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/Shopify/toxiproxy/") {
			out = append(out, g)
		}
	}
	return out
}

// toxiproxy v2.5.0's reset_peer and timeout toxics close their stub and
// stop reading from it: the stub before them, and the link's reader behind
// that, then block for ever on a channel send. Those goroutines outlived
// the proxy's Stop (which only closes connections) and failed goleak.
// reset_peer_drained and timeout_drained are the same toxics, except that
// once one has closed its link it drains whatever still arrives, until the
// link's reader ends (its connection closed), so every goroutine of the
// link ends. One difference: toxiproxy sets SO_LINGER 0 (an RST on close)
// only for a link created while its own reset_peer is active, so a
// connection made during reset_peer_drained is closed with a FIN; the
// controller's established connection got a FIN with reset_peer too.
func init() {
	toxics.Register("reset_peer_drained", new(drainedReset))
	toxics.Register("timeout_drained", new(drainedTimeout))
}

type drainedReset struct{ toxics.ResetToxic }

func (t *drainedReset) Pipe(stub *toxics.ToxicStub) {
	t.ResetToxic.Pipe(stub)
	drainClosed(stub)
}

type drainedTimeout struct{ toxics.TimeoutToxic }

func (t *drainedTimeout) Pipe(stub *toxics.ToxicStub) {
	t.TimeoutToxic.Pipe(stub)
	drainClosed(stub)
}

// Cleanup runs when the toxic is removed, after its Pipe was interrupted:
// as toxiproxy's, it closes the link; then it drains, since no Pipe runs.
func (t *drainedTimeout) Cleanup(stub *toxics.ToxicStub) {
	stub.Close()
	go drainClosed(stub)
}

// drainClosed reads a closed stub's input until the stub before it closes
// it; an interrupted stub (not closed) is left to the toxic that follows.
func drainClosed(stub *toxics.ToxicStub) {
	if !stub.Closed() {
		return
	}
	for range stub.Input {
	}
}

func (f *faultProxy) URL() string { return "tcp://" + f.p.Listen }

func (f *faultProxy) add(t *testing.T, name, typ, stream string, attrs string) {
	_, err := f.p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)))
	require.NoError(t, err)
}

func (f *faultProxy) remove(t *testing.T, name string) {
	require.NoError(t, f.p.Toxics.RemoveToxic(context.Background(), name))
}

// TestDrainedToxicsEndEveryLinkGoroutine cuts a busy link with each drained
// toxic; the proxy's cleanup then fails the test if any goroutine of the
// proxy outlives its Stop (with toxiproxy's own reset_peer two do). Not
// parallel: the cleanup counts every toxiproxy goroutine of the process, and
// no parallel test runs before the serial ones are done.
func TestDrainedToxicsEndEveryLinkGoroutine(t *testing.T) {
	// An upstream that writes to each client without pause.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for range tick.C {
					if _, err := c.Write(make([]byte, 100)); err != nil {
						return
					}
				}
			}()
		}
	}()
	px := newFaultProxy(t, l.Addr().String())
	// reset_peer closes the link itself; timeout with 0 drops everything
	// until it is removed, and its removal closes the link.
	for _, toxic := range []string{"reset_peer_drained", "timeout_drained"} {
		c, err := net.Dial("tcp", px.p.Listen)
		require.NoError(t, err)
		var got atomic.Int64
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				got.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		eventually(t, "data through the proxy", 10*time.Second, func() bool { return got.Load() > 0 })
		if toxic == "reset_peer_drained" {
			px.add(t, "cut", toxic, "downstream", `{"timeout":100}`)
		} else {
			px.add(t, "cut", toxic, "downstream", `{"timeout":0}`)
			px.remove(t, "cut")
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not close the link within 10s", toxic)
		}
		if toxic == "reset_peer_drained" {
			px.remove(t, "cut")
		}
		c.Close()
		t.Logf("%s closed a busy link after %d bytes", toxic, got.Load())
	}
}

// TestNetworkFaultsOnTheControllersBrokerLink runs a steady load while the
// controller's connection to the broker (through toxiproxy) gets latency,
// then connection resets, then a timeout (data stops, the link closes).
func TestNetworkFaultsOnTheControllersBrokerLink(t *testing.T) {
	t.Parallel()
	const n, devices = 150, 15
	b := setup(t, setupOpts{devices: devices})
	b.ctl.Kill() // replace the direct controller by one behind the proxy
	px := newFaultProxy(t, b.broker.Addr())
	b.ctl = testenv.StartController(t, testenv.ControllerOpts{DB: b.db, MQTT: px.URL(), InstanceID: "tox",
		Args: []string{"--ack-timeout", "1s", "--sweep-interval", "100ms"}})
	b.client = client.New(b.ctl.URL, "")

	ids := runLoad(t, b, "tox", n, devices, func(k int) {
		switch k {
		case 1:
			px.add(t, "lat-down", "latency", "downstream", `{"latency":300,"jitter":100}`)
			px.add(t, "lat-up", "latency", "upstream", `{"latency":300,"jitter":100}`)
			<-time.After(1500 * time.Millisecond) // fault duration, not synchronisation
			px.remove(t, "lat-down")
			px.remove(t, "lat-up")
			px.add(t, "reset", "reset_peer_drained", "downstream", `{"timeout":200}`)
			<-time.After(1 * time.Second)
			px.remove(t, "reset")
		case 2:
			px.add(t, "timeout", "timeout_drained", "upstream", `{"timeout":2000}`)
			<-time.After(2500 * time.Millisecond)
			px.remove(t, "timeout")
		}
	})
	for _, id := range ids {
		require.Equal(t, "succeeded", b.waitFinal(id).Status, id)
	}
	ex := b.executions()
	for id, k := range ex {
		require.Equal(t, 1, k, "%s executed %d times", id, k)
	}
	require.Len(t, ex, n)
	reconciles := b.metric("controller_reconciles_total")
	resent := b.rows(`SELECT COUNT(*) FROM commands WHERE attempt > 1`)
	t.Logf("latency 300±100 ms, reset_peer, timeout on the controller's broker link during %d operations: all succeeded, 0 executed twice, %.0f reconnect reconciles, %s commands re-sent with the same command_id",
		n, reconciles, resent[0])
	require.GreaterOrEqual(t, reconciles, 2.0, "the faults did break the connection")
	b.verify()
}
