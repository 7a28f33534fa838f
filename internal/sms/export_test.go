package sms

import "crypto/x509"

// TrustOnly has c's direct client verify the provider against roots alone
// (a test's own CA), as SSL_CERT_FILE would in a process.
func TrustOnly(c *Client, roots *x509.CertPool) { c.direct.tls.RootCAs = roots }

// Direct reports whether c sends through the direct client.
func Direct(c *Client) bool { return c.direct != nil }

// TwilioTrustOnly is TrustOnly for a TwilioClient.
func TwilioTrustOnly(c *TwilioClient, roots *x509.CertPool) { c.direct.tls.RootCAs = roots }

// TwilioDirect reports whether c sends through the direct client.
func TwilioDirect(c *TwilioClient) bool { return c.direct != nil }
