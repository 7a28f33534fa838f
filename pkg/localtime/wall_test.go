package localtime_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/localtime"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := localtime.LoadZone(name)
	require.NoError(t, err)
	return loc
}

func utc(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}

func wall(t *testing.T, s string) localtime.Wall {
	t.Helper()
	w, err := localtime.ParseWall(s)
	require.NoError(t, err)
	return w
}

// Both transitions of Europe/Stockholm, America/New_York and
// Australia/Lord_Howe (a 30-minute shift) in 2027, zones that changed their
// rules, and a whole skipped day.
func TestResolve(t *testing.T) {
	t.Parallel()
	tests := []struct {
		zone, wall, want, why string
	}{
		{"Europe/Stockholm", "2027-01-15T12:00", "2027-01-15T11:00:00Z", "winter"},
		{"Europe/Stockholm", "2027-07-15T12:00", "2027-07-15T10:00:00Z", "summer"},
		{"Europe/Stockholm", "2027-03-28T01:59", "2027-03-28T00:59:00Z", "before the gap"},
		{"Europe/Stockholm", "2027-03-28T02:00", "2027-03-28T01:00:00Z", "gap start moves to 03:00"},
		{"Europe/Stockholm", "2027-03-28T02:30", "2027-03-28T01:30:00Z", "gap: 03:30 CEST"},
		{"Europe/Stockholm", "2027-03-28T02:59:59", "2027-03-28T01:59:59Z", "gap end"},
		{"Europe/Stockholm", "2027-03-28T03:00", "2027-03-28T01:00:00Z", "after the gap"},
		{"Europe/Stockholm", "2027-10-31T01:59", "2027-10-30T23:59:00Z", "before the overlap"},
		{"Europe/Stockholm", "2027-10-31T02:00", "2027-10-31T00:00:00Z", "overlap start: the CEST one"},
		{"Europe/Stockholm", "2027-10-31T02:30", "2027-10-31T00:30:00Z", "overlap: earlier (PostgreSQL's AT TIME ZONE says 01:30Z)"},
		{"Europe/Stockholm", "2027-10-31T02:59:59", "2027-10-31T00:59:59Z", "overlap end"},
		{"Europe/Stockholm", "2027-10-31T03:00", "2027-10-31T02:00:00Z", "after the overlap"},

		{"America/New_York", "2027-03-14T01:59", "2027-03-14T06:59:00Z", "before the gap"},
		{"America/New_York", "2027-03-14T02:00", "2027-03-14T07:00:00Z", "gap start"},
		{"America/New_York", "2027-03-14T02:30", "2027-03-14T07:30:00Z", "gap: 03:30 EDT"},
		{"America/New_York", "2027-03-14T03:00", "2027-03-14T07:00:00Z", "after the gap"},
		{"America/New_York", "2027-11-07T00:59", "2027-11-07T04:59:00Z", "before the overlap"},
		{"America/New_York", "2027-11-07T01:00", "2027-11-07T05:00:00Z", "overlap start: EDT"},
		{"America/New_York", "2027-11-07T01:30", "2027-11-07T05:30:00Z", "overlap: earlier, EDT"},
		{"America/New_York", "2027-11-07T01:59:59", "2027-11-07T05:59:59Z", "overlap end"},
		{"America/New_York", "2027-11-07T02:00", "2027-11-07T07:00:00Z", "after the overlap: EST"},

		{"Australia/Lord_Howe", "2027-04-04T01:29", "2027-04-03T14:29:00Z", "before the 30-minute overlap"},
		{"Australia/Lord_Howe", "2027-04-04T01:30", "2027-04-03T14:30:00Z", "overlap start: +11"},
		{"Australia/Lord_Howe", "2027-04-04T01:45", "2027-04-03T14:45:00Z", "overlap: earlier, +11"},
		{"Australia/Lord_Howe", "2027-04-04T02:00", "2027-04-03T15:30:00Z", "after the overlap: +10:30"},
		{"Australia/Lord_Howe", "2027-10-03T01:59", "2027-10-02T15:29:00Z", "before the 30-minute gap"},
		{"Australia/Lord_Howe", "2027-10-03T02:00", "2027-10-02T15:30:00Z", "gap start"},
		{"Australia/Lord_Howe", "2027-10-03T02:15", "2027-10-02T15:45:00Z", "gap: 02:45 +11"},
		{"Australia/Lord_Howe", "2027-10-03T02:30", "2027-10-02T15:30:00Z", "after the gap"},

		{"Europe/Moscow", "2014-10-26T01:30", "2014-10-25T21:30:00Z", "last fall-back (to permanent +3): earlier, +4"},
		{"Europe/Moscow", "2014-10-26T02:00", "2014-10-25T23:00:00Z", "after it"},
		{"Europe/Moscow", "2027-03-28T02:30", "2027-03-27T23:30:00Z", "no DST since 2011"},
		{"America/Sao_Paulo", "2018-11-04T00:30", "2018-11-04T03:30:00Z", "its last gap (midnight -3 to -2)"},
		{"America/Sao_Paulo", "2019-11-03T00:30", "2019-11-03T03:30:00Z", "no DST since 2019: plain -3"},
		{"Pacific/Apia", "2011-12-30T12:00", "2011-12-30T22:00:00Z", "a skipped day: 31 December 12:00 +14"},
		{"UTC", "2027-03-28T02:30", "2027-03-28T02:30:00Z", "no transitions"},
		{"Asia/Kolkata", "2027-03-28T02:30", "2027-03-27T21:00:00Z", "half-hour offset"},
	}
	for _, src := range zoneSources() {
		for _, tc := range tests {
			t.Run(src.name+" "+tc.zone+" "+tc.wall, func(t *testing.T) {
				t.Parallel()
				loc := src.load(t, tc.zone)
				got := localtime.Resolve(wall(t, tc.wall), loc)
				require.Equal(t, utc(t, tc.want), got.UTC(), "%s (got %s local)", tc.why, got.Format(time.RFC3339))
				require.Equal(t, loc, got.Location())
			})
		}
	}
}

// Every wall time of a day with a gap or an overlap resolves to an instant
// whose local clock shows it, or is in a gap and moves forward by the gap;
// and of two readings, the earlier is chosen.
func TestResolveMinuteByMinute(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ zone, day string }{
		{"Europe/Stockholm", "2027-03-28"}, {"Europe/Stockholm", "2027-10-31"},
		{"America/New_York", "2027-03-14"}, {"America/New_York", "2027-11-07"},
		{"Australia/Lord_Howe", "2027-04-04"}, {"Australia/Lord_Howe", "2027-10-03"},
		{"America/Santiago", "2027-04-04"}, {"America/Santiago", "2027-09-05"},
		{"America/Chicago", "2028-12-31"}, // regression: in time/tzdata's slim files ZoneBounds ends this period on 31 December 00:00 UTC, before the day
	} {
		for _, src := range zoneSources() {
			resolveDay(t, src, tc.zone, tc.day)
		}
	}
}

// resolveDay resolves every minute of day in zone and checks each answer.
func resolveDay(t *testing.T, src zoneSource, zoneName, day string) {
	t.Helper()
	loc := src.load(t, zoneName)
	midnight := wall(t, day+"T00:00")
	skipped := 0
	for m := range 24 * 60 {
		w := midnight
		w.Minute = m
		got := localtime.Resolve(w, loc)
		u := time.Date(w.Year, w.Month, w.Day, 0, m, 0, 0, time.UTC)
		where := src.name + " " + zoneName + " " + w.String()
		if localtime.WallOf(got) == localtime.WallOf(u) {
			// Shown: no earlier instant shows it too.
			for _, back := range []time.Duration{30 * time.Minute, time.Hour} {
				require.NotEqual(t, localtime.WallOf(u), localtime.WallOf(got.Add(-back)),
					"%s: %s is not the earlier reading", where, got)
			}
			continue
		}
		// Skipped: the clock jumped over it, from offset o1 to o2, and the
		// result reads w+(o2-o1), after the jump.
		skipped++
		gap := localDiff(got, u)
		require.Positive(t, gap, "%s: resolved to %s, which does not show it, outside a gap", where, got)
		require.Equal(t, gap, offsetOf(got)-offsetOf(got.Add(-gap)), "%s: the offset jumps by the gap", where)
		require.NotEqual(t, localtime.WallOf(u), localtime.WallOf(got.Add(-gap)), where)
	}
	wantSkipped := map[string]int{"2027-03-28": 60, "2027-03-14": 60, "2027-10-03": 30, "2027-09-05": 60}[day]
	require.Equal(t, wantSkipped, skipped, "%s %s %s: minutes in the gap", src.name, zoneName, day)
}

func offsetOf(t time.Time) time.Duration {
	_, off := t.Zone()
	return time.Duration(off) * time.Second
}

// localDiff is how far t's local clock reading is past the wall time u (read as UTC).
func localDiff(t, u time.Time) time.Duration {
	return t.UTC().Add(offsetOf(t)).Sub(u)
}

func TestParseWall(t *testing.T) {
	t.Parallel()
	good := map[string]localtime.Wall{
		"2027-03-28T09:00":    {Year: 2027, Month: 3, Day: 28, Hour: 9},
		"2027-03-28T09:00:05": {Year: 2027, Month: 3, Day: 28, Hour: 9, Second: 5},
		"2027-03-28 23:59:59": {Year: 2027, Month: 3, Day: 28, Hour: 23, Minute: 59, Second: 59},
		"2028-02-29T00:00":    {Year: 2028, Month: 2, Day: 29},
	}
	for in, want := range good {
		got, err := localtime.ParseWall(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	bad := map[string]string{
		"":                          "want YYYY-MM-DDTHH:MM[:SS]",
		"2027-03-28":                "want YYYY-MM-DDTHH:MM[:SS]",
		"2027-03-28T09":             "want YYYY-MM-DDTHH:MM[:SS]",
		"2027-3-28T09:00":           "want YYYY-MM-DDTHH:MM[:SS]",
		"2027-03-28T9:00":           `hour "9" must be 2 digits`,
		"2027-13-28T09:00":          "month 13 is out of range 1-12",
		"2027-02-29T09:00":          "day 29 is out of range: February 2027 has 28 days",
		"2027-04-31T09:00":          "day 31 is out of range: April 2027 has 30 days",
		"2027-03-28T24:00":          "hour 24 is out of range 0-23",
		"2027-03-28T09:60":          "minute 60 is out of range 0-59",
		"2027-03-28T09:00:60":       "second 60 is out of range 0-59",
		"2027-03-28T09:00Z":         `has a UTC offset "Z"`,
		"2027-03-28T09:00:00+02:00": `has a UTC offset "+02:00"`,
		"2027-03-28T09:00:00.5":     "fractional seconds",
		"0000-03-28T09:00":          "year 0 is out of range 1-9999",
		"2027-0x-28T09:00":          `month "0x" must be 2 digits`,
	}
	for in, want := range bad {
		_, err := localtime.ParseWall(in)
		require.ErrorIs(t, err, localtime.ErrWall, in)
		require.ErrorContains(t, err, want, in)
		require.ErrorContains(t, err, `"`+in+`"`, "the error quotes the input")
	}
}

func TestLoadZone(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Europe/Stockholm", "UTC", "America/Argentina/Buenos_Aires", "EST5EDT", "Etc/GMT+3", "GMT", "Zulu"} {
		loc, err := localtime.LoadZone(name)
		require.NoError(t, err, name)
		require.Equal(t, name, loc.String())
	}
	bad := map[string]string{
		"":                        "empty",
		"Local":                   `"Local" is not allowed`,
		"localtime":               `"localtime" is not allowed`,
		"Factory":                 "no zone was configured",
		"CET":                     "fixed-offset abbreviation",
		"EST":                     "fixed-offset abbreviation",
		"posix/Europe/Stockholm":  `without its "posix/" prefix`,
		"right/UTC":               `without its "right/" prefix`,
		"Europe/Stokholm":         `unknown zone "Europe/Stokholm"`,
		"Mars/Olympus_Mons":       "unknown zone",
		"../etc/passwd":           "unknown zone",
		" Europe/Stockholm":       "surrounding spaces",
		"CEST":                    "unknown zone",
		"+02:00":                  "unknown zone",
		"Europe/Stockholm\x00foo": "unknown zone",
	}
	for in, want := range bad {
		_, err := localtime.LoadZone(in)
		require.ErrorIs(t, err, localtime.ErrZone, "%q", in)
		require.ErrorContains(t, err, want, "%q", in)
	}
}

func TestParseLocal(t *testing.T) {
	t.Parallel()
	got, err := localtime.ParseLocal("2027-03-28T09:00", "Europe/Stockholm")
	require.NoError(t, err)
	require.Equal(t, utc(t, "2027-03-28T07:00:00Z"), got.UTC())

	_, err = localtime.ParseLocal("2027-03-28T09:00", "Europe/Nowhere")
	require.True(t, errors.Is(err, localtime.ErrZone))
	_, err = localtime.ParseLocal("2027-03-28", "Europe/Stockholm")
	require.True(t, errors.Is(err, localtime.ErrWall))
}

func TestWallString(t *testing.T) {
	t.Parallel()
	w := localtime.Wall{Year: 2027, Month: 1, Day: 32, Hour: 9}
	require.Equal(t, "2027-02-01T09:00:00", w.String(), "normalised as time.Date does")
	require.Equal(t, w.String(), localtime.WallOf(localtime.Resolve(w, zone(t, "Europe/Stockholm"))).String())
}
