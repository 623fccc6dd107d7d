package command

import (
	"fmt"
	"time"
)

// Policy is how the controller drives one action's commands.
type Policy struct {
	// AckTimeout: with no final receipt by then, the device is asked (a Query
	// for the same command_id) and, for a dedupe device, the command may be
	// re-sent. Later checks back off exponentially.
	AckTimeout time.Duration
	// MaxAttempts bounds the publishes of one command_id (and, separately,
	// the queries about it); past that the command waits for its expiry.
	MaxAttempts int
	// TTL: a command's expires_at is its issue time plus TTL.
	TTL time.Duration
}

// Validate checks a policy.
func (p Policy) Validate() error {
	switch {
	case p.AckTimeout <= 0:
		return fmt.Errorf("policy: ack_timeout must be positive, got %s", p.AckTimeout)
	case p.MaxAttempts < 1:
		return fmt.Errorf("policy: max_attempts must be at least 1, got %d", p.MaxAttempts)
	case p.TTL <= 0:
		return fmt.Errorf("policy: ttl must be positive, got %s", p.TTL)
	}
	return nil
}

// Backoff is the wait before check number n (from 0) after a send or query:
// AckTimeout doubled each time, capped at 8×.
func (p Policy) Backoff(n int) time.Duration {
	if n > 3 {
		n = 3
	}
	return p.AckTimeout << n
}
