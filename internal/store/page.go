package store

import (
	"context"
	"fmt"
	"strings"
)

// Page sizes of every list, as the contract fixes them for the API.
const (
	DefaultPageLimit = 1000
	MaxPageLimit     = 10000
)

// Page asks for one page of a list in id order (keyset paging): the items
// whose id sorts after After ("" is the start), at most Limit of them. After
// need not name an existing item: the page starts after where it would be.
// Ids compare bytewise (SQLite's BINARY collation; a PostgreSQL backend
// orders with COLLATE "C" to match), so a caller's last id of a page is
// always the right After for the next one.
//
// A Limit outside 1..MaxPageLimit is taken as DefaultPageLimit or
// MaxPageLimit; the API refuses such a limit before it gets here.
type Page struct {
	After string
	Limit int
}

func (p Page) limit() int {
	switch {
	case p.Limit <= 0:
		return DefaultPageLimit
	case p.Limit > MaxPageLimit:
		return MaxPageLimit
	}
	return p.Limit
}

// Listed is one page of a list.
type Listed[T any] struct {
	Items []T // never nil: an empty page is an empty slice
	// Total counts the items that match the filter, on every page, read in
	// the same snapshot as Items.
	Total int64
	// Next is the After of the next page, "" on the last one. It is set
	// only when at least one more item matched when this page was read.
	Next string
}

// keyset is one table's paged read: the same filter for the count and the
// page, ordered by the table's key.
type keyset[T any] struct {
	table, key, columns string
	where               []string // conditions ANDed together, with args in order
	args                []any
	scan                func(interface{ Scan(...any) error }) (T, error)
	id                  func(T) string
}

// queries returns the count and the page statements: the count takes the
// filter's args, the page the filter's args, then After and the row limit.
func (k keyset[T]) queries() (count, page string) {
	where := ""
	if len(k.where) > 0 {
		where = " WHERE " + strings.Join(k.where, " AND ")
	}
	cond := append(append([]string(nil), k.where...), k.key+" > ?")
	return `SELECT count(*) FROM ` + k.table + where,
		`SELECT ` + k.columns + ` FROM ` + k.table + ` WHERE ` + strings.Join(cond, " AND ") + ` ORDER BY ` + k.key + ` LIMIT ?`
}

// readPage reads the total and one page in one read transaction, so both
// come from the same snapshot. It reads one row more than the limit to know
// whether a next page exists.
func readPage[T any](ctx context.Context, s *DB, k keyset[T], p Page) (Listed[T], error) {
	out := Listed[T]{Items: []T{}}
	limit := p.limit()
	countQ, pageQ := k.queries()
	rtx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return out, fmt.Errorf("list %s: %w", k.table, err)
	}
	defer rtx.Rollback()
	if err := rtx.QueryRowContext(ctx, s.d.Rebind(countQ), s.args(append([]any(nil), k.args...))...).Scan(&out.Total); err != nil {
		return out, fmt.Errorf("count %s: %w", k.table, err)
	}
	args := append(append([]any(nil), k.args...), p.After, limit+1)
	rows, err := rtx.QueryContext(ctx, s.d.Rebind(pageQ), s.args(args)...)
	if err != nil {
		return out, fmt.Errorf("list %s: %w", k.table, err)
	}
	defer rows.Close()
	for rows.Next() {
		v, err := k.scan(rows)
		if err != nil {
			return out, fmt.Errorf("list %s: %w", k.table, err)
		}
		out.Items = append(out.Items, v)
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("list %s: %w", k.table, err)
	}
	if len(out.Items) > limit {
		out.Items = out.Items[:limit]
		out.Next = k.id(out.Items[limit-1])
	}
	return out, nil
}
