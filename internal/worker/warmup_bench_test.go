package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// BenchmarkConnWarmup measures what a worker connection's start costs
// PostgreSQL: NUDGE_BENCH_CONNS (default 4) fresh connections, one after the
// other, each running NUDGE_BENCH_ITERS (default 12) batches of the worker's
// two statements (ClaimForDelivery and RecordOutcomes, 50 reminders each),
// and reports the backend's CPU (from /proc, in 10 ms ticks, averaged over
// the connections) at connect and per batch: the first batches pay for the
// catalog caches, the statements' preparation and their custom plans, which
// every connection of every worker pays once.
//
//	NUDGE_BENCH_CONNS=8 NUDGE_BENCH_ITERS=14 CI=true go test ./internal/worker -run '^$' -bench ConnWarmup -benchtime 1x -v
func BenchmarkConnWarmup(b *testing.B) {
	ctx := context.Background()
	conns, iters := envInt("NUDGE_BENCH_CONNS", 4), envInt("NUDGE_BENCH_ITERS", 12)
	n := conns * iters * 50
	db := testenv.Postgres(b)
	due, deadline := time.Now().Add(-time.Minute), time.Now().Add(2*time.Hour)
	for off := 0; off < n; off += 2000 {
		var reqs []intake.Request
		for i := off; i < min(off+2000, n); i++ {
			reqs = append(reqs, intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("w:%d", i),
				Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
				Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: deadline})
		}
		if _, err := intake.ScheduleMany(ctx, db.Pool, reqs); err != nil {
			b.Fatal(err)
		}
	}
	st := store.New(db.Pool)
	var claimed []store.Claimed
	for len(claimed) < n {
		c, err := st.ClaimDue(ctx, time.Now(), time.Now(), 500, time.Minute, "bench")
		if err != nil || len(c) == 0 {
			b.Fatal(err, len(c))
		}
		claimed = append(claimed, c...)
	}
	b.ResetTimer()
	var sb strings.Builder
	next := 0
	perIter := make([]time.Duration, iters)
	var connect time.Duration
	for range conns {
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 1
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		c, err := p.Acquire(ctx) // connects
		if err != nil {
			b.Fatal(err)
		}
		pid := int(c.Conn().PgConn().PID())
		c.Release()
		cpu0 := procCPU(pid)
		connect += cpu0
		s := store.New(p)
		for i := range iters {
			batch := claimed[next : next+50]
			next += 50
			fs := make([]store.Fenced, len(batch))
			for j, r := range batch {
				fs[j] = store.Fenced{ID: r.ID, Fence: r.Fence}
			}
			before := procCPU(pid)
			now := time.Now()
			_, atts, err := s.ClaimForDelivery(ctx, now, reminder.SMS, "", fs, time.Minute, "bench-w")
			if err != nil || len(atts) != 50 {
				b.Fatal(err, len(atts))
			}
			var outs []store.Outcome
			for _, a := range atts {
				outs = append(outs, store.Outcome{ReminderID: a.ReminderID, Fence: a.Fence, AttemptID: a.AttemptID,
					Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered, ProviderID: "x"})
			}
			if _, err := s.RecordOutcomes(ctx, now, outs, "bench-w"); err != nil {
				b.Fatal(err)
			}
			perIter[i] += procCPU(pid) - before
		}
		p.Close()
	}
	fmt.Fprintf(&sb, "\nbackend CPU at connect (its start): %.1f ms per connection\n", connect.Seconds()*1000/float64(conns))
	for i, d := range perIter {
		fmt.Fprintf(&sb, "batch %2d (50 claims + 50 outcomes): %.2f ms per connection\n", i+1, d.Seconds()*1000/float64(conns))
	}
	b.Log(sb.String())
}
