package localtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// agreementYears is the range every zone is compared over; zones that changed
// their rules before it are compared over the years of the change too.
var (
	agreementFrom = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	agreementTo   = time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	extraYears    = map[string][2]int{
		"Europe/Moscow":     {2010, 2015}, // permanent +4 in 2011, +3 in 2014
		"Europe/Volgograd":  {2018, 2019}, // +4 in 2018 (back to +3 in 2020, in range)
		"America/Sao_Paulo": {2017, 2019}, // dropped DST in 2019
		"Pacific/Apia":      {2011, 2012}, // skipped 30 December 2011
	}
)

// transition is a change of a zone's UTC offset at an instant.
type transition struct {
	at            time.Time
	before, after time.Duration
}

// transitionsOf finds loc's offset changes in [from, to) by sampling daily
// and bisecting to the second (time.Time.ZoneBounds is not trusted: see
// Resolve).
func transitionsOf(loc *time.Location, from, to time.Time) []transition {
	var out []transition
	prev := offsetOf(from.In(loc))
	for a := from; a.Before(to); a = a.Add(24 * time.Hour) {
		b := a.Add(24 * time.Hour)
		off := offsetOf(b.In(loc))
		if off == prev {
			continue
		}
		lo, hi := a, b
		for hi.Sub(lo) > time.Second {
			m := lo.Add(hi.Sub(lo) / 2).Truncate(time.Second)
			if offsetOf(m.In(loc)) == prev {
				lo = m
			} else {
				hi = m
			}
		}
		out = append(out, transition{at: hi, before: prev, after: off})
		prev = off
	}
	return out
}

// zoneTransitions is every transition of loc over the compared years.
func zoneTransitions(name string, loc *time.Location) []transition {
	trs := transitionsOf(loc, agreementFrom, agreementTo)
	if y, ok := extraYears[name]; ok {
		trs = append(transitionsOf(loc, time.Date(y[0], 1, 1, 0, 0, 0, 0, time.UTC),
			time.Date(y[1]+1, 1, 1, 0, 0, 0, 0, time.UTC)), trs...)
	}
	return trs
}

// probeWalls are the wall times compared in a zone: around both readings of
// each transition (T+before and T+after), and noon of ordinary days,
// including the last day of each year (where time.Time.ZoneBounds lies).
func probeWalls(name string, trs []transition) []time.Time {
	var out []time.Time
	for _, tr := range trs {
		for _, center := range []time.Time{tr.at.Add(tr.before), tr.at.Add(tr.after)} {
			for _, m := range []int{-90, -60, -30, -1, 0, 1, 30, 59, 60, 90} {
				out = append(out, center.Add(time.Duration(m)*time.Minute))
			}
		}
	}
	years := [][2]int{{agreementFrom.Year(), agreementTo.Year() - 1}}
	if y, ok := extraYears[name]; ok {
		years = append(years, y)
	}
	for _, yy := range years {
		for y := yy[0]; y <= yy[1]; y++ {
			for _, md := range [][2]int{{1, 1}, {4, 1}, {7, 1}, {10, 1}, {12, 31}} {
				out = append(out, time.Date(y, time.Month(md[0]), md[1], 12, 0, 0, 0, time.UTC))
			}
		}
	}
	return out
}

type agreement struct {
	ctx   context.Context
	tx    pgx.Tx
	zones []string // nudge_time_zones
}

// setupAgreement migrates a schema and opens a transaction whose session
// TimeZone is an odd one, to show the functions do not depend on it.
func setupAgreement(t *testing.T) *agreement {
	t.Helper()
	db := testenv.Postgres(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `SET LOCAL TimeZone = 'Pacific/Chatham'`)
	require.NoError(t, err)
	a := &agreement{ctx: ctx, tx: tx}
	rows, err := tx.Query(ctx, `SELECT name FROM nudge_time_zones ORDER BY name`)
	require.NoError(t, err)
	a.zones, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Greater(t, len(a.zones), 400, "nudge_time_zones is filled from pg_timezone_names")
	return a
}

// pgOffsets returns PostgreSQL's offsets of zone at the instants.
func (a *agreement) pgOffsets(t *testing.T, zone string, at []time.Time) []time.Duration {
	t.Helper()
	rows, err := a.tx.Query(a.ctx, `
		SELECT extract(epoch FROM (t AT TIME ZONE $1) - (t AT TIME ZONE 'UTC'))::bigint
		  FROM unnest($2::timestamptz[]) WITH ORDINALITY AS x(t, i) ORDER BY i`, zone, at)
	require.NoError(t, err)
	secs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	out := make([]time.Duration, len(secs))
	for i, s := range secs {
		out[i] = time.Duration(s) * time.Second
	}
	return out
}

// zoneDatabasesDiffer reports the first instant, over the compared years, at
// which Go's loc and PostgreSQL's zone have different offsets: at noon UTC of
// every day and either side of each of Go's transitions.
func (a *agreement) zoneDatabasesDiffer(t *testing.T, zone string, loc *time.Location, trs []transition) (string, bool) {
	t.Helper()
	var at []time.Time
	for d := agreementFrom.Add(12 * time.Hour); d.Before(agreementTo); d = d.Add(24 * time.Hour) {
		at = append(at, d)
	}
	for _, tr := range trs {
		at = append(at, tr.at.Add(-time.Second), tr.at)
	}
	pg := a.pgOffsets(t, zone, at)
	for i, x := range at {
		if goOff := offsetOf(x.In(loc)); goOff != pg[i] {
			return fmt.Sprintf("at %s Go's offset is %s, PostgreSQL's %s", x.Format(time.RFC3339), goOff, pg[i]), true
		}
	}
	return "", false
}

// PostgreSQL's nudge_resolve_local gives the instant Go's Resolve gives, for
// every zone both know, at wall times around every transition of 2020-2030
// (and the years zones changed their rules), with both of Go's zone
// databases. A zone where they disagree is excused only if the zone databases
// themselves differ there (different tzdata versions); it is logged. The
// transitions are also checked to be at least 48 hours apart, which
// nudge_resolve_local assumes.
func TestPostgresResolvesAsGo(t *testing.T) {
	t.Parallel()
	a := setupAgreement(t)
	sources := zoneSources()
	var (
		zones, walls []string
		probes       []localtime.Wall
		locs         = map[string][]*time.Location{} // per source
		trans        = map[string][][]transition{}
	)
	for _, name := range a.zones {
		for _, src := range sources {
			loc := src.load(t, name)
			trs := zoneTransitions(name, loc)
			locs[name] = append(locs[name], loc)
			trans[name] = append(trans[name], trs)
			for i := 1; i < len(trs); i++ {
				if gap := trs[i].at.Sub(trs[i-1].at); gap < 48*time.Hour {
					t.Errorf("%s (%s): transitions at %s and %s are %s apart; nudge_resolve_local assumes 48 hours",
						name, src.name, trs[i-1].at, trs[i].at, gap)
				}
			}
		}
		// Probes from the last source's transitions (Go's own database).
		for _, u := range probeWalls(name, trans[name][len(sources)-1]) {
			w := localtime.WallOf(u)
			zones = append(zones, name)
			walls = append(walls, w.String())
			probes = append(probes, w)
		}
	}
	start := time.Now()
	rows, err := a.tx.Query(a.ctx, `
		SELECT nudge_resolve_local(w::timestamp, z)
		  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(z, w, i) ORDER BY i`, zones, walls)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	require.Len(t, got, len(probes))
	elapsed := time.Since(start)

	for s, src := range sources {
		bad := map[string][]string{}
		for i, w := range probes {
			loc := locs[zones[i]][s]
			if want := localtime.Resolve(w, loc); !got[i].Equal(want) {
				bad[zones[i]] = append(bad[zones[i]], fmt.Sprintf("%s: Go %s, PostgreSQL %s",
					walls[i], want.Format(time.RFC3339), got[i].In(loc).Format(time.RFC3339)))
			}
		}
		excused := 0
		for zone, diffs := range bad {
			if why, differ := a.zoneDatabasesDiffer(t, zone, locs[zone][s], trans[zone][s]); differ {
				excused++
				t.Logf("%s %s: the zone databases differ (%s); %d of its comparisons disagree and are excused",
					src.name, zone, why, len(diffs))
				continue
			}
			t.Errorf("%s %s: Go and PostgreSQL resolve differently though their offsets agree:\n  %s",
				src.name, zone, strings.Join(diffs[:min(len(diffs), 5)], "\n  "))
		}
		t.Logf("%s: %d zones, %d wall times agree (PostgreSQL took %s); %d zones excused", src.name,
			len(a.zones)-len(bad), len(probes), elapsed.Round(time.Millisecond), excused)
	}
}

// The windows agree too, on a sample of zones and windows at instants around
// each transition.
func TestPostgresWindowsAsGo(t *testing.T) {
	t.Parallel()
	a := setupAgreement(t)
	sample := []string{"Europe/Stockholm", "America/New_York", "Australia/Lord_Howe", "America/Santiago",
		"America/Sao_Paulo", "Europe/Moscow", "Pacific/Apia", "Asia/Kolkata", "Asia/Tehran", "Pacific/Chatham",
		"Africa/Casablanca", "America/Havana", "UTC"}
	for i := 0; i < len(a.zones); i += 40 {
		sample = append(sample, a.zones[i])
	}
	windows := []string{"any", "08:00-21:00", "mon-fri 09:00-17:00", "21:00-08:00", "fri 22:00-02:00",
		"02:30-05:00", "01:45-02:15", "00:00-01:00", "sat,sun", "23:30-00:30", "sun 00:30-03:30"}
	sources := zoneSources()
	type probe struct {
		zone string
		w    localtime.Window
		at   time.Time
	}
	var (
		probes               []probe
		zones, opens, closes []string
		days                 []int32
		at                   []time.Time
	)
	for _, name := range sample {
		loc := sources[len(sources)-1].load(t, name)
		trs := transitionsOf(loc, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC))
		if y, ok := extraYears[name]; ok {
			trs = append(trs, transitionsOf(loc, time.Date(y[0], 1, 1, 0, 0, 0, 0, time.UTC),
				time.Date(y[1]+1, 1, 1, 0, 0, 0, 0, time.UTC))...)
		}
		var instants []time.Time
		for _, tr := range trs {
			for k := -12; k <= 12; k++ {
				instants = append(instants, tr.at.Add(time.Duration(k)*40*time.Minute))
			}
		}
		for d := range 10 {
			instants = append(instants, time.Date(2027, 6, 10+d, 7*d%24, 0, 0, 0, time.UTC))
		}
		for _, ws := range windows {
			w := window(t, ws)
			open := ""
			if !w.IsAnyTime() {
				open = w.Opens().String()
			}
			for _, x := range instants {
				probes = append(probes, probe{name, w, x})
				zones, opens, closes = append(zones, name), append(opens, open), append(closes, w.Closes().String())
				days, at = append(days, int32(w.Days())), append(at, x)
			}
		}
	}
	start := time.Now()
	type answer struct {
		open bool
		next time.Time
	}
	rows, err := a.tx.Query(a.ctx, `
		SELECT nudge_window_open(nullif(o, '')::time, c::time, d, z, t),
		       nudge_next_opening(nullif(o, '')::time, c::time, d, z, t)
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::timestamptz[])
		       WITH ORDINALITY AS x(z, o, c, d, t, i)
		 ORDER BY i`, zones, opens, closes, days, at)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (answer, error) {
		var a answer
		return a, row.Scan(&a.open, &a.next)
	})
	require.NoError(t, err)
	require.Len(t, got, len(probes))
	elapsed := time.Since(start)

	for _, src := range sources {
		locs := map[string]*time.Location{}
		failures := 0
		for i, p := range probes {
			loc, ok := locs[p.zone]
			if !ok {
				loc = src.load(t, p.zone)
				locs[p.zone] = loc
			}
			open, next := localtime.Open(p.w, loc, p.at), localtime.NextOpening(p.w, loc, p.at)
			if open != got[i].open || !next.Equal(got[i].next) {
				if failures++; failures <= 10 {
					t.Errorf("%s %s window %q at %s: Go open=%v next=%s, PostgreSQL open=%v next=%s",
						src.name, p.zone, p.w, p.at.Format(time.RFC3339),
						open, next.Format(time.RFC3339), got[i].open, got[i].next.In(loc).Format(time.RFC3339))
				}
			}
		}
		t.Logf("%s: %d zones × %d windows, %d instants, %d disagree (PostgreSQL took %s)", src.name, len(sample),
			len(windows), len(probes), failures, elapsed.Round(time.Millisecond))
	}
}

// nudge_valid_tz accepts exactly what LoadZone accepts, over every name the
// server's zone database lists and some that only look like zones.
func TestPostgresValidatesZonesAsGo(t *testing.T) {
	t.Parallel()
	a := setupAgreement(t)
	rows, err := a.tx.Query(a.ctx, `SELECT name FROM pg_timezone_names`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	names = append(names, "", "Local", " UTC", "Mars/Olympus_Mons", "../etc/passwd")
	rows, err = a.tx.Query(a.ctx, `SELECT nudge_valid_tz(n) FROM unnest($1::text[]) WITH ORDINALITY AS x(n, i) ORDER BY i`, names)
	require.NoError(t, err)
	valid, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	require.NoError(t, err)
	accepted := 0
	for i, name := range names {
		_, err := localtime.LoadZone(name)
		require.Equal(t, err == nil, valid[i], "%q: LoadZone says %v", name, err)
		if valid[i] {
			accepted++
		}
	}
	t.Logf("%d names, %d accepted", len(names), accepted)

	// Names PostgreSQL's AT TIME ZONE accepts but a reminder must not use.
	for _, name := range []string{"europe/stockholm", "CEST", "UTC+3", "posix/Europe/Stockholm", "Factory", "localtime"} {
		var ok bool
		require.NoError(t, a.tx.QueryRow(a.ctx, `SELECT nudge_valid_tz($1)`, name).Scan(&ok))
		require.False(t, ok, name)
	}
	var null *bool
	require.NoError(t, a.tx.QueryRow(a.ctx, `SELECT nudge_valid_tz(NULL)`).Scan(&null))
	require.NotNil(t, null)
	require.False(t, *null)
}
