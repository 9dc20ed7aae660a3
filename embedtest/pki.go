package embedtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/holdfast/holdfast/embedtest/internal/testserver"
)

// PKI is a certificate authority generated for a test, with a server
// certificate for 127.0.0.1 and localhost and a client certificate, all in
// PEM files under Dir (keys are unencrypted, mode 0600). Two PKIs made
// separately do not trust each other: one serves as the "unknown CA" of the
// other.
type PKI struct {
	// Dir holds the files.
	Dir string
	// CAFile is the CA certificate.
	CAFile string
	// CertFile and KeyFile are the server certificate (for 127.0.0.1, ::1
	// and localhost, usable for client authentication too) and its key.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate (common
	// name "holdfast-client") and its key.
	ClientCertFile, ClientKeyFile string

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewPKI generates a CA, a server and a client certificate (ECDSA P-256,
// valid from an hour ago for a day) and writes them into dir.
func NewPKI(dir string) (*PKI, error) {
	p := &PKI{Dir: dir}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "holdfast test CA " + testserver.RandomHex(4)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("embedtest: CA certificate: %w", err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	p.caKey = caKey
	p.CAFile = filepath.Join(dir, "ca.pem")
	if err := writePEM(p.CAFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if p.CertFile, p.KeyFile, err = p.Issue("server", "127.0.0.1", true); err != nil {
		return nil, err
	}
	if p.ClientCertFile, p.ClientKeyFile, err = p.Issue("client", "holdfast-client", false); err != nil {
		return nil, err
	}
	return p, nil
}

// TestPKI is NewPKI in t.TempDir(); an error calls t.Fatal.
func TestPKI(t testing.TB) *PKI {
	t.Helper()
	p, err := NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue signs a new certificate with common name cn into <name>.pem and
// <name>-key.pem under Dir and returns their paths. A server certificate
// names 127.0.0.1, ::1 and localhost; every certificate may authenticate
// clients.
func (p *PKI) Issue(name, cn string, server bool) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("embedtest: %s certificate: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile = filepath.Join(p.Dir, name+".pem")
	keyFile = filepath.Join(p.Dir, name+"-key.pem")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	if err := writePEM(keyFile, "PRIVATE KEY", kder); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// CAPool returns a pool holding the CA certificate.
func (p *PKI) CAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return pool
}

// ClientTLS returns a client TLS configuration that trusts the CA and, with
// withCert, presents the client certificate.
func (p *PKI) ClientTLS(withCert bool) (*tls.Config, error) {
	cfg := &tls.Config{RootCAs: p.CAPool(), MinVersion: tls.VersionTLS12}
	if withCert {
		pair, err := tls.LoadX509KeyPair(p.ClientCertFile, p.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("embedtest: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("embedtest: %w", err)
	}
	return nil
}
