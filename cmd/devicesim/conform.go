package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/device/conformtest"
	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// newConformCmd returns `devicesim conform`: the conformance suite
// (package device/conformtest) against one running device.
func newConformCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		o                        conformtest.Options
		params, passwordFile, ca string
		restart                  string
		asJSON                   bool
	)
	cmd := &cobra.Command{
		Use:   "conform --mqtt URL --device ID [--topic-root fleet] [--restart 'SHELL COMMAND'] [--action restart] [--params '{}'] [--timeout 10s] [--mqtt-user U] [--mqtt-password-file F] [--mqtt-ca F] [--json]",
		Short: "Check a running device, of any implementation, against the device protocol's rules",
		Long: `Check a running device against the rules of docs/protocol.md, acting as a
controller on the broker: it sends its own commands and queries (run-unique
ids) and judges only what the device publishes, its receipts and its presence.

It prints one line per rule, in this order, then a summary:

  PASS <rule>
  FAIL <rule>: <what it sent and what it saw>
  SKIP <rule>: <why>
  N passed, N failed, N skipped

  presence-birth              a retained birth with online, session, capabilities
  receipts-ordered            receipts with the command's ids, seq from 1 up, a final status last
  dedupe-command-id           the same command again (attempt 2) gets its latest receipt, unchanged
  dedupe-operation-id         a new command_id of an operation that ran gets that command's latest receipt
  dedupe-before-expiry        a repeat after expires_at gets the latest receipt, not rejected/expired
  expired-rejected            a never-seen expired command gets rejected, error expired, and does not run
  query-known                 a Query for a command that ran gets its current status and the query_id
  query-by-operation          a Query for an unseen command_id of an operation that ran gets the one that ran
  query-unknown               a Query for a command never seen gets unknown, seq 0, the query_id
  malformed-ignored           malformed commands and queries change nothing; the next command is answered
  presence-session-increases  after --restart, the new birth's session is larger than the old one
  dedupe-survives-restart     after --restart, repeats of commands that ran are still not executed

--restart is a shell command (/bin/sh -c) that kills the device abruptly, as
kill -9 would, and starts it again in the background; without it the last
two rules are SKIP. A device that declares dedupe:false gets the dedupe rules
(and query-by-operation) as SKIP, one that declares query:false the query
rules. --action and --params make the suite's commands: the device must run
them (succeed or fail), not reject them. --timeout bounds each wait.

Exit status: 0 when no rule failed, 1 when one failed (or the suite could not
run), 2 on a usage error. --json prints one JSON object per rule instead,
{"rule","outcome","detail"}, and no summary.`,
		Example: `  devicesim conform --mqtt tcp://127.0.0.1:1883 --device device-1

  # with the crash rules: the restart command kills the device and starts it again
  devicesim conform --mqtt tcp://127.0.0.1:1883 --device pump-7 \
    --restart 'pkill -9 -f pump-firmware; ./pump-firmware --id pump-7 >>pump.log 2>&1 &'

  # another action, on the secure profile, as JSON
  devicesim conform --mqtt ssl://127.0.0.1:8883 --device device-1 --action set-config --params '{"mode":"eco"}' \
    --mqtt-user controller-conform --mqtt-password-file ./run/creds/controller-conform.password \
    --mqtt-ca ./run/tls/ca.pem --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if params != "" {
				o.Params = json.RawMessage(params)
			}
			if o.Timeout <= 0 {
				return cmdline.Usagef("--timeout %s: must be positive", o.Timeout)
			}
			if err := o.Validate(); err != nil {
				return cmdline.Usage(err)
			}
			if passwordFile != "" {
				b, err := os.ReadFile(passwordFile)
				if err != nil {
					return fmt.Errorf("--mqtt-password-file: %w", err)
				}
				o.Password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
				if o.Password == "" {
					return fmt.Errorf("--mqtt-password-file %s is empty", passwordFile)
				}
			}
			if ca != "" {
				tc, err := mqttx.ClientTLS(ca)
				if err != nil {
					return fmt.Errorf("--mqtt-ca: %w", err)
				}
				o.TLS = tc
			}
			if restart != "" {
				o.Restart = conformtest.ShellRestart(restart, stderr)
			}
			rs, err := conformtest.Check(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetEscapeHTML(false)
				for _, r := range rs {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
			} else {
				for _, r := range rs {
					fmt.Fprintln(stdout, r)
				}
				fmt.Fprintln(stdout, conformtest.Summary(rs))
			}
			if conformtest.Failed(rs) {
				// Exit status 1; stdout holds the results alone.
				n := 0
				for _, r := range rs {
					if r.Outcome == conformtest.Fail {
						n++
					}
				}
				return fmt.Errorf("conform: %s does not conform: %d of %d rules failed", o.Device, n, len(rs))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&o.MQTT, "mqtt", "", "broker URL (tcp:// or ssl://)")
	f.StringVar(&o.Device, "device", "", "id of the device to check")
	f.StringVar(&o.TopicRoot, "topic-root", wire.DefaultTopicRoot, "MQTT topic root")
	f.StringVar(&restart, "restart", "", "shell command that kills the device abruptly and starts it again (the restart rules are SKIP without it)")
	f.StringVar(&o.Action, "action", conformtest.DefaultAction, "action of the commands the suite sends (one the device runs)")
	f.StringVar(&params, "params", "{}", "params of those commands, a JSON object")
	f.DurationVar(&o.Timeout, "timeout", conformtest.DefaultTimeout, "bound of each wait for the device")
	f.StringVar(&o.Username, "mqtt-user", "", "MQTT user name (give the suite a controller account of its own on the secure profile)")
	f.StringVar(&passwordFile, "mqtt-password-file", "", "file holding the MQTT password (one trailing newline trimmed)")
	f.StringVar(&ca, "mqtt-ca", "", "CA certificate (PEM) the broker's TLS certificate must chain to, for ssl:// URLs")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per rule instead of lines")
	_ = cmd.MarkFlagRequired("mqtt")
	_ = cmd.MarkFlagRequired("device")
	return cmd
}
