package store

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
)

func newTask(id, author string) NewTask {
	steps := `[{"step":"restart-device","action":"restart","target":"device-1","params":{}}]`
	return NewTask{TaskID: id, Steps: json.RawMessage(steps), PlanHash: "hash-" + id, CreateHash: "create-" + id, Author: author}
}

// TestListTasksByStatusPages: ?status=waiting_approval lists only the tasks
// waiting, in task_id order, with their current plan, paged by Next.
func TestListTasksByStatusPages(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be)
		for i := range 5 {
			_, created, err := b.s.CreateTask(b.ctx, newTask(fmt.Sprintf("task-%02d", i), "agent"))
			require.NoError(t, err)
			require.True(t, created)
		}
		// A new plan version for task-00, an approval for task-01, a
		// rejection for task-03: three waiting remain.
		steps := json.RawMessage(`[{"step":"restart-device","action":"restart","target":"device-2","params":{}}]`)
		_, changed, err := b.s.UpdatePlan(b.ctx, "task-00", steps, "hash-v2", "bob", nil)
		require.NoError(t, err)
		require.True(t, changed)
		_, _, err = b.s.Approve(b.ctx, "task-01", 1, "", "alice", true)
		require.NoError(t, err)
		_, err = b.s.Reject(b.ctx, "task-03", "not now", "alice")
		require.NoError(t, err)

		waiting := fsm.TaskWaitingApproval
		var ids []string
		p := Page{Limit: 2}
		for pages := 1; ; pages++ {
			require.Less(t, pages, 10, "Next never ends")
			got, err := b.s.ListTasks(b.ctx, TaskFilter{Status: &waiting}, p)
			require.NoError(t, err)
			require.EqualValues(t, 3, got.Total)
			for _, k := range got.Items {
				require.Equal(t, waiting, k.Status)
				ids = append(ids, k.TaskID)
			}
			if got.Next == "" {
				require.Equal(t, 2, pages)
				break
			}
			p.After = got.Next
		}
		require.Equal(t, []string{"task-00", "task-02", "task-04"}, ids)

		got, err := b.s.ListTasks(b.ctx, TaskFilter{Status: &waiting}, Page{Limit: 1})
		require.NoError(t, err)
		first := got.Items[0]
		require.Equal(t, 2, first.Version, "the current plan version")
		require.Equal(t, "hash-v2", first.PlanHash)
		require.Equal(t, "bob", first.Author)
		require.Equal(t, "device-2", first.Steps[0].Target)
		require.Equal(t, "agent", first.CreatedBy)

		all, err := b.s.ListTasks(b.ctx, TaskFilter{}, Page{})
		require.NoError(t, err)
		require.EqualValues(t, 5, all.Total)
		require.Len(t, all.Items, 5)
		require.Equal(t, 1, all.Items[1].ApprovedVersion, "task-01 is approved")
		require.Empty(t, all.Next)
	})
}

// changeLog is a Feed that records each fact, and each change apart.
type changeLog struct {
	mu      sync.Mutex
	facts   []Fact
	changes []Change
}

func (c *changeLog) Publish(f Fact) {
	c.mu.Lock()
	c.facts = append(c.facts, f)
	if f.Kind == FactChanged {
		c.changes = append(c.changes, f.Change)
	}
	c.mu.Unlock()
}

// TestFeedSeesCommittedChangesWithIDs: the feed is told each committed
// change with its entity id, in order, and a new submit's command as due
// with its copy as inserted; a change that is refused and rolled back tells
// it nothing.
func TestFeedSeesCommittedChangesWithIDs(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		log := &changeLog{}
		b := setupFeed(t, be, log)
		s := b.s

		_, err := s.Submit(b.ctx, newOp("op-1", "c-1"), nil)
		require.NoError(t, err)
		_, _, err = s.CreateTask(b.ctx, newTask("task-1", "agent"))
		require.NoError(t, err)
		_, err = s.Reject(b.ctx, "task-1", "no", "alice")
		require.NoError(t, err)
		_, _, err = s.Approve(b.ctx, "task-1", 1, "", "alice", true) // refused: rejected
		require.ErrorIs(t, err, domain.ErrIllegalState)

		log.mu.Lock()
		defer log.mu.Unlock()
		var got []string
		for _, c := range log.changes {
			require.Equal(t, b.clk.Now().UTC(), c.At)
			got = append(got, c.Machine+" "+c.ID+" "+c.From+"→"+c.To)
		}
		require.Equal(t, []string{
			"command c-1 →pending", // a submit inserts the command (the outbox), then the operation
			"operation op-1 →started",
			"task task-1 →waiting_approval",
			"task task-1 waiting_approval→rejected",
		}, got)
		var due []Fact
		for _, f := range log.facts {
			if f.Kind == FactDue {
				due = append(due, f)
			}
		}
		require.Len(t, due, 1, "the submit's command, once")
		require.Equal(t, "c-1", due[0].ID)
		require.NotNil(t, due[0].Inserted)
		require.Equal(t, "c-1", due[0].Inserted.CommandID)
		require.False(t, due[0].Remote)
	})
}
