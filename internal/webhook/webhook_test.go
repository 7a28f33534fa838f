package webhook

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/pkg/webhooksig"
)

var root = []byte("0123456789abcdef0123456789abcdef")

func TestBlocked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr    string
		blocked bool
	}{
		{"127.0.0.1", true}, {"127.8.9.10", true}, {"::1", true},
		{"10.1.2.3", true}, {"172.16.0.1", true}, {"172.31.255.255", true}, {"192.168.1.1", true},
		{"169.254.169.254", true}, {"fe80::1", true}, {"fc00::1", true}, {"fd12:3456::1", true},
		{"0.0.0.0", true}, {"0.1.2.3", true}, {"::", true}, {"100.64.0.1", true}, {"224.0.0.1", true},
		{"255.255.255.255", true}, {"198.18.0.1", true}, {"ff02::1", true},
		{"::ffff:127.0.0.1", true}, {"::ffff:10.0.0.1", true}, {"64:ff9b::a00:1", true}, {"2002:a00:1::", true},
		{"8.8.8.8", false}, {"172.32.0.1", false}, {"100.128.0.1", false}, {"2606:4700::1111", false},
		{"::ffff:8.8.8.8", false},
	} {
		got := Blocked(netip.MustParseAddr(tc.addr))
		require.Equal(t, tc.blocked, got, "Blocked(%s)", tc.addr)
	}
}

func TestParseTargets(t *testing.T) {
	t.Parallel()
	good := `{"version": "v1", "tenants": {"acme": {"hosts": ["App.Acme.Example", "*.jobs.acme.example", "[::1]", "10.0.0.7"],
		"allow_networks": ["10.0.0.0/8", "127.0.0.1/32"], "allow_http": true}}}`
	tg, err := ParseTargets([]byte(good))
	require.NoError(t, err)
	acme := tg.Tenants["acme"]
	require.Equal(t, []string{"app.acme.example", "*.jobs.acme.example", "::1", "10.0.0.7"}, acme.Hosts)
	require.True(t, acme.AllowHTTP)
	require.True(t, acme.allowsAddr(netip.MustParseAddr("10.2.3.4")))
	require.True(t, acme.allowsAddr(netip.MustParseAddr("::ffff:127.0.0.1")))
	require.False(t, acme.allowsAddr(netip.MustParseAddr("127.0.0.2")))
	require.False(t, acme.allowsAddr(netip.MustParseAddr("192.168.0.1")))
	require.True(t, acme.allowsAddr(netip.MustParseAddr("93.184.215.14")))

	for _, tc := range []struct{ host, want string }{
		{"app.acme.example", "yes"}, {"APP.acme.example.", "yes"}, {"x.jobs.acme.example", "yes"},
		{"a.b.jobs.acme.example", "yes"}, {"jobs.acme.example", "no"}, {"evil-jobs.acme.example", "no"},
		{"app.acme.example.evil.com", "no"}, {"::1", "yes"}, {"10.0.0.7", "yes"}, {"10.0.0.8", "no"},
	} {
		require.Equal(t, tc.want == "yes", acme.allowsHost(tc.host), "allowsHost(%s)", tc.host)
	}

	for _, bad := range []struct{ json, want string }{
		{`{"tenants": {"acme": {"hosts": ["a.example"]}}}`, "version is required"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": []}}}`, "at least one host"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": ["*"]}}}`, "not a host name"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": ["a.*.example"]}}}`, "not a host name"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": ["https://a.example"]}}}`, "not a host name"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": ["a.example:443"]}}}`, "not a host name"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": ["a.example"], "allow_networks": ["10.0.0.0/33"]}}}`, "allow_networks"},
		{`{"version": "v1", "tenants": {"acme": {"hosts": ["a.example"], "allow_network": ["10.0.0.0/8"]}}}`, "unknown field"},
	} {
		_, err := ParseTargets([]byte(bad.json))
		require.ErrorIs(t, err, ErrInvalidTargets, bad.json)
		require.ErrorContains(t, err, bad.want, bad.json)
	}
	empty, err := ParseTargets([]byte(`{}`))
	require.NoError(t, err, "no tenant: every webhook is refused")
	require.Empty(t, empty.Tenants)
}

// app is a receiving application: it verifies every request with the
// tenant's secret and answers what answer says.
type app struct {
	srv    *httptest.Server
	secret []byte
	mu     sync.Mutex
	seen   []seenRequest
	answer func(w http.ResponseWriter, r *http.Request)
}

type seenRequest struct {
	method, target, key, action, contentType, body string
	verified                                       error
}

func newApp(t *testing.T, tenant string, answer func(w http.ResponseWriter, r *http.Request)) *app {
	a := &app{secret: webhooksig.TenantSecret(root, tenant), answer: answer}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		verr := webhooksig.Verify(a.secret, r, time.Now(), time.Minute)
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.seen = append(a.seen, seenRequest{r.Method, r.RequestURI, r.Header.Get(webhooksig.IdempotencyHeader),
			r.Header.Get(webhooksig.ActionHeader), r.Header.Get("Content-Type"), string(body), verr})
		a.mu.Unlock()
		a.answer(w, r)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) requests() []seenRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seenRequest(nil), a.seen...)
}

func status(code int) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
}

// loopbackTargets allows tenant to reach the test server on loopback.
func loopbackTargets(t *testing.T, tenant string) *Targets {
	tg, err := ParseTargets([]byte(`{"version": "test", "tenants": {"` + tenant +
		`": {"hosts": ["127.0.0.1"], "allow_networks": ["127.0.0.0/8"], "allow_http": true}}}`))
	require.NoError(t, err)
	return tg
}

func newSender(t *testing.T, tg *Targets) *Sender {
	s, err := New(Config{Targets: tg, Secrets: [][]byte{root}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func message(url string, data map[string]any) provider.Message {
	return provider.Message{ReminderID: 7, IdempotencyKey: "nudge-abc", Tenant: "acme", Recipient: url,
		Template: "certificate-cleanup", Data: data, Deadline: time.Now().Add(time.Hour)}
}

// Every answer maps onto delivered (performed or already absent), permanent
// or retryable, as docs/operations.md's table says.
func TestSendMapsTheAnswer(t *testing.T) {
	t.Parallel()
	var code int
	var retryAfter string
	var mu sync.Mutex
	a := newApp(t, "acme", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "http://169.254.169.254/latest/meta-data/")
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "answer body")
	})
	s := newSender(t, loopbackTargets(t, "acme"))

	for _, tc := range []struct {
		status     int
		retryAfter string
		result     string // delivered: the provider id
		kind       provider.Kind
		code       string
		wait       time.Duration
	}{
		{status: 200, result: "performed:200"},
		{status: 202, result: "performed:202"},
		{status: 204, result: "performed:204"},
		{status: 404, result: "already_absent:404"},
		{status: 410, result: "already_absent:410"},
		{status: 400, kind: provider.Permanent, code: "http_400"},
		{status: 401, kind: provider.Permanent, code: "http_401"},
		{status: 409, kind: provider.Permanent, code: "http_409"},
		{status: 422, kind: provider.Permanent, code: "http_422"},
		{status: 302, kind: provider.Permanent, code: "http_302"},
		{status: 429, retryAfter: "30", kind: provider.Retryable, code: "http_429", wait: 30 * time.Second},
		{status: 408, kind: provider.Retryable, code: "http_408"},
		{status: 500, kind: provider.Retryable, code: "http_500"},
		{status: 503, retryAfter: "7", kind: provider.Retryable, code: "http_503", wait: 7 * time.Second},
	} {
		mu.Lock()
		code, retryAfter = tc.status, tc.retryAfter
		mu.Unlock()
		id, err := s.Send(context.Background(), message(a.srv.URL+"/learners/42/drafts/7", nil))
		if tc.result != "" {
			require.NoError(t, err, "status %d", tc.status)
			require.Equal(t, tc.result, id, "status %d", tc.status)
			res, st, ok := Result(id)
			require.True(t, ok)
			require.Equal(t, tc.status, st)
			require.Equal(t, map[bool]string{true: ResultAlreadyAbsent, false: ResultPerformed}[tc.status == 404 || tc.status == 410], res)
			continue
		}
		pe := provider.Classify(err)
		require.Equal(t, tc.kind, pe.Kind, "status %d: %v", tc.status, err)
		require.Equal(t, tc.code, pe.Code, "status %d", tc.status)
		require.Equal(t, tc.wait, pe.RetryAfter, "status %d", tc.status)
		require.Contains(t, err.Error(), "answer body")
	}
	require.Len(t, a.requests(), 14, "one request per send: the redirect is not followed")
}

// The request is what the reminder says, signed for its tenant: method,
// target with its query, idempotency key, action, JSON body.
func TestSendBuildsASignedRequest(t *testing.T) {
	t.Parallel()
	a := newApp(t, "acme", status(http.StatusNoContent))
	s := newSender(t, loopbackTargets(t, "acme"))

	_, err := s.Send(context.Background(), message(a.srv.URL+"/learners/42/drafts/7", nil))
	require.NoError(t, err)
	_, err = s.Send(context.Background(), message(a.srv.URL+"/hooks/cleanup?learner=42&why=expired%20draft",
		map[string]any{"method": "POST", "body": map[string]any{"learner": 42, "drafts": []any{7, 8}}}))
	require.NoError(t, err)
	_, err = s.Send(context.Background(), message(a.srv.URL+"/learners/42", map[string]any{"method": "PUT", "body": "archived"}))
	require.NoError(t, err)

	seen := a.requests()
	require.Len(t, seen, 3)
	for _, r := range seen {
		require.NoError(t, r.verified)
		require.Equal(t, "nudge-abc", r.key)
		require.Equal(t, "certificate-cleanup", r.action)
	}
	require.Equal(t, seenRequest{method: "DELETE", target: "/learners/42/drafts/7", key: "nudge-abc", action: "certificate-cleanup"}, seen[0])
	require.Equal(t, "POST", seen[1].method)
	require.Equal(t, "/hooks/cleanup?learner=42&why=expired%20draft", seen[1].target)
	require.Equal(t, "application/json", seen[1].contentType)
	require.JSONEq(t, `{"learner": 42, "drafts": [7, 8]}`, seen[1].body)
	require.Equal(t, "PUT", seen[2].method)
	require.Equal(t, `"archived"`, seen[2].body)

	// Another tenant's secret does not verify these requests.
	other := webhooksig.TenantSecret(root, "globex")
	req := httptest.NewRequest(seen[0].method, seen[0].target, nil)
	req.Header.Set(webhooksig.IdempotencyHeader, "nudge-abc")
	webhooksig.SignRequest(req, nil, time.Now(), other)
	require.ErrorIs(t, webhooksig.Verify(a.secret, req, time.Now(), 0), webhooksig.ErrMismatch)
}

// What the targets file does not allow is never requested: an unknown
// tenant, a host not listed, plain http without allow_http, a loopback or
// private address without allow_networks (whether named by its IP or by a
// name that resolves to it: the check is on the address dialled), and a
// connection another tenant was allowed to open is not reused.
func TestSendRefusesWhatIsNotAllowed(t *testing.T) {
	t.Parallel()
	a := newApp(t, "acme", status(http.StatusNoContent))
	u, err := url.Parse(a.srv.URL)
	require.NoError(t, err)
	port := u.Port()

	tg, err := ParseTargets([]byte(`{"version": "test", "tenants": {
		"acme": {"hosts": ["127.0.0.1"], "allow_networks": ["127.0.0.1/32"], "allow_http": true},
		"nohttp": {"hosts": ["127.0.0.1"], "allow_networks": ["127.0.0.1/32"]},
		"public": {"hosts": ["127.0.0.1", "localhost", "*.internal.example"], "allow_http": true},
		"other": {"hosts": ["127.0.0.2"], "allow_networks": ["127.0.0.1/32"], "allow_http": true}}}`))
	require.NoError(t, err)
	s := newSender(t, tg)

	// acme opens a connection first; public, listing the same host, must not
	// ride on it.
	_, err = s.Send(context.Background(), message(a.srv.URL+"/d/1", nil))
	require.NoError(t, err)

	for _, tc := range []struct {
		tenant, url, code, why string
	}{
		{"globex", a.srv.URL + "/d/1", "target_not_allowed", "has no entry"},
		{"other", a.srv.URL + "/d/1", "target_not_allowed", "not among"},
		{"nohttp", a.srv.URL + "/d/1", "target_not_allowed", "allow_http"},
		{"public", a.srv.URL + "/d/1", "address_not_allowed", "127.0.0.1"},
		{"public", "http://localhost:" + port + "/d/1", "address_not_allowed", "not allowed"},
		{"acme", "ftp://127.0.0.1/d/1", "message", "http or https"},
		{"acme", "http://user:pw@127.0.0.1:" + port + "/d/1", "message", "user info"},
	} {
		msg := message(tc.url, nil)
		msg.Tenant = tc.tenant
		_, err := s.Send(context.Background(), msg)
		pe := provider.Classify(err)
		require.Equal(t, provider.Permanent, pe.Kind, "%s %s: %v", tc.tenant, tc.url, err)
		require.Equal(t, tc.code, pe.Code, "%s %s: %v", tc.tenant, tc.url, err)
		require.ErrorContains(t, err, tc.why)
		require.Equal(t, reminder.OutcomePermanent, pe.Outcome())
	}
	require.Len(t, a.requests(), 1, "only acme's request reached the application")
}

func TestSendRefusesBadData(t *testing.T) {
	t.Parallel()
	a := newApp(t, "acme", status(http.StatusNoContent))
	s := newSender(t, loopbackTargets(t, "acme"))
	for _, data := range []map[string]any{
		{"method": "GET"}, {"method": 1}, {"body": map[string]any{"x": 1}}, {"method": "DELETE", "body": "x"},
	} {
		_, err := s.Send(context.Background(), message(a.srv.URL+"/d/1", data))
		pe := provider.Classify(err)
		require.Equal(t, provider.Permanent, pe.Kind, "%v", data)
		require.Equal(t, "message", pe.Code, "%v", data)
	}
	msg := message(a.srv.URL+"/d/1", nil)
	msg.IdempotencyKey = ""
	_, err := s.Send(context.Background(), msg)
	require.Equal(t, "message", provider.Classify(err).Code)
	require.Empty(t, a.requests())
}

// No answer in time is retryable with the outcome unknown: the application
// may have acted, and the retry carries the same Idempotency-Key.
func TestSendTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	a := newApp(t, "acme", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	s, err := New(Config{Targets: loopbackTargets(t, "acme"), Secrets: [][]byte{root}, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Send(context.Background(), message(a.srv.URL+"/d/1", nil))
	pe := provider.Classify(err)
	require.Equal(t, provider.Retryable, pe.Kind, "%v", err)
	require.Equal(t, "timeout", pe.Code)
	require.Equal(t, reminder.OutcomeUnknown, pe.Outcome())
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	tg := loopbackTargets(t, "acme")
	for _, cfg := range []Config{
		{Secrets: [][]byte{root}},
		{Targets: tg},
		{Targets: tg, Secrets: [][]byte{[]byte("short")}},
		{Targets: tg, Secrets: [][]byte{root}, Timeout: -time.Second},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
}

func TestResult(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		"performed:204": "performed 204", "already_absent:410": "already_absent 410",
		"msg-123": "", "performed": "", "performed:x": "", "gone:404": "",
	} {
		r, st, ok := Result(id)
		got := ""
		if ok {
			got = fmt.Sprintf("%s %d", r, st)
		}
		require.Equal(t, want, got, id)
	}
}
