// Package webhooksig signs the HTTP requests Nudge's webhook worker makes and
// verifies them in the application that receives them. It is in pkg/ so a Go
// application can import it; the scheme is small enough to write in any
// language (docs/operations.md shows it in Node.js).
//
// A receiving application must know that a request comes from Nudge, was not
// altered, and is not an old request played again: the target of a webhook
// is typically an endpoint that deletes things. So every request carries
//
//	Nudge-Signature: t=1786525200,v1=5f0c…[,v1=…]
//	Idempotency-Key: nudge-3b1f…
//	Nudge-Action: certificate-cleanup
//
// where t is the signing time in Unix seconds and each v1 is the hex
// HMAC-SHA256, under one of the tenant's secrets, of
//
//	t + "\n" + METHOD + "\n" + request target + "\n" + Idempotency-Key + "\n" + body
//
// (the request target is the path and query as sent on the request line, for
// example /learners/42/drafts/7?reason=expired). There is one v1 per secret
// the sender holds, so a secret can be rotated without a moment when the
// receiver refuses everything. Verify refuses a request whose t is further
// than the tolerance from its clock (a replay outside the window); within the
// window, the signed Idempotency-Key names the logical request, so a receiver
// that records the keys it has acted on refuses a replay inside it too, and
// an attacker cannot change the key without breaking the signature.
package webhooksig

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names.
const (
	// SignatureHeader carries "t=UNIX,v1=HEX[,v1=HEX…]".
	SignatureHeader = "Nudge-Signature"
	// IdempotencyHeader carries the reminder's idempotency key: the same on
	// every attempt of one reminder, so a receiver can deduplicate.
	IdempotencyHeader = "Idempotency-Key"
	// ActionHeader carries the reminder's template: the action's name. It is
	// informational and not signed; act on the method and target, which are.
	ActionHeader = "Nudge-Action"
)

const (
	// DefaultTolerance is how far a signature's time may be from the
	// verifier's clock when Verify is given zero.
	DefaultTolerance = 5 * time.Minute
	// MaxBodyBytes is the largest body Verify reads. Nudge sends at most
	// 64 KiB (a reminder's data is bounded at intake).
	MaxBodyBytes = 1 << 20
)

// Verify's errors; each is wrapped with detail.
var (
	// ErrNoSignature: the request has no Nudge-Signature header.
	ErrNoSignature = errors.New("webhooksig: no " + SignatureHeader + " header")
	// ErrMalformed: the header is not t=UNIX,v1=HEX[,v1=HEX…].
	ErrMalformed = errors.New("webhooksig: malformed " + SignatureHeader + " header")
	// ErrStale: the signature's time is outside the tolerance (a replay, or a
	// clock far off).
	ErrStale = errors.New("webhooksig: signature time outside the tolerance")
	// ErrMismatch: no v1 matches the request under the secret (forged,
	// altered, or signed with another secret).
	ErrMismatch = errors.New("webhooksig: signature does not match")
	// ErrBodyTooLarge: the body is over MaxBodyBytes.
	ErrBodyTooLarge = errors.New("webhooksig: body too large")
)

// Sign returns the hex v1 signature, under secret, of a request signed at
// unix seconds t.
func Sign(secret []byte, t int64, method, target, idempotencyKey string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "%d\n%s\n%s\n%s\n", t, method, target, idempotencyKey)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// SignRequest sets r's Nudge-Signature header for body (which must be what
// r sends) at now, with one v1 per secret. The Idempotency-Key header must be
// set first: it is signed.
func SignRequest(r *http.Request, body []byte, now time.Time, secrets ...[]byte) {
	t := now.Unix()
	var b strings.Builder
	b.WriteString("t=" + strconv.FormatInt(t, 10))
	for _, s := range secrets {
		b.WriteString(",v1=" + Sign(s, t, r.Method, r.URL.RequestURI(), r.Header.Get(IdempotencyHeader), body))
	}
	r.Header.Set(SignatureHeader, b.String())
}

// Verify checks r's signature under secret at now: its time within tolerance
// of now (zero: DefaultTolerance) and one of its v1 values the MAC of r's
// method, request target, Idempotency-Key and body. It reads the body (at
// most MaxBodyBytes) and puts it back, so the handler can read it after.
func Verify(secret []byte, r *http.Request, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	h := r.Header.Get(SignatureHeader)
	if h == "" {
		return ErrNoSignature
	}
	t, sigs, err := parse(h)
	if err != nil {
		return err
	}
	if d := now.Sub(time.Unix(t, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed at %s, %s from now (tolerance %s)", ErrStale,
			time.Unix(t, 0).UTC().Format(time.RFC3339), d.Round(time.Second), tolerance)
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	target := r.RequestURI // as the request line said it (server side)
	if target == "" {
		target = r.URL.RequestURI()
	}
	want, _ := hex.DecodeString(Sign(secret, t, r.Method, target, r.Header.Get(IdempotencyHeader), body))
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return ErrMismatch
}

// parse reads "t=UNIX,v1=HEX[,v1=HEX…]"; other keys are ignored (later schemes).
func parse(h string) (int64, [][]byte, error) {
	var (
		t     int64
		haveT bool
		sigs  [][]byte
	)
	for part := range strings.SplitSeq(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return 0, nil, fmt.Errorf("%w: %q is not key=value", ErrMalformed, part)
		}
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || haveT {
				return 0, nil, fmt.Errorf("%w: t must be one Unix time in seconds", ErrMalformed)
			}
			t, haveT = n, true
		case "v1":
			s, err := hex.DecodeString(v)
			if err != nil || len(s) != sha256.Size {
				return 0, nil, fmt.Errorf("%w: v1 must be %d hex digits", ErrMalformed, 2*sha256.Size)
			}
			sigs = append(sigs, s)
		}
	}
	if !haveT || len(sigs) == 0 {
		return 0, nil, fmt.Errorf("%w: want t=UNIX,v1=HEX", ErrMalformed)
	}
	return t, sigs, nil
}

func readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	_ = r.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("webhooksig: reading the body: %w", err)
	}
	if len(body) > MaxBodyBytes {
		return nil, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, MaxBodyBytes)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// TenantSecret derives a tenant's secret from one of the webhook worker's
// root secrets: the hex HMAC-SHA256 of "nudge-webhook:TENANT" under root. The
// worker signs a tenant's requests with it, and the tenant's application
// verifies with it (as the text, 64 hex digits: that string is the HMAC
// key). A tenant never learns the root, nor another tenant's secret, so one
// tenant's application cannot forge requests to another's.
func TenantSecret(root []byte, tenant string) []byte {
	m := hmac.New(sha256.New, root)
	m.Write([]byte("nudge-webhook:" + tenant))
	return []byte(hex.EncodeToString(m.Sum(nil)))
}
