package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/fsm"
)

// BenchmarkSubmit measures one submit transaction (operation, command,
// event) on a real SQLite file with synchronous=FULL.
func BenchmarkSubmit(b *testing.B) {
	s, err := Open(context.Background(), Config{Path: filepath.Join(b.TempDir(), "c.db"), Instance: "i1"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i))
		if _, err := s.Submit(context.Background(), n, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimSend measures one fenced pending → sent decision.
func BenchmarkClaimSend(b *testing.B) {
	s, err := Open(context.Background(), Config{Path: filepath.Join(b.TempDir(), "c.db"), Instance: "i1"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < b.N; i++ {
		if _, err := s.Submit(context.Background(), newOp(fmt.Sprintf("op-%d", i), fmt.Sprintf("c-%d", i)), nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.ClaimSend(context.Background(), fmt.Sprintf("c-%d", i), fsm.CmdPending, 0, 1, fence, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}
