package bench

import (
	"context"
	"errors"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// op runs the k-th operation of a phase (k from 0) and returns once it
// is final; nil means it succeeded.
type op func(ctx context.Context, k int64) error

// Phase is one measured load: what ran, how fast, how long each took.
//
// A phase runs for warm-up plus its window; only operations that finish
// inside the window count (closed loop), or that were due inside it (open
// loop). The operations still running at the window's end are drained
// (waited for, up to the drain time) so the next phase starts on a quiet
// system, and are not counted.
type Phase struct {
	Name        string  `json:"name"`
	Target      string  `json:"target"` // ceiling (memory fleet), fleet (devicesim), passthrough, durable_floor, controller
	Mode        string  `json:"mode"`   // closed (C callers), open (fixed arrival rate)
	Concurrency int     `json:"concurrency,omitempty"`
	TargetRate  float64 `json:"target_rate_per_s,omitempty"`
	Seconds     float64 `json:"seconds"`
	Ops         int64   `json:"ops"`
	PerS        float64 `json:"per_s"`
	Errors      int64   `json:"errors"`
	// ErrorKinds counts the errors by kind; ErrorSamples keeps the first few.
	ErrorKinds   map[string]int64 `json:"error_kinds,omitempty"`
	ErrorSamples []string         `json:"error_samples,omitempty"`
	// Skipped: open-loop arrivals not started because maxOutstanding
	// operations were already running (the system fell that far behind).
	Skipped int64 `json:"skipped,omitempty"`
	// Unfinished: operations still running when the drain ended.
	Unfinished int64    `json:"unfinished,omitempty"`
	Latency    Summary  `json:"latency_ms"`
	Overloaded int64    `json:"overloaded_503,omitempty"`
	CPU        []CPUUse `json:"cpu,omitempty"`
	// Completed counts every operation that succeeded, warm-up and drain
	// included (Ops only those of the window).
	Completed int64 `json:"completed"`
	// DBRoundTrips (controller phases): the statements every instance sent
	// to its database from the phase's start to the end of its drain, and
	// per completed operation.
	DBRoundTrips      int64   `json:"db_round_trips,omitempty"`
	DBRoundTripsPerOp float64 `json:"db_round_trips_per_op,omitempty"`
	// Commits (controller phases): the batches every instance's writer
	// committed over the same span, and per completed operation;
	// WriterBusy the share of that span's time the writers spent applying
	// and committing them (their mean), from 0 to 1.
	Commits      int64   `json:"commits,omitempty"`
	CommitsPerOp float64 `json:"commits_per_op,omitempty"`
	WriterBusy   float64 `json:"writer_busy,omitempty"`
	// SubmitCommitMS and ReceiptCommitMS (controller phases): over the
	// same span, the mean time a submit, and a call applying receipts
	// (one, or a device's group), waited for the store's answer: the
	// writer's queue, the batch and its commit
	// (controller_store_change_seconds).
	SubmitCommitMS  float64 `json:"submit_commit_ms,omitempty"`
	ReceiptCommitMS float64 `json:"receipt_commit_ms,omitempty"`
	// SubmitCommitP99MS and ReceiptCommitP99MS: their p99, estimated from
	// the histogram's buckets (which double from 0.5 ms) as Prometheus's
	// histogram_quantile does.
	SubmitCommitP99MS  float64 `json:"submit_commit_p99_ms,omitempty"`
	ReceiptCommitP99MS float64 `json:"receipt_commit_p99_ms,omitempty"`

	latencies []time.Duration
}

// Summary is a latency distribution in milliseconds.
type Summary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// CPUUse is one process's CPU time over a phase's window.
type CPUUse struct {
	Process  string  `json:"process"`
	MS       float64 `json:"ms"`
	MSPerOp  float64 `json:"ms_per_op"`
	Fraction float64 `json:"cores"` // CPU time / window: 1.0 is one core busy
}

// loadOpts are the knobs every phase shares.
type loadOpts struct {
	warmup, window, drain time.Duration
	// procs: the processes whose CPU time is taken over the window;
	// trees: the same with their children's (a PostgreSQL server).
	procs, trees map[string]int
}

func (o loadOpts) sampler() *cpuSampler {
	return &cpuSampler{procs: o.procs, trees: o.trees, before: map[string]time.Duration{}, after: map[string]time.Duration{}}
}

type recorder struct {
	p          *Phase
	mu         sync.Mutex
	lat        []time.Duration
	ok         int64
	completed  int64
	errs       map[string]int64
	samples    []string
	errCount   int64
	unfinished atomic.Int64
}

func newRecorder(p *Phase) *recorder { return &recorder{p: p, errs: map[string]int64{}} }

// add records one operation; counted says whether it falls in the window.
func (r *recorder) add(lat time.Duration, err error, counted bool, drained bool) {
	if drained && err != nil && errors.Is(err, context.Canceled) {
		r.unfinished.Add(1)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errCount++
		r.errs[errKind(err)]++
		if len(r.samples) < 5 {
			r.samples = append(r.samples, err.Error())
		}
		return
	}
	r.completed++
	if counted {
		r.ok++
		r.lat = append(r.lat, lat)
	}
}

func (r *recorder) finish(window time.Duration) {
	p := r.p
	p.Seconds = window.Seconds()
	p.Ops = r.ok
	p.Completed = r.completed
	p.PerS = float64(r.ok) / window.Seconds()
	p.Errors = r.errCount
	if len(r.errs) > 0 {
		p.ErrorKinds = r.errs
		p.ErrorSamples = r.samples
	}
	p.Unfinished = r.unfinished.Load()
	p.latencies = r.lat
	p.Latency = summarize(r.lat)
}

// cpuSampler takes the CPU time of each process at the window's start and
// end.
type cpuSampler struct {
	procs  map[string]int
	trees  map[string]int
	before map[string]time.Duration
	after  map[string]time.Duration
}

func (c *cpuSampler) sample(into map[string]time.Duration) {
	for name, pid := range c.procs {
		if t, err := cpuTime(pid); err == nil {
			into[name] = t
		}
	}
	for name, pid := range c.trees {
		if t, err := treeCPUTime(pid); err == nil {
			into[name] = t
		}
	}
}

func (c *cpuSampler) result(p *Phase) {
	names := make([]string, 0, len(c.procs)+len(c.trees))
	for name := range c.procs {
		names = append(names, name)
	}
	for name := range c.trees {
		names = append(names, name)
	}
	for _, name := range names {
		b, ok1 := c.before[name]
		a, ok2 := c.after[name]
		if !ok1 || !ok2 {
			continue
		}
		ms := float64(a-b) / float64(time.Millisecond)
		u := CPUUse{Process: name, MS: ms, Fraction: round(ms/1000/p.Seconds, 3)}
		if p.Ops > 0 {
			u.MSPerOp = round(ms/float64(p.Ops), 4)
		}
		p.CPU = append(p.CPU, u)
	}
	sort.Slice(p.CPU, func(i, j int) bool { return p.CPU[i].Process < p.CPU[j].Process })
}

// edges returns the window's start and end, and a channel closed once the
// CPU samples at both are taken (or ctx ended).
func (o loadOpts) edges(ctx context.Context, start time.Time, cs *cpuSampler) (time.Time, time.Time, <-chan struct{}) {
	from, to := start.Add(o.warmup), start.Add(o.warmup+o.window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if sleep(ctx, time.Until(from)) != nil {
			return
		}
		cs.sample(cs.before)
		if sleep(ctx, time.Until(to)) != nil {
			return
		}
		cs.sample(cs.after)
	}()
	return from, to, done
}

// closedLoop runs conc callers, each starting its next operation when the
// last one is final, until the window ends.
func closedLoop(ctx context.Context, p *Phase, conc int, o loadOpts, run op) {
	p.Mode, p.Concurrency = "closed", conc
	rec := newRecorder(p)
	cs := o.sampler()
	opCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	from, to, sampled := o.edges(ctx, start, cs)
	drainEnd := time.AfterFunc(time.Until(to.Add(o.drain)), cancel)
	defer drainEnd.Stop()
	var seq atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(to) {
				k := seq.Add(1) - 1
				t0 := time.Now()
				err := run(opCtx, k)
				t1 := time.Now()
				rec.add(t1.Sub(t0), err, !t1.Before(from) && !t1.After(to), t1.After(to))
			}
		}()
	}
	wg.Wait()
	<-sampled
	rec.finish(o.window)
	cs.result(p)
}

// openLoop starts operations at a fixed rate, whatever the system's
// answers, until the window ends. A latency counts from the arrival's due
// time, not from when it actually started, so a loop that falls behind
// shows in the figures instead of hiding (coordinated omission). At most
// maxOutstanding operations run at once; arrivals past that are skipped
// and counted.
func openLoop(ctx context.Context, p *Phase, rate float64, maxOutstanding int64, o loadOpts, run op) {
	p.Mode, p.TargetRate = "open", rate
	rec := newRecorder(p)
	cs := o.sampler()
	opCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	from, to, sampled := o.edges(ctx, start, cs)
	var (
		wg          sync.WaitGroup
		outstanding atomic.Int64
		skipped     int64
	)
	for k := int64(0); ctx.Err() == nil; k++ {
		due := start.Add(time.Duration(float64(k) / rate * float64(time.Second)))
		if !due.Before(to) {
			break
		}
		if d := time.Until(due); d > 0 {
			if sleep(ctx, d) != nil {
				break
			}
		}
		inWindow := !due.Before(from)
		if outstanding.Load() >= maxOutstanding {
			if inWindow {
				skipped++
			}
			continue
		}
		outstanding.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer outstanding.Add(-1)
			err := run(opCtx, k)
			t1 := time.Now()
			rec.add(t1.Sub(due), err, inWindow, t1.After(to.Add(o.drain)))
		}()
	}
	// The window lasts its length even when the last arrival is due
	// earlier and done at once.
	<-sampled
	drainEnd := time.AfterFunc(time.Until(to.Add(o.drain)), cancel)
	defer drainEnd.Stop()
	wg.Wait()
	rec.finish(o.window)
	p.Skipped = skipped
	cs.result(p)
}

// sleep waits d, or less if ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func summarize(lat []time.Duration) Summary {
	if len(lat) == 0 {
		return Summary{}
	}
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Summary{
		Mean: ms(sum / time.Duration(len(s))),
		P50:  ms(quantile(s, 0.50)), P90: ms(quantile(s, 0.90)), P99: ms(quantile(s, 0.99)), P999: ms(quantile(s, 0.999)),
		Max: ms(s[len(s)-1]),
	}
}

// quantile is the nearest-rank quantile of sorted values.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
