package events

import "github.com/prometheus/client_golang/prometheus"

// Collectors are the feed's metrics: readers connected now, and readers
// dropped for falling behind.
func (b *Bus) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "controller_event_stream_clients", Help: "Readers of GET /v1/events connected now.",
		}, func() float64 { return float64(b.Subscribers()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "controller_event_stream_dropped_total", Help: "Readers of GET /v1/events disconnected for falling behind (their buffer full).",
		}, func() float64 { return float64(b.Dropped()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "controller_event_stream_events_total", Help: "Events published to GET /v1/events.",
		}, func() float64 { return float64(b.Published()) }),
	}
}
