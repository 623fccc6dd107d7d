package domain

import "time"

// Grant lets a principal run an action (a shell glob) on devices (a shell glob).
type Grant struct {
	GrantID   string
	Principal string
	Action    string
	Devices   string
	CreatedBy string
	CreatedAt time.Time
	RevokedAt *time.Time
}
