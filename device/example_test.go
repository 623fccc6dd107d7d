package device_test

import (
	"context"
	"os/signal"
	"syscall"

	"github.com/fleetctl/fleetctl/device"
)

// A whole device: one action, a durable state directory, a broker. Run
// returns when the process is asked to stop, after a clean offline
// presence. (This example needs a broker, so go test compiles it but does
// not run it; TestExample runs the same device against a test broker.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	d, err := device.New(device.Options{
		ID:           "pump-17",
		Broker:       "ssl://broker.example.com:8883",
		PasswordFile: "/etc/pump/mqtt-password",
		CAFile:       "/etc/pump/ca.pem",
		StateDir:     "/var/lib/pump",
		Actions: map[string]device.Handler{
			"restart": func(ctx context.Context, cmd *device.Command) (any, error) {
				// ... restart the pump; an error fails the command.
				return map[string]any{"restarted": true}, nil
			},
		},
	})
	if err != nil {
		panic(err)
	}
	if err := d.Run(ctx); err != nil {
		panic(err)
	}
}
