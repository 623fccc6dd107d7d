// Command controller is the device-command controller: `controller serve`
// runs the daemon; the other subcommands are its API client.
package main

import (
	"os"

	"github.com/fleetctl/fleetctl/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
