package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/device"
)

// ErrStopped is returned by waits and restarts on a stopped fleet.
var ErrStopped = errors.New("sim: fleet stopped")

// DevicesDir is the directory under the state dir that holds the devices'
// durable record: the device library's journal directory (one snapshot
// file per device, <id>.json, and the fleet's journal).
const DevicesDir = "devices"

// JournalExt ends the name of a fleet's journal file in the devices dir.
const JournalExt = ".journal"

// Fleet is a set of simulated devices, one MQTT connection each.
type Fleet struct {
	cfg      Config
	log      *slog.Logger
	j        *device.Journal
	execFile string
	rcptFile string
	devices  []*Device
	byID     map[string]*Device

	// runCtx is every incarnation's Run context, cancelled by Stop (once
	// held receipts are out).
	runCtx    context.Context
	cancelRun context.CancelFunc

	stopOnce sync.Once
	done     chan struct{}
}

// bootParallelism bounds how many devices load their state at once.
const bootParallelism = 32

// Start loads every device's durable state and starts the devices; each
// connects in the background (see WaitOnline). Cancelling ctx stops the
// fleet as Stop does.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, DevicesDir), 0o755); err != nil {
		return nil, fmt.Errorf("sim: state dir: %w", err)
	}
	execFile, rcptFile := witnessFiles(cfg.StateDir)
	for _, name := range []string{execFile, rcptFile} {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("sim: witness: %w", err)
		}
		f.Close()
	}
	j, err := device.OpenJournal(filepath.Join(cfg.StateDir, DevicesDir), &device.JournalOptions{Logger: cfg.Logger, SyncHook: cfg.syncHook,
		CompactAt: cfg.JournalCompactAt})
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	f := &Fleet{cfg: cfg, log: cfg.Logger, j: j, execFile: execFile, rcptFile: rcptFile, byID: map[string]*Device{}, done: make(chan struct{})}
	f.runCtx, f.cancelRun = context.WithCancel(context.Background())
	profile := cfg.Faults
	profile.Devices = slices.Clone(profile.Devices) // the devices share its entries
	for _, id := range cfg.ids() {
		d := newDevice(f, id, profile.shared(id))
		f.devices = append(f.devices, d)
		f.byID[id] = d
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, bootParallelism)
	)
	for _, d := range f.devices {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := d.start(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", d.id, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.Stop()
		return nil, fmt.Errorf("sim: %w", err)
	}
	go func() {
		select {
		case <-ctx.Done():
			f.Stop()
		case <-f.done:
		}
	}()
	f.log.Info("fleet started", "devices", len(f.devices), "mqtt", cfg.MQTT, "state_dir", cfg.StateDir, "seed", cfg.Seed)
	return f, nil
}

// Stop shuts every device down cleanly: it finishes the command it is
// executing (a slow execution is cut short and answered failed
// "interrupted"), publishes its pending receipts, its retained offline
// presence, then DISCONNECTs. Stop is idempotent and waits until done.
func (f *Fleet) Stop() {
	f.stopOnce.Do(func() {
		var wg sync.WaitGroup
		for _, d := range f.devices {
			wg.Add(1)
			go func() { defer wg.Done(); d.stopping() }()
		}
		wg.Wait()
		f.cancelRun() // each running device stops cleanly
		for _, d := range f.devices {
			wg.Add(1)
			go func() { defer wg.Done(); d.waitEnded() }()
		}
		wg.Wait()
		if err := f.j.Close(); err != nil {
			f.log.Error("close journal", "err", err)
		}
		close(f.done)
		f.log.Info("fleet stopped")
	})
}

// Done is closed once the fleet has stopped.
func (f *Fleet) Done() <-chan struct{} { return f.done }

// Device returns the device with this id, or nil.
func (f *Fleet) Device(id string) *Device { return f.byID[id] }

// Devices returns every device, in id order of the config.
func (f *Fleet) Devices() []*Device { return append([]*Device(nil), f.devices...) }

// StateDir is where the devices' state and the witness files are.
func (f *Fleet) StateDir() string { return f.cfg.StateDir }

// TopicRoot is the fleet's topic root.
func (f *Fleet) TopicRoot() string { return f.cfg.TopicRoot }

// Seed is the seed of the fault decisions in use.
func (f *Fleet) Seed() int64 { return f.cfg.Seed }

// WaitOnline waits until every device is online (connected, subscribed and
// its birth published).
func (f *Fleet) WaitOnline(ctx context.Context) error {
	for _, d := range f.devices {
		if err := d.WaitOnline(ctx); err != nil {
			return fmt.Errorf("%s: %w", d.id, err)
		}
	}
	return nil
}

// ApplyProfile gives every device its faults from p, as at Start.
func (f *Fleet) ApplyProfile(p Profile) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	for _, d := range f.devices {
		if err := d.SetFaults(p.For(d.id)); err != nil {
			return err
		}
	}
	return nil
}

// Stats sums the counters of every device.
func (f *Fleet) Stats() Stats {
	var s Stats
	for _, d := range f.devices {
		s.add(d.Stats())
	}
	return s
}

func newDevice(f *Fleet, id string, faults *Faults) *Device {
	h := fnv.New64a()
	h.Write([]byte(id))
	d := &Device{
		id:     id,
		f:      f,
		log:    f.log.With("device", id),
		faults: faults,
		rng:    rand.New(rand.NewPCG(uint64(f.cfg.Seed), h.Sum64())),
		wake:   make(chan struct{}),
		incCh:  make(chan struct{}),
		app:    newAppState(),
	}
	d.skew.Store(int64(faults.ClockSkew.D()))
	return d
}

// now is the fleet's clock before any device's skew.
func (f *Fleet) now() time.Time { return f.cfg.Clock() }
