package bench

import (
	"fmt"
	"strings"
)

// Markdown is the run as a page of the docs (make bench writes it to
// docs/bench-latest.md, which docs/benchmarks.md links): when, where and
// what ran, the headline figures and each phase, so that the docs carry
// the latest figures without anyone copying them by hand. History stays
// in git.
func (r *Result) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Latest `make bench` (%s, %d devices)\n\n", r.Backend, r.Devices)
	fmt.Fprintf(&b, "Written by `make bench` (cmd/bench) on %s; do not edit: run it again. ", r.Date)
	fmt.Fprintf(&b, "%s, %d CPUs, commit %s; %d controller instance(s), %d devices, %d callers in flight, %g s per phase. ",
		r.GoVersion, r.CPUs, orDash(r.Commit), r.Instances, r.Devices, r.Concurrency, r.Seconds)
	b.WriteString("What each figure means, and how to read them on a shared machine: [benchmarks.md](benchmarks.md).\n\n")
	b.WriteString("| figure | value |\n| --- | --- |\n")
	for _, row := range r.figures() {
		fmt.Fprintf(&b, "| %s | %s |\n", row[0], row[1])
	}
	b.WriteString("\n## Phases\n\n")
	b.WriteString("| phase | mode | ops/s | p50 ms | p99 ms | errors | db round trips/op | cpu ms/op by process |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, p := range r.Phases {
		mode := fmt.Sprintf("closed, %d in flight", p.Concurrency)
		if p.Mode == "open" {
			mode = fmt.Sprintf("open, %.1f/s", p.TargetRate)
		}
		var cpu []string
		for _, u := range p.CPU {
			cpu = append(cpu, fmt.Sprintf("%s %.3f", u.Process, u.MSPerOp))
		}
		rt := "-"
		if p.DBRoundTripsPerOp > 0 {
			rt = fmt.Sprintf("%.2f", p.DBRoundTripsPerOp)
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %.2f | %.2f | %d | %s | %s |\n", p.Name, mode, p.PerS, p.Latency.P50,
			p.Latency.P99, p.Errors+p.Skipped+p.Unfinished, rt, strings.Join(cpu, ", "))
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
