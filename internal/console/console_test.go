package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/console"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

const token = "console-test-token-0123456789"

type bundle struct {
	db  *testenv.DB
	srv *httptest.Server
}

func setup(t *testing.T, cfg console.Config, dlq ops.DLQ) *bundle {
	t.Helper()
	b := &bundle{db: testenv.Postgres(t)}
	cfg.Token = token
	s, err := console.New(cfg, console.Deps{DB: b.db.Pool, DLQ: dlq, Log: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	b.srv = httptest.NewServer(s)
	t.Cleanup(b.srv.Close)
	return b
}

// client signs in through the form as name and keeps the session cookie.
func (b *bundle) client(t *testing.T, name string) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(b.srv.URL+"/login", url.Values{"name": {name}, "token": {token}, "next": {"/reminders"}})
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, "/reminders", resp.Request.URL.Path, "the login redirects to next")
	return c
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{}, ops.DLQ{})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	resp, err := noRedirect.Get(b.srv.URL + "/reminders")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "a browser without the token goes to the login form")
	require.True(t, strings.HasPrefix(resp.Header.Get("Location"), "/login?next="))

	for name, set := range map[string]func(*http.Request){
		"wrong bearer": func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope-nope-nope-nope") },
		"wrong basic":  func(r *http.Request) { r.SetBasicAuth("alice", "nope") },
		"forged cookie": func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: "nudge_console", Value: "YWxpY2U.9999999999.00"})
		},
	} {
		req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/act", strings.NewReader("action=cancel&id=1"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		set(req)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, name)
	}

	for name, set := range map[string]func(*http.Request){
		"bearer": func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) },
		"basic":  func(r *http.Request) { r.SetBasicAuth("alice", token) },
	} {
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/reminders", nil)
		set(req)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, name)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	}

	resp, err = http.PostForm(b.srv.URL+"/login", url.Values{"name": {"alice"}, "token": {"wrong"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestTrustedUserHeaderNamesTheOperatorButDoesNotReplaceTheToken(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{TrustedUserHeader: "X-Forwarded-User"}, ops.DLQ{})
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/reminders", nil)
	req.Header.Set("X-Forwarded-User", "alice@example.com")
	req.Header.Set("Authorization", "Bearer wrong-token-wrong-token")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "alice@example.com")

	req.Header.Del("X-Forwarded-User")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no header: the proxy was bypassed")
}

func TestActionsNeedTheCSRFTokenAndAReason(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{}, ops.DLQ{})
	id := opstest.Insert(t, b.db.Pool, opstest.Row{Key: "renewal-7"})
	c := b.client(t, "alice")

	code, body := get(t, c, b.srv.URL+"/confirm?action=cancel&id="+itoa(id))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="dry-count">1<`)
	csrf := csrfRE.FindStringSubmatch(body)[1]

	form := url.Values{"action": {"cancel"}, "id": {itoa(id)}, "reason": {"learner left"}}
	resp, err := c.PostForm(b.srv.URL+"/act", form)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token")
	wrong := "0" + csrf[1:] // another first character than the token's
	if csrf[0] == '0' {
		wrong = "1" + csrf[1:]
	}
	form.Set("csrf", wrong)
	resp, err = c.PostForm(b.srv.URL+"/act", form)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a wrong CSRF token")
	st, _, _ := opstest.State(t, b.db.Pool, id)
	require.Equal(t, reminder.Pending, st, "nothing changed")

	form.Set("csrf", csrf)
	form.Set("reason", " ")
	resp, err = c.PostForm(b.srv.URL+"/act", form)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "no reason")

	form.Set("reason", "learner left")
	resp, err = c.PostForm(b.srv.URL+"/act", form)
	require.NoError(t, err)
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	require.Contains(t, string(out), "console:alice", string(out))
	st, _, _ = opstest.State(t, b.db.Pool, id)
	require.Equal(t, reminder.Canceled, st, string(out))
	var actor, action string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT actor, action FROM operator_audit WHERE reminder_id = $1`, id).Scan(&actor, &action))
	require.Equal(t, []string{"console:alice", "bulk.cancel"}, []string{actor, action})
}

func TestReadOnlyRefusesActionsAndRecipientsAreMasked(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{ReadOnly: true}, ops.DLQ{})
	id := opstest.Insert(t, b.db.Pool, opstest.Row{Key: "renewal-8"})
	c := b.client(t, "bob")
	code, body := get(t, c, b.srv.URL+"/reminders/"+itoa(id))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "l***r@example.com")
	require.NotContains(t, body, "learner@example.com")
	require.NotContains(t, body, "/confirm?", "no action buttons")
	code, _ = get(t, c, b.srv.URL+"/confirm?action=cancel&id="+itoa(id))
	require.Equal(t, http.StatusForbidden, code)

	shown := setup(t, console.Config{ShowRecipients: true}, ops.DLQ{})
	id = opstest.Insert(t, shown.db.Pool, opstest.Row{Key: "renewal-9"})
	_, body = get(t, shown.client(t, "carol"), shown.srv.URL+"/reminders?key=renewal-9")
	require.Contains(t, body, "learner@example.com")
	require.Contains(t, body, "/reminders/"+itoa(id))
}

func TestPagesRender(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	b := setup(t, console.Config{}, ops.DLQ{URL: mq.URL, Topology: mq.Topology, Keys: opstest.Keys(t), Wait: 5 * time.Second})
	id := opstest.Insert(t, b.db.Pool, opstest.Row{Key: "q-1", State: reminder.Quarantined, Fence: 3, Channel: reminder.SMS})
	opstest.Publish(t, mq.URL, mq.Topology, opstest.Keys(t), opstest.DeadLetter{Channel: reminder.SMS, ReminderID: id, Fence: 2,
		Tenant: "acme", Deadline: time.Now().Add(24 * time.Hour), Reason: "send panicked: index out of range", ReceiveCount: 6})
	c := b.client(t, "alice")
	for path, want := range map[string]string{
		"/":                            "Is the dispatcher advancing its cutoff?",
		"/reminders?state=quarantined": "q-1",
		"/reminders/" + itoa(id):       "Timeline",
		"/dead-letters?channel=sms":    "send panicked: index out of range",
		"/confirm?action=dlq-replay&channel=sms&reminder=" + itoa(id): `id="dry-count">1<`,
		"/static/console.js": "showModal",
	} {
		code, body := get(t, c, b.srv.URL+path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		require.Contains(t, body, want, path)
	}
	require.Len(t, opstest.QueueIDs(t, mq.URL, mq.Topology, reminder.SMS), 1, "reading the queue left the message there")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
