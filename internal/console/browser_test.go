package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/console"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// chromium finds Debian's Chromium; under CI a missing browser fails the
// test (scripts/ensure-services.sh installs it), elsewhere it skips.
func chromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	for _, p := range []string{os.Getenv("NUDGE_CHROMIUM"), "/usr/bin/chromium", "chromium"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed: run scripts/ensure-services.sh (apt-get install chromium)")
	}
	t.Skip("chromium is not installed")
	return ""
}

// panicky panics on one recipient until fixed: the bug that quarantines a reminder.
type panicky struct {
	provider.Sender
	victim string
	fixed  atomic.Bool
}

func (p *panicky) Send(ctx context.Context, m provider.Message) (string, error) {
	if !p.fixed.Load() && m.Recipient == p.victim {
		panic("runtime error: index out of range [2] with length 2")
	}
	return p.Sender.Send(ctx, m)
}

// TestConsoleInABrowser drives the console in headless Chromium against a
// running fleet (dispatcher and SMS worker): it signs in, loads every page,
// finds a reminder by its key, and replays its dead letter through the
// confirmation dialog; the row, the event and the audit row name the
// operator. With NUDGE_UPDATE_SCREENSHOTS=1 it writes docs/console-*.png.
func TestConsoleInABrowser(t *testing.T) {
	exe := chromium(t)
	db, mq := testenv.Postgres(t), testenv.RabbitMQ(t)
	ctx := context.Background()
	keys := opstest.Keys(t)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	st := store.New(db.Pool)

	// The fleet: intent, a dispatcher run, an SMS worker with the bug.
	now := time.Now()
	const victim = "+14155550142"
	var reqs []intake.Request
	for i := range 12 {
		r := intake.Request{Tenant: "acme", Key: fmt.Sprintf("welcome-%d", i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415555%04d", i), Template: "subscription-renewal", DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour)}
		if i == 11 {
			r.Key, r.Recipient = "renewal-42", victim
		}
		reqs = append(reqs, r)
	}
	out, err := intake.ScheduleMany(ctx, db.Pool, reqs)
	require.NoError(t, err)
	victimID := out[11].ID
	d := &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{Store: st, Publisher: broker.NewPublisher(mq.URL, mq.Topology, "dispatcher"),
		Keys: keys, Topology: mq.Topology, Clock: clock.Real{}, Actor: "dispatcher"}, Config: dispatch.Config{Batch: 100}, Log: log}
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	smsSrv := fakesms.New()
	hs := httptest.NewServer(smsSrv)
	t.Cleanup(hs.Close)
	client, err := sms.New(sms.Config{URL: hs.URL})
	require.NoError(t, err)
	adapter := &panicky{Sender: client, victim: victim}
	w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: "sms-browser"}, worker.Deps{AMQPURL: mq.URL,
		Topology: mq.Topology, Store: st, Sender: adapter, Keys: keys, Clock: clock.Real{}, Log: log})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(runCtx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	require.Eventually(t, func() bool {
		depths, err := ops.DLQDepths(mq.URL, mq.Topology)
		s, _, _ := opstest.State(t, db.Pool, victimID)
		var delivered int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE state = 'delivered'`).Scan(&delivered)
		return err == nil && depths["sms"] == 1 && s == reminder.Quarantined && delivered == 11
	}, 30*time.Second, 100*time.Millisecond, "the others are delivered, the bug quarantines renewal-42")
	adapter.fixed.Store(true)

	// The console.
	srv, err := console.New(console.Config{Token: token}, console.Deps{DB: db.Pool,
		DLQ: ops.DLQ{URL: mq.URL, Topology: mq.Topology, Keys: keys, Wait: 5 * time.Second}, Log: log})
	require.NoError(t, err)
	web := httptest.NewServer(srv)
	t.Cleanup(web.Close)

	// Without the token, nothing; without the CSRF token, no action.
	resp, err := http.Get(web.URL + "/reminders/" + itoa(victimID) + "?x")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "/login", resp.Request.URL.Path, "a request without the token is sent to sign in")
	req, _ := http.NewRequest(http.MethodPost, web.URL+"/act", strings.NewReader("action=dlq-replay&channel=sms&reminder="+itoa(victimID)+"&reason=x&attempts=reset"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("mallory", token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "an action without the CSRF token is refused")

	// The browser.
	bctx, do, text := newBrowser(t, ctx, exe)
	do("sign in and load the overview",
		chromedp.Navigate(web.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("login")),
		chromedp.SendKeys(chromedp.ID("name"), "alice"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("q-workers")))
	live := text("live")
	require.Contains(t, live, "Is intent still being written?")
	require.Contains(t, live, "11 terminal in the last hour")
	screenshot(t, bctx, "console-overview.png")

	do("find the reminder by its key",
		chromedp.Navigate(web.URL+"/reminders"),
		chromedp.SendKeys(chromedp.ID("f-key"), "renewal-42"),
		chromedp.Click(chromedp.ID("f-search")),
		chromedp.WaitVisible(chromedp.CSS(`#count[data-searched="true"]`))) // the new page, not the one searched from
	require.Equal(t, "1 shown of 1 selected", strings.TrimSpace(text("count")))
	do("open its timeline",
		chromedp.Click(chromedp.CSS(`#results a[href="/reminders/`+itoa(victimID)+`"]`)),
		chromedp.WaitVisible(chromedp.ID("timeline")))
	timeline := text("timeline")
	require.Contains(t, timeline, "quarantined")
	require.Contains(t, timeline, "send_panicked")
	screenshot(t, bctx, "console-reminder.png")

	do("read the dead letters",
		chromedp.Navigate(web.URL+"/dead-letters?channel=sms"),
		chromedp.WaitVisible(chromedp.ID("dead-letters")))
	require.Contains(t, text("dead-letters"), "panicked")
	do("open the confirmation dialog",
		chromedp.Click(chromedp.CSS(`#dead-letters a[href*="action=dlq-replay"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "1", text("dry-count"), "the dry run's count")
	do("give the reason and confirm",
		chromedp.SendKeys(chromedp.ID("reason"), "adapter fix 1.4.2 deployed"),
		chromedp.Click(chromedp.ID("confirm-button")),
		chromedp.WaitVisible(chromedp.ID("done-count")))
	require.Contains(t, text("done-count"), "1 of 1 selected changed")

	s, _, _ := opstest.State(t, db.Pool, victimID)
	require.Equal(t, reminder.Pending, s, "back to pending for the dispatcher")
	ev := opstest.LastEvent(t, db.Pool, victimID)
	require.Equal(t, "console:alice", ev.Actor)
	require.Contains(t, ev.Reason, "adapter fix 1.4.2 deployed")
	var action, actor string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT action, actor FROM operator_audit WHERE reminder_id = $1`, victimID).Scan(&action, &actor))
	require.Equal(t, []string{"dlq.replay", "console:alice"}, []string{action, actor})
	require.Eventually(t, func() bool {
		depths, err := ops.DLQDepths(mq.URL, mq.Topology)
		return err == nil && depths["sms"] == 0
	}, 10*time.Second, 100*time.Millisecond, "the dead letter was acknowledged")
}

// newBrowser starts headless Chromium for the test, and returns its
// context, a runner of steps and a reader of an element's text by ID.
func newBrowser(t *testing.T, ctx context.Context, exe string) (context.Context, func(string, ...chromedp.Action[chromedp.Void]), func(string) string) {
	t.Helper()
	// DefaultExecAllocatorOptions: headless, no first run, no background
	// networking, no sync; and Debian's flags for a container.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	bctx, cancelTimeout := context.WithTimeout(bctx, 90*time.Second)
	t.Cleanup(cancelTimeout)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID(sel)))
		require.NoError(t, err, "reading #%s", sel)
		return s
	}
	return bctx, do, text
}

// screenshot writes the page to docs/NAME when NUDGE_UPDATE_SCREENSHOTS=1.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NotEmpty(t, png)
	if os.Getenv("NUDGE_UPDATE_SCREENSHOTS") != "1" {
		return
	}
	path := filepath.Join("..", "..", "docs", name)
	if len(png) > 1<<20 {
		t.Fatalf("%s: %d bytes, over 1 MiB", name, len(png))
	}
	if err := os.WriteFile(path, png, 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}
