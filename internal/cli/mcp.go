package cli

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
)

// mcpCmd is `controller mcp`: the agent interface over stdio, for an agent
// host to start as a tool server. Its tools call the daemon's HTTP API at
// --server with --token, so their rules are the API's.
func mcpCmd() *cobra.Command {
	var server, token string
	var logLevel string
	cmd := &cobra.Command{
		Use:   "mcp --server URL --token TOKEN",
		Short: "Serve the MCP tools over stdio for an agent host; each tool calls the daemon's HTTP API",
		Long: `Serve the Model Context Protocol over stdin and stdout, for an agent host that
starts this command as a tool server. Every tool (submit_operation, get_operation,
get_command, list_devices, get_device, create_task, update_plan, get_task,
create_rollout, get_rollout, cancel_command) is a call of the daemon's HTTP API
at --server with --token, so idempotency, approvals, grants and roles are the
API's: a reused operation_id with other params, an approval required, a missing
grant or role come back as tool errors with the API's code. There is no tool
that approves. stdout carries only MCP; logs go to stderr. It exits when the
host closes stdin.`,
		Example: `  controller mcp --server http://127.0.0.1:8080 --token "$AGENT_TOKEN"

  # as an agent host starts it, the token from the environment
  CONTROLLER_TOKEN=t-agent controller mcp --server http://127.0.0.1:8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err := mcpserver.Serve(ctx, client.New(server, token), io.NopCloser(cmd.InOrStdin()),
				nopWriteCloser{cmd.OutOrStdout()}, log, "")
			if ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
				return nil // the host closed stdin, or a signal: a clean stop
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", "http://127.0.0.1:8080", "the controller's API URL")
	f.StringVar(&token, "token", "", "bearer token the tools call the API with (see serve --tokens)")
	f.Var(cmdline.NewEnum(&logLevel, "warn", "debug", "info", "warn", "error"), "log-level", "log level on stderr (debug: a line per tool call)")
	return cmd
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
