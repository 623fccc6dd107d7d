package main

import (
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
)

// operationsPage is the operators' reference, whose tables must name every
// flag devicesim takes.
const operationsPage = "../../docs/operations.md"

// TestOperationsPageNamesEveryFlag keeps the devicesim tables of
// docs/operations.md true: every flag of `devicesim run`, `devicesim
// creds` and `devicesim conform` has a row (with its environment variable)
// in the tables of its section, and every row there names a flag the
// command takes.
func TestOperationsPageNamesEveryFlag(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(operationsPage)
	require.NoError(t, err)
	page := string(b)
	sections := map[string]string{
		"run":     section(t, page, "## `devicesim run`", "### `devicesim creds`"),
		"creds":   section(t, page, "### `devicesim creds`", "### `devicesim conform`"),
		"conform": section(t, page, "### `devicesim conform`", "## "),
	}
	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`")
	root := newRootCmd(io.Discard, io.Discard)
	for name, text := range sections {
		cmd, _, err := root.Find([]string{name})
		require.NoError(t, err)
		flags := map[string]bool{}
		var missing []string
		cmd.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			flags[f.Name] = true
			want := "| `--" + f.Name + "` | `" + cmdline.EnvName(envPrefix, f.Name) + "` |"
			if !strings.Contains(text, want) {
				missing = append(missing, want)
			}
		})
		require.NotEmpty(t, flags)
		require.Empty(t, missing, "devicesim %s: rows missing from %s", name, operationsPage)
		for _, m := range row.FindAllStringSubmatch(text, -1) {
			require.True(t, flags[m[1]], "%s names --%s under devicesim %s, which it does not take", operationsPage, m[1], name)
		}
	}
}

// section returns the page from the heading up to the next line starting
// with end.
func section(t *testing.T, page, heading, end string) string {
	t.Helper()
	_, rest, ok := strings.Cut(page, "\n"+heading+"\n")
	require.True(t, ok, "%s has no heading %q", operationsPage, heading)
	if i := strings.Index(rest, "\n"+end); i >= 0 {
		rest = rest[:i]
	}
	return rest
}
