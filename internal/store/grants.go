package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fleetctl/fleetctl/internal/approval"
	"github.com/fleetctl/fleetctl/internal/domain"
)

const grantColumns = `grant_id, principal, action, devices, created_by, created_at, revoked_at`

func scanGrant(row interface{ Scan(...any) error }) (domain.Grant, error) {
	var (
		g       domain.Grant
		created int64
		revoked sql.NullInt64
	)
	if err := row.Scan(&g.GrantID, &g.Principal, &g.Action, &g.Devices, &g.CreatedBy, &created, &revoked); err != nil {
		return domain.Grant{}, err
	}
	g.CreatedAt, g.RevokedAt = fromMS(created), fromNullMS(revoked)
	return g, nil
}

// CreateGrant inserts a grant, or returns the live one with the same
// (principal, action, devices) (created false).
func (s *DB) CreateGrant(ctx context.Context, id, principal, action, devices, by string) (domain.Grant, bool, error) {
	for _, glob := range []string{action, devices} {
		if err := approval.ValidPattern(glob); err != nil {
			return domain.Grant{}, false, fmt.Errorf("glob %q: %w", glob, domain.ErrIllegalState)
		}
	}
	var g domain.Grant
	var created bool
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(by)
		r, err := t.Exec(s.q.GrantInsert,
			id, principal, action, devices, by, ms(t.now))
		if err != nil {
			return fmt.Errorf("insert grant: %w", err)
		}
		n, _ := r.RowsAffected()
		created = n == 1
		if g, err = scanGrant(t.QueryRowContext(ctx, s.q.GrantLive, principal, action, devices)); err != nil || !created {
			return err
		}
		return t.audit(ActGrant, EntityGrant, g.GrantID, grantDetail(g))
	})
	return g, created, err
}

// RevokeGrant sets revoked_at, by who (once; a second revoke returns the
// grant as it is).
func (s *DB) RevokeGrant(ctx context.Context, id, who string) (domain.Grant, error) {
	var g domain.Grant
	err := s.write(ctx, func(ctx context.Context, t *tx) error {
		t.by(who)
		r, err := t.Exec(s.q.GrantRevoke, ms(t.now), id)
		if err != nil {
			return fmt.Errorf("revoke grant %s: %w", id, err)
		}
		g, err = scanGrant(t.QueryRowContext(ctx, s.q.GrantGet, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("grant %s: %w", id, domain.ErrNotFound)
		}
		if n, _ := r.RowsAffected(); err != nil || n == 0 {
			return err
		}
		return t.audit(ActRevoke, EntityGrant, id, grantDetail(g))
	})
	return g, err
}

// grantDetail is a grant's audit detail: whom it names, for what.
func grantDetail(g domain.Grant) map[string]any {
	return map[string]any{"grantee": g.Principal, "action": g.Action, "devices": g.Devices}
}

// GrantFilter narrows a grant list: live grants only, unless Revoked.
type GrantFilter struct {
	Revoked bool // the revoked grants too
}

// ListGrants lists one page of grants by grant_id (minted time-ordered, so
// this is also the order they were created in), with the number that match.
func (s *DB) ListGrants(ctx context.Context, f GrantFilter, p Page) (Listed[domain.Grant], error) {
	return readPage(ctx, s, grantKeyset(f), p)
}

// grantKeyset walks the primary key; the live filter is applied row by row,
// which is cheap for the few grants a fleet has.
func grantKeyset(f GrantFilter) keyset[domain.Grant] {
	k := keyset[domain.Grant]{table: "grants", key: "grant_id", columns: grantColumns, scan: scanGrant,
		id: func(g domain.Grant) string { return g.GrantID }}
	if !f.Revoked {
		k.where = append(k.where, "revoked_at IS NULL")
	}
	return k
}

// Allowed reports whether a live grant lets principal run action on device.
func (s *DB) Allowed(ctx context.Context, principal, action, device string) (bool, error) {
	return allowed(ctx, s.rq, principal, action, device)
}

func allowed(ctx context.Context, q queryer, principal, action, device string) (bool, error) {
	grants, err := grantsOf(ctx, q, principal)
	if err != nil {
		return false, err
	}
	return approval.Allows(grants, action, device), nil
}

// grantsOf reads the live grants of principal, for the domain's matching
// (approval.Allows).
func grantsOf(ctx context.Context, q queryer, principal string) ([]approval.Grant, error) {
	rows, err := q.QueryContext(ctx, stmts(q).GrantsOf, principal)
	if err != nil {
		return nil, fmt.Errorf("read grants of %s: %w", principal, err)
	}
	defer rows.Close()
	var out []approval.Grant
	for rows.Next() {
		var g approval.Grant
		if err := rows.Scan(&g.Action, &g.Devices); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, rows.Err()
}
