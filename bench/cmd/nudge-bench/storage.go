package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/retention"
)

// Storage per reminder over the retention windows (docs/deploy.md's
// capacity figures): after the headline end-to-end run has delivered every
// reminder, the run's tables are compacted and measured, then the
// reconciler's retention pass (internal/retention, default windows) runs
// with its clock moved past each window in turn, and they are measured
// again. What a delivered reminder occupies while it is young, once its
// payload is gone, once only its events remain, and after.

// storageStage is the schema's footprint at one age of the delivered reminders.
type storageStage struct {
	Age     string
	Bytes   map[string]int64 // by table: heap, TOAST and indexes
	Total   int64
	Removed int64 // rows the retention passes changed or removed to reach it
}

type storageResult struct {
	N       int
	Payload float64 // average stored bytes of data and recipient
	Stages  []storageStage
	Tables  []string // every table that held bytes at some stage, in name order
}

// measureStorage runs on the schema of a finished run, whose n reminders are
// all terminal, and leaves its rows behind retention: call it last.
func measureStorage(ctx context.Context, s *nudgeSetup, n int) (storageResult, error) {
	res := storageResult{N: n}
	if err := s.pool.QueryRow(ctx, stmt("PayloadBytes")).Scan(&res.Payload); err != nil {
		return res, fmt.Errorf("payload size: %w", err)
	}
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return res, err
	}
	defer conn.Close(ctx)
	cfg := retention.Config{}.WithDefaults()
	clk := clock.NewFake(time.Now())
	cleaner := retention.New(conn, cfg, clk)
	start := clk.Now()
	// Only the run's own tables are compacted: a database-wide VACUUM FULL
	// would lock and rewrite whatever else the server holds.
	tables, err := schemaTables(ctx, s)
	if err != nil {
		return res, err
	}
	seen := map[string]bool{}
	stages := []struct {
		age   string
		after time.Duration
	}{
		{"delivered, within the payload window (" + days(cfg.PayloadAfter) + ")", 0},
		{"payload purged, until the reminder window (" + days(cfg.ReminderAfter) + ")", cfg.PayloadAfter},
		{"reminder deleted, its events kept until the event window (" + days(cfg.EventAfter) + ")", cfg.ReminderAfter},
		{"after the event window", cfg.EventAfter},
	}
	for _, st := range stages {
		var removed int64
		if st.after > 0 {
			clk.Set(start.Add(st.after + time.Hour))
			for range 10_000 { // a pass is bounded; run them until one finds nothing
				sum, err := cleaner.Pass(ctx)
				if err != nil {
					return res, fmt.Errorf("retention pass at %s: %w", st.age, err)
				}
				removed += sum.Total()
				if sum.Total() == 0 {
					break
				}
			}
		}
		stage := storageStage{Age: st.age, Bytes: map[string]int64{}, Removed: removed}
		for _, t := range tables {
			if _, err := s.pool.Exec(ctx, "VACUUM FULL "+pgx.Identifier{t}.Sanitize()); err != nil {
				return res, fmt.Errorf("compacting %s: %w", t, err)
			}
		}
		rows, err := s.pool.Query(ctx, stmt("StorageByTable"))
		if err != nil {
			return res, err
		}
		var name string
		var size int64
		if _, err := pgx.ForEachRow(rows, []any{&name, &size}, func() error {
			stage.Bytes[name] = size
			stage.Total += size
			return nil
		}); err != nil {
			return res, err
		}
		res.Stages = append(res.Stages, stage)
		for t := range stage.Bytes {
			seen[t] = true
		}
	}
	for t := range seen {
		res.Tables = append(res.Tables, t)
	}
	slices.Sort(res.Tables)
	return res, nil
}

// schemaTables names the tables of the run's schema.
func schemaTables(ctx context.Context, s *nudgeSetup) ([]string, error) {
	rows, err := s.pool.Query(ctx, stmt("StorageByTable"))
	if err != nil {
		return nil, err
	}
	var names []string
	var name string
	var size int64
	_, err = pgx.ForEachRow(rows, []any{&name, &size}, func() error {
		names = append(names, name)
		return nil
	})
	return names, err
}

func days(d time.Duration) string { return fmt.Sprintf("%d days", int(d/(24*time.Hour))) }
