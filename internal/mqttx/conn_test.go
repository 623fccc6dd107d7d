package mqttx

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

// The client dials through openConn: a scheme paho would take (ws://) is
// refused with openConn's error.
func TestOpenConnRefusesOtherSchemes(t *testing.T) {
	t.Parallel()
	_, err := openConn(&url.URL{Scheme: "ws", Host: "127.0.0.1:1"}, *mqtt.NewClientOptions())
	require.ErrorContains(t, err, `scheme "ws": want tcp://, mqtt://, ssl://, tls://, mqtts:// or tcps://`)

	var out testenv.SyncBuffer
	cl := New(Config{URL: fmt.Sprintf("ws://127.0.0.1:%d", testenv.FreePort(t)), ClientID: "ws",
		Logger: slog.New(slog.NewTextHandler(&out, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	started := make(chan error, 1)
	go func() { started <- cl.Start(ctx) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), `scheme \"ws\": want tcp://, mqtt://`) },
		10*time.Second, 10*time.Millisecond, "the refusal logged")
	cancel()
	require.Error(t, <-started, "never connected")
	cl.Stop()
}

// Messages of every size, many at a time, arrive whole and in order
// through the buffered reads, with a manual PUBACK each: small ones that
// share a read, and one larger than the buffer, read straight through.
func TestMessagesArriveWholeThroughBufferedReads(t *testing.T) {
	t.Parallel()
	b := testenv.StartBroker(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := New(Config{URL: b.URL(), ClientID: "sub", CleanSession: true, Subscriptions: map[string]byte{"t/#": 1}, Logger: log})
	require.NoError(t, sub.Start(ctx))
	t.Cleanup(sub.Stop)
	select {
	case <-sub.Connects():
	case <-ctx.Done():
		t.Fatal("not subscribed")
	}
	pub := New(Config{URL: b.URL(), ClientID: "pub", CleanSession: true, Logger: log})
	require.NoError(t, pub.Start(ctx))
	t.Cleanup(pub.Stop)

	const n = 600
	payload := func(i int) []byte {
		size := 1 + i%300
		if i == n/2 {
			size = 3 * readBuffer / 2
		}
		return bytes.Repeat([]byte{byte('a' + i%26)}, size)
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range n {
			if err := pub.Publish(ctx, fmt.Sprintf("t/%d", i), 1, false, payload(i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := range n {
		m, err := sub.Next(ctx)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, fmt.Sprintf("t/%d", i), m.Topic)
		require.Equal(t, payload(i), m.Payload, "message %d", i)
		m.Ack()
	}
	<-published // its last PUBACK, before the cleanup disconnects
}
