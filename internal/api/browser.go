package api

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Browser rules. A web page open in an operator's browser can send requests
// to a controller on the operator's machine, and with DNS rebinding (its own
// name made to resolve to 127.0.0.1) read the answers. Three checks, before
// any route, auth or body is looked at, keep it out:
//
//   - Host: a request whose Host is not one the API answers to is refused
//     with 421 misdirected_request (a rebinding page's requests carry its
//     own name). The API answers to its listen address; for a loopback
//     listener also to localhost, 127.0.0.1 and [::1] on its port; for a
//     wildcard listener (0.0.0.0, [::]) to any IP literal and localhost on
//     its port (an IP literal cannot be rebound); and to every name given
//     with --http-host (a name alone: on any port, as behind a proxy;
//     name:port: that port only). /healthz and /metrics are exempt: they
//     carry nothing a token guards, and a Prometheus scraper sends the
//     Host of its target, whatever name it was given.
//   - Origin: a request that carries an Origin header (browsers send it on
//     every cross-origin request and every POST) is refused with 403
//     forbidden_origin unless it is the API's own: http or https and a host
//     the Host rule accepts. "Origin: null" is refused. Requests without
//     Origin (curl, the CLI, scripts) are not browsers' and pass.
//   - Content-Type: a request with a body, or a POST, PUT, PATCH or DELETE
//     that names a type, must be application/json (charset, if given,
//     utf-8), else 415 unsupported_media_type: the bodies a page may send
//     without asking first (text/plain, forms) are refused.

// HostPolicy is the set of Host values the API answers to (Config.Hosts).
type HostPolicy struct {
	port    string          // the listen port
	names   map[string]bool // hosts answered on port
	anyIP   bool            // a wildcard listener: any IP literal on port
	anyPort map[string]bool // --http-host names given without a port
	exact   map[string]bool // --http-host host:port
	shown   []string        // for messages
}

// NewHostPolicy builds the policy of a listener at listen (host:port, the
// port as bound) and the extra names of --http-host (each a name or
// name:port).
func NewHostPolicy(listen string, extra []string) (*HostPolicy, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", listen, err)
	}
	p := &HostPolicy{port: port, names: map[string]bool{}, anyPort: map[string]bool{}, exact: map[string]bool{}}
	h := normalHost(host)
	addr, err := netip.ParseAddr(h)
	ip := err == nil
	switch {
	case h == "" || ip && addr.IsUnspecified():
		p.anyIP = true
		p.names["localhost"] = true
		p.shown = append(p.shown, "any IP address:"+port, "localhost:"+port)
	case h == "localhost" || ip && addr.IsLoopback():
		for _, n := range []string{h, "localhost", "127.0.0.1", "::1"} {
			p.names[n] = true
		}
		p.shown = append(p.shown, net.JoinHostPort(h, port))
		if h != "localhost" {
			p.shown = append(p.shown, "localhost:"+port)
		}
	default:
		p.names[h] = true
		p.shown = append(p.shown, net.JoinHostPort(h, port))
	}
	for _, e := range extra {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if eh, ep, err := net.SplitHostPort(e); err == nil {
			if normalHost(eh) == "" || ep == "" {
				return nil, fmt.Errorf("--http-host %q: want a name or name:port", e)
			}
			p.exact[net.JoinHostPort(normalHost(eh), ep)] = true
		} else {
			n := normalHost(e)
			if n == "" || strings.ContainsAny(n, "/:@ ") {
				return nil, fmt.Errorf("--http-host %q: want a name or name:port", e)
			}
			p.anyPort[n] = true
		}
		p.shown = append(p.shown, e)
	}
	return p, nil
}

// normalHost lowercases a host, drops IPv6 brackets and a trailing dot,
// and writes an IP address in its canonical form.
func normalHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")), ".")
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// allows reports whether hostport (a Host header, or an origin's host) is
// one the API answers to; defaultPort is the port a hostport without one
// means (80 for http, 443 for https).
func (p *HostPolicy) allows(hostport, defaultPort string) bool {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, defaultPort
	}
	host = normalHost(host)
	if host == "" {
		return false
	}
	if p.exact[net.JoinHostPort(host, port)] || p.anyPort[host] {
		return true
	}
	if port != p.port {
		return false
	}
	if p.names[host] {
		return true
	}
	_, err = netip.ParseAddr(host)
	return p.anyIP && err == nil
}

func (p *HostPolicy) describe() string {
	s := slices.Clone(p.shown)
	sort.Strings(s[1:])
	return strings.Join(s, ", ")
}

// hostExempt: the routes the Host rule leaves alone.
func hostExempt(path string) bool { return path == "/healthz" || path == "/metrics" }

// checkBrowser applies the three rules in order: Host, Origin, Content-Type.
func (s *Server) checkBrowser(r *http.Request) error {
	if s.cfg.Hosts != nil && !hostExempt(r.URL.Path) && !s.cfg.Hosts.allows(r.Host, "80") {
		return refusal(http.StatusMisdirectedRequest, "misdirected_request", wire.ReasonMisdirected,
			fmt.Sprintf("this controller does not answer to Host %q; it answers to %s (give more names with --http-host)",
				shorten(r.Host), s.cfg.Hosts.describe()))
	}
	if origin := r.Header.Get("Origin"); origin != "" && !s.ownOrigin(origin, r.Host) {
		return refusal(http.StatusForbidden, "forbidden_origin", wire.ReasonForbiddenOrig,
			fmt.Sprintf("requests from the web origin %q are refused: only the API's own origin may call it", shorten(origin)))
	}
	if ct := r.Header.Get("Content-Type"); r.ContentLength != 0 || ct != "" && !safeMethod(r.Method) {
		if !jsonType(ct) {
			if ct == "" {
				ct = "none"
			}
			return refusal(http.StatusUnsupportedMediaType, "unsupported_media_type", wire.ReasonMediaType,
				fmt.Sprintf("a request body must be Content-Type: application/json (got %s)", shorten(ct)))
		}
	}
	return nil
}

// ownOrigin reports whether origin is the API's own: http or https, and a
// host the API answers to (without a host policy: the request's own Host).
func (s *Server) ownOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" {
		return false
	}
	var port string
	switch u.Scheme {
	case "http":
		port = "80"
	case "https":
		port = "443"
	default:
		return false
	}
	if s.cfg.Hosts == nil {
		return strings.EqualFold(u.Host, host)
	}
	return s.cfg.Hosts.allows(u.Host, port)
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// jsonType reports whether a Content-Type is application/json, with at
// most a utf-8 charset.
func jsonType(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}
