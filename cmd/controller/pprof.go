package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

// CONTROLLER_PPROF=127.0.0.1:PORT serves Go's profiler on that loopback
// address, for finding where the time goes (make bench's notes use it).
func init() {
	addr := os.Getenv("CONTROLLER_PPROF")
	if addr == "" {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		os.Stderr.WriteString("CONTROLLER_PPROF must be a loopback host:port\n")
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.ListenAndServe(addr, mux) }()
}
