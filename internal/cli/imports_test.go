package cli

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// TestClientFilesLinkNoDatabase: the client subcommands (client.go,
// rollout.go, view.go, mcp.go) speak the API through internal/client and
// internal/apiwire. Only cli.go, which wires the subcommands that run on
// the database (serve: internal/controller; verify and report), may reach
// a database driver or internal/store: this package as a whole links them,
// its client half does not.
func TestClientFilesLinkNoDatabase(t *testing.T) {
	const module = "github.com/fleetctl/fleetctl/"
	forbidden := []string{"github.com/jackc/pgx", "github.com/mattn/go-sqlite3", "github.com/lib/pq",
		module + "internal/store", module + "internal/api", module + "internal/controller"}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	importedBy := map[string][]string{} // a package of this module -> the files importing it
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "cli.go" {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, im := range af.Imports {
			p, err := strconv.Unquote(im.Path.Value)
			require.NoError(t, err)
			if strings.HasPrefix(p, module) {
				importedBy[p] = append(importedBy[p], f)
			}
		}
	}
	require.Contains(t, importedBy, module+"internal/client", "the client subcommands were found")
	for pkg, by := range importedBy {
		deps := testenv.Deps(t, pkg)
		for _, f := range forbidden {
			if len(testenv.Linked(deps, f)) > 0 {
				t.Errorf("%s imports %s, which links %s", strings.Join(by, ", "), pkg, f)
			}
		}
	}
}
