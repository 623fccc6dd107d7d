package tlsgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The certificate chains to the CA for 127.0.0.1 and localhost only, for
// the validity asked, with an ECDSA P-256 key the broker alone can read.
func TestWrite(t *testing.T) {
	t.Parallel()
	f, err := Write(t.TempDir(), time.Hour)
	require.NoError(t, err)
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	caPEM, err := os.ReadFile(f.CA)
	require.NoError(t, err)
	block, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.True(t, ca.IsCA)

	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for host, ok := range map[string]bool{"127.0.0.1": true, "localhost": true, "127.0.0.2": false, "example.com": false} {
		_, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host})
		require.Equal(t, ok, err == nil, "%s: %v", host, err)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1", CurrentTime: time.Now().Add(61 * time.Minute)})
	require.Error(t, err, "expired after the validity")
	other, err := Write(t.TempDir(), time.Hour)
	require.NoError(t, err)
	otherPEM, _ := os.ReadFile(other.CA)
	otherRoots := x509.NewCertPool()
	require.True(t, otherRoots.AppendCertsFromPEM(otherPEM))
	_, err = cert.Verify(x509.VerifyOptions{Roots: otherRoots, DNSName: "127.0.0.1"})
	require.Error(t, err, "another CA does not vouch for it")

	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	require.True(t, ok)
	require.Equal(t, elliptic.P256(), key.Curve)
	st, err := os.Stat(f.Key)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}
