package domain

import (
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Device is what the controller knows of one device's presence.
type Device struct {
	DeviceID     string
	Online       bool
	Confirmed    bool // spoke since the controller's last connect to the broker
	Seen         bool // a birth was ever applied
	Session      int64
	PresenceRank int64
	Capabilities wire.Capabilities
	ClockSkew    time.Duration // device clock minus controller clock, from its birth
	// StalePresence counts presence messages ignored for a rank lower than
	// the stored one; LastStaleSession is the session of the latest.
	StalePresence    int64
	LastStaleSession int64
	LastSeenAt       *time.Time
	UpdatedAt        time.Time
}

// InstanceInfo is one controller instance as GET /v1/instances shows it.
type InstanceInfo struct {
	InstanceID  string
	StartedAt   time.Time
	HeartbeatAt time.Time
	LeaseTTL    time.Duration
	Live        bool // its last heartbeat is within its lease ttl
	Leases      int  // started operations it holds
}
