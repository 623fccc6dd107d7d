package store

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/fsm"

	"github.com/fleetctl/fleetctl/internal/store/driver"
	"github.com/fleetctl/fleetctl/internal/store/postgres"
	"github.com/fleetctl/fleetctl/internal/store/sqlite"
)

// TestStatementsNames: both backends define exactly the statements of
// driver.Statements (each queries.sql parsed whole, none missing, none
// extra, none empty), and the store's code uses every one of them.
func TestStatementsNames(t *testing.T) {
	names := driver.Names()
	require.NotEmpty(t, names)
	for _, d := range []driver.Driver{sqlite.New(), postgres.New()} {
		for _, n := range names {
			require.NotEmpty(t, d.Statements().ByName(n), "%s: %s", d.Name(), n)
		}
	}
	for _, file := range []string{"sqlite/queries.sql", "postgres/queries.sql"} {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		defined := regexp.MustCompile(`(?m)^-- name: (\w+)\s*$`).FindAllStringSubmatch(string(src), -1)
		var got []string
		for _, m := range defined {
			got = append(got, m[1])
		}
		require.ElementsMatch(t, names, got, file)
	}

	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var code strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		code.Write(b)
	}
	for _, n := range names {
		require.Regexp(t, `\.`+n+`\b`, code.String(), "statement %s is never used", n)
	}
}

// TestStatementsParse: a misspelt, repeated or missing name fails the
// parse (at a backend's init).
func TestStatementsParse(t *testing.T) {
	var whole strings.Builder
	for _, n := range driver.Names() {
		whole.WriteString("-- name: " + n + "\nSELECT 1\n")
	}
	_, err := driver.Parse(whole.String())
	require.NoError(t, err)
	_, err = driver.Parse(whole.String() + "-- name: NoSuchStatement\nSELECT 1\n")
	require.ErrorContains(t, err, "NoSuchStatement")
	_, err = driver.Parse(whole.String() + "-- name: " + driver.Names()[0] + "\nSELECT 1\n")
	require.ErrorContains(t, err, "twice")
	_, err = driver.Parse(strings.SplitAfterN(whole.String(), "SELECT 1\n", 2)[1])
	require.ErrorContains(t, err, "missing")
}

// TestStatementsStateLists: a state list written into a backend's
// statements is the one the fsm tables give, and a column list the one the
// store's scans read.
func TestStatementsStateLists(t *testing.T) {
	for _, d := range []driver.Driver{sqlite.New(), postgres.New()} {
		st := d.Statements()
		for _, q := range []string{st.PreLockCommands, st.CommandWakeDevice, st.CommandForgetQuestions} {
			if d.Capabilities().RowLocks || q != st.PreLockCommands {
				require.Contains(t, q, openCommand(d), d.Name())
			}
		}
		require.Contains(t, st.RolloutListActive, "status IN "+sqlList(fsm.ActiveRolloutStates()), d.Name())
		require.Contains(t, st.TaskListActive, "status IN "+sqlList([]fsm.TaskState{fsm.TaskApproved, fsm.TaskRunning}), d.Name())
		// The column lists the list pages build with (page.go) are the
		// ones the backends' statements read.
		for q, cols := range map[string]string{st.DeviceGet: deviceColumns, st.RolloutGetRow: rolloutColumns,
			st.RolloutDeviceGet: rolloutDeviceColumns, st.TaskGet: taskColumns, st.GrantGet: grantColumns} {
			require.Contains(t, strings.Join(strings.Fields(q), " "), "SELECT "+strings.Join(strings.Fields(cols), " ")+" FROM", d.Name())
		}
	}
}

// openCommand is how a backend's statements say a command is open: on
// SQLite a chain of <>, as its partial indexes of open commands say it
// (migration 0013: a list builds a temporary b-tree at every run), on
// PostgreSQL NOT IN the terminal states.
func openCommand(d driver.Driver) string {
	if d.Name() != "sqlite" {
		return "status NOT IN " + terminalCommands
	}
	var terms []string
	for _, s := range fsm.TerminalCommandStates() {
		terms = append(terms, "status <> '"+string(s)+"'")
	}
	return strings.Join(terms, " AND ")
}

// TestOpenCommandIndexesSayOpenAsTheStatements: SQLite uses a partial
// index only for a query whose WHERE holds the index's own terms.
func TestOpenCommandIndexesSayOpenAsTheStatements(t *testing.T) {
	b, err := fs.ReadFile(sqlite.New().Migrations(), "0013_open_predicate.sql")
	require.NoError(t, err)
	migration := strings.Join(strings.Fields(string(b)), " ")
	for _, ix := range []string{"commands_open", "commands_device_open", "commands_device_serial_open"} {
		require.Regexp(t, `CREATE INDEX `+ix+` ON [^;]*`+regexp.QuoteMeta(openCommand(sqlite.New()))+`;`, migration)
	}
}

// PostgreSQL's one-statement submit (OperationCommandInsert) repeats
// OperationInsert whole and CommandInsertForDevice's columns, publish
// decision and read of the device, with the command's arguments numbered
// after the operation's (the statement files have no includes): the
// copies must say the same.
func TestOperationCommandInsertRepeatsItsTwoStatements(t *testing.T) {
	q := postgres.New().Statements()
	spaces := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	numbers := regexp.MustCompile(`\$\d+`)
	unnumbered := func(s string) string { return numbers.ReplaceAllString(spaces(s), "$") }
	require.Contains(t, spaces(q.OperationCommandInsert), spaces(q.OperationInsert), "OperationInsert, whole")
	span := func(s, from, to string) string {
		i := strings.Index(s, from)
		require.GreaterOrEqual(t, i, 0, "%q in %s", from, s)
		if to == "" {
			return s[i:]
		}
		j := strings.Index(s[i:], to)
		require.GreaterOrEqual(t, j, 0, "%q after %q in %s", to, from, s)
		return s[i : i+j]
	}
	both, one := unnumbered(q.OperationCommandInsert), unnumbered(q.CommandInsertForDevice)
	for _, part := range [][2]string{
		{"INSERT INTO commands (", " SELECT "},                                    // the columns
		{"CASE WHEN d.claim THEN 'sent'", "CASE WHEN d.claim THEN $::bigint END"}, // the publish decision
		{"(SELECT $::bigint = 1 AND", ""},                                         // the device's row, to the end
	} {
		require.Equal(t, span(one, part[0], part[1]), span(both, part[0], part[1]))
	}
}

// TestOrFailOnlyWhereNoStatementIsUndoneAlone: SQLite's OR FAIL runs a
// statement without a statement journal, so one that fails after writing
// some rows leaves them. That is safe for the batch's multi-row INSERTs
// (a failing one fails the whole batch: TestAFailingEventsInsertFailsTheWholeBatch)
// and for an UPDATE of one row by its key (its constraints are checked
// before it writes), and nowhere else.
func TestOrFailOnlyWhereNoStatementIsUndoneAlone(t *testing.T) {
	q := sqlite.New().Statements()
	keys := map[string]string{"commands": "command_id", "operations": "operation_id"}
	var found []string
	for _, n := range driver.Names() {
		s := strings.Join(strings.Fields(q.ByName(n)), " ")
		if !strings.Contains(s, "OR FAIL") {
			continue
		}
		found = append(found, n)
		switch n {
		case "EventsInsertHead", "ReceiptsInsertHead":
			require.Regexp(t, `^INSERT OR FAIL INTO \w+ \([^)]*\) VALUES$`, s, n)
			continue
		}
		m := regexp.MustCompile(`^UPDATE OR FAIL (\w+) SET .*? WHERE (\w+) = \? `).FindStringSubmatch(s)
		require.NotNil(t, m, "%s: only an UPDATE of one row by its key may run OR FAIL: %s", n, s)
		require.Equal(t, keys[m[1]], m[2], "%s: the WHERE must name the row's key first", n)
		where, _, _ := strings.Cut(s[strings.Index(s, " WHERE "):], " RETURNING ")
		require.False(t, topLevelOr(where), "%s: one row, by its key AND the rest: %s", n, where)
	}
	require.ElementsMatch(t, []string{"EventsInsertHead", "ReceiptsInsertHead", "CommandClaimSend", "CommandMove",
		"OperationFinish", "OperationFinishCurrent", "CommandAdvanceFrom"}, found)
}

// topLevelOr says whether an OR stands outside every parenthesis of where.
func topLevelOr(where string) bool {
	depth := 0
	for i := 0; i < len(where); i++ {
		switch where[i] {
		case '(':
			depth++
		case ')':
			depth--
		}
		if depth == 0 && strings.HasPrefix(where[i:], " OR ") {
			return true
		}
	}
	return false
}

// PostgreSQL's CommandAdvanceFinish moves the command with
// CommandAdvanceFrom's very statement (its first part, word for word), so
// a receipt moves a command under the same conditions whether or not the
// operation ends in the same statement.
func TestAdvanceFinishMovesTheCommandAsAdvanceFrom(t *testing.T) {
	q := postgres.New().Statements()
	words := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	require.Contains(t, words(q.CommandAdvanceFinish), "WITH c AS ( "+words(q.CommandAdvanceFrom)+" ), o AS (")
}
