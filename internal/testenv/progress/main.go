// Command progress shows a long `go test -json` run as it goes, without
// the flood of -v: one line per package when it ends (as go test prints
// them), the whole output of every failing test and package, benchmark
// results, and, whenever nothing was printed for a while, a line saying
// what is still running. It exits 1 if anything failed.
//
//	go test -json ./... 2>&1 | progress [-every 30s]
//
// Input lines that are not test2json events (go vet's, a build error) are
// copied as they are. It ignores SIGINT and SIGTERM: after an interrupt
// the test binaries still report, and it reads until go test is gone.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Elapsed    float64
	Output     string
}

type pkgState struct {
	started  bool
	done     bool
	running  map[string]bool
	finished int                 // top-level tests
	benches  int                 // benchmark result lines
	output   map[string][]string // by test; "" for the package's own lines
	partial  map[string]string   // by test: output not ended by a newline yet
}

type tracker struct {
	mu       sync.Mutex
	w        io.Writer
	start    time.Time
	every    time.Duration
	lastOut  time.Time
	pkgs     map[string]*pkgState
	order    []string
	done     int
	failed   []string
	passed   int
	benches  int
	build    map[string][]string
	anything bool
}

var benchLine = regexp.MustCompile(`^Benchmark\S*\s+\d+\s+\S`)

func main() {
	every := flag.Duration("every", 25*time.Second, "print what is running when nothing was printed for this long")
	flag.Parse()
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	t := &tracker{w: os.Stdout, start: time.Now(), every: *every, lastOut: time.Now(),
		pkgs: map[string]*pkgState{}, build: map[string][]string{}}
	stop := make(chan struct{})
	go t.heartbeat(stop)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		t.line(sc.Text())
	}
	close(stop)
	os.Exit(t.summary())
}

func (t *tracker) printf(format string, args ...any) {
	fmt.Fprintf(t.w, format, args...)
	t.lastOut = time.Now()
}

func (t *tracker) pkg(name string) *pkgState {
	p := t.pkgs[name]
	if p == nil {
		p = &pkgState{running: map[string]bool{}, output: map[string][]string{}, partial: map[string]string{}}
		t.pkgs[name] = p
		t.order = append(t.order, name)
	}
	return p
}

func (t *tracker) line(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var e event
	if !strings.HasPrefix(s, "{") || json.Unmarshal([]byte(s), &e) != nil || (e.Action == "" && e.ImportPath == "") {
		t.printf("%s\n", s)
		return
	}
	t.anything = true
	switch e.Action {
	case "build-output":
		t.build[e.ImportPath] = append(t.build[e.ImportPath], e.Output)
		return
	case "build-fail":
		t.printf("%s", strings.Join(t.build[e.ImportPath], ""))
		t.failed = append(t.failed, e.ImportPath+" [build failed]")
		return
	}
	p := t.pkg(e.Package)
	switch e.Action {
	case "start":
		p.started = true
	case "run":
		p.running[e.Test] = true
	case "output":
		p.output[e.Test] = append(p.output[e.Test], e.Output)
		// A benchmark prints its name, runs, then its numbers: two events.
		line := p.partial[e.Test] + e.Output
		if !strings.HasSuffix(line, "\n") {
			p.partial[e.Test] = line
			return
		}
		delete(p.partial, e.Test)
		if benchLine.MatchString(line) {
			p.benches++
			t.benches++
			t.printf("%s", line)
		}
	case "pass", "fail", "skip":
		if e.Test != "" {
			delete(p.running, e.Test)
			if !strings.Contains(e.Test, "/") {
				p.finished++
			}
			if e.Action == "fail" {
				t.printf("%s", strings.Join(p.output[e.Test], ""))
				t.failed = append(t.failed, e.Package+" "+e.Test)
			} else if e.Action == "pass" && !strings.Contains(e.Test, "/") {
				t.passed++
			}
			delete(p.output, e.Test)
			return
		}
		p.done = true
		t.done++
		switch {
		case e.Action == "fail":
			// The package's own lines: a panic, goleak, its FAIL line.
			t.printf("%s", strings.Join(p.output[""], ""))
			t.failed = append(t.failed, e.Package)
		case p.benches > 0:
			t.printf("ok  \t%s\t%.1fs\t(%d benchmarks)\n", e.Package, e.Elapsed, p.benches)
		case e.Action == "skip" || p.finished == 0:
			// no test files, or no test matched: nothing ran
		default:
			t.printf("ok  \t%s\t%.1fs\t(%d tests)\n", e.Package, e.Elapsed, p.finished)
		}
	}
}

// heartbeat says what is running whenever nothing was printed for t.every.
func (t *tracker) heartbeat(stop <-chan struct{}) {
	tick := time.NewTicker(t.every / 6)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		t.mu.Lock()
		if time.Since(t.lastOut) >= t.every {
			t.printf("… %s: %s\n", time.Since(t.start).Round(time.Second), t.status())
		}
		t.mu.Unlock()
	}
}

func (t *tracker) status() string {
	var running []string
	for _, name := range t.order {
		p := t.pkgs[name]
		if p.done || !p.started {
			continue
		}
		var tests []string
		for test := range p.running {
			if !strings.Contains(test, "/") {
				tests = append(tests, test)
			}
		}
		sort.Strings(tests)
		desc := fmt.Sprintf("%s (%d tests done", strings.TrimPrefix(name, "github.com/fleetctl/fleetctl/"), p.finished)
		if len(tests) > 0 {
			more := ""
			if len(tests) > 3 {
				more = fmt.Sprintf(" +%d", len(tests)-3)
				tests = tests[:3]
			}
			desc += "; running " + strings.Join(tests, ", ") + more
		}
		running = append(running, desc+")")
	}
	s := fmt.Sprintf("%d packages done, %d failures", t.done, len(t.failed))
	if len(running) > 0 {
		s += "; still running: " + strings.Join(running, ", ")
	} else {
		s += "; building"
	}
	return s
}

func (t *tracker) summary() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	took := time.Since(t.start).Round(time.Second)
	if len(t.failed) > 0 {
		t.printf("FAILED after %s: %s\n", took, strings.Join(t.failed, "; "))
		return 1
	}
	for _, name := range t.order {
		if p := t.pkgs[name]; p.started && !p.done {
			t.printf("INCOMPLETE after %s: %s did not finish (interrupted?)\n", took, name)
			return 1
		}
	}
	if !t.anything {
		return 1 // go test did not run: its own message was copied above
	}
	if t.benches > 0 {
		t.printf("passed: %d benchmarks in %d packages, %s\n", t.benches, t.done, took)
		return 0
	}
	t.printf("passed: %d tests in %d packages, %s\n", t.passed, t.done, took)
	return 0
}
