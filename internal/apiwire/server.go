package apiwire

import "time"

// EventData is an event's JSON form, the stream's contract: the data of
// each event of GET /v1/events.
type EventData struct {
	Kind   string    `json:"kind"`
	ID     string    `json:"id"`
	Status string    `json:"status"`
	At     time.Time `json:"at"`
	// Principal is the person whose change it is (a cancel, a resolve,
	// an approval...); omitted for the controller's own.
	Principal string `json:"principal,omitempty"`
}

// Who is the caller as GET /v1/whoami shows it: the dashboard asks, to show
// who is signed in and to offer approve and reject only to an approver.
type Who struct {
	Principal string   `json:"principal"`
	Roles     []string `json:"roles"`
	Auth      bool     `json:"auth"` // false: the API runs without --tokens, everyone has every role
}

// InstanceView is one controller instance in GET /v1/instances.
type InstanceView struct {
	InstanceID  string    `json:"instance_id"`
	Live        bool      `json:"live"`
	Leases      int       `json:"leases"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	LeaseTTL    string    `json:"lease_ttl"`
}
