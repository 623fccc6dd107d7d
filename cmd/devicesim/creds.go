package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetctl/fleetctl/internal/cli/cmdline"
	"github.com/fleetctl/fleetctl/internal/creds"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// newCredsCmd returns `devicesim creds`: a fleet's broker accounts for the
// secure profile (package creds).
func newCredsCmd(stdout io.Writer) *cobra.Command {
	var (
		devices             int
		idPrefix, out, root string
		controllers         []string
	)
	cmd := &cobra.Command{
		Use:   "creds --devices N [--id-prefix device-] [--controllers ID,ID] --out DIR",
		Short: "Write a fleet's broker accounts: Mosquitto's passwd and acl, and credentials.json",
		Long: `Write the broker accounts of a fleet for the secure Mosquitto profile
(mosquitto/secure.conf.tmpl): one per device, numbered from 1 as "devicesim run"
numbers them (user name = device id), and one per controller instance (user
name controller-ID), each with a random password (192 bits from crypto/rand).

  DIR/passwd                 Mosquitto's password_file (PBKDF2-SHA512 hashes, as
                             mosquitto_passwd writes them), mode 0600
  DIR/acl                    Mosquitto's acl_file: a device reads only
                             {root}/{id}/commands and /queries and writes only its
                             /receipts and /presence; controllers read every
                             device's receipts and presence, write commands and queries
  DIR/credentials.json       [{"username","password"}], devices and controllers,
                             mode 0600: for "devicesim run --credentials"
  DIR/controller-ID.password each controller's password alone, mode 0600: for
                             "controller serve --mqtt-password-file"

Run again on the same DIR to add accounts (more devices, another prefix,
another controller): existing passwords are kept, passwd and acl rewritten
with every account. Mosquitto reads both files again on SIGHUP. To change a
password, delete its entry from credentials.json and run again.`,
		Example: `  # then: mosquitto/broker.sh start-secure 8883 ./run/broker ./run/creds ./run/tls
  devicesim creds --devices 20 --controllers c1 --out ./run/creds

  # ten more devices, another prefix; the first twenty keep their passwords
  devicesim creds --devices 10 --id-prefix pump- --out ./run/creds`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return cmdline.Usagef("--out DIR is required")
			}
			if devices < 0 || devices == 0 && len(controllers) == 0 {
				return cmdline.Usagef("--devices %d: at least 1 (or --controllers only)", devices)
			}
			ids := make([]string, 0, devices)
			for i := 1; i <= devices; i++ {
				ids = append(ids, fmt.Sprintf("%s%d", idPrefix, i))
			}
			for i, c := range controllers {
				controllers[i] = strings.TrimPrefix(strings.TrimSpace(c), creds.ControllerPrefix)
			}
			res, err := creds.Write(creds.Options{Dir: out, Devices: ids, Controllers: controllers, TopicRoot: root})
			if err != nil {
				return cmdline.Usage(err)
			}
			nctl := 0
			for _, a := range res.Accounts {
				if a.Controller() {
					nctl++
				}
			}
			fmt.Fprintf(stdout, "devicesim creds: %s holds %d accounts (%d devices, %d controllers), %d new\n",
				out, len(res.Accounts), len(res.Accounts)-nctl, nctl, res.Added)
			fmt.Fprintf(stdout, "  broker:     password_file %s, acl_file %s\n",
				filepath.Join(out, creds.PasswdFile), filepath.Join(out, creds.ACLFile))
			fmt.Fprintf(stdout, "  devices:    devicesim run --credentials %s\n", filepath.Join(out, creds.CredentialsFile))
			for _, c := range controllers {
				fmt.Fprintf(stdout, "  controller: controller serve --instance-id %s --mqtt-password-file %s\n", c, creds.PasswordFile(out, c))
			}
			if nctl == 0 {
				fmt.Fprintln(stdout, "  no controller account yet: add one with --controllers ID")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.IntVar(&devices, "devices", 0, "number of device accounts, numbered from 1")
	f.StringVar(&idPrefix, "id-prefix", sim.DefaultIDPrefix, "device id prefix")
	f.StringSliceVar(&controllers, "controllers", nil, "controller instance ids (accounts controller-ID)")
	f.StringVar(&root, "topic-root", wire.DefaultTopicRoot, "MQTT topic root of the ACL")
	f.StringVar(&out, "out", "", "directory to write (created if missing; completed if it holds credentials.json)")
	return cmd
}
