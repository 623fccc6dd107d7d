package cmdline

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// CheckExamples parses every command line in the Example of every command
// of the tree that newRoot builds, as a shell would split it, and checks it
// against a fresh tree: the command exists, every flag exists and takes its
// value, the arguments fit, the required flags are given (on the line, or
// as PREFIX_ variables before it). It returns how many lines it checked.
// Tests call it so that an example never shows a flag that is not there.
func CheckExamples(newRoot func() *cobra.Command, envPrefix string) (int, error) {
	root := newRoot()
	var errs []error
	n := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, line := range exampleLines(c.Example) {
			words, err := shellWords(line)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: example %q: %w", c.CommandPath(), line, err))
				continue
			}
			n++
			if err := checkLine(newRoot(), envPrefix, words); err != nil {
				errs = append(errs, fmt.Errorf("%s: example %q: %w", c.CommandPath(), line, err))
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return n, errors.Join(errs...)
}

// exampleLines joins continued lines (a trailing '\') and drops comments
// and blank lines.
func exampleLines(example string) []string {
	var out []string
	for _, l := range strings.Split(strings.ReplaceAll(example, "\\\n", " "), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, l)
	}
	return out
}

// shellWords splits a line as sh would, for what examples use: single and
// double quotes, backslash escapes, a trailing "# comment"; $VAR stays as
// written.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == ' ' || ch == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '#' && !inWord:
			return words, nil
		case ch == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated '")
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case ch == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, errors.New(`unterminated "`)
			}
			inWord = true
		case ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

func checkLine(root *cobra.Command, envPrefix string, words []string) error {
	env := map[string]string{}
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		k, v, _ := strings.Cut(words[0], "=")
		env[k] = v
		words = words[1:]
	}
	if len(words) == 0 || words[0] != root.Name() {
		return fmt.Errorf("does not start with %q", root.Name())
	}
	cmd, rest, err := root.Find(words[1:])
	if err != nil {
		return err
	}
	if cmd.HasSubCommands() {
		return fmt.Errorf("%q needs a subcommand", cmd.CommandPath())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	for k, v := range env {
		if !strings.HasPrefix(k, envPrefix) {
			continue
		}
		found := false
		for name := range flagNames(cmd) {
			if EnvName(envPrefix, name) == k {
				found = true
				if !cmd.Flags().Changed(name) {
					if err := cmd.Flags().Set(name, v); err != nil {
						return fmt.Errorf("%s: %w", k, err)
					}
				}
			}
		}
		if !found {
			return fmt.Errorf("%s: no flag of %q reads it", k, cmd.CommandPath())
		}
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return err
	}
	return checkRequired(cmd.Flags())
}

func flagNames(cmd *cobra.Command) map[string]bool {
	names := map[string]bool{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
	return names
}
