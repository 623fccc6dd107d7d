package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// Page is what a list answer says besides its items.
type Page struct {
	Total int64  // X-Total-Count: the items that match, over every page
	Next  string // the path of the next page (from Link rel="next"), "" on the last
}

// maxPages bounds one listing: at the API's smallest page (1 item) it
// still reads a million items; it stops a server whose links never end.
const maxPages = 1 << 20

// listAll reads every page from path on, following the Link headers. A
// device added while the pages are read shows up if its id sorts after the
// page being read; none shows up twice.
func listAll[T any](ctx context.Context, c *Client, path string) ([]T, error) {
	var out []T
	seen := map[string]bool{}
	for n := 0; path != ""; n++ {
		if seen[path] || n >= maxPages {
			return out, fmt.Errorf("list %s: the server's next links do not advance", path)
		}
		seen[path] = true
		items, p, err := listPage[T](ctx, c, path)
		if err != nil {
			return out, err
		}
		if out == nil {
			out = make([]T, 0, min(max(p.Total, int64(len(items))), 1<<17))
		}
		out = append(out, items...)
		path = p.Next
	}
	return out, nil
}

// listPage reads one page.
func listPage[T any](ctx context.Context, c *Client, path string) ([]T, Page, error) {
	items := []T{}
	_, h, err := c.do(ctx, http.MethodGet, path, nil, nil, &items)
	if err != nil {
		return nil, Page{}, err
	}
	var p Page
	if v := h.Get("X-Total-Count"); v != "" {
		if p.Total, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, Page{}, fmt.Errorf("list %s: X-Total-Count %q: %w", path, v, err)
		}
	}
	if p.Next, err = nextPath(path, h.Values("Link")); err != nil {
		return nil, Page{}, fmt.Errorf("list %s: %w", path, err)
	}
	return items, p, nil
}

var linkPattern = regexp.MustCompile(`^\s*<([^>]*)>\s*;(.*)$`)

// isNext reports whether a link's parameters hold rel="next" (rel may list
// several relation types, separated by spaces).
func isNext(params string) bool {
	for _, p := range strings.Split(params, ";") {
		name, value, ok := strings.Cut(p, "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "rel") {
			continue
		}
		for _, rel := range strings.Fields(strings.Trim(strings.TrimSpace(value), `"`)) {
			if strings.EqualFold(rel, "next") {
				return true
			}
		}
	}
	return false
}

// nextPath finds rel="next" among Link header values (RFC 8288) and
// returns it as a path on the same server: a link to another host is
// refused, since the client would send its token there.
func nextPath(current string, links []string) (string, error) {
	for _, v := range links {
		for _, link := range splitLinks(v) {
			m := linkPattern.FindStringSubmatch(link)
			if m == nil || !isNext(m[2]) {
				continue
			}
			base, err := url.Parse(current)
			if err != nil {
				return "", err
			}
			ref, err := url.Parse(m[1])
			if err != nil {
				return "", fmt.Errorf("next link %q: %w", m[1], err)
			}
			if ref.Scheme != "" || ref.Host != "" {
				return "", fmt.Errorf("next link %q: not a path on this server", m[1])
			}
			return base.ResolveReference(ref).RequestURI(), nil
		}
	}
	return "", nil
}

// splitLinks splits one Link header value at the commas between links
// (never inside <...> or a quoted string).
func splitLinks(v string) []string {
	var out []string
	inURI, inQuote, start := false, false, 0
	for i, r := range v {
		switch {
		case r == '<' && !inQuote:
			inURI = true
		case r == '>' && !inQuote:
			inURI = false
		case r == '"' && !inURI:
			inQuote = !inQuote
		case r == ',' && !inURI && !inQuote:
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return append(out, v[start:])
}

// withQuery appends v to path as its query, if any.
func withQuery(path string, v url.Values) string {
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}
