// Package metrics holds the controller's Prometheus metrics. Metrics
// implements store.Observer, so every committed transition, refused
// transition and receipt effect is counted where the store decides it.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// Metrics is one instance's registry and counters.
type Metrics struct {
	Registry           *prometheus.Registry
	Transitions        *prometheus.CounterVec
	TransitionsRefused *prometheus.CounterVec
	Receipts           *prometheus.CounterVec
	Publishes          *prometheus.CounterVec
	PublishFailures    *prometheus.CounterVec
	FencingRefused     prometheus.Counter
	FailpointHits      *prometheus.CounterVec
	LateOutcomes       prometheus.Counter
	Presence           *prometheus.CounterVec
	Reconciles         prometheus.Counter
	Takeovers          prometheus.Counter
	BatchChanges       prometheus.Histogram
	BatchSeconds       prometheus.Histogram
	// ChangeSeconds is how long a submit or a call applying receipts
	// waited for its answer from the store's writer, by change (the
	// store's Change* names): the two commits on an operation's path.
	ChangeSeconds *prometheus.HistogramVec
	// BatchFallbacks counts the batches that ran again with a savepoint
	// per change because one of their changes failed.
	BatchFallbacks prometheus.Counter
	// BatchDeadlocks counts the batches that lost a deadlock to another
	// instance's transaction.
	BatchDeadlocks prometheus.Counter
	// InputsRefused counts inputs refused whole by a limit or a rule, by
	// source (SourceHTTP, SourceReceipts, SourcePresence, SourceMQTT) and
	// reason (the wire.Reason* constants: too_large, invalid_json, too_deep,
	// bad_number, wrong_type, unknown_field, bad_id, rate_limited, ...).
	InputsRefused *prometheus.CounterVec
	// ReceiptsForPeers counts receipts acknowledged unapplied because
	// another live instance owns their device (peers.Division).
	ReceiptsForPeers prometheus.Counter
	// ReceiptSubscription is 1 while the controller's probe came back
	// through its receipt subscription, 0 when the last one did not.
	ReceiptSubscription prometheus.Gauge
	// Operations and Commands are the number of operations and commands
	// in each state, read from the database (every instance reads the
	// same): controller_operations{status}, controller_commands{status},
	// every state present from the start (package controller refreshes them).
	Operations, Commands *prometheus.GaugeVec
}

// Sources of refused inputs, the source label of controller_inputs_refused_total.
const (
	SourceHTTP     = "http"     // a request to the HTTP API
	SourceReceipts = "receipts" // a message on {root}/{d}/receipts
	SourcePresence = "presence" // a message on {root}/{d}/presence
	SourceMQTT     = "mqtt"     // a message on a topic that is neither
)

// New registers the contract's metrics (and the Go runtime's) in a fresh registry.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_transitions_total", Help: "Committed state transitions.",
		}, []string{"machine", "from", "to"}),
		TransitionsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_transitions_refused_total", Help: "Conditional updates that matched no row (duplicate, stale, illegal, fenced).",
		}, []string{"machine", "reason"}),
		Receipts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_receipts_total", Help: "Receipts by effect (applied, duplicate, stale, late, mismatch, unknown_command, malformed).",
		}, []string{"effect"}),
		Publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_publishes_total", Help: "Messages published to devices, by kind (command, query).",
		}, []string{"kind"}),
		PublishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_publish_failures_total", Help: "Publishes the broker did not confirm, by kind.",
		}, []string{"kind"}),
		FencingRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_fencing_refused_total", Help: "Decisions refused for a stale fencing token or dropped outside the lease's trust window.",
		}),
		FailpointHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_failpoint_hits_total", Help: "Armed failpoints that fired.",
		}, []string{"name"}),
		LateOutcomes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_late_outcomes_total", Help: "Final receipts kept as a late outcome after a terminal state.",
		}),
		Presence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_presence_total", Help: "Presence messages by effect (applied, stale, coalesced: held back by the device's presence rate and replaced by a higher-ranked one).",
		}, []string{"effect"}),
		Reconciles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_reconciles_total", Help: "Ask-about-every-open-command passes after a broker (re)connect.",
		}),
		Takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_takeovers_total", Help: "Operations taken over from a peer whose lease ran out.",
		}),
		BatchChanges: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "controller_store_batch_changes", Help: "Changes committed together by the store's writer (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		BatchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "controller_store_batch_seconds", Help: "Time to apply and commit one batch of changes.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		ChangeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "controller_store_change_seconds",
			Help:    "Time from a submit or a call applying receipts to the store's answer (the writer's queue, the batch and its commit), by change (submit, receipts).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"change"}),
		BatchFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_store_batch_fallbacks_total",
			Help: "Batches run again with a savepoint per change because one of their changes failed or was refused.",
		}),
		BatchDeadlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_store_batch_deadlocks_total",
			Help: "Batches that lost a deadlock to another instance's transaction (PostgreSQL), each run again whole or, after the last try, failed.",
		}),
		InputsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_inputs_refused_total",
			Help: "Inputs refused whole by a limit or rule, changing nothing, by source (http, receipts, presence, mqtt) and reason.",
		}, []string{"source", "reason"}),
	}
	m.ReceiptsForPeers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "controller_receipts_for_peers_total",
		Help: "Receipts acknowledged unapplied because another live instance owns their device (the instances divide the devices).",
	})
	m.ReceiptSubscription = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "controller_receipt_subscription_ok",
		Help: "1 when the controller's probe on its own receipts topic came back through its receipt subscription after the last connect, 0 when it did not.",
	})
	m.Operations = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "controller_operations",
		Help: "Operations in each state, from the database (every instance reports the same counts); refreshed every few seconds.",
	}, []string{"status"})
	m.Commands = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "controller_commands",
		Help: "Commands in each state, from the database (every instance reports the same counts); needs_attention > 0: a person must resolve one.",
	}, []string{"status"})
	for _, s := range fsm.Operation.States() {
		m.Operations.WithLabelValues(string(s))
	}
	for _, s := range fsm.Command.States() {
		m.Commands.WithLabelValues(string(s))
	}
	r.MustRegister(m.Operations, m.Commands)
	r.MustRegister(m.ReceiptsForPeers, m.ReceiptSubscription)
	for _, c := range storeChanges {
		m.ChangeSeconds.WithLabelValues(c)
	}
	r.MustRegister(m.BatchChanges, m.BatchSeconds, m.ChangeSeconds, m.BatchFallbacks, m.BatchDeadlocks, m.InputsRefused)
	r.MustRegister(m.Transitions, m.TransitionsRefused, m.Receipts, m.Publishes, m.PublishFailures,
		m.FencingRefused, m.FailpointHits, m.LateOutcomes, m.Presence, m.Reconciles, m.Takeovers,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Make the fencing counter and the common receipt effects visible at 0.
	for _, e := range []string{"applied", "duplicate", "stale", "late", "mismatch", "unknown_command", "malformed"} {
		m.Receipts.WithLabelValues(e)
	}
	for _, k := range []string{"command", "query"} {
		m.Publishes.WithLabelValues(k)
	}
	return m
}

// InputRefused counts one input refused; a nil *Metrics counts nothing.
func (m *Metrics) InputRefused(source, reason string) {
	if m != nil {
		m.InputsRefused.WithLabelValues(source, reason).Inc()
	}
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Transition implements store.Observer.
func (m *Metrics) Transition(machine, from, to string) {
	m.Transitions.WithLabelValues(machine, from, to).Inc()
}

// Refused implements store.Observer.
func (m *Metrics) Refused(machine, reason string) {
	m.TransitionsRefused.WithLabelValues(machine, reason).Inc()
}

// Receipt implements store.Observer.
func (m *Metrics) Receipt(effect string) {
	m.Receipts.WithLabelValues(effect).Inc()
	if effect == "late" {
		m.LateOutcomes.Inc()
	}
}

// Fenced implements store.Observer.
func (m *Metrics) Fenced() { m.FencingRefused.Inc() }

// CountRoundTrips exports a running count of the store's database round
// trips (each statement, BEGIN, SAVEPOINT and COMMIT), read when scraped.
func (m *Metrics) CountRoundTrips(read func() int64) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "controller_store_round_trips_total",
		Help: "Statements sent to the database (reads, writes, BEGIN, SAVEPOINT, RELEASE, COMMIT).",
	}, func() float64 { return float64(read()) }))
}

// ShowDivision exports, read when scraped, how this instance divides the
// receipts with its peers (package peers): the live instances it counts
// itself among, and the replaced memberships it still applies the devices
// of (within their grace; each overlaps its successor, so receipts are
// then applied by more than one instance).
func (m *Metrics) ShowDivision(members, overlapping func() int) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "controller_receipt_division_members",
		Help: "Live instances this one divides the devices' receipts with, itself included (0 before its first read of them).",
	}, func() float64 { return float64(members()) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "controller_receipt_division_overlapping",
		Help: "Replaced memberships whose devices this instance still applies, within their grace (receipts applied twice meanwhile).",
	}, func() float64 { return float64(overlapping()) }))
}

// Deadlock implements store.Observer.
func (m *Metrics) Deadlock() { m.BatchDeadlocks.Inc() }

// storeChanges are the store's Change* names (store.ChangeSubmit,
// store.ChangeReceipts), the change label's values, present from the start.
var storeChanges = []string{"submit", "receipts"}

// Answered implements store.Observer.
func (m *Metrics) Answered(change string, took time.Duration) {
	m.ChangeSeconds.WithLabelValues(change).Observe(took.Seconds())
}

// Batch implements store.Observer.
func (m *Metrics) Batch(changes int, took time.Duration, fellBack bool) {
	m.BatchChanges.Observe(float64(changes))
	m.BatchSeconds.Observe(took.Seconds())
	if fellBack {
		m.BatchFallbacks.Inc()
	}
}
