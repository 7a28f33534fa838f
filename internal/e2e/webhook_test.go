package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/webhook"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/pkg/webhooksig"
)

// cleanupApp is the application that receives the cleanups: it holds
// drafts, verifies every request's signature, and deletes a draft when asked
// (204), answering 404 (or 410 for every other one) when it is already gone.
// Some drafts answer 503 to their first request, before acting, so that
// retries are part of the run.
type cleanupApp struct {
	secret []byte
	mu     sync.Mutex
	drafts map[string]bool // path → exists
	flaky  map[string]bool // path → answers 503 once
	// per idempotency key: requests seen, deletions performed
	requests, deletions map[string]int
	refused             int
	sample              *http.Request // one request as received, for the replay
	sampleBody          []byte
}

func (a *cleanupApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := webhooksig.Verify(a.secret, r, time.Now(), time.Minute); err != nil {
		a.mu.Lock()
		a.refused++
		a.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get(webhooksig.IdempotencyHeader)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests[key]++
	if a.sample == nil {
		a.sample, a.sampleBody = r.Clone(context.Background()), body
	}
	switch {
	case r.Method != http.MethodDelete:
		w.WriteHeader(http.StatusMethodNotAllowed)
	case a.flaky[r.URL.Path]:
		delete(a.flaky, r.URL.Path)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
	case a.drafts[r.URL.Path]:
		delete(a.drafts, r.URL.Path)
		a.deletions[key]++
		w.WriteHeader(http.StatusNoContent)
	case len(r.URL.Path)%2 == 0:
		w.WriteHeader(http.StatusGone)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// TestWebhookCleanupEndToEnd (issue 16): 1,000 cleanup reminders against a
// small application whose targets are 10% already deleted, worked by two
// webhook workers through the whole pipeline. Every reminder ends delivered,
// recorded as performed or already absent according to what the application
// held; the application saw each reminder's request at most once per attempt
// recorded and performed each deletion once; and its verifier refuses a
// forged request and a replayed one.
func TestWebhookCleanupEndToEnd(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ctx := context.Background()
	now := time.Now()

	const (
		tenant = "edu"
		total  = 1000
	)
	root := []byte("webhook-e2e-root-0123456789abcdef")
	app := &cleanupApp{secret: webhooksig.TenantSecret(root, tenant), drafts: map[string]bool{}, flaky: map[string]bool{},
		requests: map[string]int{}, deletions: map[string]int{}}
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)

	// The test tenant may reach the application on loopback, over plain
	// http: both explicitly allowed in its entry.
	targets, err := webhook.ParseTargets([]byte(`{"version": "e2e", "tenants": {"` + tenant +
		`": {"hosts": ["127.0.0.1"], "allow_networks": ["127.0.0.1/32"], "allow_http": true}}}`))
	require.NoError(t, err)
	sender, err := webhook.New(webhook.Config{Targets: targets, Secrets: [][]byte{root}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(sender.Close)
	f.webhook = sender

	absent := map[string]bool{} // key → target already deleted
	var reqs []intake.Request
	for i := range total {
		path := fmt.Sprintf("/learners/%d/drafts/%d", i/3, i)
		key := fmt.Sprintf("draft-cleanup:%d", i)
		if i%10 == 4 {
			absent[key] = true
		} else {
			app.drafts[path] = true
		}
		if i%20 == 7 {
			app.flaky[path] = true
		}
		reqs = append(reqs, intake.Request{Tenant: tenant, Key: key, Channel: reminder.Webhook,
			Recipient: srv.URL + path, Template: "draft-cleanup", DueAt: now.Add(-time.Minute), Deadline: now.Add(time.Hour)})
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		f.startWorker(t, runCtx, reminder.Webhook, fmt.Sprint("webhook-", i), &wg)
	}
	d := f.dispatcher("dispatcher")
	wg.Go(func() { _ = d.Loop(runCtx, 500*time.Millisecond) })
	rec := &reconcile.Reconciler{Enqueuer: f.enqueuer("reconciler"), Config: reconcile.Config{Overdue: 30 * time.Second}, Log: f.log}
	wg.Go(func() { _ = rec.Loop(runCtx, time.Second) })
	f.waitTerminal(t, 2*time.Minute)
	stop()
	wg.Wait()

	// Every reminder delivered; the last attempt records performed or
	// already absent, as the application held the target or not.
	rows, err := f.db.Pool.Query(ctx, `
		SELECT r.key, s.state, r.idempotency_key, count(a.id),
		       (array_agg(a.provider_message_id ORDER BY a.id DESC))[1]
		  FROM reminders r JOIN reminder_state s ON s.id = r.id LEFT JOIN delivery_attempts a ON a.reminder_id = r.id
		 GROUP BY r.id, s.state`)
	require.NoError(t, err)
	results := map[string]int{}
	n, retried := 0, 0
	for rows.Next() {
		var (
			key, idem  string
			state      reminder.State
			attempts   int
			providerID *string
		)
		require.NoError(t, rows.Scan(&key, &state, &idem, &attempts, &providerID))
		n++
		require.Equal(t, reminder.Delivered, state, key)
		require.NotNil(t, providerID, key)
		result, status, ok := webhook.Result(*providerID)
		require.True(t, ok, "%s: provider id %q", key, *providerID)
		results[result]++
		if absent[key] {
			require.Equal(t, webhook.ResultAlreadyAbsent, result, key)
			require.Contains(t, []int{404, 410}, status, key)
			require.Zero(t, app.deletions[idem], key)
		} else {
			require.Equal(t, webhook.ResultPerformed, result, key)
			require.Equal(t, 204, status, key)
			require.Equal(t, 1, app.deletions[idem], "%s: deleted once", key)
		}
		require.LessOrEqual(t, app.requests[idem], attempts, "%s: at most one request per recorded attempt", key)
		require.GreaterOrEqual(t, app.requests[idem], 1, key)
		if attempts > 1 {
			retried++
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, total, n)
	require.Equal(t, map[string]int{webhook.ResultPerformed: 900, webhook.ResultAlreadyAbsent: 100}, results)
	require.GreaterOrEqual(t, retried, total/20, "the 503s were retried")
	require.Empty(t, app.flaky, "every flaky target was retried")
	require.Empty(t, app.drafts, "every draft that existed was deleted")
	require.Zero(t, app.refused, "every request the workers made verified")

	// Counting by result is one query over the delivered attempts (one per
	// reminder), as docs/operations.md shows it.
	var performed, gone int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE a.provider_message_id LIKE 'performed:%'),
		       count(*) FILTER (WHERE a.provider_message_id LIKE 'already_absent:%')
		  FROM delivery_attempts a WHERE a.outcome = 'delivered'`).Scan(&performed, &gone))
	require.Equal(t, [2]int{900, 100}, [2]int{performed, gone})

	// The application's verifier refuses a replay of a request it accepted
	// once the tolerance has passed, and a forged one now.
	replay := app.sample.Clone(ctx)
	replay.Body = io.NopCloser(bytes.NewReader(app.sampleBody))
	require.ErrorIs(t, webhooksig.Verify(app.secret, replay, time.Now().Add(2*time.Minute), time.Minute), webhooksig.ErrStale)
	// Another target than the sample's (which may be any learner's draft).
	forged := httptest.NewRequest(http.MethodDelete, app.sample.URL.Path+"/forged", nil)
	forged.Header.Set(webhooksig.IdempotencyHeader, app.sample.Header.Get(webhooksig.IdempotencyHeader))
	forged.Header.Set(webhooksig.SignatureHeader, app.sample.Header.Get(webhooksig.SignatureHeader))
	require.ErrorIs(t, webhooksig.Verify(app.secret, forged, time.Now(), time.Minute), webhooksig.ErrMismatch,
		"a valid signature moved onto another target")
	webhooksig.SignRequest(forged, nil, time.Now(), webhooksig.TenantSecret(root, "another-tenant"))
	require.ErrorIs(t, webhooksig.Verify(app.secret, forged, time.Now(), time.Minute), webhooksig.ErrMismatch,
		"signed with another tenant's secret")
}
