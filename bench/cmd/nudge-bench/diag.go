package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/sqlfile"
)

// statementOf names a Nudge statement from its text (the store's queries
// reach PostgreSQL without their "-- name:" line).
func statementOf(q string) string {
	switch {
	case strings.Contains(q, "WITH due AS"), strings.Contains(q, "WITH RECURSIVE tenants"):
		return "ClaimDue"
	case strings.Contains(q, "INSERT INTO publish_confirms"):
		return "ConfirmPublished"
	case strings.Contains(q, "SELECT id, tenant, channel, recipient, template, data"):
		return "LoadForDelivery"
	case strings.Contains(q, "SET state = 'sending'"):
		return "ClaimAttempts"
	case strings.Contains(q, "WITH o AS"): // the text is cut at track_activity_query_size
		return "RecordOutcomes"
	case strings.Contains(q, "WITH raw AS MATERIALIZED"):
		return "ScheduleMany (seeding, before the clock starts)"
	case strings.Contains(q, "SELECT count(*) FROM reminders"), strings.Contains(q, "SELECT count(*) FROM reminder_state"):
		return "(harness poll)"
	case q == "":
		return "(none)"
	}
	j := strings.Join(strings.Fields(q), " ")
	return "other: " + j[:min(60, len(j))]
}

// sampleActivity samples pg_stat_activity every 5 ms until ctx ends and
// counts active backends by statement and wait event: a sampling profile of
// where PostgreSQL spends the run.
func sampleActivity(ctx context.Context, e *env) func() map[string]int {
	counts := map[string]int{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := pgx.Connect(ctx, e.dbURL)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			rows, err := conn.Query(ctx, stmt("ActiveBackends"))
			if err != nil {
				return
			}
			for rows.Next() {
				var q, w string
				if rows.Scan(&q, &w) == nil {
					mu.Lock()
					counts[statementOf(q)+" | "+w]++
					mu.Unlock()
				}
			}
			rows.Close()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return func() map[string]int { <-done; mu.Lock(); defer mu.Unlock(); return counts }
}

// diagnose seeds n reminders, runs EXPLAIN ANALYZE on the dispatcher's two
// statements (rolled back), then one end-to-end run with k workers while
// sampling pg_stat_activity, and prints both.
func diagnose(ctx context.Context, e *env, n, k int) error {
	src, err := os.ReadFile("../internal/store/queries.sql")
	if err != nil {
		return err
	}
	qs := sqlfile.Parse("queries.sql", string(src))
	s, err := setupNudge(ctx, e, n, nil)
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		s.cleanup()
		return err
	}
	now := time.Now()
	explain := func(name string, args pgx.NamedArgs) error {
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, WAL) "+qs.Get(name), args)
		if err != nil {
			return err
		}
		fmt.Printf("\n== EXPLAIN ANALYZE %s\n", name)
		for rows.Next() {
			var l string
			_ = rows.Scan(&l)
			fmt.Println(l)
		}
		return rows.Err()
	}
	err = explain("ClaimDue", pgx.NamedArgs{"now": now, "cutoff": now, "limit": 500, "lease_until": now.Add(time.Minute), "actor": "diag"})
	if err == nil {
		var ids, fences []int64
		rows, _ := tx.Query(ctx, stmt("EnqueuedSample"))
		for rows.Next() {
			var id, f int64
			_ = rows.Scan(&id, &f)
			ids, fences = append(ids, id), append(fences, f)
		}
		rows.Close()
		err = explain("ClaimForDelivery", pgx.NamedArgs{"now": now, "channel": "sms", "ids": ids, "fences": fences,
			"lease_until": now.Add(time.Minute), "actor": "diag"})
	}
	_ = tx.Rollback(ctx)
	s.cleanup()
	if err != nil {
		return err
	}

	sctx, stop := context.WithCancel(ctx)
	result := sampleActivity(sctx, e)
	res, err := nudgeE2E(ctx, e, n, k, "", false, nil)
	stop()
	counts := result()
	if err != nil {
		return err
	}
	fmt.Printf("\n== pg_stat_activity samples during e2e, %d workers (%.0f reminders/s)\n", k, res.Rate)
	type kv struct {
		k string
		v int
	}
	var l []kv
	total := 0
	for k, v := range counts {
		l = append(l, kv{k, v})
		total += v
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	for _, x := range l {
		fmt.Printf("%6d %5.1f%%  %s\n", x.v, 100*float64(x.v)/float64(total), x.k)
	}
	return nil
}
