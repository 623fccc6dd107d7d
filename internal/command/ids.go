package command

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"
)

// crockford is the base32 alphabet of ULIDs (no I, L, O, U).
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

var idMu sync.Mutex

// newULID returns a 26-character, time-ordered id: 48 bits of milliseconds
// then 80 random bits, in Crockford base32.
func newULID(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	idMu.Lock()
	_, _ = rand.Read(b[6:])
	idMu.Unlock()
	// 128 bits → 26 base32 digits (the first carries 3 bits).
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// NewID mints a time-ordered id: prefix and a ULID.
func NewID(prefix string, now time.Time) string { return prefix + newULID(now) }

// NewCommandID mints a command id, "c-" and a ULID. Called once per
// intent's attempt: never for a command that may still run.
func NewCommandID(now time.Time) string { return NewID("c-", now) }

// NewQueryID mints a query id, "q-" and a ULID.
func NewQueryID(now time.Time) string { return NewID("q-", now) }
