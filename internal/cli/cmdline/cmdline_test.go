package cmdline

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

func TestExitCode(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for name, tc := range map[string]struct {
		err  error
		code int
	}{
		"nil":               {nil, 0},
		"plain":             {boom, 1},
		"usage":             {Usage(boom), 2},
		"usagef":            {Usagef("--x: %w", boom), 2},
		"wrapped usage":     {fmt.Errorf("ctx: %w", Usage(boom)), 2},
		"hinted usage":      {WithHint(Usage(boom), "h"), 2},
		"reported usage":    {&Error{Binary: "b", Err: Usage(boom)}, 2},
		"reported plain":    {&Error{Binary: "b", Err: WithHint(boom, "h")}, 1},
		"usage twice stays": {Usage(Usage(boom)), 2},
	} {
		require.Equal(t, tc.code, ExitCode(tc.err), name)
	}
	require.NoError(t, Usage(nil))
	require.NoError(t, WithHint(nil, "h"))
}

func TestExitPrintsOneFormat(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	require.Equal(t, 0, Exit(&b, nil))
	require.Empty(t, b.String())
	require.Equal(t, 1, Exit(&b, &Error{Binary: "tool", Err: WithHint(errors.New("it broke"), "try again")}))
	require.Equal(t, "tool: it broke\ntry again\n", b.String())
}

// tree is a small tree like the binaries' own: a group, a leaf with an
// argument, a required flag, an enum and an int.
func tree() *cobra.Command {
	root := &cobra.Command{Use: "tool"}
	grp := &cobra.Command{Use: "grp", Short: "a group"}
	var name, mode string
	var count int
	leaf := &cobra.Command{
		Use: "leaf ID", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "fail" {
				return errors.New("it failed")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s name=%s mode=%s count=%d\n", args[0], name, mode, count)
			return nil
		},
	}
	leaf.Flags().StringVar(&name, "name", "", "a name")
	leaf.Flags().IntVar(&count, "count", 1, "how many")
	leaf.Flags().Var(NewEnum(&mode, "slow", "slow", "fast"), "mode", "how")
	_ = leaf.MarkFlagRequired("name")
	grp.AddCommand(leaf)
	bare := &cobra.Command{Use: "bare", RunE: func(*cobra.Command, []string) error { return nil }}
	root.AddCommand(grp, bare)
	Setup(root, "TOOL_")
	return root
}

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb strings.Builder
	code = Exit(&errb, Execute(t.Context(), tree(), args, &out, &errb))
	return code, out.String(), errb.String()
}

func TestSetupUsageErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		args       []string
		code       int
		msg, usage string
	}{
		"ok":               {[]string{"grp", "leaf", "a", "--name", "n"}, 0, "", ""},
		"run fails":        {[]string{"grp", "leaf", "fail", "--name", "n"}, 1, "tool: it failed\n", ""},
		"unknown flag":     {[]string{"grp", "leaf", "a", "--name", "n", "--bogus"}, 2, "unknown flag: --bogus", "tool grp leaf"},
		"missing required": {[]string{"grp", "leaf", "a"}, 2, "required flag(s) --name not set", "tool grp leaf"},
		"too few args":     {[]string{"grp", "leaf", "--name", "n"}, 2, "accepts 1 arg(s), received 0", "tool grp leaf"},
		"too many args":    {[]string{"grp", "leaf", "a", "b", "--name", "n"}, 2, "accepts 1 arg(s), received 2", "tool grp leaf"},
		"bad int":          {[]string{"grp", "leaf", "a", "--name", "n", "--count", "x"}, 2, `invalid argument "x" for "--count"`, "tool grp leaf"},
		"bad enum":         {[]string{"grp", "leaf", "a", "--name", "n", "--mode", "warp"}, 2, "want slow, fast", "tool grp leaf"},
		"no value":         {[]string{"grp", "leaf", "a", "--name"}, 2, "flag needs an argument", "tool grp leaf"},
		"unknown sub":      {[]string{"grp", "laef"}, 2, `unknown command "laef" for "tool grp"; did you mean leaf?`, "tool grp"},
		"unknown top":      {[]string{"nope"}, 2, `unknown command "nope" for "tool"`, "tool"},
		"args to a leaf":   {[]string{"bare", "x"}, 2, `unknown command "x" for "tool bare"`, "tool bare"},
		"group alone":      {[]string{"grp"}, 0, "", ""},
		"help":             {[]string{"grp", "leaf", "--help"}, 0, "", ""},
	} {
		code, _, stderr := run(t, tc.args...)
		require.Equal(t, tc.code, code, "%s: %s", name, stderr)
		if tc.msg != "" {
			require.True(t, strings.HasPrefix(stderr, "tool: "), "%s: %s", name, stderr)
			require.Contains(t, stderr, tc.msg, name)
		}
		if tc.usage != "" {
			require.Contains(t, stderr, "\nRun '"+tc.usage+" --help' for usage.\n", name)
		} else {
			require.NotContains(t, stderr, "--help' for usage", name)
		}
	}
}

func TestSetupReadsVariables(t *testing.T) {
	t.Setenv("TOOL_NAME", "from-env")
	t.Setenv("TOOL_MODE", "FAST")
	code, out, stderr := run(t, "grp", "leaf", "a", "--mode", "slow")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "a name=from-env mode=slow count=1\n", out, "the variable fills a required flag; the command line wins")

	t.Setenv("TOOL_COUNT", "many")
	code, _, stderr = run(t, "grp", "leaf", "a")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `tool: TOOL_COUNT="many": invalid argument "many" for "--count" flag`)
	require.Contains(t, stderr, "Run 'tool grp leaf --help' for usage.")
}

func TestSetupHelpNamesVariables(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "grp", "leaf", "--help")
	require.Equal(t, 0, code)
	require.Regexp(t, `--name string +a name \(required\) \(env TOOL_NAME\)\n`, out)
	require.Regexp(t, `--count int +how many \(env TOOL_COUNT\) \(default 1\)\n`, out)
	require.Regexp(t, `--mode slow\|fast +how \(env TOOL_MODE\) \(default slow\)\n`, out)
	require.NotContains(t, out, "TOOL_HELP")

	_, out, _ = run(t, "grp", "--help")
	require.Contains(t, out, "Usage:\n  tool grp [command]\n", "a group's usage does not offer to run it")
}

func TestShellWords(t *testing.T) {
	t.Parallel()
	for line, want := range map[string][]string{
		`a --b 'c d' "e \"f\"" g\ h`:      {"a", "--b", "c d", `e "f"`, "g h"},
		`x --steps '[{"a":1}]'  # note`:   {"x", "--steps", `[{"a":1}]`},
		`A=1 tool run --token "$TOKEN"`:   {"A=1", "tool", "run", "--token", "$TOKEN"},
		`tool --pattern 'device-*'#notes`: {"tool", "--pattern", "device-*#notes"},
	} {
		got, err := shellWords(line)
		require.NoError(t, err, line)
		require.Equal(t, want, got, line)
	}
	_, err := shellWords(`a 'b`)
	require.Error(t, err)
}

func TestCheckExamples(t *testing.T) {
	t.Parallel()
	withExample := func(ex string) func() *cobra.Command {
		return func() *cobra.Command {
			root := tree()
			leaf, _, _ := root.Find([]string{"grp", "leaf"})
			leaf.Example = ex
			return root
		}
	}
	n, err := CheckExamples(withExample(`  # a comment
  tool grp leaf a --name n \
    --count 2 --mode fast
  TOOL_NAME=n tool grp leaf b`), "TOOL_")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for bad, want := range map[string]string{
		`tool grp leaf a --name n --bogus`:     "unknown flag",
		`tool grp leaf a`:                      "required flag",
		`tool grp leaf --name n`:               "accepts 1 arg",
		`tool grp leaf a --name n --count x`:   "invalid argument",
		`tool grp`:                             "needs a subcommand",
		`other grp leaf a --name n`:            "does not start with",
		`TOOL_NOPE=1 tool grp leaf a --name n`: "no flag",
	} {
		_, err := CheckExamples(withExample(bad), "TOOL_")
		require.ErrorContains(t, err, want, bad)
	}
}
