package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

const signingKeys = "e2e:0123456789abcdef0123456789abcdef"

// fleet is a whole Nudge deployment in one test process: every component
// with its own connections, as separate processes would have.
type fleet struct {
	db      *testenv.DB
	mq      *testenv.Broker
	mail    *testenv.MailpitServer
	smsSrv  *fakesms.Server
	smsURL  string
	keys    *message.Keyring
	log     zerolog.Logger
	store   *store.Store
	webhook provider.Sender // the webhook workers' sender, set by the test that runs them
	// limits, when set, gives each worker startWorker starts a rate
	// limiter of its own over them (sharing their state in PostgreSQL,
	// as worker processes do).
	limits  *ratelimit.Config
	workers []*worker.Worker
	regs    []*prometheus.Registry
	// clk is every component's clock (clock.Real unless a test shifts it).
	clk clock.Clock
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	f := newSMSFleet(t)
	f.mail = testenv.Mailpit(t)
	return f
}

// newSMSFleet is a fleet without Mailpit, its fake SMS provider built with opts.
func newSMSFleet(t *testing.T, opts ...fakesms.Option) *fleet {
	t.Helper()
	f := &fleet{db: testenv.Postgres(t), mq: testenv.RabbitMQ(t)}
	f.smsSrv = fakesms.New(opts...)
	hs := httptest.NewServer(f.smsSrv)
	t.Cleanup(hs.Close)
	t.Cleanup(f.smsSrv.Close) // runs first: releases waiting handlers so hs.Close returns
	f.smsURL = hs.URL
	var err error
	f.keys, err = message.ParseKeys(signingKeys)
	require.NoError(t, err)
	f.log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	f.store = store.New(f.db.Pool)
	f.clk = clock.Real{}
	return f
}

func (f *fleet) enqueuer(actor string) dispatch.Enqueuer {
	return dispatch.Enqueuer{
		Store: f.store, Publisher: broker.NewPublisher(f.mq.URL, f.mq.Topology, actor), Keys: f.keys,
		Topology: f.mq.Topology, Clock: f.clk, Actor: actor,
	}
}

func (f *fleet) dispatcher(name string) *dispatch.Dispatcher {
	return &dispatch.Dispatcher{Enqueuer: f.enqueuer(name), Config: dispatch.Config{Batch: 200}, Log: f.log}
}

// startWorker runs a worker in wg until ctx ends.
func (f *fleet) startWorker(t *testing.T, ctx context.Context, ch reminder.Channel, name string, wg *sync.WaitGroup) {
	t.Helper()
	cfg := worker.Config{Channel: ch, Name: name, Concurrency: 2, Batch: 25, SendTimeout: 5 * time.Second,
		BackoffBase: 200 * time.Millisecond, Grace: 10 * time.Second}
	deps := worker.Deps{AMQPURL: f.mq.URL, Topology: f.mq.Topology, Store: f.store, Keys: f.keys,
		Clock: f.clk, Log: f.log.With().Str("worker", name).Logger()}
	switch ch {
	case reminder.Email:
		smtpCfg, perr := email.ParseSMTPURL(f.mail.SMTPURL())
		require.NoError(t, perr)
		smtpCfg.From = "Nudge <reminders@nudge.test>"
		smtpCfg.MessageIDDomain = "nudge.test"
		tmpl, terr := email.LoadTemplates("")
		require.NoError(t, terr)
		s, serr := email.New(smtpCfg, tmpl)
		require.NoError(t, serr)
		t.Cleanup(func() { s.Close() })
		deps.Sender = s
	case reminder.SMS:
		c, serr := sms.New(sms.Config{URL: f.smsURL, Timeout: 5 * time.Second})
		require.NoError(t, serr)
		deps.Sender = c
	case reminder.Webhook:
		deps.Sender = f.webhook
	}
	if f.limits != nil {
		deps.Limiter = ratelimit.New(f.db.Pool, *f.limits)
	}
	reg := prometheus.NewRegistry()
	deps.Metrics = metrics.New(reg)
	f.regs = append(f.regs, reg)
	w, err := worker.New(cfg, deps)
	require.NoError(t, err)
	f.workers = append(f.workers, w)
	wg.Go(func() { _ = w.Run(ctx) })
}

// waitTerminal polls until every reminder is terminal or the timeout passes
// (one without its state row yet, lazy, is pending).
func (f *fleet) waitTerminal(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var open int
		require.NoError(t, f.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id
			  WHERE coalesce(s.state, 'pending') NOT IN ('delivered', 'failed', 'expired', 'canceled')`).Scan(&open))
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			rows, _ := f.db.Pool.Query(context.Background(), `SELECT state, count(*) FROM reminder_state GROUP BY 1`)
			counts := map[string]int{}
			for rows.Next() {
				var s string
				var n int
				_ = rows.Scan(&s, &n)
				counts[s] = n
			}
			t.Fatalf("%d reminders still open after %s: %v", open, timeout, counts)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type row struct {
	id            int64
	tenant, key   string
	channel       reminder.Channel
	state         reminder.State
	idem          string
	due, deadline time.Time
}

func (f *fleet) rows(t *testing.T) map[int64]row {
	t.Helper()
	rs, err := f.db.Pool.Query(context.Background(),
		`SELECT r.id, r.tenant, r.key, r.channel, coalesce(s.state, 'pending'), r.idempotency_key,
		        coalesce(s.due_at, r.due_at), coalesce(s.deadline, r.deadline)
		   FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id`)
	require.NoError(t, err)
	out := map[int64]row{}
	for rs.Next() {
		var r row
		require.NoError(t, rs.Scan(&r.id, &r.tenant, &r.key, &r.channel, &r.state, &r.idem, &r.due, &r.deadline))
		out[r.id] = r
	}
	require.NoError(t, rs.Err())
	return out
}

// TestPipelineEndToEnd is the core promise on real services: 2,000 reminders
// over both channels and five tenants, some due later, some canceled after
// they were enqueued, some already past their deadline, worked by two email
// and two SMS workers. Every reminder ends terminal; each deliverable one is
// delivered exactly once, never before it was due nor at or after its
// deadline; no canceled one is sent; every terminal state has its event.
func TestPipelineEndToEnd(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ctx := context.Background()
	now := time.Now()

	const total = 2000
	type kind int
	const (
		dueNow kind = iota
		dueLater
		pastDeadline
		cancelAfterEnqueue
	)
	kinds := map[string]kind{}
	var reqs []intake.Request
	for i := range total {
		ch := reminder.Email
		recipient := fmt.Sprintf("learner-%d@example.com", i)
		if i%2 == 1 {
			ch = reminder.SMS
			recipient = fmt.Sprintf("+1415555%04d", i)
		}
		k := dueNow
		switch {
		case i%10 == 3:
			k = dueLater
		case i%10 == 7:
			k = pastDeadline
		case i%20 == 5:
			k = cancelAfterEnqueue
		}
		r := intake.Request{
			Tenant: fmt.Sprintf("tenant-%d", i%5), Key: fmt.Sprintf("course-expiry:learner-%d:course-7", i),
			Channel: ch, Recipient: recipient, Template: "course-expiry",
			Data:  map[string]any{"course": "Go 101", "learner": fmt.Sprint("Learner ", i)},
			DueAt: now.Add(-time.Minute), Deadline: now.Add(time.Hour),
		}
		switch k {
		case dueLater:
			r.DueAt = now.Add(4 * time.Second)
		case pastDeadline:
			r.DueAt, r.Deadline = now.Add(-2*time.Hour), now.Add(-time.Hour)
		}
		kinds[r.Tenant+"/"+r.Key] = k
		reqs = append(reqs, r)
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}

	// One dispatcher run before any worker exists: due work is enqueued and
	// the late work expired; then the application cancels some enqueued ones.
	sum, err := f.dispatcher("dispatcher-a").RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, total/10, sum.Expired)
	require.Equal(t, total-total/10-total/10, sum.Enqueued, "everything due and alive is enqueued")
	canceled := 0
	for _, r := range reqs {
		if kinds[r.Tenant+"/"+r.Key] == cancelAfterEnqueue {
			st, err := intake.Cancel(ctx, f.db.Pool, r.Tenant, r.Key, "app", "learner finished the course")
			require.NoError(t, err)
			require.Equal(t, reminder.Canceled, st)
			canceled++
		}
	}
	require.Equal(t, 100, canceled)

	// The fleet: two workers per channel, two dispatchers looping (the due-later
	// work), and the reconciler.
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		f.startWorker(t, runCtx, reminder.Email, fmt.Sprint("email-", i), &wg)
		f.startWorker(t, runCtx, reminder.SMS, fmt.Sprint("sms-", i), &wg)
	}
	for _, name := range []string{"dispatcher-b", "dispatcher-c"} {
		d := f.dispatcher(name)
		wg.Go(func() { _ = d.Loop(runCtx, 500*time.Millisecond) })
	}
	rec := &reconcile.Reconciler{Enqueuer: f.enqueuer("reconciler"), Config: reconcile.Config{Overdue: 30 * time.Second}, Log: f.log}
	wg.Go(func() { _ = rec.Loop(runCtx, time.Second) })

	f.waitTerminal(t, 2*time.Minute)
	stop()
	wg.Wait()

	rows := f.rows(t)
	require.Len(t, rows, total)
	byState := map[reminder.State]int{}
	for _, r := range rows {
		byState[r.state]++
		want := map[kind]reminder.State{dueNow: reminder.Delivered, dueLater: reminder.Delivered,
			pastDeadline: reminder.Expired, cancelAfterEnqueue: reminder.Canceled}[kinds[r.tenant+"/"+r.key]]
		require.Equal(t, want, r.state, "reminder %d (%s/%s)", r.id, r.tenant, r.key)
	}
	t.Logf("final states: %v", byState)

	// Email: exactly one message per delivered email reminder, by Message-ID,
	// accepted after it was due and before its deadline; nothing else.
	mails, err := f.mail.Messages(ctx)
	require.NoError(t, err)
	mailsByID := map[string]int{}
	for _, m := range mails {
		mailsByID[m.MessageID]++
	}
	// SMS: exactly one accepted message per delivered SMS reminder, by key.
	smsByKey := map[string]int{}
	smsAt := map[string]time.Time{}
	for _, m := range f.smsSrv.Messages() {
		smsByKey[m.IdempotencyKey]++
		smsAt[m.IdempotencyKey] = m.AcceptedAt
	}
	mailAt := map[string]time.Time{}
	for _, m := range mails {
		mailAt[m.MessageID] = m.Created
	}
	var deliveredEmail, deliveredSMS int
	for _, r := range rows {
		switch r.channel {
		case reminder.Email:
			id := email.MessageID(r.idem, "nudge.test")
			if r.state == reminder.Delivered {
				deliveredEmail++
				require.Equal(t, 1, mailsByID[id], "email reminder %d delivered %d times", r.id, mailsByID[id])
				at := mailAt[id]
				require.False(t, at.Before(r.due.Add(-time.Second)), "reminder %d sent at %s before due %s", r.id, at, r.due)
				require.True(t, at.Before(r.deadline), "reminder %d sent at %s, deadline %s", r.id, at, r.deadline)
			} else {
				require.Zero(t, mailsByID[id], "%s email reminder %d was sent", r.state, r.id)
			}
		case reminder.SMS:
			if r.state == reminder.Delivered {
				deliveredSMS++
				require.Equal(t, 1, smsByKey[r.idem], "sms reminder %d accepted %d times", r.id, smsByKey[r.idem])
				at := smsAt[r.idem]
				require.False(t, at.Before(r.due), "reminder %d sent at %s before due %s", r.id, at, r.due)
				require.True(t, at.Before(r.deadline))
			} else {
				require.Zero(t, smsByKey[r.idem], "%s sms reminder %d was sent", r.state, r.id)
			}
		}
	}
	require.Len(t, mails, deliveredEmail, "no email beyond one per delivered reminder")
	require.Len(t, smsByKey, deliveredSMS, "no SMS beyond one per delivered reminder")
	require.Equal(t, 1700, deliveredEmail+deliveredSMS)

	// No send attempt started before due or at/after the deadline.
	var badAttempts int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM delivery_attempts a JOIN reminder_state r ON r.id = a.reminder_id
		WHERE a.started_at < r.due_at OR a.started_at >= r.deadline`).Scan(&badAttempts))
	require.Zero(t, badAttempts)

	// Every terminal state is explained by its last event.
	var unexplained int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state r WHERE NOT EXISTS (
		SELECT 1 FROM reminder_timeline e WHERE e.reminder_id = r.id AND e.to_state = r.state AND e.reason <> '')`).Scan(&unexplained))
	require.Zero(t, unexplained)

	var c worker.Counts
	for _, w := range f.workers {
		wc := w.Counts()
		c.Delivered += wc.Delivered
		c.Superseded += wc.Superseded
		c.Duplicates += wc.Duplicates
	}
	require.EqualValues(t, 1700, c.Delivered)

	// What the workers' and the reconciler's /metrics say agrees with the table.
	var delivered, superseded float64
	for _, reg := range f.regs {
		fams := scrape(t, reg)
		delivered += sumWhere(fams["nudge_outcomes_total"], "outcome", "delivered")
		superseded += sumWhere(fams["nudge_duplicates_suppressed_total"], "kind", "superseded")
	}
	recReg := prometheus.NewRegistry()
	recReg.MustRegister(&metrics.DBCollector{DB: f.db.Pool, Clock: clock.Real{}})
	recFams := scrape(t, recReg)
	require.Zero(t, sumWhere(recFams["nudge_open_reminders"], "", ""), "no reminder is open, says the reconciler")
	require.EqualValues(t, byState[reminder.Expired], sumWhere(recFams["nudge_deadline_misses_last_hour"], "", ""))
	require.EqualValues(t, 1, sumWhere(recFams["nudge_db_scrape_success"], "", ""))
	require.EqualValues(t, 1700, delivered, "nudge_outcomes_total{outcome=delivered} matches the table")
	require.EqualValues(t, 100, superseded, "the canceled reminders' messages were counted as superseded")
	require.GreaterOrEqual(t, c.Superseded+c.Duplicates, int64(100), "the canceled reminders' messages were discarded")
}

// scrape serves reg over HTTP, as a process's /metrics does, fetches it and
// parses the exposition.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// sumWhere adds the values of a family's series whose label has the given
// value (every series when label is "").
func sumWhere(fam *dto.MetricFamily, label, value string) float64 {
	if fam == nil {
		return 0
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		match := label == ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				match = true
			}
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}
