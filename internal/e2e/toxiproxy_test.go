package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
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
	t.Cleanup(p.Stop)
	return &faultProxy{p: p}
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
			px.add(t, "reset", "reset_peer", "downstream", `{"timeout":200}`)
			<-time.After(1 * time.Second)
			px.remove(t, "reset")
		case 2:
			px.add(t, "timeout", "timeout", "upstream", `{"timeout":2000}`)
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
