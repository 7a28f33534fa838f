package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

type bundle struct {
	db   *testenv.DB
	mq   *testenv.Broker
	keys *message.Keyring
	now  time.Time
}

func setup(t *testing.T) bundle {
	t.Helper()
	keys, err := message.ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	return bundle{db: testenv.Postgres(t), mq: testenv.RabbitMQ(t), keys: keys, now: time.Now()}
}

func (b bundle) dispatcher(url string, topo broker.Topology, c clock.Clock, cfg dispatch.Config) *dispatch.Dispatcher {
	return &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{
		Store: store.New(b.db.Pool), Publisher: broker.NewPublisher(url, topo, "test-dispatcher"), Keys: b.keys,
		Topology: topo, Clock: c, Actor: "test-dispatcher",
	}, Config: cfg, Log: zerolog.Nop()}
}

func (b bundle) schedule(t *testing.T, n int, ch reminder.Channel) {
	t.Helper()
	var reqs []intake.Request
	for i := range n {
		rcpt := fmt.Sprintf("u%d@example.com", i)
		if ch == reminder.SMS {
			rcpt = fmt.Sprintf("+1415555%04d", i)
		}
		reqs = append(reqs, intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", ch, i), Channel: ch,
			Recipient: rcpt, Template: "course-expiry", DueAt: b.now.Add(-time.Minute), Deadline: b.now.Add(time.Hour)})
	}
	out, err := intake.ScheduleMany(context.Background(), b.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}
}

func (b bundle) states(t *testing.T) map[reminder.State]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT state, count(*) FROM reminder_state GROUP BY 1`)
	require.NoError(t, err)
	out := map[reminder.State]int{}
	for rows.Next() {
		var s reminder.State
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	return out
}

// confirmed returns the publish confirmations recorded: how many batches,
// and how many messages in all.
func (b bundle) confirmed(t *testing.T) (batches, messages int) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), coalesce(sum(confirmed), 0) FROM publish_confirms`).Scan(&batches, &messages))
	return batches, messages
}

func TestPublishesSignedPersistentMessagesAndRecordsEnqueued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, 3, reminder.SMS)
	// A message per reminder (envelopes are tested below).
	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, clock.Real{}, dispatch.Config{EnvelopeSize: 1}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, sum.Enqueued)
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 3}, b.states(t))
	batches, messages := b.confirmed(t)
	require.Equal(t, [2]int{1, 3}, [2]int{batches, messages}, "one confirmation for the batch of three")

	conn, err := broker.Dial(b.mq.URL, "reader")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	d, ok, err := ch.Get(b.mq.Topology.Queue("sms"), false)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 2, d.DeliveryMode, "persistent")
	env, err := b.keys.Open(d.Body, d.Headers)
	require.NoError(t, err)
	r, err := intake.Get(context.Background(), b.db.Pool, env.ReminderID)
	require.NoError(t, err)
	require.Equal(t, r.Fence, env.Fence)
	require.Empty(t, env.IdempotencyKey, "the message carries no key: the worker reads it from the row it claims")
	require.Equal(t, fmt.Sprintf("%d-%d", r.ID, r.Fence), d.MessageId)
}

func TestUnroutablePublishIsReleasedNotEnqueued(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 50} {
		t.Run(fmt.Sprintf("envelope size %d", size), func(t *testing.T) {
			t.Parallel()
			testUnroutablePublishIsReleased(t, size)
		})
	}
}

// testUnroutablePublishIsReleased: with envelopes, the unrouted envelope
// releases each of its reminders.
func testUnroutablePublishIsReleased(t *testing.T, size int) {
	b := setup(t)
	// A topology whose email queue was never declared: the exchange exists
	// and confirms the publish, but nothing routes it.
	topo := broker.Topology{Prefix: b.mq.Topology.Prefix, Channels: []string{"sms"}, RetryTiers: b.mq.Topology.RetryTiers}.WithDefaults()
	conn, err := broker.Dial(b.mq.URL, "unbinder")
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.QueueUnbind(b.mq.Topology.Queue("email"), "email", b.mq.Topology.WorkExchange(), nil))
	conn.Close()

	b.schedule(t, 2, reminder.Email)
	b.schedule(t, 2, reminder.SMS)
	sum, err := b.dispatcher(b.mq.URL, topo, clock.Real{}, dispatch.Config{EnvelopeSize: size}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, sum.Enqueued)
	require.Equal(t, 2, sum.Released)
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 2, reminder.Pending: 2}, b.states(t))
	batches, messages := b.confirmed(t)
	require.Equal(t, [2]int{1, 2}, [2]int{batches, messages}, "only the routed messages are confirmed")
	r, err := intake.GetByKey(context.Background(), b.db.Pool, "acme", "email-0")
	require.NoError(t, err)
	require.Contains(t, r.LastError, "unroutable")
	require.Equal(t, int64(2), r.Fence, "released under a new fence")
}

func TestBrokerDownLeavesNothingEnqueued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, 5, reminder.Email)
	_, err := b.dispatcher("amqp://guest:guest@127.0.0.1:1/", b.mq.Topology, clock.Real{}, dispatch.Config{}).
		RunOnce(context.Background())
	require.Error(t, err)
	require.Equal(t, map[reminder.State]int{reminder.Pending: 5}, b.states(t),
		"claims whose publish could not happen go straight back to pending")
	batches, _ := b.confirmed(t)
	require.Zero(t, batches)
}

// tickingClock advances by step on every reading, so a run's own work
// consumes its budget.
type tickingClock struct {
	f    *clock.Fake
	step time.Duration
}

func (c tickingClock) Now() time.Time {
	t := c.f.Now()
	c.f.Advance(c.step)
	return t
}

func TestStopsStartingBatchesWhenTheBudgetIsNear(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, 100, reminder.SMS)
	c := tickingClock{f: clock.NewFake(b.now), step: time.Second}
	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, c, dispatch.Config{Batch: 10, Budget: 20 * time.Second}).
		RunOnce(context.Background())
	require.NoError(t, err)
	require.True(t, sum.OutOfBudget)
	require.Less(t, sum.Claimed, 100)
	require.Greater(t, sum.Claimed, 0)
	st := b.states(t)
	require.Equal(t, sum.Enqueued, st[reminder.Enqueued])
	require.Equal(t, 100-sum.Claimed, st[reminder.Pending], "what the run did not reach stays pending for the next")
}

func TestCutoffIsFixedAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := clock.NewFake(b.now)
	_, err := intake.Schedule(ctx, b.db.Pool, intake.Request{Tenant: "acme", Key: "later", Channel: reminder.SMS,
		Recipient: "+14155550100", Template: "t", DueAt: b.now.Add(5 * time.Second), Deadline: b.now.Add(time.Hour)})
	require.NoError(t, err)
	// The run's clock passes the reminder's due time mid-run; the cutoff does not move.
	c := tickingClock{f: f, step: 10 * time.Second}
	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, c, dispatch.Config{}).RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, sum.Claimed)
	require.Equal(t, map[reminder.State]int{reminder.Pending: 1}, b.states(t))
}

// closedBroker is a broker URL nothing listens on.
const closedBroker = "amqp://guest:guest@127.0.0.1:1/"

// gated is a dispatcher on url that asks its publisher before claiming.
func (b bundle) gated(url string, c clock.Clock, cfg dispatch.Config) *dispatch.Dispatcher {
	d := b.dispatcher(url, b.mq.Topology, c, cfg)
	pub := d.Publisher.(*broker.Publisher)
	d.BrokerReady = func(context.Context) error { return pub.Connect() }
	return d
}

// events counts the events of reminders' timelines (stored and folded), by
// reason.
func (b bundle) events(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT reason, count(*) FROM reminder_timeline GROUP BY 1`)
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var reason string
		var n int
		require.NoError(t, rows.Scan(&reason, &n))
		out[reason] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// Issue 13, finding 7: with the broker down, a run claimed rows only to
// release them, and what was past its deadline stayed pending. Now a run
// that cannot publish claims nothing and expires what is due and past its
// deadline; the rest stays pending, untouched.
func TestBrokerDownRunExpiresWhatIsLateAndClaimsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reqs := make([]intake.Request, 0, 505)
	for i := range 505 {
		deadline := b.now.Add(2 * time.Second)
		if i >= 500 {
			deadline = b.now.Add(time.Hour)
		}
		reqs = append(reqs, intake.Request{Tenant: "acme", Key: fmt.Sprintf("k%d", i), Channel: reminder.Email,
			Recipient: "a@example.com", Template: "t", DueAt: b.now.Add(-time.Minute), Deadline: deadline})
	}
	_, err := intake.ScheduleMany(context.Background(), b.db.Pool, reqs)
	require.NoError(t, err)

	f := clock.NewFake(b.now.Add(3 * time.Second)) // past the 500 deadlines
	sum, err := b.gated(closedBroker, f, dispatch.Config{Batch: 200}).RunOnce(context.Background())
	require.ErrorIs(t, err, dispatch.ErrBrokerUnavailable)
	require.True(t, sum.BrokerDown)
	require.Equal(t, 500, sum.Expired)
	require.Zero(t, sum.Claimed)
	require.Equal(t, map[reminder.State]int{reminder.Expired: 500, reminder.Pending: 5}, b.states(t))
	ev := b.events(t)
	require.Equal(t, 500, ev["deadline passed before dispatch"])
	require.Zero(t, ev["claimed for dispatch"], "nothing claimed for a publish that cannot happen")
}

// Issue 13, finding 7: during a 20 s broker outage a dispatcher with --every
// 1s made 14,000 claim→release cycles for 2,000 reminders, an event row
// each. Now no run claims while the broker is unreachable, and the loop
// backs off (1, 2, 4, 8 s...) instead of trying every second; once the
// broker is back, the next run publishes everything.
func TestLoopBacksOffInsteadOfChurningDuringABrokerOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, 300, reminder.Email)
	f := clock.NewFake(b.now)
	d := b.gated(closedBroker, f, dispatch.Config{Batch: 100})
	runs := make(chan error, 100)
	d.AfterRun = func(_ context.Context, _ dispatch.Summary, err error) { runs <- err }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Loop(ctx, time.Second) }()

	n := 0
	for elapsed := time.Duration(0); elapsed < 20*time.Second; elapsed += time.Second {
		waitForWaiter(t, f)
		f.Advance(time.Second)
	}
	waitForWaiter(t, f)
	cancel()
	require.NoError(t, <-done)
	close(runs)
	for err := range runs {
		require.ErrorIs(t, err, dispatch.ErrBrokerUnavailable)
		n++
	}
	require.LessOrEqual(t, n, 5, "runs at 0, 2, 6, 14 s: backed off, not one a second")
	require.GreaterOrEqual(t, n, 4)
	ev := b.events(t)
	require.Zero(t, ev["claimed for dispatch"], "no claim→release churn")
	require.Equal(t, map[reminder.State]int{reminder.Pending: 300}, b.states(t))

	sum, err := b.gated(b.mq.URL, f, dispatch.Config{Batch: 100}).RunOnce(context.Background())
	require.NoError(t, err, "the broker is back")
	require.Equal(t, 300, sum.Enqueued)
}

// waitForWaiter waits until the code under test blocks on the fake clock.
func waitForWaiter(t *testing.T, f *clock.Fake) {
	t.Helper()
	require.Eventually(t, func() bool { return f.Waiters() > 0 }, 10*time.Second, time.Millisecond)
}

// Issue 18: with EnvelopeSize n, a claim batch goes out as message.Batch
// envelopes of up to n reminders of one channel (a lone one as a single
// message), each reminder in exactly one message at its current fence, and
// one publish confirmation records the whole claim batch as before.
func TestEnvelopesCarryTheClaimBatchPerChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, 7, reminder.SMS)
	b.schedule(t, 3, reminder.Email)
	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, clock.Real{}, dispatch.Config{EnvelopeSize: 3}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 10, sum.Enqueued)
	batches, messages := b.confirmed(t)
	require.Equal(t, [2]int{1, 10}, [2]int{batches, messages}, "one confirmation for the claim batch, counting reminders")

	seen := map[int64]int{}
	sizes := map[string][]int{}
	for _, queue := range []string{"sms", "email"} {
		for _, envs := range b.drain(t, queue) {
			sizes[queue] = append(sizes[queue], len(envs))
			for _, env := range envs {
				require.Equal(t, queue, env.Channel)
				r, err := intake.Get(context.Background(), b.db.Pool, env.ReminderID)
				require.NoError(t, err)
				require.Equal(t, r.Fence, env.Fence)
				require.Empty(t, env.IdempotencyKey, "the worker reads the key from the row it claims")
				require.Equal(t, r.Deadline.UTC(), env.Deadline.UTC())
				seen[env.ReminderID]++
			}
		}
	}
	require.Equal(t, map[string][]int{"sms": {3, 2, 2}, "email": {3}}, sizes, "7 in envelopes of at most 3: evenly filled")
	require.Len(t, seen, 10)
	for id, n := range seen {
		require.Equal(t, 1, n, "reminder %d", id)
	}
}

// drain takes every message of the channel's work queue and opens it: the
// reminders of each message, in queue order.
func (b bundle) drain(t *testing.T, queue string) (msgs [][]message.Envelope) {
	t.Helper()
	conn, err := broker.Dial(b.mq.URL, "reader")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for {
		d, ok, err := ch.Get(b.mq.Topology.Queue(queue), true)
		require.NoError(t, err)
		if !ok {
			return msgs
		}
		envs, batch, err := b.keys.OpenAll(d.Body, d.Headers, nil)
		require.NoError(t, err)
		require.Equal(t, len(envs) > 1, batch, "a lone reminder goes in a single message")
		msgs = append(msgs, envs)
	}
}

// Issue 18: a claim that leaves due rows behind (a burst) goes out in
// envelopes of BurstEnvelopeSize; the claim that takes the rest, in
// envelopes of EnvelopeSize.
func TestBurstClaimsGoOutInBurstEnvelopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, 11, reminder.SMS)
	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, clock.Real{},
		dispatch.Config{Batch: 4, EnvelopeSize: 2, BurstEnvelopeSize: 4}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 11, sum.Enqueued)
	var sizes []int
	for _, envs := range b.drain(t, "sms") {
		sizes = append(sizes, len(envs))
	}
	require.Equal(t, []int{4, 4, 2, 1}, sizes, "claims of 4, 4 (due rows left: a burst) and 3 (the rest)")
}

// loopRun is a summary Loop reported.
type loopRun struct {
	sum dispatch.Summary
	err error
}

// startLoop runs d.Loop(every) until the returned stop is called, and hands
// over what it reports.
func startLoop(t *testing.T, d *dispatch.Dispatcher, every time.Duration) (runs chan loopRun, stop func()) {
	t.Helper()
	runs = make(chan loopRun, 100)
	d.AfterRun = func(_ context.Context, sum dispatch.Summary, err error) { runs <- loopRun{sum, err} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Loop(ctx, every) }()
	return runs, func() {
		cancel()
		require.NoError(t, <-done)
		close(runs)
	}
}

// Issue 18: a loop on a fixed tick made every reminder wait for the next
// tick. Now a pending row's due time wakes the loop: with --every an hour,
// a reminder due 5 s after an idle pass is claimed once the clock reaches
// its due time, and one written after that pass's probe waits for the pass
// at every at the latest, as before.
func TestLoopWakesWhenARowIsDueNotAtEvery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := clock.NewFake(b.now)
	b.scheduleAt(t, "soon", b.now.Add(5*time.Second))
	d := b.dispatcher(b.mq.URL, b.mq.Topology, f, dispatch.Config{})
	runs, stop := startLoop(t, d, time.Hour)

	first := <-runs // the first pass is always reported
	require.NoError(t, first.err)
	require.Zero(t, first.sum.Claimed, "nothing due yet")
	waitForWaiter(t, f)
	f.Advance(5*time.Second - time.Millisecond)
	require.Equal(t, 1, f.Waiters(), "still waiting: the row is due 1 ms later")
	require.Equal(t, map[reminder.State]int{reminder.Pending: 1}, b.states(t))
	f.Advance(time.Millisecond)
	second := <-runs // claimed something, 5 s after the last report
	require.NoError(t, second.err)
	require.Equal(t, 1, second.sum.Enqueued, "claimed at its due time, an hour before every")
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 1}, b.states(t))

	// Nothing pending now: the loop waits for every; a row written meanwhile
	// (after the probe) is claimed by the pass at every.
	waitForWaiter(t, f)
	b.scheduleAt(t, "later", b.now.Add(6*time.Second))
	f.Advance(time.Minute)
	require.Equal(t, 1, f.Waiters(), "written after the probe: not seen before every")
	f.Advance(time.Hour - time.Minute)
	waitForWaiter(t, f)
	stop()
	last := <-runs // flushed at the end
	require.Equal(t, 1, last.sum.Enqueued)
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 2}, b.states(t))
}

// Issue 18: the loop never starts a pass sooner than MinGap after the last
// one started, however soon the next row is due, and the passes of a
// stream are reported merged: the first pass at once, the next ones
// together at most once a second (here when the loop stops).
func TestLoopHoldsTheMinGapAndMergesItsReports(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := clock.NewFake(b.now)
	b.scheduleAt(t, "s", b.now, b.now.Add(10*time.Millisecond), b.now.Add(60*time.Millisecond))
	d := b.dispatcher(b.mq.URL, b.mq.Topology, f, dispatch.Config{MinGap: 50 * time.Millisecond})
	runs, stop := startLoop(t, d, time.Hour)

	first := <-runs
	require.NoError(t, first.err)
	require.Equal(t, dispatch.Summary{Passes: 1, Claimed: 1, Enqueued: 1, Batches: 1},
		dispatch.Summary{Passes: first.sum.Passes, Claimed: first.sum.Claimed, Enqueued: first.sum.Enqueued, Batches: first.sum.Batches})
	waitForWaiter(t, f)
	f.Advance(10 * time.Millisecond) // the second row is due, the min gap not over
	require.Equal(t, 1, f.Waiters(), "the min gap holds")
	f.Advance(39 * time.Millisecond)
	require.Equal(t, 1, f.Waiters(), "the min gap holds")
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 1, reminder.Pending: 2}, b.states(t))
	f.Advance(time.Millisecond) // 50 ms: the second pass
	require.Eventually(t, func() bool { return b.states(t)[reminder.Enqueued] == 2 }, 10*time.Second, time.Millisecond)
	waitForWaiter(t, f)
	f.Advance(49 * time.Millisecond) // the third row was due at 60 ms; the min gap ends at 100
	require.Equal(t, 1, f.Waiters(), "the min gap holds")
	f.Advance(time.Millisecond)
	require.Eventually(t, func() bool { return b.states(t)[reminder.Enqueued] == 3 }, 10*time.Second, time.Millisecond)
	waitForWaiter(t, f)
	require.Empty(t, runs, "passes 50 ms apart are not reported one by one")
	stop()
	merged := <-runs
	require.NoError(t, merged.err)
	require.Equal(t, 2, merged.sum.Passes)
	require.Equal(t, 2, merged.sum.Enqueued)
	require.Equal(t, b.now.Add(100*time.Millisecond), merged.sum.Cutoff, "the later pass's cutoff")
	_, ok := <-runs
	require.False(t, ok, "nothing else reported")
}

// Issue 18: NextDue runs after every pass of a loop, so it must read the
// first entry of reminder_state_pending_due past the cutoff, whatever the
// statistics say: here reminder_state was analyzed while empty (an install
// gone quiet), which estimates every partial index of pending rows at none.
func TestNextDueReadsThePendingDueIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `ANALYZE reminder_state`)
	require.NoError(t, err)
	dues := make([]time.Time, 2000)
	for i := range dues {
		dues[i] = b.now.Add(time.Duration(i-1000) * time.Second)
	}
	b.scheduleAt(t, "n", dues...)

	next, err := dispatch.NextDue(ctx, b.db.Pool, b.now)
	require.NoError(t, err)
	require.Equal(t, b.now.Add(time.Second).Truncate(time.Microsecond).UTC(), next.UTC(), "the first due after the cutoff")
	rows, err := b.db.Pool.Query(ctx, `EXPLAIN (FORMAT TEXT, COSTS OFF)
		SELECT (SELECT due_at FROM reminder_state WHERE state = 'pending' AND due_at > $1 ORDER BY due_at, id LIMIT 1)`,
		b.now)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "using reminder_state_pending_due", plan)
	require.NotContains(t, plan, "Sort", plan)

	none, err := dispatch.NextDue(ctx, b.db.Pool, b.now.Add(time.Hour))
	require.NoError(t, err)
	require.True(t, none.IsZero(), "nothing pending after it: %v", none)
}

// Issue 18's envelopes of 200 wait for the after-rollout step: on the
// schema as it is while the previous release's workers (which refuse more
// than 100 entries) may run, no envelope carries more than 100; once
// migration 49 has run, the dispatcher sees it at its next read of the
// limit (a minute on its clock after the last) and sends envelopes of 200.
func TestEnvelopesStayAtThePreviousLimitUntilTheAfterRolloutStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keys, err := message.ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	b := bundle{db: testenv.PostgresBeforeRollout(t), mq: testenv.RabbitMQ(t), keys: keys, now: time.Now()}
	c := clock.NewFake(b.now)
	d := b.dispatcher(b.mq.URL, b.mq.Topology, c, dispatch.Config{EnvelopeSize: 200, BurstEnvelopeSize: 200})
	schedule := func(prefix string, n int) {
		var reqs []intake.Request
		for i := range n {
			reqs = append(reqs, intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", prefix, i), Channel: reminder.SMS,
				Recipient: fmt.Sprintf("+1415555%04d", i), Template: "course-expiry",
				DueAt: c.Now().Add(-time.Minute), Deadline: c.Now().Add(time.Hour)})
		}
		out, err := intake.ScheduleMany(ctx, b.db.Pool, reqs)
		require.NoError(t, err)
		for _, o := range out {
			require.NoError(t, o.Err)
		}
	}
	run := func() []int {
		t.Helper()
		sum, err := d.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 250, sum.Enqueued)
		var sizes []int
		for _, envs := range b.drain(t, "sms") {
			sizes = append(sizes, len(envs))
		}
		return sizes
	}

	schedule("before", 250)
	require.Equal(t, []int{84, 83, 83}, run(), "before migration 49: the previous release's limit (envelopes of at most 100, evenly filled)")

	_, err = schema.MigrateAfterRollout(ctx, b.db.Pool)
	require.NoError(t, err)
	schedule("after", 250)
	c.Advance(59 * time.Second)
	require.Equal(t, []int{84, 83, 83}, run(), "the limit read 59 s ago still holds")

	schedule("later", 250)
	c.Advance(time.Second)
	require.Equal(t, []int{125, 125}, run(), "read again a minute after: this release's limit (at most 200)")
}
