package e2e_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// windowZones are the recipients' zones: some open at the start (Saturday
// 27 March 2027, 19:50 UTC), Stockholm about to close, the others closed and
// opening after Europe's spring-forward (28 March, 01:00 UTC) or on the far
// side of the date line.
var windowZones = []string{
	"Europe/Stockholm", "Europe/London", "Europe/Helsinki", "America/New_York", "America/Los_Angeles",
	"America/Sao_Paulo", "Asia/Tokyo", "Asia/Kolkata", "Australia/Lord_Howe", "UTC",
}

// TestSendWindowsEndToEnd: 2,000 SMS reminders over ten zones, every one
// under the SMS policy window 08:00-21:00 recipient time, half with a
// deadline two hours out and half a day out. The fleet's clock (dispatcher,
// workers, reconciler and the fake provider's own record) starts at 19:50
// UTC on the Saturday before Europe's spring-forward; the dispatcher claims
// while Stockholm is still open, the clock moves past Stockholm's 21:00
// close before any worker runs, then to Lord Howe's morning, then across the
// DST transition to Sunday morning in Europe, then past every deadline.
// The provider's record shows no send outside the recipient's window, and
// every reminder not delivered is expired as no_window_before_deadline.
func TestSendWindowsEndToEnd(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ctx := context.Background()
	t0 := time.Date(2027, 3, 27, 19, 50, 0, 0, time.UTC)
	clk := clock.NewShifted(time.Until(t0))
	f.clk = clk
	f.smsSrv = fakesms.New(fakesms.WithClock(clk))
	hs := httptest.NewServer(f.smsSrv)
	t.Cleanup(hs.Close)
	f.smsURL = hs.URL
	_, err := f.db.Pool.Exec(ctx, `INSERT INTO nudge_send_windows (tenant, channel, window_open, window_close) VALUES ('*', 'sms', '08:00', '21:00')`)
	require.NoError(t, err)
	smsWindow, err := localtime.ParseWindow("08:00-21:00")
	require.NoError(t, err)

	const total = 2000
	var reqs []intake.Request
	for i := range total {
		now := clk.Now()
		r := intake.Request{
			Tenant: fmt.Sprintf("tenant-%d", i%3), Key: fmt.Sprintf("window:%d", i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415555%04d", i), Template: "course-expiry", TZ: windowZones[i%len(windowZones)],
			DueAt: now.Add(-time.Minute), Deadline: now.Add(2 * time.Hour),
		}
		if (i/len(windowZones))%2 == 1 { // half of each zone's
			r.Deadline = now.Add(24 * time.Hour)
		}
		reqs = append(reqs, r)
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}
	// The fleet's clock is months ahead of the database's: these reminders
	// were left lazy (due beyond intake's horizon on the database's clock),
	// and the dispatcher's promoter never promotes past that clock. Real time
	// would have brought them within its reach; the test moves time instead.
	f.db.PromoteUntil(t, clk.Now().Add(time.Hour))

	// 19:50 UTC: the dispatcher claims what is open (Stockholm until 20:00
	// UTC), moves what opens before its deadline to the opening and expires
	// the rest; no worker runs yet.
	sum, err := f.dispatcher("dispatcher-a").RunOnce(ctx)
	require.NoError(t, err)
	t.Logf("first claim: %+v", sum)
	// 20:05 UTC: Stockholm's window closed with its messages in the queue.
	clk.Advance(15 * time.Minute)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		f.startWorker(t, runCtx, reminder.SMS, fmt.Sprint("sms-", i), &wg)
	}
	d := f.dispatcher("dispatcher-b")
	wg.Go(func() { _ = d.Loop(runCtx, 200*time.Millisecond) })
	rec := &reconcile.Reconciler{Enqueuer: f.enqueuer("reconciler"), Config: reconcile.Config{Overdue: 30 * time.Second}, Log: f.log}
	wg.Go(func() { _ = rec.Loop(runCtx, 200*time.Millisecond) })
	defer func() { stop(); wg.Wait() }()

	f.waitQuiet(t, clk)
	// 21:05 UTC: Lord Howe's Sunday morning (08:05 +11).
	clk.Advance(time.Hour)
	f.waitQuiet(t, clk)
	// Sunday 06:30 UTC, across Europe's spring-forward: 08:30 in Stockholm
	// (CEST), 09:30 in Helsinki, 15:30 in Tokyo, 12:00 in Kolkata.
	clk.Advance(9*time.Hour + 25*time.Minute)
	f.waitQuiet(t, clk)
	// Past every deadline: what is left expires.
	clk.Advance(15 * time.Hour)
	f.waitTerminal(t, 30*time.Second)
	stop()
	wg.Wait()

	// The provider's own record: one accepted message per delivered
	// reminder, each inside 08:00-21:00 in the recipient's zone, after it was
	// due and before its deadline.
	accepted := map[string][]time.Time{}
	for _, m := range f.smsSrv.Messages() {
		accepted[m.IdempotencyKey] = append(accepted[m.IdempotencyKey], m.AcceptedAt)
	}
	rows, err := f.db.Pool.Query(ctx, `SELECT r.id, s.state, r.idempotency_key, s.tz, coalesce(s.requested_due_at, s.due_at),
		s.deadline, e.code, e.at
		FROM reminders r JOIN reminder_state s ON s.id = r.id
		CROSS JOIN LATERAL (SELECT e.code, e.at FROM reminder_timeline e WHERE e.reminder_id = r.id ORDER BY e.seq DESC LIMIT 1) e`)
	require.NoError(t, err)
	byOutcome := map[string]int{}
	byZone := map[string]map[string]int{}
	n := 0
	for rows.Next() {
		var (
			id            int64
			state, idem   string
			tz            string
			due, deadline time.Time
			code          *string
			last          time.Time
		)
		require.NoError(t, rows.Scan(&id, &state, &idem, &tz, &due, &deadline, &code, &last))
		n++
		loc, err := localtime.LoadZone(tz)
		require.NoError(t, err)
		outcome := state
		if code != nil {
			outcome += "/" + *code
		}
		byOutcome[outcome]++
		if byZone[tz] == nil {
			byZone[tz] = map[string]int{}
		}
		byZone[tz][outcome]++
		switch reminder.State(state) {
		case reminder.Delivered:
			require.Len(t, accepted[idem], 1, "reminder %d (%s) accepted %d times", id, tz, len(accepted[idem]))
			at := accepted[idem][0]
			require.True(t, localtime.Open(smsWindow, loc, at), "reminder %d sent at %s, %s in %s: outside 08:00-21:00",
				id, at.UTC().Format(time.RFC3339), at.In(loc).Format("Mon 15:04 MST"), tz)
			require.False(t, at.Before(due), "reminder %d sent at %s before due %s", id, at, due)
			require.True(t, at.Before(deadline), "reminder %d sent at %s, deadline %s", id, at, deadline)
		case reminder.Expired:
			require.Empty(t, accepted[idem], "expired reminder %d was sent", id)
			require.NotNil(t, code)
			require.Equal(t, string(reminder.CodeNoWindowBeforeDeadline), *code,
				"reminder %d (%s, deadline %s) expired, but not for want of a window", id, tz, deadline.In(loc))
			// And indeed no opening was left before the deadline when it expired.
			require.Equal(t, localtime.Expire, localtime.Decide(smsWindow, loc, last, deadline, 0).Verdict,
				"reminder %d (%s), expired at %s: a window opens before its deadline %s", id, tz, last.In(loc), deadline.In(loc))
		default:
			t.Fatalf("reminder %d ended %s", id, state)
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, total, n)
	t.Logf("outcomes: %v", byOutcome)
	t.Logf("by zone: %v", byZone)
	// Every reminder with a day to go was sent. The short ones (two hours) of
	// the zones closed until after their deadline (Helsinki, Tokyo, Kolkata,
	// and Stockholm, whose window closed while they waited in the queue)
	// expired as no_window_before_deadline, some by the claim, Stockholm's by
	// a worker; everywhere else they were sent too.
	perZone := total / len(windowZones)
	shortClosed := map[string]bool{"Europe/Stockholm": true, "Europe/Helsinki": true, "Asia/Tokyo": true, "Asia/Kolkata": true}
	for _, tz := range windowZones {
		want := map[string]int{"delivered/delivered": perZone}
		if shortClosed[tz] {
			want = map[string]int{"delivered/delivered": perZone / 2, "expired/no_window_before_deadline": perZone / 2}
		}
		require.Equal(t, want, byZone[tz], tz)
	}
	var byWorker int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_timeline
		WHERE code = 'no_window_before_deadline' AND from_state = 'enqueued'`).Scan(&byWorker))
	require.Equal(t, perZone/2, byWorker, "Stockholm's expired in the worker, after its window closed")
	var moved int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE requested_due_at IS NOT NULL`).Scan(&moved))
	require.Positive(t, moved, "the claim moved closed windows' reminders to their openings")
}

// waitQuiet waits until nothing due at the clock's time is left undone: no
// pending row due, no enqueued, retrying or sending row whose time has come
// (a row deferred to its window's opening waits for it).
func (f *fleet) waitQuiet(t *testing.T, clk clock.Clock) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var busy int
		require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM reminder_state
			WHERE (state = 'pending' AND due_at <= $1)
			   OR (state IN ('leased', 'enqueued') AND enqueued_at <= $1)
			   OR (state = 'retrying' AND next_attempt_at <= $1)
			   OR state = 'sending'`, clk.Now()).Scan(&busy))
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reminders still due at %s after 30 s", busy, clk.Now().UTC())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
