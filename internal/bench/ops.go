package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fleetctl/fleetctl/internal/benchwire"
)

// opTimeout bounds one operation, submit to final state.
const opTimeout = 60 * time.Second

// pollWait is the ?wait= of each GET /v1/operations/{id} long-poll.
const pollWait = 30 * time.Second

// maxRetryAfter caps how long a 503's Retry-After makes a caller wait.
const maxRetryAfter = 30 * time.Second

// work is the k-th operation of a phase: which device, what action and
// params, and its operation_id in the contract's default form
// task_id:step:target:business_version (a fresh task id per operation).
type work struct {
	device, action, taskID, operationID string
	params                              json.RawMessage
}

func workFor(runID, phase string, devices int, k int64) work {
	w := work{device: benchwire.DeviceID(int(k%int64(devices)) + 1), taskID: fmt.Sprintf("%s-%s-%d", runID, phase, k)}
	if k%2 == 0 {
		w.action, w.params = benchwire.ActionRestart, json.RawMessage(`{"reason":"bench"}`)
	} else {
		w.action, w.params = benchwire.ActionSetConfig, json.RawMessage(fmt.Sprintf(`{"bench_k":%d}`, k))
	}
	w.operationID = w.taskID + ":" + w.action + ":" + w.device + ":v1"
	return w
}

// ceilingOp sends the k-th command straight to a device through the
// Commander and waits for its succeeded receipt.
func ceilingOp(cm *benchwire.Commander, runID, phase string, devices int) op {
	return func(ctx context.Context, k int64) error {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		w := workFor(runID, phase, devices, k)
		_, err := cm.Do(ctx, w.device, w.operationID, w.action, w.params)
		return err
	}
}

// controllerLoad drives the controllers through their HTTP API only:
// the k-th operation of a phase goes to bases[k%len(bases)], which is
// also asked for its final state.
type controllerLoad struct {
	bases      []string
	http       *http.Client
	runID      string
	devices    int
	overloaded atomic.Int64 // 503 answers, each honoured and retried
}

func newControllerLoad(bases []string, runID string, devices, conc int) *controllerLoad {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 4*conc + 64
	tr.MaxIdleConnsPerHost = 4*conc + 64
	return &controllerLoad{bases: bases, runID: runID, devices: devices,
		http: &http.Client{Transport: tr, Timeout: pollWait + 30*time.Second}}
}

// submitBody is POST /v1/operations's body (as internal/api decodes it).
type submitBody struct {
	TaskID          string          `json:"task_id"`
	Step            string          `json:"step"`
	Target          string          `json:"target"`
	BusinessVersion string          `json:"business_version"`
	Action          string          `json:"action"`
	Params          json.RawMessage `json:"params"`
}

// operation is the part of the API's operation record the bench reads.
type operation struct {
	OperationID string `json:"operation_id"`
	Status      string `json:"status"`
	Reason      string `json:"reason"`
}

// httpError is an answer other than 200/201 (and other than a 503, which
// is retried).
type httpError struct {
	method string
	status int
	code   string
	body   string
}

func (e *httpError) Error() string {
	return fmt.Sprintf("%s: %d %s %s", e.method, e.status, e.code, e.body)
}

// finalError: the operation ended in another state than succeeded.
type finalError struct{ op operation }

func (e *finalError) Error() string {
	return fmt.Sprintf("operation %s ended %s (%s)", e.op.OperationID, e.op.Status, e.op.Reason)
}

// op submits the k-th operation and long-polls it until it is final.
func (c *controllerLoad) op(phase string) op {
	return func(ctx context.Context, k int64) error {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		w := workFor(c.runID, phase, c.devices, k)
		base := c.instance(k)
		body, _ := json.Marshal(submitBody{TaskID: w.taskID, Step: w.action, Target: w.device, BusinessVersion: "v1",
			Action: w.action, Params: w.params})
		got, err := c.call(ctx, http.MethodPost, base+"/v1/operations", body)
		if err != nil {
			return err
		}
		if got.OperationID != w.operationID {
			return fmt.Errorf("submit: operation_id %q, want %q", got.OperationID, w.operationID)
		}
		for got.Status == "started" {
			if got, err = c.call(ctx, http.MethodGet, base+"/v1/operations/"+url.PathEscape(w.operationID)+
				"?wait="+pollWait.String(), nil); err != nil {
				return err
			}
		}
		if got.Status != "succeeded" {
			return &finalError{got}
		}
		return nil
	}
}

// instance is the base URL of the controller that gets the k-th operation.
func (c *controllerLoad) instance(k int64) string { return c.bases[int(k%int64(len(c.bases)))] }

// call sends one request (to an absolute URL), honouring a 503's Retry-After and sending the
// same request again (the same operation_id: a retry of one intent).
func (c *controllerLoad) call(ctx context.Context, method, target string, body []byte) (operation, error) {
	path := target
	if u, err := url.Parse(target); err == nil {
		path = u.Path
	}
	for {
		req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
		if err != nil {
			return operation{}, err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return operation{}, err
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return operation{}, err
		}
		switch resp.StatusCode {
		case http.StatusOK, http.StatusCreated:
			var op operation
			if err := json.Unmarshal(raw, &op); err != nil {
				return operation{}, fmt.Errorf("%s %s: decode: %w", method, path, err)
			}
			return op, nil
		case http.StatusServiceUnavailable:
			c.overloaded.Add(1)
			if err := sleep(ctx, retryAfter(resp.Header.Get("Retry-After"))); err != nil {
				return operation{}, err
			}
			continue
		}
		var e struct {
			Code string `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		return operation{}, &httpError{method: method, status: resp.StatusCode, code: e.Code, body: strings.TrimSpace(string(raw))}
	}
}

// retryAfter reads a Retry-After header: seconds (fractions accepted) or
// an HTTP date; absent or unreadable, one second. It is capped at
// maxRetryAfter.
func retryAfter(h string) time.Duration {
	d := time.Second
	if s, err := strconv.ParseFloat(strings.TrimSpace(h), 64); err == nil && s >= 0 {
		d = time.Duration(s * float64(time.Second))
	} else if t, err := http.ParseTime(h); err == nil {
		d = time.Until(t)
	}
	return max(0, min(d, maxRetryAfter))
}

// errKind names an error's class for the counts.
func errKind(err error) string {
	var he *httpError
	var fe *finalError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, benchwire.ErrNotSucceeded):
		return "device_not_succeeded"
	case errors.As(err, &he):
		if he.code != "" {
			return fmt.Sprintf("http_%d_%s", he.status, he.code)
		}
		return fmt.Sprintf("http_%d", he.status)
	case errors.As(err, &fe):
		return "operation_" + fe.op.Status
	}
	return "other"
}

// onlineDevices counts the devices that instance i's GET /v1/devices
// shows online, following the pages (?limit=, ?after=, Link rel="next")
// where the API has them.
func (c *controllerLoad) onlineDevices(ctx context.Context, i int) (int, error) {
	base := c.bases[i]
	next := base + "/v1/devices?online=true&limit=10000"
	n := 0
	for pages := 0; next != "" && pages < 1000; pages++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, next, nil)
		if err != nil {
			return 0, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return 0, err
		}
		var devs []struct {
			Online bool `json:"online"`
		}
		err = json.NewDecoder(resp.Body).Decode(&devs)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET /v1/devices: %d", resp.StatusCode)
		}
		if err != nil {
			return 0, fmt.Errorf("GET /v1/devices: %w", err)
		}
		for _, d := range devs {
			if d.Online {
				n++
			}
		}
		next = nextLink(base, resp.Header.Get("Link"))
	}
	return n, nil
}

// nextLink returns the rel="next" target of a Link header, resolved
// against base, or "".
func nextLink(base, h string) string {
	for _, part := range strings.Split(h, ",") {
		target, params, ok := strings.Cut(strings.TrimSpace(part), ";")
		if !ok || !strings.Contains(strings.ReplaceAll(params, " ", ""), `rel="next"`) {
			continue
		}
		target = strings.Trim(strings.TrimSpace(target), "<>")
		b, err1 := url.Parse(base)
		t, err2 := url.Parse(target)
		if err1 != nil || err2 != nil {
			return ""
		}
		return b.ResolveReference(t).String()
	}
	return ""
}

// storeSample is what the bench reads of one controller's store at GET
// /metrics around each controller phase: the statements sent to the
// database (controller_store_round_trips_total: BEGIN, SAVEPOINT, RELEASE
// and COMMIT included), the writer's batches (controller_store_batch_seconds:
// one commit each, and the seconds it spent applying and committing them),
// and how long a submit, and a call applying receipts, waited for the
// store's answer (controller_store_change_seconds, by storeWaits).
type storeSample struct {
	trips float64
	batch histogram
	waits [len(storeWaits)]histogram
}

// storeWaits are the values of controller_store_change_seconds' label
// change that the bench reads. A controller built before that histogram
// (bench --bin of an older build) has neither, and its phases go without
// the figures they give (countStore).
var storeWaits = [...]string{"submit", "receipts"}

// readStoreSample reads instance i's storeSample.
func (c *controllerLoad) readStoreSample(ctx context.Context, i int) (storeSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.bases[i]+"/metrics", nil)
	if err != nil {
		return storeSample{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return storeSample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return storeSample{}, fmt.Errorf("GET %s/metrics: %d", c.bases[i], resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return storeSample{}, fmt.Errorf("GET %s/metrics: %w", c.bases[i], err)
	}
	sample, err := storeSampleOf(families)
	if err != nil {
		return storeSample{}, fmt.Errorf("GET %s/metrics: %w", c.bases[i], err)
	}
	return sample, nil
}

// storeSampleOf picks the store's series out of one reading of /metrics.
// The round trips and the batches must be there; the waits may not
// (storeWaits).
func storeSampleOf(families map[string]*dto.MetricFamily) (storeSample, error) {
	one := func(name string) (*dto.Metric, error) {
		if f := families[name]; f != nil && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0], nil
		}
		return nil, fmt.Errorf("no %s (a controller without it?)", name)
	}
	trips, err := one("controller_store_round_trips_total")
	if err != nil {
		return storeSample{}, err
	}
	batches, err := one("controller_store_batch_seconds")
	if err != nil {
		return storeSample{}, err
	}
	if trips.GetCounter() == nil || batches.GetHistogram() == nil {
		return storeSample{}, errors.New("controller_store_round_trips_total is not a counter, or controller_store_batch_seconds not a histogram")
	}
	s := storeSample{trips: trips.GetCounter().GetValue(), batch: histogramOf(batches.GetHistogram())}
	for _, m := range families["controller_store_change_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if k := slices.Index(storeWaits[:], l.GetValue()); l.GetName() == "change" && k >= 0 {
				s.waits[k] = histogramOf(m.GetHistogram())
			}
		}
	}
	return s, nil
}

// add is s plus sign times other, series by series: a phase's sample is
// the reading after it add the one before with sign -1, and several
// instances' add up with sign 1.
func (s storeSample) add(other storeSample, sign float64) storeSample {
	out := storeSample{trips: s.trips + sign*other.trips, batch: s.batch.add(other.batch, sign)}
	for k := range out.waits {
		out.waits[k] = s.waits[k].add(other.waits[k], sign)
	}
	return out
}

// histogram is one series of a Prometheus histogram: its cumulative
// buckets by le (+Inf last, whose count is the series' count) and the sum
// of its observations.
type histogram struct {
	buckets []bucket
	sum     float64
}

// bucket is one cumulative bucket: the observations at most le.
type bucket struct{ le, n float64 }

// histogramOf is a parsed series as a histogram, its +Inf bucket (the
// series' count) added if the text had none.
func histogramOf(h *dto.Histogram) histogram {
	out := histogram{sum: h.GetSampleSum()}
	for _, b := range h.GetBucket() {
		out.buckets = append(out.buckets, bucket{le: b.GetUpperBound(), n: float64(b.GetCumulativeCount()) + b.GetCumulativeCountFloat()})
	}
	slices.SortFunc(out.buckets, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if n := len(out.buckets); n == 0 || !math.IsInf(out.buckets[n-1].le, 1) {
		out.buckets = append(out.buckets, bucket{le: math.Inf(1), n: float64(h.GetSampleCount()) + h.GetSampleCountFloat()})
	}
	return out
}

// count is the observations in h (its +Inf bucket's).
func (h histogram) count() float64 {
	if len(h.buckets) == 0 {
		return 0
	}
	return h.buckets[len(h.buckets)-1].n
}

// add is h plus sign times other, bucket by bucket (matched by le, a
// bucket only one has counting 0 in the other; storeSample.add).
func (h histogram) add(other histogram, sign float64) histogram {
	out := histogram{buckets: slices.Clone(h.buckets), sum: h.sum + sign*other.sum}
	for _, x := range other.buckets {
		i := slices.IndexFunc(out.buckets, func(b bucket) bool { return b.le == x.le })
		if i < 0 {
			out.buckets, i = append(out.buckets, bucket{le: x.le}), len(out.buckets)
		}
		out.buckets[i].n += sign * x.n
	}
	slices.SortFunc(out.buckets, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	return out
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linearly within the bucket where it falls (from 0 in the first);
// in the +Inf bucket, the largest finite bound. 0 when there are no
// observations.
func (h histogram) quantile(q float64) float64 {
	if h.count() <= 0 {
		return 0
	}
	rank := q * h.count()
	lower, below := 0.0, 0.0
	for _, x := range h.buckets {
		if x.n >= rank {
			if math.IsInf(x.le, 1) {
				return lower
			}
			return lower + (x.le-lower)*(rank-below)/(x.n-below)
		}
		lower, below = x.le, x.n
	}
	return lower
}
