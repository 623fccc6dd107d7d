package store

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"sync"
)

// Prepared statements. go-sqlite3 prepares every statement it is given as
// a string afresh, which cost about a quarter of the controller's CPU at
// saturation; each pool keeps its statements prepared instead (database/sql
// prepares a *sql.Stmt again on any new connection by itself).

// preparer prepares statements: the read pool (*sql.DB), or the writer's
// connection (*sql.Conn), whose statements run on it alone.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// stmtCache holds one pool's prepared statements by query text.
type stmtCache struct {
	db preparer // nil: none to prepare on (the writer lost its connection)
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// missed: queries first run inside a writer transaction, prepared
	// once it ends (the writer's only connection is busy until then).
	missed map[string]bool
}

func newStmtCache(db preparer) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}, missed: map[string]bool{}}
}

func (c *stmtCache) get(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[query]
}

// getOrPrepare prepares a query on miss; for pools whose connections are
// free to take (the readers).
func (c *stmtCache) getOrPrepare(ctx context.Context, query string) (*sql.Stmt, error) {
	if st := c.get(query); st != nil {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[query]; old != nil {
		st.Close()
		return old, nil
	}
	c.m[query] = st
	return st, nil
}

func (c *stmtCache) miss(query string) {
	c.mu.Lock()
	c.missed[query] = true
	c.mu.Unlock()
}

// prepareMissed prepares what a transaction ran unprepared; the writer
// calls it between batches. A query that fails to prepare stays unprepared.
func (c *stmtCache) prepareMissed(ctx context.Context) {
	c.mu.Lock()
	missed := c.missed
	c.missed = map[string]bool{}
	c.mu.Unlock()
	if c.db == nil {
		maps.Copy(c.missed, missed)
		return
	}
	for q := range missed {
		_, _ = c.getOrPrepare(ctx, q)
	}
}

// reset closes every statement and prepares on db from then on (nil: on
// nothing until the next reset); what it closed is prepared again on db
// after the next batch.
func (c *stmtCache) reset(db preparer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, st := range c.m {
		st.Close()
		c.missed[q] = true // prepared again on db, after the next batch
	}
	c.m = map[string]*sql.Stmt{}
	c.db = db
}

func (c *stmtCache) close() { c.reset(nil) }

// readers runs the read pool's queries, through its prepared statements
// where the backend wants them.
type readers struct {
	s  *DB
	db *sql.DB
	c  *stmtCache
}

func (r readers) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	r.s.trips.Add(1)
	query, args = r.s.d.Rebind(query), r.s.args(args)
	if !r.s.caps.Prepares {
		return r.db.QueryContext(ctx, query, args...)
	}
	st, err := r.c.getOrPrepare(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

func (r readers) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	r.s.trips.Add(1)
	query, args = r.s.d.Rebind(query), r.s.args(args)
	if !r.s.caps.Prepares {
		return r.db.QueryRowContext(ctx, query, args...)
	}
	st, err := r.c.getOrPrepare(ctx, query)
	if err != nil {
		return r.db.QueryRowContext(ctx, query, args...) // carries the same error
	}
	return st.QueryRowContext(ctx, args...)
}

// The writer transaction's statements: prepared ones when the writer has
// them, the text otherwise (then prepared after the batch).

// stmt returns the writer's prepared statement for query, or nil (noting
// the miss) when there is none yet; query is already rebound.
func (t *tx) stmt(query string) *sql.Stmt { return t.s.writerStmt(query) }

func (s *DB) writerStmt(query string) *sql.Stmt {
	if !s.caps.Prepares {
		return nil
	}
	if st := s.wstmts.get(query); st != nil {
		return st
	}
	s.wstmts.miss(query)
	return nil
}

func (t *tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	t.s.trips.Add(1)
	query, args = t.s.d.Rebind(query), t.s.args(args)
	if st := t.stmt(query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return t.c.ExecContext(ctx, query, args...)
}

// execRows runs a statement whose result nobody reads (a batch's
// multi-row INSERTs, up to 2,560 arguments), as a query where the driver
// binds a query's arguments at once (Capabilities.BindsQueriesAtOnce).
func (t *tx) execRows(ctx context.Context, query string, args ...any) error {
	if !t.s.caps.BindsQueriesAtOnce {
		_, err := t.ExecContext(ctx, query, args...)
		return err
	}
	rows, err := t.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	return errors.Join(rows.Close(), rows.Err())
}

func (t *tx) Exec(query string, args ...any) (sql.Result, error) {
	return t.ExecContext(context.Background(), query, args...)
}

func (t *tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	t.s.trips.Add(1)
	query, args = t.s.d.Rebind(query), t.s.args(args)
	if st := t.stmt(query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return t.c.QueryContext(ctx, query, args...)
}

func (t *tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	t.s.trips.Add(1)
	query, args = t.s.d.Rebind(query), t.s.args(args)
	if st := t.stmt(query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return t.c.QueryRowContext(ctx, query, args...)
}
