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

	// Fleet names the devices of the target phases: devicesim.
	Fleet string `json:"fleet"`
	// FleetStorage is what holds the fleet's durable files: tmpfs or disk
	// (Config.FleetDir).
	FleetStorage string `json:"fleet_storage"`

	// The pass-through saturated.
	PassthroughPerS  float64 `json:"passthrough_per_s"`
	PassthroughP50MS float64 `json:"passthrough_p50_ms"`
	PassthroughP99MS float64 `json:"passthrough_p99_ms"`
	// PassthroughCPUMSPerOp: the pass-through process's CPU per operation,
	// saturated.
	PassthroughCPUMSPerOp float64 `json:"passthrough_cpu_ms_per_op"`

	// The controller saturated; Ratio is controller_per_s /
	// passthrough_per_s.
	ControllerPerS float64 `json:"controller_per_s"`
	Ratio          float64 `json:"ratio"`
	P50MS          float64 `json:"p50_ms"`
	P90MS          float64 `json:"p90_ms"`
	P99MS          float64 `json:"p99_ms"`
	// ControllerCPUMSPerOp: the controllers' CPU per operation, saturated,
	// with a PostgreSQL server's on this host (it does the controller's
	// work); CPURatio is passthrough_cpu_ms_per_op / controller_cpu_ms_per_op.
	ControllerCPUMSPerOp float64 `json:"controller_cpu_ms_per_op"`
	CPURatio             float64 `json:"cpu_ratio"`
	// StatementsPerOp: the statements the controllers sent to their
	// database per completed operation, saturated
	// (controller_store_round_trips_total; each phase's db_round_trips_per_op).
	StatementsPerOp float64 `json:"statements_per_op"`

	// HalfLoadRate is R, half of controller_per_s: the arrival rate of
	// both half-load phases.
	HalfLoadRate             float64 `json:"half_load_rate"`
	HalfLoadP50MS            float64 `json:"half_load_p50_ms"`
	HalfLoadP99MS            float64 `json:"half_load_p99_ms"`
	PassthroughHalfLoadP50MS float64 `json:"passthrough_half_load_p50_ms"`
	PassthroughHalfLoadP99MS float64 `json:"passthrough_half_load_p99_ms"`
	HalfLoadP99Ratio         float64 `json:"half_load_p99_ratio"`
	// Where the controller's time at R goes, as means: an operation's
	// (HalfLoadMeanMS) holds a submit's wait for the store
	// (HalfLoadSubmitCommitMS: queue, batch, commit), a call applying its
	// receipts (HalfLoadReceiptCommitMS, likewise) and the rest: HTTP, the
	// broker, the device and the receipt's way in (HalfLoadOtherMS, by
	// difference); beside the pass-through's mean at R.
	HalfLoadMeanMS            float64 `json:"half_load_mean_ms"`
	HalfLoadSubmitCommitMS    float64 `json:"half_load_submit_commit_ms"`
	HalfLoadReceiptCommitMS   float64 `json:"half_load_receipt_commit_ms"`
	HalfLoadOtherMS           float64 `json:"half_load_other_ms"`
	PassthroughHalfLoadMeanMS float64 `json:"passthrough_half_load_mean_ms"`
	// The p99 of the two waits for the store at R (the phase's
	// SubmitCommitP99MS and ReceiptCommitP99MS): how much of the
	// controller's tail is the writer's queue.
	HalfLoadSubmitCommitP99MS   float64 `json:"half_load_submit_commit_p99_ms"`
	HalfLoadReceiptCommitP99MS  float64 `json:"half_load_receipt_commit_p99_ms"`
	PassthroughHalfLoadCPUMSPer float64 `json:"passthrough_half_load_cpu_ms_per_op"`
	HalfLoadCPUMSPerOp          float64 `json:"half_load_cpu_ms_per_op"`

	// The durable floor at R (a reference): the pass-through with each
	// command and final receipt synced to a log before it is answered, the
	// least a durable answer costs on this host. DurableFloorP99Ratio is its
	// p99 / the pass-through's at R, HalfLoadP99VsFloor the controller's /
	// its.
	DurableFloorHalfLoadP50MS float64 `json:"durable_floor_half_load_p50_ms"`
	DurableFloorHalfLoadP99MS float64 `json:"durable_floor_half_load_p99_ms"`
	DurableFloorCPUMSPerOp    float64 `json:"durable_floor_cpu_ms_per_op"`
	DurableFloorP99Ratio      float64 `json:"durable_floor_p99_ratio"`
	HalfLoadP99VsFloor        float64 `json:"half_load_p99_vs_floor"`

	// The controller with every action serial, saturated: SerialRatio is
	// serial / pass-through, SerialVsParallel serial / controller.
	SerialPerS            float64 `json:"serial_per_s"`
	SerialRatio           float64 `json:"serial_ratio"`
	SerialVsParallel      float64 `json:"serial_vs_parallel"`
	SerialCPUMSPerOp      float64 `json:"serial_cpu_ms_per_op"`
	SerialP50MS           float64 `json:"serial_p50_ms"`
	SerialP99MS           float64 `json:"serial_p99_ms"`
	SerialStatementsPerOp float64 `json:"serial_statements_per_op"`

	// The references: the MQTT-only ceiling (plain client, in-memory
	// fleet) and the plain client on devicesim.
	CeilingPerS       float64 `json:"ceiling_per_s"`
	CeilingP50MS      float64 `json:"ceiling_p50_ms"`
	CeilingP90MS      float64 `json:"ceiling_p90_ms"`
	CeilingP99MS      float64 `json:"ceiling_p99_ms"`
	CeilingRatio      float64 `json:"ceiling_ratio"`
	FleetCeilingPerS  float64 `json:"fleet_ceiling_per_s"`
	FleetCeilingP50MS float64 `json:"fleet_ceiling_p50_ms"`
	FleetCeilingP99MS float64 `json:"fleet_ceiling_p99_ms"`
	FleetRatio        float64 `json:"fleet_ratio"`
	// ControllerPeakRSSMB is the largest instance's; Each has them all.
	ControllerPeakRSSMB     float64   `json:"controller_peak_rss_mb"`
	ControllerPeakRSSMBEach []float64 `json:"controller_peak_rss_mb_each,omitempty"`
	// HalfLoadDBRoundTripsPerOp: StatementsPerOp at half load.
	HalfLoadDBRoundTripsPerOp float64 `json:"half_load_db_round_trips_per_op"`
	// CommitsPerOp and WriterBusy: the controller's commits per operation
	// and its writer's busy share, saturated and at half load.
	CommitsPerOp         float64 `json:"commits_per_op"`
	WriterBusy           float64 `json:"writer_busy"`
	HalfLoadCommitsPerOp float64 `json:"half_load_commits_per_op"`
	HalfLoadWriterBusy   float64 `json:"half_load_writer_busy"`
	// CPUMSPerOp: the controller processes' alone, saturated.
	CPUMSPerOp float64 `json:"cpu_ms_per_op"`
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
		Fleet: "devicesim",
		Notes: []string{
			"passthrough: bench passthrough, its own process: the load client's two routes, one QoS 1 command per operation, answered at the device's final receipt; no database, no retries, no leases",
			"controller: HTTP submit -> GET ?wait= until final, on a fresh database; latency submit -> succeeded; the same load client, broker and devicesim devices as the pass-through",
			"half load: open loop at R = controller_per_s / 2, latency from each arrival's due time; the pass-through's half load runs after the controller's, at the same R",
			"durable floor (reference): the pass-through with --log: each command and each final receipt written to a file in the run's directory and fdatasync'd (one writer, group commit) before it is answered or published; at the same R, after the pass-through's half load",
			"controller_serial: another fresh database, --policy {\"defaults\":{\"concurrency\":\"serial\"}}: one command in flight per device, in submit order",
			"ceiling (reference): plain MQTT client -> in-memory devices (QoS 1 command, three QoS 1 receipts), no HTTP, no database; fleet_ceiling: the same client -> devicesim's devices (durable state on disk)",
			"only operations finishing inside each window count (closed loop) or due inside it (open loop); a warm-up precedes each window",
			"every process shares this host's CPUs; cpu per phase and process is in phases[].cpu (bench: the load client, and in the ceiling phase the in-memory fleet too); a PostgreSQL server on this host (found by its port) is \"postgres\": its postmaster and every backend, counted in controller_cpu_ms_per_op",
			"instances > 1: operation k is submitted to instance k % instances and waited for there; cpu figures sum the instances",
			"statements_per_op (a phase's db_round_trips_per_op): controller_store_round_trips_total of every instance (GET /metrics) after the phase's drain less before its start, over the operations it completed (warm-up and drain included)",
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
	ceil, fleet, pt, ctl, half, ptHalf, floor, serial := get("ceiling"), get("fleet_ceiling"), get("passthrough"),
		get("controller"), get("controller_half_load"), get("passthrough_half_load"), get("durable_floor_half_load"),
		get("controller_serial")

	r.PassthroughPerS, r.PassthroughP50MS, r.PassthroughP99MS = round(pt.PerS, 1), pt.Latency.P50, pt.Latency.P99
	r.PassthroughCPUMSPerOp = targetCPU(pt, false)
	r.ControllerPerS, r.P50MS, r.P90MS, r.P99MS = round(ctl.PerS, 1), ctl.Latency.P50, ctl.Latency.P90, ctl.Latency.P99
	r.Ratio = ratio(ctl.PerS, pt.PerS)
	r.ControllerCPUMSPerOp = targetCPU(ctl, true)
	r.CPUMSPerOp = targetCPU(ctl, false)
	r.CPURatio = ratio(r.PassthroughCPUMSPerOp, r.ControllerCPUMSPerOp)
	r.StatementsPerOp = ctl.DBRoundTripsPerOp

	r.HalfLoadRate = round(half.TargetRate, 1)
	r.HalfLoadP50MS, r.HalfLoadP99MS = half.Latency.P50, half.Latency.P99
	r.PassthroughHalfLoadP50MS, r.PassthroughHalfLoadP99MS = ptHalf.Latency.P50, ptHalf.Latency.P99
	r.HalfLoadP99Ratio = ratio(half.Latency.P99, ptHalf.Latency.P99)
	r.HalfLoadMeanMS, r.PassthroughHalfLoadMeanMS = half.Latency.Mean, ptHalf.Latency.Mean
	r.HalfLoadSubmitCommitMS, r.HalfLoadReceiptCommitMS = half.SubmitCommitMS, half.ReceiptCommitMS
	r.HalfLoadSubmitCommitP99MS, r.HalfLoadReceiptCommitP99MS = half.SubmitCommitP99MS, half.ReceiptCommitP99MS
	if half.SubmitCommitMS > 0 {
		r.HalfLoadOtherMS = round(half.Latency.Mean-half.SubmitCommitMS-half.ReceiptCommitMS, 2)
	}
	r.HalfLoadCPUMSPerOp, r.PassthroughHalfLoadCPUMSPer = targetCPU(half, true), targetCPU(ptHalf, false)
	r.DurableFloorHalfLoadP50MS, r.DurableFloorHalfLoadP99MS = floor.Latency.P50, floor.Latency.P99
	r.DurableFloorCPUMSPerOp = targetCPU(floor, false)
	r.DurableFloorP99Ratio, r.HalfLoadP99VsFloor = ratio(floor.Latency.P99, ptHalf.Latency.P99), ratio(half.Latency.P99, floor.Latency.P99)

	r.SerialPerS, r.SerialP50MS, r.SerialP99MS = round(serial.PerS, 1), serial.Latency.P50, serial.Latency.P99
	r.SerialRatio, r.SerialVsParallel = ratio(serial.PerS, pt.PerS), ratio(serial.PerS, ctl.PerS)
	r.SerialCPUMSPerOp = targetCPU(serial, true)
	r.SerialStatementsPerOp = serial.DBRoundTripsPerOp

	r.CeilingPerS, r.CeilingP50MS, r.CeilingP90MS, r.CeilingP99MS = round(ceil.PerS, 1), ceil.Latency.P50, ceil.Latency.P90, ceil.Latency.P99
	r.CeilingRatio = ratio(ctl.PerS, ceil.PerS)
	r.FleetCeilingPerS, r.FleetCeilingP50MS, r.FleetCeilingP99MS = round(fleet.PerS, 1), fleet.Latency.P50, fleet.Latency.P99
	r.FleetRatio = ratio(ctl.PerS, fleet.PerS)
	for _, u := range ctl.CPU {
		switch u.Process {
		case "mosquitto":
			r.BrokerCPUMSPerOp = round(u.MSPerOp, 3)
		case "postgres":
			r.PostgresCPUMSPerOp = round(u.MSPerOp, 3)
		}
	}
	r.HalfLoadDBRoundTripsPerOp = half.DBRoundTripsPerOp
	r.CommitsPerOp, r.WriterBusy = ctl.CommitsPerOp, ctl.WriterBusy
	r.HalfLoadCommitsPerOp, r.HalfLoadWriterBusy = half.CommitsPerOp, half.WriterBusy
	for _, u := range ceil.CPU {
		if u.Process == "mosquitto" {
			r.CeilingBrokerCPUMSPer = round(u.MSPerOp, 3)
		}
	}
	for _, n := range r.Errors {
		r.TotalErrors += n
	}
}

// targetCPU is the CPU per operation of a phase's target: the
// pass-through, or every controller instance, with a local PostgreSQL
// server's when withServer.
func targetCPU(p *Phase, withServer bool) float64 {
	if p.Ops == 0 {
		return 0
	}
	var sum float64
	for _, u := range p.CPU {
		if isTarget(u.Process) || (withServer && u.Process == "postgres") {
			sum += u.MS
		}
	}
	return round(sum/float64(p.Ops), 3)
}

// isTarget says whether a CPU row (or a phase's Target) is a target's: the
// pass-through, the durable floor or a controller instance.
func isTarget(process string) bool {
	return process == "passthrough" || process == "durable_floor" || process == "controller" || strings.HasPrefix(process, "controller-")
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
	halfLoadParts, halfLoadWaits := "-", "-" // a controller without controller_store_change_seconds
	if r.HalfLoadSubmitCommitMS > 0 {
		halfLoadParts = fmt.Sprintf("%.2f = %.2f + %.2f + %.2f ms (%.2f)",
			r.HalfLoadMeanMS, r.HalfLoadSubmitCommitMS, r.HalfLoadReceiptCommitMS, r.HalfLoadOtherMS, r.PassthroughHalfLoadMeanMS)
		halfLoadWaits = fmt.Sprintf("%.1f / %.1f ms", r.HalfLoadSubmitCommitP99MS, r.HalfLoadReceiptCommitP99MS)
	}
	pgCPU := "-"
	if r.PostgresCPUMSPerOp > 0 {
		pgCPU = fmt.Sprintf("%.3f", r.PostgresCPUMSPerOp)
	}
	return [][2]string{
		{"backend / instances / fleet (its files)", fmt.Sprintf("%s / %d / %s (%s)", r.Backend, r.Instances, r.Fleet, r.FleetStorage)},
		{"passthrough_per_s", f(r.PassthroughPerS)},
		{"controller_per_s", f(r.ControllerPerS)},
		{"ratio (controller / pass-through)", fmt.Sprintf("%.4f", r.Ratio)},
		{"passthrough_cpu_ms_per_op", fmt.Sprintf("%.3f", r.PassthroughCPUMSPerOp)},
		{"controller_cpu_ms_per_op (with a local server's)", fmt.Sprintf("%.3f", r.ControllerCPUMSPerOp)},
		{"cpu_ratio (pass-through / controller)", fmt.Sprintf("%.4f", r.CPURatio)},
		{"p50 / p90 / p99 (controller, saturated)", fmt.Sprintf("%.2f / %.2f / %.2f ms", r.P50MS, r.P90MS, r.P99MS)},
		{"p50 / p99 (pass-through, saturated)", fmt.Sprintf("%.2f / %.2f ms", r.PassthroughP50MS, r.PassthroughP99MS)},
		{"half_load_rate R", f(r.HalfLoadRate) + "/s"},
		{"half_load_p99 (controller at R)", msf(r.HalfLoadP99MS)},
		{"passthrough_half_load_p99 (pass-through at R)", msf(r.PassthroughHalfLoadP99MS)},
		{"half_load_p99_ratio (controller / pass-through)", fmt.Sprintf("%.2f", r.HalfLoadP99Ratio)},
		{"half_load_mean = the store's answer to the submit + to the receipts + the rest (pass-through's mean)", halfLoadParts},
		{"p99 at R of the store's answer to the submit / to the receipts (from its histogram)", halfLoadWaits},
		{"durable_floor_half_load p50 / p99 (reference: the pass-through syncing both answers, at R)",
			fmt.Sprintf("%.2f / %.2f ms", r.DurableFloorHalfLoadP50MS, r.DurableFloorHalfLoadP99MS)},
		{"durable_floor_p99_ratio (floor / pass-through) / half_load_p99_vs_floor (controller / floor)",
			fmt.Sprintf("%.2f / %.2f", r.DurableFloorP99Ratio, r.HalfLoadP99VsFloor)},
		{"serial_per_s (every action serial)", f(r.SerialPerS)},
		{"serial_ratio (serial / pass-through)", fmt.Sprintf("%.4f", r.SerialRatio)},
		{"serial_vs_parallel (serial / controller)", fmt.Sprintf("%.4f", r.SerialVsParallel)},
		{"serial_cpu_ms_per_op", fmt.Sprintf("%.3f", r.SerialCPUMSPerOp)},
		{"serial p50 / p99", fmt.Sprintf("%.2f / %.2f ms", r.SerialP50MS, r.SerialP99MS)},
		{"statements_per_op (controller, saturated)", fmt.Sprintf("%.2f", r.StatementsPerOp)},
		{"serial_statements_per_op", fmt.Sprintf("%.2f", r.SerialStatementsPerOp)},
		{"half_load_db_round_trips_per_op", fmt.Sprintf("%.2f", r.HalfLoadDBRoundTripsPerOp)},
		{"commits_per_op / writer_busy (controller, saturated)", fmt.Sprintf("%.3f / %.3f", r.CommitsPerOp, r.WriterBusy)},
		{"half_load_commits_per_op / half_load_writer_busy", fmt.Sprintf("%.3f / %.3f", r.HalfLoadCommitsPerOp, r.HalfLoadWriterBusy)},
		{"controller_peak_rss (largest instance)", fmt.Sprintf("%.1f MiB", r.ControllerPeakRSSMB)},
		{"cpu_ms_per_op (controller processes alone)", fmt.Sprintf("%.3f", r.CPUMSPerOp)},
		{"postgres_cpu_ms_per_op (server, saturated)", pgCPU},
		{"ceiling_per_s (reference: MQTT only, in-memory fleet)", f(r.CeilingPerS)},
		{"fleet_ceiling_per_s (reference: MQTT only, devicesim)", f(r.FleetCeilingPerS)},
		{"overloaded_503 (honoured, retried)", fmt.Sprint(r.Overloaded503)},
		{"errors (all phases)", fmt.Sprint(r.TotalErrors)},
	}
}
