package mqttx

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// readBuffer is the size of a broker connection's read buffer: many
// receipts (a few hundred bytes each) per read, and a larger packet read
// straight through.
const readBuffer = 32 << 10

// bufferedConn is a broker connection whose reads go through a buffer.
// paho reads a packet's fixed header a byte at a time (the type, then each
// byte of the remaining length) and then its body: on a bare connection
// that is four read system calls for a receipt, three for a PUBACK. Through
// the buffer one read takes whatever the socket holds. Only paho's reading
// goroutine reads; writes, deadlines and Close go to the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CheckURL refuses a broker URL the client cannot dial: a scheme
// wire.CheckScheme refuses, or no host.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if err := wire.CheckScheme(u.Scheme); err != nil {
		return err
	}
	if u.Host == "" {
		return errors.New("no host:port")
	}
	return nil
}

// openConn dials the broker for paho, as paho's own dialer does for the
// schemes CheckURL takes (TLS with the options' TLS configuration), and
// buffers the connection's reads.
func openConn(uri *url.URL, o mqtt.ClientOptions) (net.Conn, error) {
	d := &net.Dialer{Timeout: o.ConnectTimeout}
	var c net.Conn
	var err error
	switch {
	case wire.PlainScheme(uri.Scheme):
		c, err = d.Dial("tcp", uri.Host)
	case wire.TLSScheme(uri.Scheme):
		c, err = tls.DialWithDialer(d, "tcp", uri.Host, o.TLSConfig)
	default:
		return nil, fmt.Errorf("mqtt: %w", wire.CheckScheme(uri.Scheme))
	}
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, readBuffer)}, nil
}
