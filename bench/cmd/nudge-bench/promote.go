package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/store"
)

// The scale tables are lazy (ScaleFill): no reminder has its state row
// until the promoter inserts it. Before the scrapes and the claims the
// promoter runs on each table as a dispatcher whose last pass ran before
// the table's reminders were written would run it on its return
// (dispatch.Dispatcher.RunOnce's promote): bounded passes of store.Promote
// up to the database's clock plus H, until its sweep completes, then a
// second sweep, which moves the final watermark over it (as a dispatcher's
// next run does; since schema 46 it re-reads only from the floors of the
// writers the first one waited for and that are gone: none here, so it
// reads nothing the first one read). So the watermark ends
// where a running dispatcher leaves it, and nudge_unpromoted_due (the
// scrape's read) reads the empty range a caught-up promoter leaves.

// promoteAhead and promoteLimit are the dispatcher's defaults
// (dispatch.Config's PromoteAhead and PromoteBatch).
const (
	promoteAhead = time.Hour
	promoteLimit = 5000
)

// promotion is what the promoter's passes did on one table.
type promotion struct {
	Passes []promotePass
}

// promotePass is one store.Promote call: its sweep (1 or 2), the rows of
// that sweep read before it (Offset: its sweep reads in due order, so the
// clustered set's rows come first), the rows it read and inserted, and its
// wall and backend CPU seconds (CPU -1 when the backend's
// /proc/<pid>/schedstat cannot be read).
type promotePass struct {
	Sweep          int
	Offset, Read   int
	Promoted       int64
	Sec, CPU       float64
	Final, Through time.Time
}

// promoterShare is one due set's share of a table's promotion: the state
// rows inserted for it, and the seconds of the passes that read its rows
// (each pass's time split by the rows it read of each set; a pass that
// read none, the one that completes a sweep, split evenly), in the first
// sweep and in the re-scan.
type promoterShare struct {
	Rows                  int64
	Sec, CPU              float64 // both sweeps
	FirstSec, RescanSec   float64
	FirstCPU, RescanCPU   float64
	CPUKnown              bool
	FirstRead, RescanRead int
}

// share is set k's share (0: clustered, 1: spread, each perSet rows, in
// that due order) of the promotion.
func (p promotion) share(perSet, k int) promoterShare {
	var out promoterShare
	out.CPUKnown = true
	lo, hi := k*perSet, (k+1)*perSet
	for _, x := range p.Passes {
		f := 0.5
		if x.Read > 0 {
			n := min(hi, x.Offset+x.Read) - max(lo, x.Offset)
			f = float64(max(0, n)) / float64(x.Read)
			if x.Sweep == 1 {
				out.FirstRead += max(0, n)
				out.Rows += int64(float64(x.Promoted) * f)
			} else {
				out.RescanRead += max(0, n)
			}
		}
		if x.CPU < 0 {
			out.CPUKnown = false
		}
		if x.Sweep == 1 {
			out.FirstSec += f * x.Sec
			out.FirstCPU += f * x.CPU
		} else {
			out.RescanSec += f * x.Sec
			out.RescanCPU += f * x.CPU
		}
	}
	out.Sec, out.CPU = out.FirstSec+out.RescanSec, out.FirstCPU+out.RescanCPU
	return out
}

// promoteTables runs the promoter on each table until its second sweep
// completes, one pass on each in turn (the first table first on even
// turns), so both see the same moments of a busy machine, and checks what
// it left: every due reminder with its pending state row, no other state
// row, the final watermark past the due sets.
func promoteTables(ctx context.Context, tables []*scaleTable) ([]promotion, error) {
	type side struct {
		t      *scaleTable
		pool   *pgxpool.Pool
		st     *store.Store
		pid    int
		until  time.Time
		sweep  int
		offset int
		done   bool
	}
	sides := make([]*side, len(tables))
	defer func() {
		for _, s := range sides {
			if s != nil && s.pool != nil {
				s.pool.Close()
			}
		}
	}()
	for i, t := range tables {
		// One connection, so the passes' backend is one process whose CPU
		// /proc tells.
		cfg := t.pool.Config().Copy()
		cfg.MaxConns, cfg.MinConns = 1, 0
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("promoting: %w", err)
		}
		s := &side{t: t, pool: pool, st: store.New(pool), sweep: 1}
		sides[i] = s
		if _, err := pool.Exec(ctx, stmt("ScalePromoterFrom"), pgx.NamedArgs{"from": t.now.Add(-24 * time.Hour)}); err != nil {
			return nil, fmt.Errorf("promoting: setting the watermark: %w", err)
		}
		var dbNow time.Time
		if err := pool.QueryRow(ctx, stmt("DatabaseClock")).Scan(&dbNow); err != nil {
			return nil, fmt.Errorf("promoting: %w", err)
		}
		s.until = dbNow.Add(promoteAhead)
		if err := pool.QueryRow(ctx, stmt("BackendPID")).Scan(&s.pid); err != nil {
			return nil, fmt.Errorf("promoting: %w", err)
		}
	}
	out := make([]promotion, len(tables))
	for turn := 0; ; turn++ {
		busy := false
		for k := range sides {
			i := inTurn(turn, k, len(sides))
			s := sides[i]
			if s.done {
				continue
			}
			busy = true
			c0 := backendCPU(s.pid)
			t0 := time.Now()
			p, err := s.st.Promote(ctx, s.until, promoteAhead, promoteLimit)
			sec := time.Since(t0).Seconds()
			c1 := backendCPU(s.pid)
			if err != nil {
				return nil, fmt.Errorf("promoting: %w", err)
			}
			cpu := -1.0
			if c0 >= 0 && c1 >= 0 {
				cpu = c1 - c0
			}
			out[i].Passes = append(out[i].Passes, promotePass{Sweep: s.sweep, Offset: s.offset, Read: p.Read,
				Promoted: p.Promoted, Sec: sec, CPU: cpu, Final: p.Final, Through: p.Through})
			s.offset += p.Read
			if p.SweepDone {
				s.sweep++
				s.offset = 0
			}
			if s.sweep > 2 {
				s.done = true
			}
			if len(out[i].Passes) > 1000 {
				return nil, fmt.Errorf("promoting: still not done after %d passes", len(out[i].Passes))
			}
		}
		if !busy {
			break
		}
	}
	for i, s := range sides {
		if err := checkPromoted(ctx, s.t); err != nil {
			return nil, err
		}
		if out[i].rows() != int64(s.t.due) {
			return nil, fmt.Errorf("promoting: %d state rows inserted, want %d", out[i].rows(), s.t.due)
		}
	}
	return out, nil
}

// rows are the state rows the passes inserted.
func (p promotion) rows() int64 {
	var n int64
	for _, x := range p.Passes {
		n += x.Promoted
	}
	return n
}

// checkPromoted fails unless t holds exactly its due sets' state rows,
// pending, no lazy reminder due by its cutoff without one, the final
// watermark past its cutoff and nudge_unpromoted_due finding nothing due.
func checkPromoted(ctx context.Context, t *scaleTable) error {
	var states, pending, missing, unpromoted int64
	var final time.Time
	if err := t.pool.QueryRow(ctx, stmt("ScalePromoted"), pgx.NamedArgs{"now": t.now}).
		Scan(&states, &pending, &missing, &final, &unpromoted); err != nil {
		return fmt.Errorf("promoting: reading what it left: %w", err)
	}
	if states != int64(t.due) || pending != int64(t.due) || missing != 0 || unpromoted != 0 || !final.After(t.now) {
		return fmt.Errorf("promoting: %d state rows, %d pending and due, %d due without one, %d unpromoted by the gauges' read, final watermark %s; want %d, %d, 0, 0, after %s",
			states, pending, missing, unpromoted, final, t.due, t.due, t.now)
	}
	return nil
}

// backendCPU is the CPU time of process pid (a PostgreSQL backend), in
// seconds, from /proc/<pid>/schedstat (nanoseconds); -1 if unreadable.
func backendCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return -1
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return -1
	}
	return float64(ns) / 1e9
}
