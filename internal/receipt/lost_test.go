package receipt

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/metrics"
	"github.com/fleetctl/fleetctl/internal/mqttx"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// lostStore is a store whose database file left its path: every change fails.
type lostStore struct {
	store.Store
	calls atomic.Int32
}

func (l *lostStore) ApplyReceipt(context.Context, string, wire.Receipt, func() error) (store.ReceiptOutcome, error) {
	l.calls.Add(1)
	return store.ReceiptOutcome{}, &store.BatchError{Err: fmt.Errorf("after commit: %w: the database /x/c.db", store.ErrDatabaseLost)}
}

// A receipt that a store with a lost database could not record is left
// unacknowledged at once, for the broker to deliver to the next instance:
// never retried into "acknowledged anyway".
func TestReceiptNotAcknowledgedWhenTheDatabaseIsLost(t *testing.T) {
	t.Parallel()
	st := &lostStore{}
	in := New(Config{Store: st, Source: make(chanSource), TopicRoot: "fleet", Metrics: metrics.New(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var acked atomic.Int32
	m := mqttx.NewMessage("fleet/device-1/receipts", []byte(receiptJSON("c-1", 1)), func() { acked.Add(1) })
	start := time.Now()
	in.Handle(context.Background(), m)
	require.Zero(t, acked.Load(), "no PUBACK for a receipt the lost database did not keep")
	require.EqualValues(t, 1, st.calls.Load(), "not retried")
	require.Less(t, time.Since(start), time.Second)
}
