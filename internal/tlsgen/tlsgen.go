// Package tlsgen makes a throwaway certificate authority and a broker
// certificate signed by it, for the secure profile's TLS listener in tests
// and in `make demo`: ECDSA P-256 keys, the server certificate valid for IP
// 127.0.0.1 (and the name localhost) only, for a short time. Nothing here is
// meant for a real deployment, whose certificates come from its own PKI.
package tlsgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files names the PEM files Write made.
type Files struct {
	CA   string // the CA certificate: what clients trust (--mqtt-ca)
	Cert string // the broker's certificate (certfile)
	Key  string // the broker's private key (keyfile), mode 0600
}

// defaultValidity is how long the certificates Write makes are valid when
// it is given no validity.
const defaultValidity = 24 * time.Hour

// Write makes a new CA and a broker certificate for 127.0.0.1 in dir
// (ca.pem, server.pem, server-key.pem), valid from a minute ago for
// validity (24 hours when 0).
func Write(dir string, validity time.Duration) (Files, error) {
	if validity <= 0 {
		validity = defaultValidity
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "fleetctl throwaway CA " + now.UTC().Format(time.RFC3339Nano)},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return Files{}, fmt.Errorf("server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem")}
	for _, w := range []struct {
		file, kind string
		der        []byte
		mode       os.FileMode
	}{
		{f.CA, "CERTIFICATE", caDER, 0o644},
		{f.Cert, "CERTIFICATE", der, 0o644},
		{f.Key, "EC PRIVATE KEY", keyDER, 0o600},
	} {
		if err := os.WriteFile(w.file, pem.EncodeToMemory(&pem.Block{Type: w.kind, Bytes: w.der}), w.mode); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
