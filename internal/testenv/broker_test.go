package testenv

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
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

// Persistence works as the README says, also when the broker is started as
// root (Mosquitto would otherwise drop to its own user and fail to write the
// data directory): a retained message survives a clean stop and start.
func TestBrokerPersistsRetainedMessagesAcrossACleanRestart(t *testing.T) {
	b := StartBroker(t)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(b.URL()).SetClientID("persist-writer"))
	if tok := c.Connect(); !tok.WaitTimeout(ProbeWait) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	payload, _ := json.Marshal(wire.Presence{Online: true, Session: 42, Capabilities: &wire.Capabilities{Dedupe: true, Query: true}})
	if tok := c.Publish(wire.Topic("fleet", "device-9", wire.KindPresence), 1, true, payload); !tok.WaitTimeout(ProbeWait) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	c.Disconnect(100)
	b.Restart(false) // SIGTERM: the broker saves its database
	db := filepath.Join(b.Dir, "data", "mosquitto.db")
	if _, err := os.Stat(db); err != nil {
		log, _ := os.ReadFile(filepath.Join(b.Dir, "mosquitto.log"))
		t.Fatalf("no persistence file after a clean stop (%v); broker log:\n%s", err, log)
	}
	got := RetainedPresence(t, b.URL(), "fleet", "device-9")
	if got["device-9"].Session != 42 {
		t.Fatalf("retained presence after restart: %+v", got)
	}
}
