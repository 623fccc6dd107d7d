package wire

import "fmt"

// The broker URL schemes devices and controllers dial: PlainScheme's over
// TCP, TLSScheme's over TLS (paho's names for both). CheckScheme refuses
// any other, naming them all.

// PlainScheme reports whether a broker URL's scheme is plain TCP: tcp://
// or mqtt://.
func PlainScheme(s string) bool { return s == "tcp" || s == "mqtt" }

// TLSScheme reports whether a broker URL's scheme is TLS: ssl://, tls://,
// mqtts:// or tcps://.
func TLSScheme(s string) bool { return s == "ssl" || s == "tls" || s == "mqtts" || s == "tcps" }

// CheckScheme refuses a broker URL scheme neither PlainScheme nor TLSScheme.
func CheckScheme(s string) error {
	if PlainScheme(s) || TLSScheme(s) {
		return nil
	}
	return fmt.Errorf("scheme %q: want tcp://, mqtt://, ssl://, tls://, mqtts:// or tcps://", s)
}
