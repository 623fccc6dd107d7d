package device_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// The crash tests run this binary as a device process (childMain). Every
// goroutine of a stopped device ends: its paho client, its timers.
func TestMain(m *testing.M) {
	if os.Getenv("DEVICE_CHILD") != "" {
		childMain()
		return
	}
	goleak.VerifyTestMain(m)
}
