package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetctl/fleetctl/internal/benchwire"
)

// Result is latest.json. The flat fields are the figures the contract
// names; Phases has each phase in full.
type Result struct {
	Date        string  `json:"date"`
	GoVersion   string  `json:"go_version"`
	Commit      string  `json:"commit,omitempty"`
	CPUs        int     `json:"cpus"`
	Devices     int     `json:"devices"`
	Seconds     float64 `json:"seconds"`
	Warmup      float64 `json:"warmup_seconds"`
	Concurrency int     `json:"concurrency"`
	Backend     string  `json:"backend"`
	DB          string  `json:"db"`
	// Instances: the controller processes of the controller phases.
	Instances int `json:"instances"`

	CeilingPerS  float64 `json:"ceiling_per_s"`
	CeilingP50MS float64 `json:"ceiling_p50_ms"`
	CeilingP90MS float64 `json:"ceiling_p90_ms"`
	CeilingP99MS float64 `json:"ceiling_p99_ms"`

	ControllerPerS float64 `json:"controller_per_s"`
	Ratio          float64 `json:"ratio"`
	P50MS          float64 `json:"p50_ms"`
	P90MS          float64 `json:"p90_ms"`
	P99MS          float64 `json:"p99_ms"`

	// HalfLoadRate is R, half of controller_per_s: the arrival rate of
	// both half-load phases.
	HalfLoadRate         float64 `json:"half_load_rate_per_s"`
	HalfLoadP50MS        float64 `json:"half_load_p50_ms"`
	HalfLoadP99MS        float64 `json:"half_load_p99_ms"`
	CeilingHalfLoadP50MS float64 `json:"ceiling_half_load_p50_ms"`
	CeilingHalfLoadP99MS float64 `json:"ceiling_half_load_p99_ms"`
	FleetCeilingPerS     float64 `json:"fleet_ceiling_per_s"`
	FleetCeilingP50MS    float64 `json:"fleet_ceiling_p50_ms"`
	FleetCeilingP99MS    float64 `json:"fleet_ceiling_p99_ms"`
	FleetRatio           float64 `json:"fleet_ratio"`
	// ControllerPeakRSSMB is the largest instance's; Each has them all.
	ControllerPeakRSSMB     float64   `json:"controller_peak_rss_mb"`
	ControllerPeakRSSMBEach []float64 `json:"controller_peak_rss_mb_each,omitempty"`
	// DBRoundTripsPerOp: the statements the controllers sent to their
	// database per completed operation, saturated (controller phase) and
	// at half load.
	DBRoundTripsPerOp         float64 `json:"db_round_trips_per_op"`
	HalfLoadDBRoundTripsPerOp float64 `json:"half_load_db_round_trips_per_op"`
	CPUMSPerOp                float64 `json:"cpu_ms_per_op"`
	// PostgresCPUMSPerOp: a PostgreSQL server's on this host, saturated.
	PostgresCPUMSPerOp    float64 `json:"postgres_cpu_ms_per_op,omitempty"`
	BrokerCPUMSPerOp      float64 `json:"broker_cpu_ms_per_op,omitempty"`
	CeilingBrokerCPUMSPer float64 `json:"ceiling_broker_cpu_ms_per_op,omitempty"`
	Overloaded503         int64   `json:"overloaded_503"`
	// Errors counts, per phase, the operations that failed (any kind),
	// the open-loop arrivals skipped and the operations left unfinished.
	Errors      map[string]int64 `json:"errors"`
	TotalErrors int64            `json:"total_errors"`

	ControllerDevicesOnlineSeconds float64  `json:"controller_devices_online_seconds"`
	ControllerArgs                 []string `json:"controller_args"`
	// ControllerLogProblems counts each controller's WARN and ERROR log
	// lines; ControllerLogSamples keeps the first few of each.
	ControllerLogProblems map[string]int            `json:"controller_log_problems,omitempty"`
	ControllerLogSamples  []string                  `json:"controller_log_samples,omitempty"`
	MemoryFleet           *benchwire.FleetStats     `json:"memory_fleet,omitempty"`
	Commander             *benchwire.CommanderStats `json:"commander,omitempty"`
	Phases                []*Phase                  `json:"phases"`
	Notes                 []string                  `json:"notes"`
	byName                map[string]*Phase
}

func newResult(cfg Config) *Result {
	goVersion, commit := buildInfo()
	db := cfg.DB
	if db == "" {
		db = "(a temporary file)"
	}
	return &Result{
		Date: time.Now().UTC().Format(time.RFC3339), GoVersion: goVersion, Commit: commit, CPUs: runtime.NumCPU(),
		Devices: cfg.Devices, Seconds: cfg.Window.Seconds(), Warmup: cfg.Warmup.Seconds(), Concurrency: cfg.Concurrency,
		Backend: Backend(cfg.DB), DB: redactURL(db), Instances: cfg.Instances, Errors: map[string]int64{}, byName: map[string]*Phase{},
		Notes: []string{
			"ceiling: plain MQTT client -> in-memory devices (QoS 1 command, three QoS 1 receipts), no database, no controller",
			"controller: HTTP submit -> GET ?wait= until final, with the same in-memory devices; latency submit -> succeeded",
			"half load: open loop at R = controller_per_s / 2, latency from each arrival's due time; the ceiling's half load runs after the controller's, at the same R",
			"fleet ceiling: the ceiling's traffic to devicesim's own devices (durable state on disk)",
			"only operations finishing inside each window count (closed loop) or due inside it (open loop); a warm-up precedes each window",
			"every process shares this host's CPUs; cpu per phase and process is in phases[].cpu; a PostgreSQL server on this host (found by its port) is \"postgres\": its postmaster and every backend",
			"instances > 1: operation k is submitted to instance k % instances and waited for there; cpu_ms_per_op sums the instances",
			"db_round_trips_per_op: controller_store_round_trips_total of every instance (GET /metrics) after the phase's drain less before its start, over the operations it completed (warm-up and drain included)",
		},
	}
}

func (r *Result) add(p *Phase) {
	r.Phases = append(r.Phases, p)
	r.byName[p.Name] = p
	r.Errors[p.Name] = p.Errors
	if p.Skipped > 0 {
		r.Errors[p.Name+"_skipped"] = p.Skipped
	}
	if p.Unfinished > 0 {
		r.Errors[p.Name+"_unfinished"] = p.Unfinished
	}
	r.Overloaded503 += p.Overloaded
}

// finish derives the flat figures from the phases.
func (r *Result) finish() {
	get := func(name string) *Phase {
		if p := r.byName[name]; p != nil {
			return p
		}
		return &Phase{}
	}
	ceil, ctl, half, ceilHalf, fleet := get("ceiling"), get("controller"), get("controller_half_load"),
		get("ceiling_half_load"), get("fleet_ceiling")
	r.CeilingPerS, r.CeilingP50MS, r.CeilingP90MS, r.CeilingP99MS = round(ceil.PerS, 1), ceil.Latency.P50, ceil.Latency.P90, ceil.Latency.P99
	r.ControllerPerS, r.P50MS, r.P90MS, r.P99MS = round(ctl.PerS, 1), ctl.Latency.P50, ctl.Latency.P90, ctl.Latency.P99
	r.Ratio = ratio(ctl.PerS, ceil.PerS)
	r.HalfLoadRate = round(half.TargetRate, 1)
	r.HalfLoadP50MS, r.HalfLoadP99MS = half.Latency.P50, half.Latency.P99
	r.CeilingHalfLoadP50MS, r.CeilingHalfLoadP99MS = ceilHalf.Latency.P50, ceilHalf.Latency.P99
	r.FleetCeilingPerS, r.FleetCeilingP50MS, r.FleetCeilingP99MS = round(fleet.PerS, 1), fleet.Latency.P50, fleet.Latency.P99
	r.FleetRatio = ratio(ctl.PerS, fleet.PerS)
	var ctlMS float64
	for _, u := range ctl.CPU {
		switch {
		case u.Process == "controller" || strings.HasPrefix(u.Process, "controller-"):
			ctlMS += u.MS
		case u.Process == "mosquitto":
			r.BrokerCPUMSPerOp = round(u.MSPerOp, 3)
		case u.Process == "postgres":
			r.PostgresCPUMSPerOp = round(u.MSPerOp, 3)
		}
	}
	if ctl.Ops > 0 {
		r.CPUMSPerOp = round(ctlMS/float64(ctl.Ops), 3)
	}
	r.DBRoundTripsPerOp, r.HalfLoadDBRoundTripsPerOp = ctl.DBRoundTripsPerOp, half.DBRoundTripsPerOp
	for _, u := range ceil.CPU {
		if u.Process == "mosquitto" {
			r.CeilingBrokerCPUMSPer = round(u.MSPerOp, 3)
		}
	}
	for _, n := range r.Errors {
		r.TotalErrors += n
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round(a/b, 4)
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// write puts latest.json and latest.html in dir, and the same as
// NAME.json and NAME.html for each of names.
func (r *Result) write(dir string, names ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	html, err := r.html()
	if err != nil {
		return err
	}
	for _, name := range append([]string{"latest"}, names...) {
		if err := writeAtomic(filepath.Join(dir, name+".json"), append(b, '\n')); err != nil {
			return err
		}
		if err := writeAtomic(filepath.Join(dir, name+".html"), html); err != nil {
			return err
		}
	}
	return nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// table prints the figures a person reads first, then each phase.
func (r *Result) table(w io.Writer) {
	fmt.Fprintf(w, "\nfleetctl bench  %s  %s  %s backend  %d instance(s)  %d devices  %d in flight  %gs per phase  %d CPUs\n\n",
		r.Date, r.GoVersion, r.Backend, r.Instances, r.Devices, r.Concurrency, r.Seconds, r.CPUs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tmode\tops/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\terrors\tdb rt/op\tcpu ms/op (process)\t")
	for _, p := range r.Phases {
		mode := fmt.Sprintf("closed C=%d", p.Concurrency)
		if p.Mode == "open" {
			mode = fmt.Sprintf("open %.1f/s", p.TargetRate)
		}
		cpu := ""
		for _, u := range p.CPU {
			cpu += fmt.Sprintf(" %s %.3f", u.Process, u.MSPerOp)
		}
		rt := ""
		if p.DBRoundTripsPerOp > 0 {
			rt = fmt.Sprintf("%.2f", p.DBRoundTripsPerOp)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%s\t%s\t\n", p.Name, mode, p.PerS, p.Latency.P50,
			p.Latency.P90, p.Latency.P99, p.Latency.Max, p.Errors+p.Skipped+p.Unfinished, rt, cpu)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range r.figures() {
		fmt.Fprintf(tw, "%s\t%s\t\n", row[0], row[1])
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// figures are the headline numbers, as label and value.
func (r *Result) figures() [][2]string {
	f := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	msf := func(v float64) string { return fmt.Sprintf("%.2f ms", v) }
	pgCPU := "-"
	if r.PostgresCPUMSPerOp > 0 {
		pgCPU = fmt.Sprintf("%.3f", r.PostgresCPUMSPerOp)
	}
	return [][2]string{
		{"backend / instances", fmt.Sprintf("%s / %d", r.Backend, r.Instances)},
		{"ceiling_per_s", f(r.CeilingPerS)},
		{"controller_per_s", f(r.ControllerPerS)},
		{"ratio (controller / ceiling)", fmt.Sprintf("%.4f", r.Ratio)},
		{"fleet_ceiling_per_s (devicesim)", f(r.FleetCeilingPerS)},
		{"fleet_ratio (controller / fleet ceiling)", fmt.Sprintf("%.4f", r.FleetRatio)},
		{"p50 / p90 / p99 (controller, saturated)", fmt.Sprintf("%.2f / %.2f / %.2f ms", r.P50MS, r.P90MS, r.P99MS)},
		{"half-load rate R", f(r.HalfLoadRate) + "/s"},
		{"half_load_p99 (controller at R)", msf(r.HalfLoadP99MS)},
		{"ceiling_half_load_p99 (ceiling at R)", msf(r.CeilingHalfLoadP99MS)},
		{"controller_peak_rss (largest instance)", fmt.Sprintf("%.1f MiB", r.ControllerPeakRSSMB)},
		{"cpu_ms_per_op (controller, saturated)", fmt.Sprintf("%.3f", r.CPUMSPerOp)},
		{"postgres_cpu_ms_per_op (server, saturated)", pgCPU},
		{"db_round_trips_per_op (controller, saturated)", fmt.Sprintf("%.2f", r.DBRoundTripsPerOp)},
		{"half_load_db_round_trips_per_op", fmt.Sprintf("%.2f", r.HalfLoadDBRoundTripsPerOp)},
		{"overloaded_503 (honoured, retried)", fmt.Sprint(r.Overloaded503)},
		{"errors (all phases)", fmt.Sprint(r.TotalErrors)},
	}
}
