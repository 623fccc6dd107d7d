package feed

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/store"
)

// calls records every consumer call, in order, as one line each.
type calls struct{ log []string }

func (c *calls) add(format string, args ...any) { c.log = append(c.log, fmt.Sprintf(format, args...)) }

type waiters struct{ *calls }

func (w waiters) Started(id string) { w.add("started %s", id) }
func (w waiters) Reset()            { w.add("waiters reset") }
func (w waiters) Changed(id string, committed *domain.Operation) {
	if committed == nil {
		w.add("wait %s (read again)", id)
		return
	}
	w.add("wait %s (committed %s)", id, committed.Status)
}

type dispatcher struct{ *calls }

func (d dispatcher) Submitted(id string, ins *store.OpenCommand) {
	d.add("submitted %s %s", id, ins.CommandID)
}
func (d dispatcher) Kick(id string)           { d.add("kick %s", id) }
func (d dispatcher) QueueMoved(device string) { d.add("queue %s", device) }

type scheduler struct{ *calls }

func (s scheduler) Adopt(id string, token int64) { s.add("adopt %s %d", id, token) }
func (s scheduler) Wake(id string)               { s.add("wake %s", id) }

type tasks struct{ *calls }

func (k tasks) Wake(id string) { k.add("task %s", id) }

type stream struct{ *calls }

func (s stream) Changed(c store.Change) { s.add("stream %s %s %s", c.Machine, c.ID, c.To) }
func (s stream) Publish(kind, id, status string, _ time.Time) uint64 {
	s.add("stream %s", kind)
	return 0
}

func consumers(c *calls) *Consumers {
	return &Consumers{Waiters: waiters{c}, Dispatcher: dispatcher{c}, Scheduler: scheduler{c}, Tasks: tasks{c}, Stream: stream{c},
		Remote: func(id string) { c.add("remote %s", id) }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// Each kind of fact goes to the consumers that act on it, and to no other.
func TestRouteSendsEachKindToItsConsumers(t *testing.T) {
	changed := func(machine, id, from, to string) store.Fact {
		return store.Fact{Kind: store.FactChanged, Change: store.Change{Machine: machine, ID: id, From: from, To: to}}
	}
	for _, tc := range []struct {
		name string
		fact store.Fact
		want []string
	}{
		{"an operation that left started", changed("operation", "op-1", "started", "succeeded"),
			[]string{"wait op-1 (read again)", "stream operation op-1 succeeded"}},
		{"an operation that ended with its row as committed", store.Fact{Kind: store.FactChanged, Change: store.Change{
			Machine: "operation", ID: "op-1", From: "started", To: "succeeded", Operation: &domain.Operation{Status: "succeeded"}}},
			[]string{"wait op-1 (committed succeeded)", "stream operation op-1 succeeded"}},
		{"an operation that started (its waiters need not read it first)", changed("operation", "op-1", "", "started"),
			[]string{"started op-1", "stream operation op-1 started"}},
		{"a retry started again", changed("operation", "op-1", "failed_retryable", "started"),
			[]string{"started op-1", "stream operation op-1 started"}},
		{"another instance's operation", store.Fact{Kind: store.FactChanged, ID: "op-2",
			Change: store.Change{Machine: "operation", ID: "op-2"}, Remote: true},
			[]string{"wait op-2 (read again)", "remote op-2"}},
		{"a command", changed("command", "c-1", "pending", "sent"), []string{"stream command c-1 sent"}},
		{"a device's presence", changed("device", "device-1", "offline", "online"), []string{"stream device device-1 online"}},
		{"a task", changed("task", "task-1", "approved", "running"), []string{"task task-1", "stream task task-1 running"}},
		{"a task step's operation that ended", changed("operation", "task-1:s:device-1:approval-v2", "started", "failed_final"),
			[]string{"task task-1", "wait task-1:s:device-1:approval-v2 (read again)", "stream operation task-1:s:device-1:approval-v2 failed_final"}},
		{"a task step's operation that started (the runner made it)", changed("operation", "task-1:s:device-1:approval-v2", "", "started"),
			[]string{"started task-1:s:device-1:approval-v2", "stream operation task-1:s:device-1:approval-v2 started"}},
		{"another instance's task step operation", store.Fact{Kind: store.FactChanged, ID: "task-2:s:d:approval-v1",
			Change: store.Change{Machine: "operation", ID: "task-2:s:d:approval-v1"}, Remote: true},
			[]string{"task task-2", "wait task-2:s:d:approval-v1 (read again)", "remote task-2:s:d:approval-v1"}},
		{"a rollout's own move", changed("rollout", "r-1", "scheduled", "running"), []string{"stream rollout r-1 running"}},
		{"a lease (the stream drops it)", changed("lease", "i1", "", "reclaimed"), []string{"stream lease i1 reclaimed"}},
		{"a new submit's command", store.Fact{Kind: store.FactDue, ID: "c-1",
			Inserted: &store.OpenCommand{Command: domain.Command{CommandID: "c-1"}}}, []string{"submitted c-1 c-1"}},
		{"a command made due", store.Fact{Kind: store.FactDue, ID: "c-2"}, []string{"kick c-2"}},
		{"a command made due elsewhere", store.Fact{Kind: store.FactDue, ID: "c-3", Remote: true}, []string{"kick c-3"}},
		{"a device's serial queue moved", store.Fact{Kind: store.FactQueue, ID: "device-1"}, []string{"queue device-1"}},
		{"a device's serial queue moved elsewhere", store.Fact{Kind: store.FactQueue, ID: "device-2", Remote: true}, []string{"queue device-2"}},
		{"a rollout created here", store.Fact{Kind: store.FactRollout, ID: "r-1", Token: 1}, []string{"adopt r-1 1"}},
		{"a person's action on a rollout", store.Fact{Kind: store.FactRollout, ID: "r-1"}, []string{"wake r-1"}},
		{"wake-ups missed", store.Fact{Kind: store.FactReset, Remote: true}, []string{"waiters reset", "stream " + events.KindReset}},
		{"facts dropped before the route", store.Fact{Kind: store.FactReset}, []string{"waiters reset", "stream " + events.KindReset}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			var c calls
			consumers(&c).Route(tc.fact)
			require.Equal(t, tc.want, c.log)
		})
	}
}

// The route through a Feed: a fact published before Route is set reaches
// the consumers once it is, and a reset of the feed's own reaches the
// stream.
func TestFeedRoutesToConsumers(t *testing.T) {
	var c calls
	fd := New()
	fd.Publish(store.Fact{Kind: store.FactDue, ID: "c-1"})
	require.Empty(t, c.log, "no route yet")
	fd.Route(consumers(&c).Route)
	require.Equal(t, []string{"kick c-1"}, c.log)
	fd.Publish(store.Fact{Kind: store.FactReset, Remote: true})
	require.Equal(t, []string{"kick c-1", "waiters reset", "stream reset"}, c.log)
}
