package sim_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine of a stopped fleet ends: devices, paho clients, timers.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
