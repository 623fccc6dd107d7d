// Package cmdline is what the project's two cobra binaries, controller and
// devicesim, share about running a command line, so that both behave the
// same way:
//
//   - every flag also reads an environment variable, PREFIX_ and the flag's
//     name in upper case with '-' as '_' (--ack-timeout ←
//     CONTROLLER_ACK_TIMEOUT), and its help says so: "(env
//     CONTROLLER_ACK_TIMEOUT)", added here, never written by hand;
//   - a flag given on the command line wins over its variable; required flags
//     are checked after the variables are read, so either may supply them;
//   - usage errors (an unknown command or flag, a missing required flag, a
//     wrong number of arguments, a bad flag or variable value) exit with
//     status 2 and a hint naming the command's help; every other error exits
//     with status 1;
//   - errors go to stderr as "<binary>: <message>", with an optional hint on
//     the next line.
//
// A binary builds its tree, calls Setup once, then
//
//	os.Exit(cmdline.Exit(stderr, cmdline.Execute(ctx, root, args, stdout, stderr)))
package cmdline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit statuses.
const (
	ExitOK    = 0
	ExitError = 1 // the command ran and failed
	ExitUsage = 2 // the command line was wrong; nothing ran
)

// UsageError is an error in the command line itself: nothing ran.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usage marks err as a usage error (nil stays nil).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	var u *UsageError
	if errors.As(err, &u) {
		return err
	}
	return &UsageError{Err: err}
}

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// IsUsage reports whether err is, or wraps, a usage error.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}

// ExitCode maps an error to the process exit status: nil 0, a usage error
// 2, anything else 1.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case IsUsage(err):
		return ExitUsage
	default:
		return ExitError
	}
}

// hinted carries advice for the person at the terminal, printed on the line
// after the error.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() }
func (h *hinted) Unwrap() error { return h.err }

// WithHint attaches a hint to err (nil stays nil). Of several, the
// outermost is the one printed.
func WithHint(err error, hint string) error {
	if err == nil {
		return nil
	}
	return &hinted{err: err, hint: hint}
}

// Hint returns the hint attached to err, or "".
func Hint(err error) string {
	var h *hinted
	if errors.As(err, &h) {
		return h.hint
	}
	return ""
}

// Error is what Execute returns for a failed run: the error and the binary
// that reports it.
type Error struct {
	Binary string // the root command's name: controller, devicesim
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Execute runs root with args and returns its error, nil on success. A
// usage error comes back with the hint "Run '<command> --help' for usage.",
// naming the command that was being run.
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) error {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return nil
	}
	if IsUsage(err) && Hint(err) == "" {
		if cmd == nil {
			cmd = root
		}
		err = WithHint(err, fmt.Sprintf("Run '%s --help' for usage.", cmd.CommandPath()))
	}
	return &Error{Binary: root.Name(), Err: err}
}

// Exit prints err, if any, as "<binary>: <message>" and its hint on the
// next line, and returns the exit status for it.
func Exit(stderr io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	name := "error"
	var e *Error
	if errors.As(err, &e) {
		name = e.Binary
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, err)
	if h := Hint(err); h != "" {
		fmt.Fprintln(stderr, h)
	}
	return ExitCode(err)
}

// EnvName is the variable a flag reads: prefix and the flag's name in upper
// case, '-' as '_' (CONTROLLER_, ack-timeout → CONTROLLER_ACK_TIMEOUT).
func EnvName(prefix, flag string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// FromEnv sets every flag of fs not given on the command line from its
// variable. A flag set this way counts as given (pflag's Changed), as if it
// had been typed. A value the flag refuses is a usage error naming the
// variable.
func FromEnv(fs *pflag.FlagSet, prefix string) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := EnvName(prefix, f.Name)
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = Usagef("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

// Setup prepares a built command tree for Execute. For every command of
// the tree (cobra's own help and completion commands aside) it:
//   - appends "(env PREFIX_NAME)" to each flag's help, and " (required)" to
//     the required ones;
//   - before the command runs, reads the flags not given from their
//     variables, then checks the required flags, as usage errors;
//   - turns argument-count errors and flag errors into usage errors;
//   - makes a command with subcommands refuse an unknown one (usage error,
//     with suggestions) and show its help when given none;
//   - makes a command without subcommands and without an Args rule refuse
//     arguments.
//
// Call it once, after every command and flag is added.
func Setup(root *cobra.Command, envPrefix string) {
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Usage(err) })
	seen := map[*pflag.Flag]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		annotate := func(f *pflag.Flag) {
			if seen[f] || f.Name == "help" {
				return
			}
			seen[f] = true
			if isRequired(f) {
				f.Usage += " (required)"
			}
			f.Usage += " (env " + EnvName(envPrefix, f.Name) + ")"
		}
		c.PersistentFlags().VisitAll(annotate)
		c.Flags().VisitAll(annotate)
		wrapArgs(c)
		wrapPreRun(c, envPrefix)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

func isRequired(f *pflag.Flag) bool {
	v, ok := f.Annotations[cobra.BashCompOneRequiredFlag]
	return ok && len(v) > 0 && v[0] == "true"
}

func wrapArgs(c *cobra.Command) {
	switch {
	case c.HasSubCommands() && !c.Runnable():
		// A group: cobra would show its help for "group bogus" and exit 0.
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if cmd.SuggestionsMinimumDistance <= 0 {
				cmd.SuggestionsMinimumDistance = 2
			}
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return Usage(errors.New(msg))
		}
		// Runnable now, only to refuse unknown subcommands: its usage
		// still shows "group [command]" alone.
		c.SetUsageTemplate(strings.Replace(c.UsageTemplate(), "{{if .Runnable}}", "{{if and .Runnable (not .HasAvailableSubCommands)}}", 1))
	case c.Args == nil:
		c.Args = cobra.NoArgs
	}
	orig := c.Args
	c.Args = func(cmd *cobra.Command, args []string) error { return Usage(orig(cmd, args)) }
}

func wrapPreRun(c *cobra.Command, envPrefix string) {
	origE, orig := c.PreRunE, c.PreRun
	c.PreRun = nil
	c.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := FromEnv(cmd.Flags(), envPrefix); err != nil {
			return err
		}
		if err := checkRequired(cmd.Flags()); err != nil {
			return err
		}
		switch {
		case origE != nil:
			return origE(cmd, args)
		case orig != nil:
			orig(cmd, args)
		}
		return nil
	}
}

// checkRequired is cobra's required-flag check, done here so that it comes
// after the variables are read and fails as a usage error.
func checkRequired(fs *pflag.FlagSet) error {
	var missing []string
	fs.VisitAll(func(f *pflag.Flag) {
		if isRequired(f) && !f.Changed {
			missing = append(missing, "--"+f.Name)
		}
	})
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return Usagef("required flag(s) %s not set", strings.Join(missing, ", "))
}

// Enum is a string flag value that accepts one of a fixed set of words
// (case-insensitive), so a wrong one is refused while the command line is
// parsed. Its type, shown in the help, is the words joined by '|'.
type Enum struct {
	p       *string
	allowed []string
}

// NewEnum returns an Enum that stores into p, set to def.
func NewEnum(p *string, def string, allowed ...string) *Enum {
	*p = def
	return &Enum{p: p, allowed: allowed}
}

func (e *Enum) String() string { return *e.p }
func (e *Enum) Type() string   { return strings.Join(e.allowed, "|") }

func (e *Enum) Set(v string) error {
	for _, a := range e.allowed {
		if strings.EqualFold(v, a) {
			*e.p = a
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(e.allowed, ", "))
}
