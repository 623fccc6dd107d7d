package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"
)

// loopbackAddr is the value of serve's --pprof: empty (off) or a loopback
// IP and a port, checked as the command line (or CONTROLLER_PPROF) is read,
// so a wrong one is a usage error before anything starts.
type loopbackAddr string

func (a *loopbackAddr) String() string { return string(*a) }
func (a *loopbackAddr) Type() string   { return "host:port" }

func (a *loopbackAddr) Set(v string) error {
	if err := checkLoopback(v); err != nil {
		return err
	}
	*a = loopbackAddr(v)
	return nil
}

// checkLoopback accepts "" and a loopback IP with a port (127.0.0.1:6061,
// [::1]:6061). A host name is refused, localhost included: what it resolves
// to is not the flag's to decide, and the profiler must never be reachable
// from another host.
func checkLoopback(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want a loopback host:port such as 127.0.0.1:6061: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback IP address: the profiler listens on loopback only (127.0.0.1:PORT or [::1]:PORT)", host)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// startPprof serves Go's profiler (/debug/pprof/) on addr until stop is
// called, and returns the address it listens on (port 0 picks one). The
// listener is open when it returns, so a port in use is an error at start,
// not a line in a log later.
func startPprof(addr string, log *slog.Logger) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // and every named profile: heap, goroutine, ...
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server", "err", err)
		}
	}()
	log.Info("pprof listening", "addr", ln.Addr().String())
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close() // a profile being taken does not hold the exit up
		}
		<-done
	}, nil
}
