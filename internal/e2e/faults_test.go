package e2e_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/faults"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// procFleet runs the real binaries, built with fault injection, as separate
// processes against the real services: a crash is a real SIGKILL.
type procFleet struct {
	db     *testenv.DB
	mq     *testenv.Broker
	mail   *testenv.MailpitServer
	sms    *fakesms.Server
	smsURL string
	bins   string
}

func newProcFleet(t *testing.T, withMail bool) *procFleet {
	t.Helper()
	f := &procFleet{db: testenv.Postgres(t), mq: testenv.RabbitMQ(t), sms: fakesms.New()}
	if withMail {
		f.mail = testenv.Mailpit(t)
	}
	hs := httptest.NewServer(f.sms)
	t.Cleanup(hs.Close)
	f.smsURL = hs.URL
	f.bins = testenv.Binaries(t, "faultinject")
	return f
}

func (f *procFleet) env(extra ...string) []string {
	env := []string{
		"NUDGE_DATABASE_URL=" + f.db.URL, "NUDGE_AMQP_URL=" + f.mq.URL, "NUDGE_SIGNING_KEYS=" + signingKeys,
		"NUDGE_QUEUE_PREFIX=" + f.mq.Topology.Prefix, "NUDGE_SMS_URL=" + f.smsURL,
		"NUDGE_LOG_FORMAT=json", "NUDGE_LISTEN=", "NUDGE_FAULT=",
	}
	if f.mail != nil {
		env = append(env, "NUDGE_SMTP_URL="+f.mail.SMTPURL())
	}
	return append(env, extra...)
}

func (f *procFleet) start(t *testing.T, bin string, env []string, args ...string) *testenv.Proc {
	t.Helper()
	return testenv.Start(t, f.bins, bin, env, args...)
}

// runOK runs a binary to completion and requires exit 0.
func (f *procFleet) runOK(t *testing.T, bin string, args ...string) {
	t.Helper()
	p := f.start(t, bin, f.env(), args...)
	code, sig := p.Wait(t, 60*time.Second)
	require.Equal(t, 0, code, "%s exited %d (signal %v):\n%s", bin, code, sig, p.Output())
}

// crash runs a binary that must die by SIGKILL at the fault point.
func (f *procFleet) crash(t *testing.T, point, bin string, args ...string) {
	t.Helper()
	p := f.start(t, bin, f.env("NUDGE_FAULT="+point), args...)
	_, sig := p.Wait(t, 60*time.Second)
	require.Equal(t, syscall.SIGKILL, sig, "%s was meant to die at %s:\n%s", bin, point, p.Output())
	require.Contains(t, p.Output(), "FAULT INJECTED: killing process at "+point)
}

// stop sends SIGTERM and requires a clean exit.
func stop(t *testing.T, p *testenv.Proc) {
	t.Helper()
	require.NoError(t, p.Signal(syscall.SIGTERM))
	code, sig := p.Wait(t, 60*time.Second)
	require.Equal(t, 0, code, "%s exited %d (signal %v) on SIGTERM", p, code, sig)
}

func (f *procFleet) schedule(t *testing.T, ch reminder.Channel, n int) []int64 {
	t.Helper()
	now := time.Now()
	var reqs []intake.Request
	for i := range n {
		r := intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", ch, i), Channel: ch, Template: "course-expiry",
			Recipient: fmt.Sprintf("u%d@example.com", i), DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour)}
		if ch == reminder.SMS {
			r.Recipient = fmt.Sprintf("+1415555%04d", i)
		}
		reqs = append(reqs, r)
	}
	return f.scheduleAll(t, reqs)
}

// scheduleAll records reqs and returns their ids.
func (f *procFleet) scheduleAll(t *testing.T, reqs []intake.Request) []int64 {
	t.Helper()
	out, err := intake.ScheduleMany(context.Background(), f.db.Pool, reqs)
	require.NoError(t, err)
	ids := make([]int64, len(out))
	for i, o := range out {
		require.NoError(t, o.Err)
		ids[i] = o.ID
	}
	return ids
}

func (f *procFleet) get(t *testing.T, id int64) reminder.Reminder {
	t.Helper()
	r, err := intake.Get(context.Background(), f.db.Pool, id)
	require.NoError(t, err)
	return r
}

func (f *procFleet) waitAll(t *testing.T, ids []int64, want reminder.State) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if f.get(t, id).State != want {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "not every reminder reached %s", want)
}

// reconcileUntil runs reconciler passes (each a process, --once) until every
// reminder is in state want, failing after 30 s.
func (f *procFleet) reconcileUntil(t *testing.T, ids []int64, want reminder.State) {
	t.Helper()
	for giveUp := time.Now().Add(30 * time.Second); ; {
		f.runOK(t, "reconciler", "--once")
		reached := true
		for _, id := range ids {
			reached = reached && f.get(t, id).State == want
		}
		if reached {
			return
		}
		require.True(t, time.Now().Before(giveUp), "the reconciler did not bring every reminder to %s", want)
	}
}

func (f *procFleet) reasons(t *testing.T, id int64) string {
	t.Helper()
	evs, err := intake.Events(context.Background(), f.db.Pool, id)
	require.NoError(t, err)
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s→%s: %s\n", e.From, e.To, e.Reason)
	}
	return b.String()
}

// attemptOutcomes lists the outcome of each attempt row ("" while unknown).
func (f *procFleet) attemptOutcomes(t *testing.T, id int64) []string {
	t.Helper()
	rows, err := f.db.Pool.Query(context.Background(),
		`SELECT coalesce(outcome, '') FROM delivery_attempts WHERE reminder_id = $1 ORDER BY id`, id)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	return out
}

func (f *procFleet) queueDepth(t *testing.T, channel string) int {
	t.Helper()
	conn, err := broker.Dial(f.mq.URL, "inspect")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(f.mq.Topology.Queue(channel), true, false, false, false,
		amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	return q.Messages
}

// drainEnvelopes takes every message off channel's queue and opens it:
// how many times each reminder ID was carried, and each message's size.
func (f *procFleet) drainEnvelopes(t *testing.T, channel string) (perReminder map[int64]int, sizes []int) {
	t.Helper()
	keys, err := message.ParseKeys(signingKeys)
	require.NoError(t, err)
	conn, err := broker.Dial(f.mq.URL, "inspect")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	perReminder = map[int64]int{}
	for {
		d, ok, err := ch.Get(f.mq.Topology.Queue(channel), true)
		require.NoError(t, err)
		if !ok {
			return perReminder, sizes
		}
		envs, _, err := keys.OpenAll(d.Body, d.Headers, nil)
		require.NoError(t, err)
		sizes = append(sizes, len(envs))
		for _, e := range envs {
			perReminder[e.ReminderID]++
		}
	}
}

// Inventory: a worker is killed after the provider accepted the send but
// before the outcome was recorded. SMS: the next attempt asks the provider
// for the unknown one's message (GET by idempotency key), finds it and
// records the reminder delivered without sending; had it sent, the same
// idempotency key would have been deduplicated.
func TestFaultWorkerKilledAfterProviderAcceptedSMS(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	ids := f.schedule(t, reminder.SMS, 1)
	f.runOK(t, "dispatcher")
	f.crash(t, faults.WorkerAfterSend, "sms-worker", "--send-lease", "2s")

	require.Equal(t, reminder.Sending, f.get(t, ids[0]).State)
	require.Len(t, f.sms.Messages(), 1, "the provider accepted before the crash")

	f.start(t, "reconciler", f.env(), "--every", "300ms")
	w := f.start(t, "sms-worker", f.env())
	f.waitAll(t, ids, reminder.Delivered)
	stop(t, w)

	require.Len(t, f.sms.Messages(), 1, "one message reached the phone")
	require.Len(t, f.sms.Attempts(), 1, "the retry asked the provider first, found the message and sent nothing")
	require.Equal(t, 1, f.sms.Stats().Lookups)
	require.Equal(t, []string{"", "delivered"}, f.attemptOutcomes(t, ids[0]), "the crashed attempt stays unknown")
	require.Contains(t, f.reasons(t, ids[0]), "found at the provider")
	require.Contains(t, f.reasons(t, ids[0]), "send lease expired; retrying with the same idempotency key")
}

// The same window on email: SMTP cannot deduplicate, so exactly one
// duplicate appears, recognisable by its Message-ID and explained by the
// attempt the crash left without an outcome.
func TestFaultWorkerKilledAfterProviderAcceptedEmail(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, true)
	ids := f.schedule(t, reminder.Email, 1)
	f.runOK(t, "dispatcher")
	f.crash(t, faults.WorkerAfterSend, "email-worker", "--send-lease", "2s")
	f.start(t, "reconciler", f.env(), "--every", "300ms")
	w := f.start(t, "email-worker", f.env())
	f.waitAll(t, ids, reminder.Delivered)
	stop(t, w)

	r := f.get(t, ids[0])
	mails, err := f.mail.Messages(context.Background())
	require.NoError(t, err)
	require.Len(t, mails, 2)
	want := email.MessageID(r.IdempotencyKey, "nudge.local")
	require.Equal(t, want, mails[0].MessageID)
	require.Equal(t, want, mails[1].MessageID, "the duplicate carries the same Message-ID")
	require.Equal(t, []string{"", "delivered"}, f.attemptOutcomes(t, ids[0]))
}

// Inventory: a worker is killed after claiming, before sending.
func TestFaultWorkerKilledAfterClaim(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	ids := f.schedule(t, reminder.SMS, 3)
	f.runOK(t, "dispatcher")
	f.crash(t, faults.WorkerAfterClaim, "sms-worker", "--send-lease", "2s")
	require.Empty(t, f.sms.Attempts(), "nothing was sent before the crash")

	f.start(t, "reconciler", f.env(), "--every", "300ms")
	w := f.start(t, "sms-worker", f.env())
	f.waitAll(t, ids, reminder.Delivered)
	stop(t, w)
	require.Len(t, f.sms.Messages(), 3)
	require.Len(t, f.sms.Attempts(), 3, "each reminder sent once")
}

// Inventory: the worker is killed after recording the outcome, before the
// ack. The broker redelivers; the fence absorbs it; nothing is sent again.
func TestFaultWorkerKilledBeforeAck(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	ids := f.schedule(t, reminder.SMS, 3)
	f.runOK(t, "dispatcher", "--envelope-size", "1") // counts messages: one per reminder
	f.crash(t, faults.WorkerAfterRecord, "sms-worker")
	f.waitAll(t, ids, reminder.Delivered)
	require.Eventually(t, func() bool { return f.queueDepth(t, "sms") == 3 }, 10*time.Second, 20*time.Millisecond,
		"unacked messages went back to the queue")

	w := f.start(t, "sms-worker", f.env())
	require.Eventually(t, func() bool { return f.queueDepth(t, "sms") == 0 }, 30*time.Second, 50*time.Millisecond)
	stop(t, w)
	require.Len(t, f.sms.Attempts(), 3, "redeliveries sent nothing")
	require.Contains(t, w.Output(), `"duplicates":3`)
}

// Inventory: the dispatcher is killed between publishing and recording the
// broker's confirmation, and its lease expires before any worker runs: the
// reconciler finds no confirmation for the batch and returns the rows to
// pending, the next run publishes them under a new fence, and the orphaned
// messages are discarded as superseded.
func TestFaultDispatcherKilledAfterPublish(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	ids := f.schedule(t, reminder.SMS, 5)
	// Counts messages: one per reminder.
	f.crash(t, faults.DispatcherAfterPublish, "dispatcher", "--lease", "1s", "--envelope-size", "1")
	require.Equal(t, reminder.Enqueued, f.get(t, ids[0]).State)
	require.Equal(t, 5, f.queueDepth(t, "sms"), "the broker holds the published messages")
	var confirms int
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM publish_confirms`).Scan(&confirms))
	require.Zero(t, confirms, "the dispatcher died before recording the confirmation")

	// The dispatcher's 1 s lease runs out on the processes' wall clock: run
	// the reconciler until it finds it expired, rather than sleeping past it.
	f.reconcileUntil(t, ids, reminder.Pending)
	f.runOK(t, "dispatcher", "--envelope-size", "1")
	require.Equal(t, 10, f.queueDepth(t, "sms"))

	w := f.start(t, "sms-worker", f.env())
	f.waitAll(t, ids, reminder.Delivered)
	require.Eventually(t, func() bool { return f.queueDepth(t, "sms") == 0 }, 30*time.Second, 50*time.Millisecond)
	stop(t, w)
	require.Len(t, f.sms.Attempts(), 5, "each reminder sent once")
	require.Contains(t, w.Output(), `"duplicates":5`, "the orphaned messages were discarded")
}

// Inventory: two dispatchers run at once over the same window.
func TestFaultTwoDispatchersAtOnce(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	ids := f.schedule(t, reminder.SMS, 3000)
	// Every claim but the last leaves due rows behind: a burst, whose
	// envelope size is pinned too, so that the count below is exact.
	a := f.start(t, "dispatcher", f.env(), "--batch", "100", "--envelope-size", "50", "--burst-envelope-size", "50")
	b := f.start(t, "dispatcher", f.env(), "--batch", "100", "--envelope-size", "50", "--burst-envelope-size", "50")
	for _, p := range []*testenv.Proc{a, b} {
		code, _ := p.Wait(t, 60*time.Second)
		require.Equal(t, 0, code, p.Output())
	}
	// Every reminder is in exactly one message, at most 50 to a message. How
	// many messages depends on the race: a claim that meets rows the other
	// dispatcher holds (SKIP LOCKED) comes back short, and its remainder is
	// an envelope of its own.
	perReminder, sizes := f.drainEnvelopes(t, "sms")
	require.Len(t, perReminder, 3000, "every reminder published")
	for id, n := range perReminder {
		require.Equal(t, 1, n, "reminder %d published %d times", id, n)
	}
	require.GreaterOrEqual(t, len(sizes), 3000/50)
	for _, n := range sizes {
		require.LessOrEqual(t, n, 50, "an envelope of more than --burst-envelope-size")
	}
	var claims, claimedTwice, notEnqueued, confirmed int
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) - count(DISTINCT reminder_id)
		FROM reminder_timeline WHERE reason = 'claimed for dispatch'`).Scan(&claims, &claimedTwice))
	require.Equal(t, 3000, claims)
	require.Zero(t, claimedTwice)
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(confirmed), 0) FROM publish_confirms`).Scan(&confirmed))
	require.Equal(t, 3000, confirmed, "every publish confirmation recorded, once")
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reminder_state WHERE state <> 'enqueued'`).Scan(&notEnqueued))
	require.Zero(t, notEnqueued)
	require.Len(t, ids, 3000)
}

// Inventory: a deploy sends SIGTERM to a worker with deliveries in flight:
// it finishes and acks them, then exits 0.
func TestFaultSIGTERMWithDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	require.NoError(t, f.sms.SetConfig(fakesms.Config{Delay: 800 * time.Millisecond}))
	ids := f.schedule(t, reminder.SMS, 40)
	f.runOK(t, "dispatcher")
	w := f.start(t, "sms-worker", f.env(), "--grace", "20s")
	require.Eventually(t, func() bool { return len(f.sms.Attempts()) > 0 }, 30*time.Second, 5*time.Millisecond)
	stop(t, w)

	var delivered int
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reminder_state WHERE state = 'delivered'`).Scan(&delivered))
	require.Equal(t, len(f.sms.Messages()), delivered, "every send that started was recorded")
	require.Positive(t, delivered)
	var sending int
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reminder_state WHERE state = 'sending'`).Scan(&sending))
	require.Zero(t, sending, "nothing was left mid-send")
	require.Eventually(t, func() bool { return f.queueDepth(t, "sms") == len(ids)-delivered }, 10*time.Second,
		20*time.Millisecond, "what was not started is back in the queue")
}

// Past the grace period a stopping worker exits without acking: the broker
// redelivers, the sends in flight are recovered by the reconciler with the
// same idempotency key, and each reminder reaches the phone once.
func TestFaultSIGTERMPastTheGracePeriod(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	// The provider would answer after a minute: the worker leaves long before.
	require.NoError(t, f.sms.SetConfig(fakesms.Config{Delay: time.Minute}))
	ids := f.schedule(t, reminder.SMS, 10)
	f.runOK(t, "dispatcher", "--envelope-size", "1") // counts messages: one per reminder
	w := f.start(t, "sms-worker", f.env(), "--grace", "300ms", "--send-lease", "4s")
	require.Eventually(t, func() bool { return len(f.sms.Attempts()) > 0 }, 30*time.Second, 5*time.Millisecond)
	stop(t, w)
	require.Contains(t, w.Output(), "grace period over")
	require.Eventually(t, func() bool {
		for _, a := range f.sms.Attempts() {
			if !a.ClientGone {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the worker left while every send was still waiting for the provider")
	require.Empty(t, f.sms.Messages(), "no send in flight was answered")
	// The broker returns a closed connection's unacked messages asynchronously.
	require.Eventually(t, func() bool { return f.queueDepth(t, "sms") == 10 }, 10*time.Second, 20*time.Millisecond,
		"nothing was acked; the broker has every message back")

	require.NoError(t, f.sms.SetConfig(fakesms.Config{}))
	f.start(t, "reconciler", f.env(), "--every", "300ms")
	w2 := f.start(t, "sms-worker", f.env())
	f.waitAll(t, ids, reminder.Delivered)
	stop(t, w2)
	require.Len(t, f.sms.Messages(), 10, "one message per reminder reached the phone")
}
