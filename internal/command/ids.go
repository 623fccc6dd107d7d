package command

import (
	"crypto/rand"
	"time"

	"github.com/oklog/ulid/v2"
)

// NewID mints a time-ordered id: prefix and a ULID (48 bits of
// milliseconds, 80 random bits, Crockford base32).
func NewID(prefix string, now time.Time) string {
	return prefix + ulid.MustNew(ulid.Timestamp(now), rand.Reader).String()
}

// NewCommandID mints a command id, "c-" and a ULID. Called once per
// intent's attempt: never for a command that may still run.
func NewCommandID(now time.Time) string { return NewID("c-", now) }

// NewQueryID mints a query id, "q-" and a ULID.
func NewQueryID(now time.Time) string { return NewID("q-", now) }
