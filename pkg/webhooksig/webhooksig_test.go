package webhooksig_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/webhooksig"
)

var (
	root   = []byte("0123456789abcdef0123456789abcdef")
	secret = webhooksig.TenantSecret(root, "acme")
	t0     = time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)
)

// captured is what a receiving server saw: each request as it arrived.
type captured struct {
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

// server records every request and answers 204 once the signature under
// secret verifies at now, 401 otherwise; the handler reads the body after
// Verify, as an application would.
func server(t *testing.T, now func() time.Time) (*httptest.Server, *captured) {
	c := &captured{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := webhooksig.Verify(secret, r, now(), time.Minute)
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.reqs, c.body = append(c.reqs, r), append(c.body, body)
		c.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, c
}

func signed(t *testing.T, method, url, key string, body []byte, at time.Time, secrets ...[]byte) *http.Request {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(webhooksig.IdempotencyHeader, key)
	webhooksig.SignRequest(req, body, at, secrets...)
	return req
}

func send(t *testing.T, req *http.Request) (int, string) {
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// Over a real connection: a signed request verifies, and its body is still
// there for the handler; a signed request with a query verifies too.
func TestVerifyAcceptsWhatWasSigned(t *testing.T) {
	t.Parallel()
	srv, c := server(t, func() time.Time { return t0.Add(30 * time.Second) })

	code, msg := send(t, signed(t, http.MethodDelete, srv.URL+"/learners/42/drafts/7", "nudge-k1", nil, t0, secret))
	require.Equal(t, http.StatusNoContent, code, msg)
	body := []byte(`{"learner":42}`)
	code, msg = send(t, signed(t, http.MethodPost, srv.URL+"/hooks/cleanup?learner=42&reason=expired%20draft", "nudge-k2", body, t0, secret))
	require.Equal(t, http.StatusNoContent, code, msg)
	require.Equal(t, body, c.body[1], "Verify puts the body back for the handler")
}

// Forged requests are refused: a signature under another secret (another
// tenant's), or a signed request with its method, target, idempotency key or
// body changed, or no signature, or a malformed one.
func TestVerifyRefusesForgeries(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func() time.Time { return t0 })
	url := srv.URL + "/learners/42/drafts/7"
	body := []byte(`{"learner":42}`)
	good := func() *http.Request { return signed(t, http.MethodPost, url, "nudge-k1", body, t0, secret) }

	cases := []struct {
		name string
		req  func() *http.Request
		want string
	}{
		{"another tenant's secret", func() *http.Request {
			return signed(t, http.MethodPost, url, "nudge-k1", body, t0, webhooksig.TenantSecret(root, "globex"))
		}, "does not match"},
		{"the root secret", func() *http.Request { return signed(t, http.MethodPost, url, "nudge-k1", body, t0, root) }, "does not match"},
		{"method changed", func() *http.Request {
			r := good()
			r.Method = http.MethodPut
			return r
		}, "does not match"},
		{"target changed", func() *http.Request {
			r := good()
			r.URL.Path = "/learners/43/drafts/7"
			return r
		}, "does not match"},
		{"query added", func() *http.Request {
			r := good()
			r.URL.RawQuery = "all=true"
			return r
		}, "does not match"},
		{"idempotency key changed", func() *http.Request {
			r := good()
			r.Header.Set(webhooksig.IdempotencyHeader, "nudge-k9")
			return r
		}, "does not match"},
		{"body changed", func() *http.Request {
			r := good()
			other := []byte(`{"learner":43}`)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(other)), int64(len(other))
			return r
		}, "does not match"},
		{"signature bit flipped", func() *http.Request {
			r := good()
			h := r.Header.Get(webhooksig.SignatureHeader)
			last := h[len(h)-1]
			flip := map[byte]byte{'0': '1'}[last]
			if flip == 0 {
				flip = '0'
			}
			r.Header.Set(webhooksig.SignatureHeader, h[:len(h)-1]+string(flip))
			return r
		}, "does not match"},
		{"no signature", func() *http.Request {
			r := good()
			r.Header.Del(webhooksig.SignatureHeader)
			return r
		}, "no Nudge-Signature"},
		{"no v1", func() *http.Request {
			r := good()
			r.Header.Set(webhooksig.SignatureHeader, "t=1786525200")
			return r
		}, "malformed"},
		{"short v1", func() *http.Request {
			r := good()
			r.Header.Set(webhooksig.SignatureHeader, "t=1786525200,v1=abcd")
			return r
		}, "malformed"},
		{"two times", func() *http.Request {
			r := good()
			r.Header.Set(webhooksig.SignatureHeader, "t=1,"+r.Header.Get(webhooksig.SignatureHeader))
			return r
		}, "malformed"},
	}
	for _, tc := range cases {
		code, msg := send(t, tc.req())
		require.Equal(t, http.StatusUnauthorized, code, tc.name)
		require.Contains(t, msg, tc.want, tc.name)
	}
}

// A request captured and played again, byte for byte, is refused once its
// signature is older than the tolerance; one signed by a clock far ahead is
// refused as well.
func TestVerifyRefusesReplays(t *testing.T) {
	t.Parallel()
	now := t0
	srv, c := server(t, func() time.Time { return now })
	url := srv.URL + "/learners/42/drafts/7"

	code, msg := send(t, signed(t, http.MethodDelete, url, "nudge-k1", nil, t0, secret))
	require.Equal(t, http.StatusNoContent, code, msg)

	// Replay what the server saw, headers and all, 61 seconds later.
	seen := c.reqs[0]
	now = t0.Add(61 * time.Second)
	replay, err := http.NewRequest(seen.Method, url, nil)
	require.NoError(t, err)
	replay.Header = seen.Header.Clone()
	code, msg = send(t, replay)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, msg, "outside the tolerance")

	// Within the window the same replay verifies: the receiver deduplicates
	// it on the signed Idempotency-Key (package doc).
	now = t0.Add(59 * time.Second)
	code, _ = send(t, replay)
	require.Equal(t, http.StatusNoContent, code)

	code, msg = send(t, signed(t, http.MethodDelete, url, "nudge-k1", nil, t0.Add(2*time.Minute), secret))
	require.Equal(t, http.StatusUnauthorized, code, "signed in the future")
	require.Contains(t, msg, "outside the tolerance")
}

// During a rotation the sender signs with the old and the new secret, and a
// receiver holding either verifies.
func TestRotationSignsWithEverySecret(t *testing.T) {
	t.Parallel()
	newRoot := []byte("fedcba9876543210fedcba9876543210")
	oldS, newS := webhooksig.TenantSecret(root, "acme"), webhooksig.TenantSecret(newRoot, "acme")
	req := signed(t, http.MethodDelete, "https://app.internal/drafts/7", "nudge-k1", nil, t0, oldS, newS)
	require.Equal(t, 2, strings.Count(req.Header.Get(webhooksig.SignatureHeader), "v1="))
	for _, s := range [][]byte{oldS, newS} {
		require.NoError(t, webhooksig.Verify(s, req, t0, 0))
	}
	require.ErrorIs(t, webhooksig.Verify(webhooksig.TenantSecret(root, "globex"), req, t0, 0), webhooksig.ErrMismatch)
}

func TestVerifyBoundsTheBody(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte("x"), webhooksig.MaxBodyBytes+1)
	req := signed(t, http.MethodPost, "https://app.internal/hooks", "nudge-k1", body, t0, secret)
	require.ErrorIs(t, webhooksig.Verify(secret, req, t0, 0), webhooksig.ErrBodyTooLarge)
}

// The secret is derived per tenant, is hex text, and is stable.
func TestTenantSecret(t *testing.T) {
	t.Parallel()
	a := webhooksig.TenantSecret(root, "acme")
	require.Regexp(t, `^[0-9a-f]{64}$`, string(a))
	require.Equal(t, a, webhooksig.TenantSecret(root, "acme"))
	require.NotEqual(t, a, webhooksig.TenantSecret(root, "acme2"))
}
