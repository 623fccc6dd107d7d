package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// The durable floor's log: records reach the file in order, go round to
// its beginning when the next batch would pass its end, and a batch larger
// than the file is refused, not written.
func TestPtLogGoesRound(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "floor.log")
	l, err := openPtLog(path, 16)
	require.NoError(t, err)
	stop := l.start(ctx)
	defer stop()

	read := func() string {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(raw)
	}
	require.Equal(t, string(make([]byte, 16)), read(), "written through with zeros at the start")
	require.NoError(t, l.append(ctx, []byte("aaaaaa")))
	require.NoError(t, l.append(ctx, []byte("bbbbbb")))
	require.Equal(t, "aaaaaa\nbbbbbb\n\x00\x00", read())
	require.NoError(t, l.append(ctx, []byte("cc")))
	require.Equal(t, "cc\naaa\nbbbbbb\n\x00\x00", read(), "past the end: from the beginning")
	require.ErrorContains(t, l.append(ctx, make([]byte, 16)), "exceeds")
	require.Equal(t, "cc\naaa\nbbbbbb\n\x00\x00", read(), "a batch too large changes nothing")

	stop()
	require.Error(t, l.append(ctx, []byte("late")), "the writer has stopped")
}

// The durable floor ends an operation only once its final receipt is in
// the log: while the log's writer is held, the operation stays started.
func TestDurableFloorEndsAfterTheReceiptIsLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "floor.log")
	l, err := openPtLog(path, 1<<16)
	require.NoError(t, err)
	held, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	l.beforeWrite = func() {
		close(held)
		<-hold
	}
	stop := l.start(context.Background())
	defer func() {
		release()
		stop()
	}()

	p := &passthrough{log: l, ops: map[string]*ptOp{}, byCmd: map[string]*ptOp{}}
	o := &ptOp{id: "op-1", done: make(chan struct{}), status: ptStarted}
	p.ops[o.id], p.byCmd["cmd-1"] = o, o
	payload, err := wire.Encode(wire.Receipt{CommandID: "cmd-1", OperationID: "op-1", Status: wire.ReceiptSucceeded, Seq: 2,
		At: time.Now().UTC()})
	require.NoError(t, err)
	p.onReceipt(nil, receiptMessage(payload))

	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the receipt never reached the log's writer")
	}
	require.Equal(t, ptStarted, p.record(o).Status, "not ended before the log is written")
	select {
	case <-o.done:
		t.Fatal("the operation ended before its receipt was logged")
	default:
	}
	release()
	select {
	case <-o.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the operation did not end once its receipt was logged")
	}
	require.Equal(t, ptSucceeded, p.record(o).Status)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(raw), string(payload)+"\n"), "the receipt is the log's first line")
}

// A submit the durable floor could not log is answered 500 and forgotten:
// nothing published, the same operation_id free to be submitted again
// (not 409).
func TestDurableFloorForgetsASubmitItCouldNotLog(t *testing.T) {
	l, err := openPtLog(filepath.Join(t.TempDir(), "floor.log"), 1<<10)
	require.NoError(t, err)
	l.start(context.Background())() // stopped: every append fails
	p := &passthrough{log: l, ops: map[string]*ptOp{}, byCmd: map[string]*ptOp{}}
	for range 2 {
		w := httptest.NewRecorder()
		p.submit(w, httptest.NewRequest(http.MethodPost, "/v1/operations",
			strings.NewReader(`{"task_id":"t1","step":"restart","target":"device-1","business_version":"v1","action":"restart"}`)))
		require.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), "log: stopped")
		require.Empty(t, p.ops)
		require.Empty(t, p.byCmd)
	}
}

// receiptMessage is a received message with only its payload.
type receiptMessage []byte

var _ mqtt.Message = receiptMessage(nil)

func (m receiptMessage) Duplicate() bool   { return false }
func (m receiptMessage) Qos() byte         { return 1 }
func (m receiptMessage) Retained() bool    { return false }
func (m receiptMessage) Topic() string     { return "" }
func (m receiptMessage) MessageID() uint16 { return 1 }
func (m receiptMessage) Payload() []byte   { return m }
func (m receiptMessage) Ack()              {}
