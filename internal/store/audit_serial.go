package store

import (
	"context"
	"fmt"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// AuditSerialCommand is a serial command as invariant 10 reads it: its
// device and its place in the device's queue.
type AuditSerialCommand struct {
	CommandID string
	DeviceID  string
	SerialSeq int64 // per device 1, 2, 3... in the order the submits committed
	Status    fsm.CommandState
}

// SerialCommands lists every serial command (serial_seq set), by device and
// serial_seq; none on a database from before the serial migration (0011).
func (a *Audit) SerialCommands(ctx context.Context) ([]AuditSerialCommand, error) {
	var version int
	if err := a.q.QueryRowContext(ctx, stmts(a.q).SchemaVersion).Scan(&version); err != nil {
		return nil, fmt.Errorf("audit: schema version: %w", err)
	}
	if version < 11 {
		return nil, nil
	}
	rows, err := a.q.QueryContext(ctx, stmts(a.q).AuditSerialCommands)
	if err != nil {
		return nil, fmt.Errorf("audit: list serial commands: %w", err)
	}
	defer rows.Close()
	out := []AuditSerialCommand{}
	for rows.Next() {
		var c AuditSerialCommand
		if err := rows.Scan(&c.CommandID, &c.DeviceID, &c.SerialSeq, &c.Status); err != nil {
			return nil, fmt.Errorf("audit: list serial commands: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: list serial commands: %w", err)
	}
	return out, nil
}
