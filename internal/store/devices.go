package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// UnseenDevice is a device never seen: offline, and assumed unable to
// deduplicate or answer queries until its first birth.
func UnseenDevice(id string) domain.Device { return domain.Device{DeviceID: id} }

// deviceColumns are the columns scanDevice reads, in its order: those of
// the backends' device statements (DeviceGet, DeviceResetPresence), and of
// the devices' list page, built here (page.go).
const deviceColumns = `device_id, online, confirmed, seen, session, presence_rank, dedupe, query, clock_skew_ms,
	stale_presence, last_stale_session, last_seen_at, updated_at`

func scanDevice(row interface{ Scan(...any) error }) (domain.Device, error) {
	var (
		d        domain.Device
		skew, up int64
		last     sql.NullInt64
	)
	if err := row.Scan(&d.DeviceID, &d.Online, &d.Confirmed, &d.Seen, &d.Session, &d.PresenceRank,
		&d.Capabilities.Dedupe, &d.Capabilities.Query, &skew, &d.StalePresence, &d.LastStaleSession, &last, &up); err != nil {
		return domain.Device{}, err
	}
	d.ClockSkew, d.LastSeenAt, d.UpdatedAt = time.Duration(skew)*time.Millisecond, fromNullMS(last), fromMS(up)
	return d, nil
}

// GetDevice reads one device; a device never seen is domain.ErrNotFound.
func (s *DB) GetDevice(ctx context.Context, id string) (domain.Device, error) {
	d, err := scanDevice(s.rq.QueryRowContext(ctx, s.q.DeviceGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Device{}, fmt.Errorf("device %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Device{}, fmt.Errorf("get device %s: %w", id, err)
	}
	return d, nil
}

// DeviceFilter narrows a device list; a nil field does not filter.
type DeviceFilter struct {
	Online *bool
}

// ListDevices lists one page of the devices the controller has heard of,
// by id, with the number that match the filter. The index devices_online
// (online, device_id) serves a filtered page and its count; the primary key
// an unfiltered one.
func (s *DB) ListDevices(ctx context.Context, f DeviceFilter, p Page) (Listed[domain.Device], error) {
	return readPage(ctx, s, deviceKeyset(f), p)
}

func deviceKeyset(f DeviceFilter) keyset[domain.Device] {
	k := keyset[domain.Device]{table: "devices", key: "device_id", columns: deviceColumns, scan: scanDevice,
		id: func(d domain.Device) string { return d.DeviceID }}
	if f.Online != nil {
		k.where, k.args = append(k.where, "online = ?"), append(k.args, *f.Online)
	}
	return k
}

// PresenceOutcome says whether a presence message was applied.
type PresenceOutcome struct {
	Applied    bool
	Device     domain.Device // after the message
	WentOnline bool          // offline (or never seen) → online
	Stale      bool          // ignored for a rank lower than the stored one
}

// ApplyPresence applies a birth, a clean offline or an LWT, guarded by rank:
// only a strictly higher rank than the stored one is applied (a delayed LWT
// of an old connection, or a stale retained birth, changes nothing).
func (s *DB) ApplyPresence(ctx context.Context, device string, p wire.Presence) (PresenceOutcome, error) {
	var out PresenceOutcome
	err := s.writeLocking(ctx, rowLocks{deviceRows: []string{device}}, func(ctx context.Context, t *tx) error {
		var err error
		out, err = t.presence(ctx, device, p)
		return err
	})
	return out, err
}

// presence is the change of one presence message.
func (t *tx) presence(ctx context.Context, device string, p wire.Presence) (PresenceOutcome, error) {
	var out PresenceOutcome
	now := ms(t.now)
	if _, err := t.Exec(t.s.q.DeviceInsert,
		device, now); err != nil {
		return out, fmt.Errorf("insert device %s: %w", device, err)
	}
	// No row lock: the rank is the guard. Most presence messages are
	// retained ones re-delivered to every instance, and change nothing.
	before, err := scanDevice(t.QueryRowContext(ctx, t.s.q.DeviceGet, device))
	if err != nil {
		return out, fmt.Errorf("read device %s: %w", device, err)
	}
	rank := p.Rank()
	if rank <= before.PresenceRank {
		// Equal: the same message again (a retained one re-delivered).
		// Lower: stale, counted so a device whose births are ignored shows.
		if rank < before.PresenceRank {
			out.Stale = true
			if _, err := t.Exec(t.s.q.DeviceStalePresence, p.Session, device); err != nil {
				return out, fmt.Errorf("count stale presence of %s: %w", device, err)
			}
		}
		out.Device = before
		return out, nil
	}
	caps, seen, skew := before.Capabilities, before.Seen, before.ClockSkew.Milliseconds()
	if p.Online {
		seen = true
		if p.Capabilities != nil {
			caps = *p.Capabilities
		}
		if p.At != nil {
			skew = p.At.Sub(t.now).Milliseconds()
		}
	}
	r, err := t.Exec(t.s.q.DevicePresence,
		p.Online, seen, p.Session, rank, caps.Dedupe, caps.Query, skew, now, now, device, rank)
	if err != nil {
		return out, fmt.Errorf("apply presence of %s: %w", device, err)
	}
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		// Another instance applied this rank, or a higher one, first.
		out.Device = before
		return out, err
	}
	from, to := onlineWord(before.Online), onlineWord(p.Online)
	if err := t.event("device", device, from, to, fmt.Sprintf("presence session %d", p.Session), 0); err != nil {
		return out, err
	}
	out.Applied, out.WentOnline = true, p.Online && !before.Online
	out.Device, err = scanDevice(t.QueryRowContext(ctx, t.s.q.DeviceGet, device))
	return out, err
}

func onlineWord(online bool) string {
	if online {
		return "online"
	}
	return "offline"
}

// ResetPresence forgets a device's stored presence rank (and its stale
// count), so that the next presence message applies whatever its session:
// for a device whose counter went backwards (a reflash, lost storage) or a
// rank poisoned by a forged retained message. Its presence is unchanged
// until that message arrives. An admin's action.
func (s *DB) ResetPresence(ctx context.Context, device, who string) (domain.Device, error) {
	var out domain.Device
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(who)
		var err error
		out, err = scanDevice(t.QueryRowContext(ctx, s.q.DeviceResetPresence, ms(t.now), device))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("device %s: %w", device, domain.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("reset presence of %s: %w", device, err)
		}
		if err := t.event("device", device, onlineWord(out.Online), onlineWord(out.Online), "presence rank reset by "+who, 0); err != nil {
			return err
		}
		return t.audit(ActPresenceReset, EntityDevice, device, map[string]any{"online": out.Online, "session": out.Session})
	})
	return out, err
}

// touchDevice records that a device spoke (a receipt): it is confirmed and
// its last-seen time moves, at most once a second (lastSeenResolution):
// a busy device's receipts do not each rewrite, and with PostgreSQL lock,
// its row. Presence itself only changes by rank.
//
// A device this store touched within that second, in a change that
// committed, is not touched again: no statement at all. Its own
// UnconfirmAll forgets those touches; another instance's (PostgreSQL) may
// leave a device unconfirmed for up to that second longer, until its next
// receipt.
func (t *tx) touchDevice(device string) error {
	now := ms(t.now)
	if at, ok := t.s.touched[device]; ok && at > now-lastSeenResolution.Milliseconds() {
		return nil
	}
	// A row another instance's change holds is being written by it (touched
	// by another receipt, or its presence applied): this touch is skipped.
	if _, err := t.Exec(t.s.q.DeviceTouch,
		now, now, device, now-lastSeenResolution.Milliseconds()); err != nil {
		return fmt.Errorf("touch device %s: %w", device, err)
	}
	s := t.s
	t.notes = append(t.notes, func(Observer) { s.touched[device] = now }) // once committed
	return nil
}

// lastSeenResolution is how stale a device's last_seen_at may be.
const lastSeenResolution = time.Second

// UnconfirmAll marks every device unconfirmed, after the controller
// (re)connects to a broker that may have lost its sessions: presence is a
// hint until each device speaks again.
func (s *DB) UnconfirmAll(ctx context.Context) error {
	return s.write(ctx, func(ctx context.Context, t *tx) error {
		// A device whose row another change holds is speaking right now.
		if _, err := t.Exec(t.s.q.DeviceUnconfirmAll); err != nil {
			return err
		}
		s := t.s
		t.notes = append(t.notes, func(Observer) { clear(s.touched) }) // each is touched at its next receipt
		return nil
	})
}
