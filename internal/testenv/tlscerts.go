package testenv

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

// CA is a certificate authority a TLS test makes for itself, so that it can
// prove a client verifies (its own CA accepted, another refused) without
// any certificate of the machine's.
type CA struct {
	// File is the CA certificate in PEM, for sslrootcert=, cacertfile=, ca=.
	File string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	name string
}

// NewCA creates a CA named name and writes its certificate to dir/name.pem.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{File: filepath.Join(dir, name+".pem"), cert: cert, key: key, dir: dir, name: name}
	return ca, writePEM(ca.File, "CERTIFICATE", der, 0o644)
}

// Server issues a certificate for this machine's loopback (127.0.0.1, ::1
// and localhost) and returns the certificate and key files.
func (ca *CA) Server(name string) (certFile, keyFile string, err error) {
	return ca.issue(name, func(c *x509.Certificate) {
		c.Subject.CommonName = "localhost"
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
}

// Client issues a client certificate whose common name is user (the login
// for PostgreSQL's cert authentication and RabbitMQ's EXTERNAL mechanism).
func (ca *CA) Client(name, user string) (certFile, keyFile string, err error) {
	return ca.issue(name, func(c *x509.Certificate) {
		c.Subject.CommonName = user
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
}

func (ca *CA) issue(name string, shape func(*x509.Certificate)) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	shape(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return "", "", err
	}
	// 0600: PostgreSQL and libpq-compatible clients refuse a key others can read.
	return certFile, keyFile, writePEM(keyFile, "PRIVATE KEY", keyDER, 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// FreePorts returns n distinct TCP ports that were free on 127.0.0.1, for
// servers a test starts itself.
func FreePorts(n int) ([]int, error) { return freePorts(n) }
