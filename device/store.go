package device

import (
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// copyStore is paho's memory store keeping its own copy of every publish
// packet. paho 1.5.1 runs resume() right after it starts the OnConnect
// handler: resume marks the stored packets DUP and sends them again, while
// the writer may still be sending the very same objects (a birth published
// from OnConnect, for one), a data race on the packet. paho stores a packet
// before it hands it to the writer, so a copy taken in Put is never shared
// with the writer's first send.
type copyStore struct{ *mqtt.MemoryStore }

func newCopyStore() copyStore { return copyStore{mqtt.NewMemoryStore()} }

func (s copyStore) Put(key string, m packets.ControlPacket) {
	if p, ok := m.(*packets.PublishPacket); ok {
		cp := *p
		m = &cp
	}
	s.MemoryStore.Put(key, m)
}
