package api

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Every list (GET /v1/devices, GET /v1/grants) pages by id: ?limit= (1 to
// store.MaxPageLimit, store.DefaultPageLimit by default) and ?after=<id>,
// plus its own filters. The body stays a JSON array; X-Total-Count carries
// the number of items that match the filter, and a Link header with
// rel="next" the next page, only when there is one.

// validCursor: an after outside the charset of every id a list is keyed by
// (device ids, grant ids) cannot be an id and is refused.
func validCursor(v string) bool { return wire.IDChars(v, 200, true) }

// cursorRule is validCursor's rule, as the OpenAPI document gives it.
const cursorRule = `^[A-Za-z0-9._:-]{1,200}$`

// listQuery is a list request's query string, checked: only the parameters
// the list takes, each at most once.
type listQuery struct {
	path   string
	page   store.Page
	values url.Values // the filters as given, for the next link
	order  []string   // the filters' names, in the order of the next link
}

// parseList checks limit, after and the list's filters (their names; each
// is then read with boolParam). Any other parameter, or one given twice, is
// refused: a misspelt filter must not silently list everything.
func parseList(r *http.Request, filters ...string) (listQuery, error) {
	q := r.URL.Query()
	lq := listQuery{path: r.URL.EscapedPath(), page: store.Page{Limit: store.DefaultPageLimit}, values: url.Values{}, order: filters}
	if err := checkQuery(q, "list", append([]string{"limit", "after"}, filters...)); err != nil {
		return lq, err
	}
	var err error
	if lq.page.Limit, err = parseLimit(q, store.DefaultPageLimit, store.MaxPageLimit); err != nil {
		return lq, err
	}
	if v, ok := q["after"]; ok && v[0] != "" { // an empty after is the start
		if !validCursor(v[0]) {
			return lq, invalidParam("after", fmt.Sprintf("%q: an id, [A-Za-z0-9._:-]{1,200}", v[0]))
		}
		lq.page.After = v[0]
	}
	for _, f := range filters {
		if v, ok := q[f]; ok {
			lq.values.Set(f, v[0])
		}
	}
	return lq, nil
}

// checkQuery refuses a parameter of q that the route (what: "route",
// "list", "stream") does not take, or one given twice, naming it. In a
// sorted order, so that the same query is always refused for the same name.
//
// A name in takes that ends in repeatable ("status*") may be given more
// than once.
func checkQuery(q url.Values, what string, takes []string) error {
	names := slices.Sorted(maps.Keys(q))
	plain := make([]string, len(takes))
	for i, t := range takes {
		plain[i] = strings.TrimSuffix(t, repeatable)
	}
	for _, name := range names {
		if !slices.Contains(plain, name) {
			if len(takes) == 0 {
				return invalidParam(name, "unknown query parameter; this "+what+" takes none")
			}
			return invalidParam(name, "unknown query parameter; this "+what+" takes "+strings.Join(plain, ", "))
		}
	}
	for _, name := range names {
		if len(q[name]) > 1 && !slices.Contains(takes, name+repeatable) {
			return invalidParam(name, "given more than once")
		}
	}
	return nil
}

// boolParam reads a filter that takes true or false (and, for the older
// ?all=1 of grants, 1 or 0); absent is nil.
func (lq listQuery) boolParam(name string) (*bool, error) {
	v, ok := lq.values[name]
	if !ok {
		return nil, nil
	}
	var b bool
	switch v[0] {
	case "true", "1":
		b = true
	case "false", "0":
	default:
		return nil, invalidParam(name, fmt.Sprintf("%q: true or false", v[0]))
	}
	return &b, nil
}

// parseLimit reads ?limit=: 1 to max, def when absent.
func parseLimit(q url.Values, def, max int) (int, error) {
	v, ok := q["limit"]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v[0])
	if err != nil || n < 1 || n > max {
		return 0, invalidParam("limit", fmt.Sprintf("%q: an integer from 1 to %d (default %d)", v[0], max, def))
	}
	return n, nil
}

func invalidParam(name, msg string) error {
	return apiErr(http.StatusBadRequest, "invalid_request", "query parameter "+shorten(name)+": "+msg)
}

// listed is a list answer: the array and its paging headers.
type listed struct {
	header http.Header
	body   any
}

// answerList builds the answer of one page: X-Total-Count always, Link
// rel="next" only when next is not "" (the same limit and filters, after the
// page's last id).
func answerList(lq listQuery, items any, total int64, next string) (int, any, error) {
	h := http.Header{}
	h.Set("X-Total-Count", strconv.FormatInt(total, 10))
	if next != "" {
		link := lq.path + "?limit=" + strconv.Itoa(lq.page.Limit) + "&after=" + url.QueryEscape(next)
		for _, f := range lq.order {
			for _, v := range lq.values[f] { // a repeatable filter's every value
				link += "&" + url.QueryEscape(f) + "=" + url.QueryEscape(v)
			}
		}
		h.Set("Link", "<"+link+`>; rel="next"`)
	}
	return http.StatusOK, listed{header: h, body: items}, nil
}
