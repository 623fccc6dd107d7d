package cli

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
)

// operationsPage is the operators' reference, whose tables must name every
// flag the controller takes.
const operationsPage = "../../docs/operations.md"

// flagMentioned reports whether page names --name as a whole flag (not as
// the start of a longer one: --ramp is not --ramp-base).
func flagMentioned(page, name string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9-])--` + regexp.QuoteMeta(name) + `([^A-Za-z0-9-]|$)`).MatchString(page)
}

// commandFlags calls fn for every flag defined on every command of the tree
// (each once, on the command that defines it), cobra's own help and
// completion aside.
func commandFlags(root *cobra.Command, fn func(cmd *cobra.Command, f *pflag.Flag)) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "completion" || c.Name() == "help" {
			return
		}
		c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" {
				fn(c, f)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// TestOperationsPageNamesEveryFlag keeps docs/operations.md true to the
// command tree: every flag of every controller subcommand is named on the
// page, and every flag of `controller serve` has its row in the serve
// table with its environment variable; the other way round, every row of
// that table names a flag serve has.
func TestOperationsPageNamesEveryFlag(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(operationsPage)
	require.NoError(t, err)
	page := string(b)
	serveTable := tableAfter(t, page, "## `controller serve`")

	var missing []string
	serveFlags := map[string]bool{}
	commandFlags(NewRoot(), func(cmd *cobra.Command, f *pflag.Flag) {
		if !flagMentioned(page, f.Name) {
			missing = append(missing, cmd.CommandPath()+" --"+f.Name)
		}
		if cmd.Name() != "serve" {
			return
		}
		serveFlags[f.Name] = true
		row := "| `--" + f.Name + "` | `" + cmdline.EnvName(EnvPrefix, f.Name) + "` |"
		if !strings.Contains(serveTable, row) {
			missing = append(missing, "serve table row "+row)
		}
	})
	require.Empty(t, missing, "flags missing from %s", operationsPage)
	require.NotEmpty(t, serveFlags)

	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`").FindAllStringSubmatch(serveTable, -1) {
		require.True(t, serveFlags[m[1]], "the serve table of %s names --%s, which controller serve does not take", operationsPage, m[1])
	}
}

// tableAfter returns the first Markdown table after the heading.
func tableAfter(t *testing.T, page, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(page, "\n"+heading+"\n")
	require.True(t, ok, "%s has no heading %q", operationsPage, heading)
	var rows []string
	for _, line := range strings.Split(rest, "\n") {
		switch {
		case strings.HasPrefix(line, "|"):
			rows = append(rows, line)
		case len(rows) > 0:
			return strings.Join(rows, "\n")
		}
	}
	require.NotEmpty(t, rows, "no table after %q", heading)
	return strings.Join(rows, "\n")
}
