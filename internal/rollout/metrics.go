package rollout

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Metrics are the rollouts' Prometheus metrics:
//
//   - controller_rollout_devices{rollout,status}: devices by status, read
//     from the database when scraped (every instance shows the committed
//     truth, whoever schedules);
//   - controller_rollout_rate_per_minute{rollout}: the start rate allowed now
//     (the ramp's, from the committed successes), and
//     controller_rollout_starts_last_minute{rollout}: the committed starts
//     in the trailing minute, also read when scraped;
//   - controller_rollout_starts_total{rollout}: the starts this instance's
//     scheduler committed;
//   - controller_rollout_takeovers_total: rollout leases this instance took
//     over from a peer whose lease ran out.
type Metrics struct {
	starts    *prometheus.CounterVec
	takeovers prometheus.Counter
}

// NewMetrics registers the rollout metrics in reg; the gauges read st.
func NewMetrics(reg prometheus.Registerer, st store.Store) *Metrics {
	m := &Metrics{
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_rollout_starts_total", Help: "Rollout device starts committed by this instance's scheduler (retries included).",
		}, []string{"rollout"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_rollout_takeovers_total", Help: "Rollout scheduler leases taken over from a peer whose lease ran out.",
		}),
	}
	reg.MustRegister(m.starts, m.takeovers, &collector{st: st})
	return m
}

func (m *Metrics) started(rollout string) {
	if m != nil {
		m.starts.WithLabelValues(rollout).Inc()
	}
}

func (m *Metrics) takeover() {
	if m != nil {
		m.takeovers.Inc()
	}
}

var (
	devicesDesc = prometheus.NewDesc("controller_rollout_devices", "Rollout devices by status (from the database).",
		[]string{"rollout", "status"}, nil)
	rateDesc = prometheus.NewDesc("controller_rollout_rate_per_minute", "The start rate a rollout is allowed now (ramp and max_per_minute).",
		[]string{"rollout"}, nil)
	recentDesc = prometheus.NewDesc("controller_rollout_starts_last_minute", "Rollout starts committed in the trailing minute (from the database).",
		[]string{"rollout"}, nil)
)

// collector reads the rollouts' gauges from the store when scraped.
type collector struct{ st store.Store }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- devicesDesc
	ch <- rateDesc
	ch <- recentDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	page, err := c.st.ListRollouts(ctx, store.RolloutFilter{}, store.Page{Limit: 1000})
	if err != nil {
		return
	}
	for _, r := range page.Items {
		for _, st := range fsm.RolloutDevice.States() {
			ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(r.Counts[st]), r.RolloutID, string(st))
		}
		if spec, err := ParseSpec(r.Spec); err == nil {
			ch <- prometheus.MustNewConstMetric(rateDesc, prometheus.GaugeValue, spec.Rate(r.Counts[fsm.DevSucceeded]), r.RolloutID)
		}
		ch <- prometheus.MustNewConstMetric(recentDesc, prometheus.GaugeValue, float64(r.StartsLastMinute), r.RolloutID)
	}
}
