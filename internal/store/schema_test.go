package store

import (
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store/driver"
	"github.com/fleetctl/fleetctl/internal/store/postgres"
	"github.com/fleetctl/fleetctl/internal/store/sqlite"
)

// The schema's CHECK lists are the state machines of package fsm, written a
// second time in SQL. These tests replay each backend's embedded migrations
// (the last definition of a constraint wins) and require every state
// column's `CHECK (status IN (...))` to be exactly its machine's states: a
// state added to fsm without a migration, or a migration that drops one,
// fails here rather than at the first INSERT of that state.

// stateColumns maps each state column to the machine whose states its CHECK
// must list.
var stateColumns = map[string][]string{
	"operations.status":      names(fsm.Operation.States()),
	"commands.status":        names(fsm.Command.States()),
	"tasks.status":           names(fsm.Task.States()),
	"rollouts.status":        names(fsm.Rollout.States()),
	"rollout_devices.status": names(fsm.RolloutDevice.States()),
}

// otherEnums are the string CHECK lists that are not a state machine's
// states, with what each must hold. A new string CHECK must be added to one
// of the two maps, so none goes unchecked.
var otherEnums = map[string]func(t *testing.T, got []string){
	"receipts.effect": func(t *testing.T, got []string) {
		require.ElementsMatch(t, []string{EffectApplied, EffectDuplicate, EffectStale, EffectLate, EffectMismatch,
			EffectUnknownCommand}, got)
	},
	// The channel an operation came through ('' before migration 0009).
	"operations.via": func(t *testing.T, got []string) {
		require.ElementsMatch(t, []string{"", domain.ViaAPI, domain.ViaMCP, domain.ViaTask, domain.ViaRollout,
			domain.ViaCompensation}, got)
	},
	// The events log names the machine of each line; the machines whose
	// changes it records (and device and lease, which have no fsm table).
	"events.machine": func(t *testing.T, got []string) {
		require.Subset(t, got, []string{fsm.Operation.Name(), fsm.Command.Name(), fsm.Task.Name(), fsm.Rollout.Name()})
	},
	// The audit log names the kind of entity a person changed (auditlog.go).
	"audit.kind": func(t *testing.T, got []string) {
		require.ElementsMatch(t, []string{EntityOperation, EntityCommand, EntityDevice, EntityTask, EntityGrant, EntityRollout}, got)
	},
}

func names[S ~string](states []S) []string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = string(s)
	}
	return out
}

var (
	sqlComment      = regexp.MustCompile(`--[^\n]*`)
	inCheck         = regexp.MustCompile(`(?is)\bCHECK\s*\(\s*(\w+)\s+IN\s*\(([^)]*)\)\s*\)`)
	quoted          = regexp.MustCompile(`^'([^']*)'$`)
	createTable     = regexp.MustCompile(`(?is)^CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"?(\w+)"?\s*\(`)
	dropTable       = regexp.MustCompile(`(?is)^DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)$`)
	renameTable     = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(\w+)\s+RENAME\s+TO\s+(\w+)$`)
	dropConstraint  = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(\w+)\s+DROP\s+CONSTRAINT\s+(?:IF\s+EXISTS\s+)?(\w+)$`)
	dropColumn      = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(\w+)\s+DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(\w+)$`)
	alterTableAdd   = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(\w+)\s+ADD\s`)
	mentionsCheckIn = regexp.MustCompile(`(?is)\bCHECK\b`)
)

// schema is what the replay knows of each table: column → its string CHECK
// list (a numeric list such as a flag's IN (0, 1) is not kept).
type schema map[string]map[string][]string

// apply replays one SQL statement (comments stripped, no trailing ';').
// A statement that carries a CHECK and that apply does not understand is an
// error: the test must learn it rather than read a stale list.
func (s schema) apply(stmt string) error {
	stmt = strings.TrimSpace(stmt)
	checks := func() map[string][]string {
		out := map[string][]string{}
		for _, m := range inCheck.FindAllStringSubmatch(stmt, -1) {
			var vals []string
			for _, item := range strings.Split(m[2], ",") {
				q := quoted.FindStringSubmatch(strings.TrimSpace(item))
				if q == nil {
					vals = nil // not a list of strings
					break
				}
				vals = append(vals, q[1])
			}
			if vals != nil {
				out[strings.ToLower(m[1])] = vals
			}
		}
		return out
	}
	switch {
	case createTable.MatchString(stmt):
		name := strings.ToLower(createTable.FindStringSubmatch(stmt)[1])
		s[name] = checks()
	case dropTable.MatchString(stmt):
		delete(s, strings.ToLower(dropTable.FindStringSubmatch(stmt)[1]))
	case renameTable.MatchString(stmt):
		m := renameTable.FindStringSubmatch(stmt)
		from, to := strings.ToLower(m[1]), strings.ToLower(m[2])
		s[to] = s[from]
		delete(s, from)
	case dropConstraint.MatchString(stmt):
		// PostgreSQL names a column's CHECK {table}_{column}_check (and the
		// migrations name theirs alike).
		m := dropConstraint.FindStringSubmatch(stmt)
		table, name := strings.ToLower(m[1]), strings.ToLower(m[2])
		col, ok := strings.CutSuffix(strings.TrimPrefix(name, table+"_"), "_check")
		if !ok || !strings.HasPrefix(name, table+"_") {
			return fmt.Errorf("constraint %s of %s: not named {table}_{column}_check", name, table)
		}
		delete(s[table], col)
	case dropColumn.MatchString(stmt):
		m := dropColumn.FindStringSubmatch(stmt)
		delete(s[strings.ToLower(m[1])], strings.ToLower(m[2]))
	case alterTableAdd.MatchString(stmt):
		table := strings.ToLower(alterTableAdd.FindStringSubmatch(stmt)[1])
		if s[table] == nil {
			s[table] = map[string][]string{}
		}
		for col, vals := range checks() {
			s[table][col] = vals
		}
	case mentionsCheckIn.MatchString(stmt):
		return fmt.Errorf("a statement with a CHECK the test does not replay: %q", stmt)
	}
	return nil
}

// migratedSchema replays the migration files of a backend
// (driver.Driver's Migrations) in the order migrate applies them.
func migratedSchema(t *testing.T, migrations fs.FS) schema {
	t.Helper()
	files, err := fs.Glob(migrations, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	sort.Strings(files)
	s := schema{}
	for _, f := range files {
		body, err := fs.ReadFile(migrations, f)
		require.NoError(t, err)
		// Statements split at ';': a trigger's or a function's body falls
		// apart into fragments that match nothing and carry no CHECK.
		for _, stmt := range strings.Split(sqlComment.ReplaceAllString(string(body), ""), ";") {
			require.NoError(t, s.apply(stmt), f)
		}
	}
	return s
}

// checkSchema requires every string CHECK list of s to be accounted for and
// right.
func checkSchema(t *testing.T, s schema) {
	t.Helper()
	seen := map[string]bool{}
	for table, cols := range s {
		for col, vals := range cols {
			key := table + "." + col
			seen[key] = true
			if want, ok := stateColumns[key]; ok {
				require.ElementsMatch(t, want, vals, "%s: its CHECK list against the fsm machine's states", key)
				continue
			}
			check, ok := otherEnums[key]
			require.True(t, ok, "%s has a CHECK list %v that no test knows: add it to stateColumns or otherEnums", key, vals)
			check(t, vals)
		}
	}
	for key := range stateColumns {
		require.True(t, seen[key], "%s: no CHECK list after the migrations", key)
	}
}

// TestSchemaChecksMatchFSM replays each backend's migration files.
func TestSchemaChecksMatchFSM(t *testing.T) {
	t.Parallel()
	for _, b := range []driver.Driver{sqlite.New(), postgres.New()} {
		t.Run(b.Name(), func(t *testing.T) {
			t.Parallel()
			checkSchema(t, migratedSchema(t, b.Migrations()))
		})
	}
}

// TestSchemaReplayMatchesDatabase: the replay above reads the migrations
// as the database does. The CHECK lists a migrated database holds (SQLite's
// sqlite_master, PostgreSQL's pg_constraint) are the replayed ones.
func TestSchemaReplayMatchesDatabase(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		replayed := migratedSchema(t, b.s.d.Migrations())
		got := schema{}
		if be == "sqlite" {
			rows, err := b.s.r.QueryContext(b.ctx, `SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL`)
			require.NoError(t, err)
			defer rows.Close()
			for rows.Next() {
				var stmt string
				require.NoError(t, rows.Scan(&stmt))
				require.NoError(t, got.apply(sqlComment.ReplaceAllString(stmt, "")))
			}
			require.NoError(t, rows.Err())
		} else {
			got = postgresChecks(b.ctx, t, b.s)
		}
		// Only tables with a string CHECK list count (the replay keeps an
		// empty entry for the others, as does sqlite_master).
		require.Equal(t, nonEmpty(replayed), nonEmpty(got))
		checkSchema(t, got)
	})
}

// SQLite builds a temporary b-tree of an IN list of more than two constants
// at every run of a statement that evaluates it, and it evaluates a partial
// index's predicate at every insert into its table and every change of a
// column the predicate reads: the open commands' indexes did so at every
// change of a command's status (three and six of them). No partial index
// may hold such a list. (A state column's CHECK keeps its list, which the
// tests above read: the SQLite of go-sqlite3 checks it without one.)
func TestPartialIndexesBuildNoTemporaryTable(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite")
	longList := regexp.MustCompile(`(?is)\bIN\s*\([^()]*,[^()]*,[^()]*\)`)
	rows, err := b.s.r.QueryContext(b.ctx, `SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql LIKE '% WHERE %'`)
	require.NoError(t, err)
	defer rows.Close()
	partial := 0
	for rows.Next() {
		var name, stmt string
		require.NoError(t, rows.Scan(&name, &stmt))
		require.NotRegexp(t, longList, stmt, "index %s", name)
		partial++
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, partial, 3, "the open commands' indexes are partial")

	for _, name := range []string{"CommandInsert", "CommandAdvance"} {
		q := b.s.q.ByName(name)
		ops, err := b.s.r.QueryContext(b.ctx, "EXPLAIN "+q, make([]any, strings.Count(q, "?"))...)
		require.NoError(t, err)
		ephemeral := 0
		for ops.Next() {
			var addr, p1, p2, p3 int
			var opcode string
			var p4, p5, comment any
			require.NoError(t, ops.Scan(&addr, &opcode, &p1, &p2, &p3, &p4, &p5, &comment))
			if opcode == "OpenEphemeral" {
				ephemeral++
			}
		}
		require.NoError(t, ops.Err())
		ops.Close()
		require.Zero(t, ephemeral, "%s builds a temporary b-tree", name)
	}
}

// anyArray reads pg_get_constraintdef's form of `col IN ('a','b')`:
// CHECK ((col = ANY (ARRAY['a'::text, 'b'::text]))).
var (
	anyArray  = regexp.MustCompile(`^CHECK \(\(\(?(\w+)\)?(?:::text)? = ANY \(\(?ARRAY\[(.*)\]\)?(?:::text\[\])?\)\)\)$`)
	textValue = regexp.MustCompile(`^'([^']*)'::text$`)
)

func postgresChecks(ctx context.Context, t *testing.T, s *DB) schema {
	t.Helper()
	rows, err := s.r.QueryContext(ctx, `SELECT c.relname, pg_get_constraintdef(k.oid)
		FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE k.contype = 'c' AND n.nspname = current_schema()`)
	require.NoError(t, err)
	defer rows.Close()
	out := schema{}
	for rows.Next() {
		var table, def string
		require.NoError(t, rows.Scan(&table, &def))
		m := anyArray.FindStringSubmatch(def)
		if m == nil {
			continue // not a list: >= 1, BETWEEN, ...
		}
		var vals []string
		for _, item := range strings.Split(m[2], ",") {
			v := textValue.FindStringSubmatch(strings.TrimSpace(item))
			if v == nil {
				vals = nil // a numeric list (a flag's IN (0, 1))
				break
			}
			vals = append(vals, v[1])
		}
		if vals == nil {
			continue
		}
		if out[table] == nil {
			out[table] = map[string][]string{}
		}
		out[table][m[1]] = vals
	}
	require.NoError(t, rows.Err())
	return out
}

func nonEmpty(s schema) schema {
	out := schema{}
	for table, cols := range s {
		if len(cols) > 0 {
			out[table] = cols
		}
	}
	return out
}

// TestSchemaReplay: the replay keeps the last definition of each list
// through the ways the migrations change a CHECK, and refuses a CHECK it
// cannot follow.
func TestSchemaReplay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		stmts []string
		want  schema
		err   string
	}{
		{"create", []string{`CREATE TABLE t (status TEXT CHECK (status IN ('a','b')), f INTEGER CHECK (f IN (0, 1)))`},
			schema{"t": {"status": {"a", "b"}}}, ""},
		{"sqlite rebuild", []string{
			`CREATE TABLE t (status TEXT CHECK (status IN ('a')))`,
			`CREATE TABLE t_new (status TEXT CHECK (status IN ('a','b')))`,
			`DROP TABLE t`,
			`ALTER TABLE t_new RENAME TO t`,
		}, schema{"t": {"status": {"a", "b"}}}, ""},
		{"postgres constraint", []string{
			`CREATE TABLE t (status TEXT CHECK (status IN ('a')))`,
			`ALTER TABLE t DROP CONSTRAINT t_status_check`,
			`ALTER TABLE t ADD CONSTRAINT t_status_check CHECK (status IN ('a', 'c'))`,
		}, schema{"t": {"status": {"a", "c"}}}, ""},
		{"dropped constraint", []string{
			`CREATE TABLE t (status TEXT CHECK (status IN ('a')))`,
			`ALTER TABLE t DROP CONSTRAINT t_status_check`,
		}, schema{"t": {}}, ""},
		{"added column", []string{
			`CREATE TABLE t (id TEXT)`,
			`ALTER TABLE t ADD COLUMN state TEXT NOT NULL DEFAULT 'x' CHECK (state IN ('x','y'))`,
		}, schema{"t": {"state": {"x", "y"}}}, ""},
		{"unknown constraint name", []string{
			`CREATE TABLE t (status TEXT CHECK (status IN ('a')))`,
			`ALTER TABLE t DROP CONSTRAINT status_ok`,
		}, nil, "not named {table}_{column}_check"},
		{"unknown statement with a CHECK", []string{
			`ALTER TABLE t ALTER COLUMN status SET CHECK (status IN ('a'))`,
		}, nil, "does not replay"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := schema{}
			var err error
			for _, stmt := range c.stmts {
				if err = s.apply(stmt); err != nil {
					break
				}
			}
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, s)
		})
	}
}
