package e2e

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// sniffer records every command and query the controller publishes: the
// MQTT traffic as an independent witness.
type sniffer struct {
	mu       sync.Mutex
	commands []sniffed
	queries  []wire.Query
}

type sniffed struct {
	cmd wire.Command
	qos byte
}

func sniff(t *testing.T, url string) *sniffer {
	s := &sniffer{}
	c := rawClient(t, url, "sniffer-"+t.Name())
	tok := c.Subscribe("fleet/+/commands", 1, func(_ mqtt.Client, m mqtt.Message) {
		var cmd wire.Command
		if json.Unmarshal(m.Payload(), &cmd) == nil {
			s.mu.Lock()
			s.commands = append(s.commands, sniffed{cmd, m.Qos()})
			s.mu.Unlock()
		}
	})
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	tok = c.Subscribe("fleet/+/queries", 1, func(_ mqtt.Client, m mqtt.Message) {
		var q wire.Query
		if json.Unmarshal(m.Payload(), &q) == nil {
			s.mu.Lock()
			s.queries = append(s.queries, q)
			s.mu.Unlock()
		}
	})
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	return s
}

// of returns the commands and queries published for one operation.
func (s *sniffer) of(opID string) (cmds []sniffed, queries []wire.Query) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.commands {
		if c.cmd.OperationID == opID {
			cmds = append(cmds, c)
		}
	}
	for _, q := range s.queries {
		if q.OperationID == opID {
			queries = append(queries, q)
		}
	}
	return cmds, queries
}

// commandIDs is the set of distinct command ids among cmds.
func commandIDs(cmds []sniffed) map[string]bool {
	out := map[string]bool{}
	for _, c := range cmds {
		out[c.cmd.CommandID] = true
	}
	return out
}
