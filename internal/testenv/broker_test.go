package testenv

import (
	"net"
	"testing"
)

func TestBrokerStartsAndRestarts(t *testing.T) {
	b := StartBroker(t)
	b.Restart(true)
	c, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatalf("broker not reachable after restart: %v", err)
	}
	c.Close()
}
