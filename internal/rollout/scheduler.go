package rollout

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/lease"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
)

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	Store store.Store
	Ops   *ops.Service // builds each device's operation record
	// Policy gives the action's ack_timeout: the least time left in a
	// window for a start, and how long a provisional outcome holds the
	// rollout's end (see Decide). Nil: zero.
	Policy   func(action string) command.Policy
	Instance string
	// LeaseTTL is the scheduler's lease on each rollout it drives; every
	// pass extends it.
	LeaseTTL time.Duration
	// Checks are re-made before each start.
	Checks store.RolloutChecks
	// Poll is how often the list of active rollouts is read (other
	// instances' rollouts whose lease runs out are taken over then).
	Poll time.Duration
	// Tick is a driven rollout's idle pass interval (outcomes settle and
	// abort thresholds are checked at least this often).
	Tick    time.Duration
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
}

// Scheduler drives rollouts: for each active rollout whose lease it holds
// (or takes, when it ran out, or reclaims, when this instance held it
// before it restarted), one goroutine makes passes (store.RolloutPass),
// each a fenced transaction, until the rollout ended and its last device
// in flight settled, or its lease is lost.
type Scheduler struct {
	cfg     SchedulerConfig
	mu      sync.Mutex
	driving map[string]chan struct{} // rollout id → its wake-up
	known   map[string]bool          // rollouts this process has looked at
	adopted map[string]int64         // rollouts this process created, with the token it took
	wake    chan struct{}
}

// NewScheduler builds a Scheduler.
func NewScheduler(cfg SchedulerConfig) *Scheduler {
	if cfg.Poll <= 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 100 * time.Millisecond
	}
	if cfg.Tick > cfg.LeaseTTL/4 {
		cfg.Tick = cfg.LeaseTTL / 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Scheduler{cfg: cfg, driving: map[string]chan struct{}{}, known: map[string]bool{}, adopted: map[string]int64{},
		wake: make(chan struct{}, 1)}
}

// Wake makes the scheduler look at a rollout now (a create, an approval,
// a pause, resume or cancel on this instance).
func (s *Scheduler) Wake(rolloutID string) {
	s.mu.Lock()
	ch := s.driving[rolloutID]
	s.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Adopt tells the scheduler that this process created a rollout and took
// its lease with token: it drives it under that fence, without a reclaim.
func (s *Scheduler) Adopt(rolloutID string, token int64) {
	s.mu.Lock()
	s.adopted[rolloutID] = token
	s.mu.Unlock()
	s.Wake(rolloutID)
}

// Run looks for rollouts to drive every Poll until ctx ends, then waits for
// the rollouts it drives to stop.
func (s *Scheduler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(s.cfg.Poll)
	defer t.Stop()
	for {
		s.look(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.wake:
		}
	}
}

// look takes the leases it can and starts a driver for each.
func (s *Scheduler) look(ctx context.Context, wg *sync.WaitGroup) {
	active, err := s.cfg.Store.ActiveRollouts(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Logger.Error("list active rollouts", "err", err)
		}
		return
	}
	now := s.cfg.Now()
	for _, l := range active {
		s.mu.Lock()
		_, driving := s.driving[l.RolloutID]
		first := !s.known[l.RolloutID]
		adopted, created := s.adopted[l.RolloutID]
		s.known[l.RolloutID] = true
		delete(s.adopted, l.RolloutID)
		s.mu.Unlock()
		if driving {
			continue
		}
		var f domain.Fence
		err = nil
		claim := lease.ClaimFor(l.Owner, l.LeaseExpiresAt, s.cfg.Instance, first, now)
		switch {
		case created && l.Owner == s.cfg.Instance && l.FencingToken == adopted && l.LeaseExpiresAt.After(now):
			f = domain.Fence{Owner: s.cfg.Instance, Token: adopted} // created here: the lease it took
		case claim == lease.Leave:
			continue
		default: // this instance held it before it restarted (or created it just now), or it ran out
			f, err = s.cfg.Store.AcquireRollout(ctx, l.RolloutID, s.cfg.Instance, s.cfg.LeaseTTL, claim == lease.Reclaim)
		}
		if err != nil {
			if !errors.Is(err, store.ErrRefused) && ctx.Err() == nil {
				s.cfg.Logger.Error("take rollout lease", "rollout_id", l.RolloutID, "err", err)
			}
			continue
		}
		if l.Owner != s.cfg.Instance {
			s.cfg.Logger.Info("took over a rollout whose scheduler lease ran out", "rollout_id", l.RolloutID,
				"from", l.Owner, "fencing_token", f.Token)
			s.cfg.Metrics.takeover()
		}
		ch := make(chan struct{}, 1)
		s.mu.Lock()
		s.driving[l.RolloutID] = ch
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.drive(ctx, l.RolloutID, f, ch)
			s.mu.Lock()
			delete(s.driving, l.RolloutID)
			s.mu.Unlock()
		}()
	}
}

// drive makes passes over one rollout under fence f until it is over for
// this instance.
func (s *Scheduler) drive(ctx context.Context, id string, f domain.Fence, wake <-chan struct{}) {
	log := s.cfg.Logger.With("rollout_id", id)
	r, err := s.cfg.Store.GetRollout(ctx, id)
	if err != nil {
		log.Error("read rollout", "err", err)
		return
	}
	spec, err := ParseSpec(r.Spec)
	if err != nil {
		log.Error("read rollout spec", "err", err)
		return
	}
	var ack time.Duration
	if s.cfg.Policy != nil {
		ack = s.cfg.Policy(r.Action).AckTimeout
	}
	var cand *store.RolloutCandidate
	var last Decision
	decide := func(snap store.RolloutSnapshot) store.RolloutDecision {
		last = Decide(spec, snap, ack)
		return last.RolloutDecision
	}
	backoff := s.cfg.Tick
	for ctx.Err() == nil {
		if cand == nil && !r.Status.Terminal() {
			if cand, err = s.candidate(ctx, r); err != nil {
				log.Warn("prepare next device", "err", err)
			}
		}
		res, err := s.cfg.Store.RolloutPass(ctx, id, f, s.cfg.LeaseTTL, cand, s.cfg.Checks, decide)
		switch {
		case errors.Is(err, store.ErrFenced):
			log.Warn("rollout scheduler lease lost; another instance drives it", "fencing_token", f.Token)
			return
		case err != nil:
			if ctx.Err() == nil {
				log.Error("rollout pass", "err", err)
			}
			if !sleep(ctx, backoff, wake) {
				return
			}
			backoff = min(2*backoff, s.cfg.LeaseTTL/4)
			continue
		}
		backoff = s.cfg.Tick
		r = res.Snapshot.Rollout
		if res.Moved {
			r.Status = res.Decision.To
			log.Info("rollout moved", "to", res.Decision.To, "reason", res.Decision.Reason)
		}
		// The operations cancelled and the command a start made due are the
		// store's facts (package feed): their ?wait= callers and the
		// dispatcher hear of them from there.
		if len(res.Cancelled) > 0 {
			log.Info("rollout ended: unpublished commands cancelled", "count", len(res.Cancelled))
		}
		if res.Started != nil {
			cand = nil
			s.cfg.Metrics.started(id)
		} else if res.StartRefused != "" || res.Snapshot.Candidate == nil {
			cand = nil // read it again
		}
		if r.Status.Terminal() && r.Counts[fsm.DevStarted] == 0 && r.Counts[fsm.DevNeedsAttention] == 0 {
			log.Info("rollout over", "status", r.Status)
			return
		}
		wait := s.cfg.Tick
		if r.Status.Terminal() || last.Waiting == "paused" || last.Waiting == "approval" || last.Waiting == "window" {
			wait = max(s.cfg.Tick, s.cfg.LeaseTTL/4)
		}
		if !last.Next.IsZero() {
			if until := last.Next.Sub(s.cfg.Now()); until < wait {
				wait = max(until, time.Millisecond)
			}
		}
		if res.Started != nil {
			// The next start is due one interval after this one (sooner only
			// if the ramp steps up meanwhile, which the next pass sees).
			wait = max(res.Decision.Interval-s.cfg.Now().Sub(res.Snapshot.Now), 0)
		}
		if !sleep(ctx, wait, wake) {
			return
		}
	}
}

// candidate reads the next device to start and builds its operation record.
func (s *Scheduler) candidate(ctx context.Context, r domain.Rollout) (*store.RolloutCandidate, error) {
	d, ok, err := s.cfg.Store.NextRolloutCandidate(ctx, r.RolloutID)
	if err != nil || !ok {
		return nil, err
	}
	n, err := s.cfg.Ops.Prepare(ctx, d.OperationID, intent(r.RolloutID, r.Action, r.Params, d.DeviceID))
	if err != nil {
		return nil, err
	}
	return &store.RolloutCandidate{Device: d, Operation: n}, nil
}

// sleep waits d (or a wake-up); false when ctx ended.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}
