package lease

import (
	"context"
	"log/slog"
	"time"

	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/store"
)

// Config configures a Keeper.
type Config struct {
	Store      store.Store
	Instance   string
	TTL        time.Duration
	Failpoints *failpoint.Set
	Metrics    *metrics.Metrics
	Logger     *slog.Logger
}

// Keeper renews this instance's leases and takes over expired ones.
type Keeper struct{ cfg Config }

// New builds a Keeper.
func New(cfg Config) *Keeper {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Keeper{cfg: cfg}
}

// TrustMargin is how far before its expiry a lease stops being trusted for
// acting: a fifth of the ttl, at most 2 s.
func TrustMargin(ttl time.Duration) time.Duration { return min(ttl/5, 2*time.Second) }

// Run beats every third of the ttl until ctx ends.
func (k *Keeper) Run(ctx context.Context) error {
	t := time.NewTicker(k.cfg.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		k.Beat(ctx)
	}
}

// Beat renews the leases this instance holds, then takes over the expired
// ones of its peers.
func (k *Keeper) Beat(ctx context.Context) {
	if err := k.cfg.Failpoints.HitContext(ctx, failpoint.BeforeLeaseRenew); err != nil {
		k.cfg.Logger.Warn("lease renewal skipped", "err", err)
		return
	}
	if _, _, err := k.cfg.Store.RenewLeases(ctx, k.cfg.Instance, k.cfg.TTL); err != nil && ctx.Err() == nil {
		k.cfg.Logger.Error("renew leases", "err", err)
	}
	taken, err := k.cfg.Store.TakeOver(ctx, k.cfg.Instance, k.cfg.TTL, 1000)
	if err != nil {
		if ctx.Err() == nil {
			k.cfg.Logger.Error("take over expired leases", "err", err)
		}
		return
	}
	if len(taken) > 0 {
		k.cfg.Metrics.Takeovers.Add(float64(len(taken)))
		k.cfg.Logger.Info("took over operations whose lease ran out", "count", len(taken))
	}
}
