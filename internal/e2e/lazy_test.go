package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// TestLazyRemindersDeliveredOnceDue: with lazy intake on (schema 44),
// reminders scheduled three hours ahead through the public intake get no
// state row; a dispatcher run then promotes and claims none of them. Three
// hours later (the fleet's clock moves; testenv's PromoteUntil does what the
// promoter's passes would have done as real time passed) the dispatcher and
// two workers deliver each one exactly once, by the provider's own record,
// never before it was due. Fails without 44 (they get their state rows at
// intake).
func TestLazyRemindersDeliveredOnceDue(t *testing.T) {
	t.Parallel()
	clk := clock.NewShifted(0)
	f := newSMSFleet(t, fakesms.WithClock(clk))
	f.clk = clk
	ctx := context.Background()
	now := clk.Now()

	const n = 300
	reqs := make([]intake.Request, 0, n)
	for i := range n {
		due := now.Add(3*time.Hour + time.Duration(i)*time.Second)
		reqs = append(reqs, intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%3), Key: fmt.Sprintf("lazy:%d", i),
			Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415555%04d", i), Template: "course-expiry",
			Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: due.Add(time.Hour)})
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}
	var lazy int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders r
		WHERE r.lazy AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)`).Scan(&lazy))
	require.Equal(t, n, lazy, "due in 3 h: no state row at intake")

	sum, err := f.dispatcher("dispatcher-a").RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, sum.Promoted, "not within the promoter's hour yet")
	require.Zero(t, sum.Enqueued)

	clk.Advance(3*time.Hour + 10*time.Minute)
	f.db.PromoteUntil(t, clk.Now().Add(time.Hour))

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		f.startWorker(t, runCtx, reminder.SMS, fmt.Sprint("sms-", i), &wg)
	}
	d := f.dispatcher("dispatcher-b")
	wg.Go(func() { _ = d.Loop(runCtx, 200*time.Millisecond) })
	defer func() { stop(); wg.Wait() }()
	f.waitTerminal(t, 60*time.Second)
	stop()
	wg.Wait()

	accepted := map[string][]time.Time{}
	for _, m := range f.smsSrv.Messages() {
		accepted[m.IdempotencyKey] = append(accepted[m.IdempotencyKey], m.AcceptedAt)
	}
	rows := f.rows(t)
	require.Len(t, rows, n)
	for _, r := range rows {
		require.Equal(t, reminder.Delivered, r.state, "reminder %d (%s)", r.id, r.key)
		require.Len(t, accepted[r.idem], 1, "reminder %d accepted %d times", r.id, len(accepted[r.idem]))
		require.False(t, accepted[r.idem][0].Before(r.due), "reminder %d sent at %s, due %s", r.id, accepted[r.idem][0], r.due)
	}
}
