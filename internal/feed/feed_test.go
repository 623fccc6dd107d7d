package feed

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/store"
)

// recorder is a route that records what reached it.
type recorder struct {
	mu  sync.Mutex
	got []store.Fact
}

func (r *recorder) route(f store.Fact) {
	r.mu.Lock()
	r.got = append(r.got, f)
	r.mu.Unlock()
}

func (r *recorder) facts() []store.Fact {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]store.Fact(nil), r.got...)
}

// Each kind of fact reaches the route as published, inline: it is there
// when Publish returns.
func TestEachKindReachesTheRouteInline(t *testing.T) {
	fd := New()
	var r recorder
	fd.Route(r.route)
	ins := &store.OpenCommand{Command: domain.Command{CommandID: "c-1"}}
	facts := []store.Fact{
		{Kind: store.FactChanged, Change: store.Change{Machine: "operation", ID: "op-1", From: "started", To: "succeeded"}},
		{Kind: store.FactChanged, ID: "op-2", Change: store.Change{Machine: "operation", ID: "op-2"}, Remote: true},
		{Kind: store.FactDue, ID: "c-1", Inserted: ins},
		{Kind: store.FactDue, ID: "c-2", Remote: true},
		{Kind: store.FactRollout, ID: "r-1", Token: 1},
		{Kind: store.FactRollout, ID: "r-2"},
		{Kind: store.FactChanged, Change: store.Change{Machine: "device", ID: "device-1", From: "offline", To: "online"}},
		{Kind: store.FactChanged, Change: store.Change{Machine: "task", ID: "task-1", From: "approved", To: "running"}},
		{Kind: store.FactReset, Remote: true},
	}
	for i, f := range facts {
		fd.Publish(f)
		require.Equal(t, facts[:i+1], r.facts(), "fact %d is routed before Publish returns", i)
	}
	require.Same(t, ins, r.facts()[2].Inserted, "the inserted command is handed on, not copied")
}

// Facts published before the route is set are kept and reach it first, in
// order, then the ones after.
func TestFactsBeforeTheRouteReachItFirst(t *testing.T) {
	fd := New()
	fd.Publish(store.Fact{Kind: store.FactChanged, Change: store.Change{Machine: "operation", ID: "op-1", To: "started"}})
	fd.Publish(store.Fact{Kind: store.FactDue, ID: "c-1"})
	var r recorder
	fd.Route(r.route)
	fd.Publish(store.Fact{Kind: store.FactDue, ID: "c-2"})
	var ids []string
	for _, f := range r.facts() {
		ids = append(ids, f.Change.ID+f.ID)
	}
	require.Equal(t, []string{"op-1", "c-1", "c-2"}, ids)
	for _, f := range r.facts() {
		require.NotEqual(t, store.FactReset, f.Kind, "nothing was dropped")
	}
}

// Beyond MaxPending facts before the route, the rest are dropped and the
// route gets one reset after the kept ones.
func TestTooManyFactsBeforeTheRouteEndInAReset(t *testing.T) {
	fd := New()
	for i := 0; i < MaxPending+10; i++ {
		fd.Publish(store.Fact{Kind: store.FactDue, ID: "c"})
	}
	var r recorder
	fd.Route(r.route)
	got := r.facts()
	require.Len(t, got, MaxPending+1)
	require.Equal(t, store.FactReset, got[MaxPending].Kind)
	require.False(t, got[MaxPending].Remote, "the feed's own reset, not another instance's")
	fd.Publish(store.Fact{Kind: store.FactDue, ID: "after"})
	require.Equal(t, "after", r.facts()[MaxPending+1].ID)
}

// Publishers racing with Route: every fact reaches the route exactly once,
// each publisher's in its order.
func TestPublishWhileTheRouteIsSet(t *testing.T) {
	fd := New()
	var r recorder
	const publishers, each = 4, 500
	var wg sync.WaitGroup
	for p := 0; p < publishers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				fd.Publish(store.Fact{Kind: store.FactDue, ID: string(rune('a' + p)), Token: int64(i)})
			}
		}()
	}
	fd.Route(r.route)
	wg.Wait()
	got := r.facts()
	require.Len(t, got, publishers*each)
	next := map[string]int64{}
	for _, f := range got {
		require.Equal(t, next[f.ID], f.Token, "publisher %s in order", f.ID)
		next[f.ID]++
	}
}

func TestRouteTwicePanics(t *testing.T) {
	fd := New()
	fd.Route(func(store.Fact) {})
	require.Panics(t, func() { fd.Route(func(store.Fact) {}) })
}
