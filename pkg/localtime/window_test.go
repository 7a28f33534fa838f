package localtime_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/localtime"
)

func window(t *testing.T, s string) localtime.Window {
	t.Helper()
	w, err := localtime.ParseWindow(s)
	require.NoError(t, err)
	return w
}

func TestParseWindow(t *testing.T) {
	t.Parallel()
	mon, fri := time.Monday, time.Friday
	good := []struct {
		in, canonical string
		days          localtime.Weekdays
		open, close   localtime.TimeOfDay
	}{
		{"any", "any", 0, 0, localtime.EndOfDay},
		{"ANY", "any", 0, 0, localtime.EndOfDay},
		{"00:00-24:00", "any", 0, 0, localtime.EndOfDay},
		{"mon-sun", "any", 0, 0, localtime.EndOfDay},
		{"08:00-21:00", "08:00-21:00", 0, localtime.Clock(8, 0), localtime.Clock(21, 0)},
		{"21:00-08:00", "21:00-08:00", 0, localtime.Clock(21, 0), localtime.Clock(8, 0)},
		{"mon-fri 08:00-21:00", "mon-fri 08:00-21:00", localtime.Days(1, 2, 3, 4, 5), localtime.Clock(8, 0), localtime.Clock(21, 0)},
		{"  Mon-Fri   09:30-17:45 ", "mon-fri 09:30-17:45", localtime.Days(1, 2, 3, 4, 5), localtime.Clock(9, 30), localtime.Clock(17, 45)},
		{"sat,sun", "sat,sun", localtime.Days(0, 6), 0, localtime.EndOfDay},
		{"sun,sat", "sat,sun", localtime.Days(0, 6), 0, localtime.EndOfDay},
		{"fri-mon 18:00-24:00", "mon,fri-sun 18:00-24:00", localtime.Days(5, 6, 0, 1), localtime.Clock(18, 0), localtime.EndOfDay},
		{"mon,wed-fri 00:00-00:01", "mon,wed-fri 00:00-00:01", localtime.Days(1, 3, 4, 5), 0, 1},
		{"mon,fri", "mon,fri", localtime.Days(mon, fri), 0, localtime.EndOfDay},
		{"mon-tue 08:00-09:00", "mon,tue 08:00-09:00", localtime.Days(1, 2), localtime.Clock(8, 0), localtime.Clock(9, 0)},
	}
	for _, tc := range good {
		w, err := localtime.ParseWindow(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.canonical, w.String(), tc.in)
		require.Equal(t, tc.days, w.Days(), tc.in)
		require.Equal(t, tc.open, w.Opens(), tc.in)
		require.Equal(t, tc.close, w.Closes(), tc.in)
		again, err := localtime.ParseWindow(w.String())
		require.NoError(t, err, tc.in)
		require.Equal(t, w, again, "%q round-trips", tc.in)
	}
	bad := map[string]string{
		"":                    "empty",
		"always":              `day "always"`,
		"08:00":               `hours "08:00": want HH:MM-HH:MM`,
		"8:00-21:00":          `opening time "8:00": want HH:MM`,
		"08:00-21":            `closing time "21": want HH:MM`,
		"24:00-08:00":         `opening time "24:00": hour must be 00-23`,
		"08:00-24:01":         `closing time "24:01": hour must be 00-23 (or 24:00)`,
		"08:00-25:00":         `hour must be 00-23 (or 24:00)`,
		"08:60-21:00":         "minute must be 00-59",
		"08:00-08:00":         "opens and closes at 08:00",
		"mon-fry 08:00-21:00": `day "fry"`,
		"mon-fri 08:00":       `hours "08:00"`,
		"mon-fri weekends":    `hours "weekends"`,
		"mon fri 08:00-21:00": "at most days and hours",
		"08:00-21:00 mon-fri": `day "08:00"`,
		"mon,,fri":            `day ""`,
	}
	for in, want := range bad {
		_, err := localtime.ParseWindow(in)
		require.ErrorIs(t, err, localtime.ErrWindow, in)
		require.ErrorContains(t, err, want, in)
	}
}

func TestNewWindow(t *testing.T) {
	t.Parallel()
	_, err := localtime.NewWindow(0, -1, 60)
	require.ErrorIs(t, err, localtime.ErrWindow)
	_, err = localtime.NewWindow(0, 60, 0)
	require.ErrorIs(t, err, localtime.ErrWindow)
	_, err = localtime.NewWindow(0, 60, localtime.EndOfDay+1)
	require.ErrorIs(t, err, localtime.ErrWindow)
	_, err = localtime.NewWindow(1<<7, 60, 120)
	require.ErrorIs(t, err, localtime.ErrWindow)
	w, err := localtime.NewWindow(localtime.EveryDay, 0, localtime.EndOfDay)
	require.NoError(t, err)
	require.True(t, w.IsAnyTime())
	require.Equal(t, localtime.AnyTime, w)
	require.True(t, localtime.Window{}.IsAnyTime(), "the zero Window is AnyTime")
}

func TestWindowJSON(t *testing.T) {
	t.Parallel()
	var v struct{ Window localtime.Window }
	require.NoError(t, json.Unmarshal([]byte(`{"Window":"mon-fri 08:00-21:00"}`), &v))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	require.JSONEq(t, `{"Window":"mon-fri 08:00-21:00"}`, string(b))
	require.ErrorIs(t, json.Unmarshal([]byte(`{"Window":"08:00"}`), &v), localtime.ErrWindow)
}

func inst(t *testing.T, s string) time.Time {
	t.Helper()
	if s == "" {
		return time.Time{}
	}
	return utc(t, s)
}

// Open, NextOpening and CloseAfter at chosen instants (written with the
// local offset in force, so "+01:00" and "+02:00" tell the two readings of
// an overlap apart).
func TestWindowOpenings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, zone, window, at string
		open                   bool
		next, close            string // "" for the zero Time
	}{
		// Europe/Stockholm, spring forward 2027-03-28 02:00 → 03:00.
		{"across the night before the gap", "Europe/Stockholm", "08:00-21:00", "2027-03-27T22:00:00+01:00",
			false, "2027-03-28T08:00:00+02:00", "2027-03-28T21:00:00+02:00"},
		{"opening in the gap opens by the gap rule", "Europe/Stockholm", "02:30-05:00", "2027-03-28T03:15:00+02:00",
			false, "2027-03-28T03:30:00+02:00", "2027-03-28T05:00:00+02:00"},
		{"at that opening", "Europe/Stockholm", "02:30-05:00", "2027-03-28T03:30:00+02:00",
			true, "2027-03-28T03:30:00+02:00", "2027-03-28T05:00:00+02:00"},
		{"closing in the gap closes by the gap rule", "Europe/Stockholm", "01:00-02:30", "2027-03-28T03:20:00+02:00",
			true, "2027-03-28T03:20:00+02:00", "2027-03-28T03:30:00+02:00"},
		// Europe/Stockholm, fall back 2027-10-31 03:00 → 02:00.
		{"opening in the overlap opens at its first reading; the repeated hour is inside", "Europe/Stockholm", "02:30-03:00", "2027-10-31T02:45:00+01:00",
			true, "2027-10-31T02:45:00+01:00", "2027-10-31T03:00:00+01:00"},
		{"before that opening", "Europe/Stockholm", "02:30-03:00", "2027-10-31T02:10:00+02:00",
			false, "2027-10-31T02:30:00+02:00", "2027-10-31T03:00:00+01:00"},
		{"closing in the overlap closes at its first reading", "Europe/Stockholm", "00:00-02:30", "2027-10-31T02:10:00+01:00",
			false, "2027-11-01T00:00:00+01:00", "2027-11-01T02:30:00+01:00"},
		// America/New_York, 2027-03-14 02:00 → 03:00 and 2027-11-07 02:00 → 01:00.
		{"overnight across the gap: open", "America/New_York", "21:00-08:00", "2027-03-14T07:30:00-04:00",
			true, "2027-03-14T07:30:00-04:00", "2027-03-14T08:00:00-04:00"},
		{"overnight across the gap: closed", "America/New_York", "21:00-08:00", "2027-03-14T12:00:00-04:00",
			false, "2027-03-14T21:00:00-04:00", "2027-03-15T08:00:00-04:00"},
		{"overnight across the overlap", "America/New_York", "21:00-08:00", "2027-11-07T01:30:00-05:00",
			true, "2027-11-07T01:30:00-05:00", "2027-11-07T08:00:00-05:00"},
		{"weekdays across a weekend and the overlap", "America/New_York", "mon-fri 08:00-21:00", "2027-11-05T21:30:00-04:00",
			false, "2027-11-08T08:00:00-05:00", "2027-11-08T21:00:00-05:00"},
		{"weekdays, open before a weekend", "America/New_York", "mon-fri 08:00-21:00", "2027-11-05T20:59:59-04:00",
			true, "2027-11-05T20:59:59-04:00", "2027-11-05T21:00:00-04:00"},
		// Weekday windows across midnight: the weekday is the day it opens.
		{"friday night, on saturday morning", "Europe/Stockholm", "fri 22:00-02:00", "2027-06-12T01:00:00+02:00",
			true, "2027-06-12T01:00:00+02:00", "2027-06-12T02:00:00+02:00"},
		{"friday night, on saturday night", "Europe/Stockholm", "fri 22:00-02:00", "2027-06-12T22:30:00+02:00",
			false, "2027-06-18T22:00:00+02:00", "2027-06-19T02:00:00+02:00"},
		{"friday night, on thursday night", "Europe/Stockholm", "fri 22:00-02:00", "2027-06-10T23:00:00+02:00",
			false, "2027-06-11T22:00:00+02:00", "2027-06-12T02:00:00+02:00"},
		{"saturday night across the gap", "Europe/Stockholm", "sat 22:00-04:00", "2027-03-28T03:59:00+02:00",
			true, "2027-03-28T03:59:00+02:00", "2027-03-28T04:00:00+02:00"},
		{"touching days join", "Europe/Stockholm", "sat,sun", "2027-03-26T23:59:00+01:00",
			false, "2027-03-27T00:00:00+01:00", "2027-03-29T00:00:00+02:00"},
		{"all-day weekdays close on saturday", "America/New_York", "mon-fri", "2027-11-03T12:00:00-04:00",
			true, "2027-11-03T12:00:00-04:00", "2027-11-06T00:00:00-04:00"},
		{"any time", "Europe/Stockholm", "any", "2027-03-28T02:00:00+01:00",
			true, "2027-03-28T02:00:00+01:00", ""},
		// Australia/Lord_Howe: 2027-04-04 02:00 → 01:30, 2027-10-03 02:00 → 02:30.
		{"both ends in the 30-minute gap move forward by it", "Australia/Lord_Howe", "02:00-02:15", "2027-10-03T02:40:00+11:00",
			true, "2027-10-03T02:40:00+11:00", "2027-10-03T02:45:00+11:00"},
		{"an opening the gap empties does not happen", "Australia/Lord_Howe", "02:20-02:40", "2027-10-03T02:45:00+11:00",
			false, "2027-10-04T02:20:00+11:00", "2027-10-04T02:40:00+11:00"},
		{"nor before it", "Australia/Lord_Howe", "02:20-02:40", "2027-10-02T12:00:00+10:30",
			false, "2027-10-04T02:20:00+11:00", "2027-10-04T02:40:00+11:00"},
		{"an opening in the 30-minute overlap is its first reading", "Australia/Lord_Howe", "01:40-01:50", "2027-04-04T01:45:00+10:30",
			false, "2027-04-05T01:40:00+10:30", "2027-04-05T01:50:00+10:30"},
		{"inside the first reading", "Australia/Lord_Howe", "01:40-01:50", "2027-04-04T01:45:00+11:00",
			true, "2027-04-04T01:45:00+11:00", "2027-04-04T01:50:00+11:00"},
		// America/Santiago falls back at 24:00 to 23:00 of the day before.
		{"overlap just before midnight: second reading", "America/Santiago", "23:00-23:30", "2027-04-03T23:15:00-04:00",
			false, "2027-04-04T23:00:00-04:00", "2027-04-04T23:30:00-04:00"},
		{"spring forward at midnight: the day opens at 01:00", "America/Santiago", "00:00-06:00", "2027-09-04T23:59:00-04:00",
			false, "2027-09-05T01:00:00-03:00", "2027-09-05T06:00:00-03:00"},
		// Pacific/Apia skipped 30 December 2011.
		{"a skipped day's opening is the next day's", "Pacific/Apia", "09:00-10:00", "2011-12-29T12:00:00-10:00",
			false, "2011-12-31T09:00:00+14:00", "2011-12-31T10:00:00+14:00"},
	}
	for _, src := range zoneSources() {
		for _, tc := range tests {
			t.Run(src.name+" "+tc.name, func(t *testing.T) {
				t.Parallel()
				loc, w, at := src.load(t, tc.zone), window(t, tc.window), inst(t, tc.at)
				require.Equal(t, tc.open, localtime.Open(w, loc, at), "Open")
				next := localtime.NextOpening(w, loc, at)
				require.True(t, inst(t, tc.next).Equal(next), "NextOpening: got %s, want %s", next, tc.next)
				closes := localtime.CloseAfter(w, loc, at)
				require.True(t, inst(t, tc.close).Equal(closes), "CloseAfter: got %s, want %s", closes, tc.close)
				if !closes.IsZero() {
					require.True(t, localtime.Open(w, loc, closes.Add(-time.Nanosecond)), "open until the close")
					require.False(t, localtime.Open(w, loc, closes), "closed at the close")
				}
				if !next.Equal(at) {
					require.False(t, localtime.Open(w, loc, next.Add(-time.Nanosecond)), "closed until the opening")
				}
			})
		}
	}
}

// Walking a year minute by minute in zones with odd transitions, Open
// changes only where NextOpening and CloseAfter say it does.
func TestWindowWalkAgreesWithOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ zone, window string }{
		{"Europe/Stockholm", "mon-fri 02:30-21:00"},
		{"Australia/Lord_Howe", "01:45-02:15"},
		{"America/Santiago", "sat 23:30-00:30"},
		{"America/New_York", "sun 01:15-01:45"},
	} {
		loc, w := zone(t, tc.zone), window(t, tc.window)
		start := time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
		var transitions int
		for at := start; at.Year() == 2027; {
			next := localtime.NextOpening(w, loc, at)
			closes := localtime.CloseAfter(w, loc, at)
			require.False(t, next.Before(at), "%s %s at %s", tc.zone, tc.window, at)
			require.True(t, closes.After(next), "%s %s at %s: closes %s, opens %s", tc.zone, tc.window, at, closes, next)
			for _, probe := range []time.Time{at, next.Add(-time.Minute), next, closes.Add(-time.Minute), closes} {
				if probe.Before(at) {
					continue
				}
				want := !probe.Before(next) && probe.Before(closes)
				require.Equal(t, want, localtime.Open(w, loc, probe), "%s %s probe %s (from %s)", tc.zone, tc.window, probe, at)
			}
			at = closes
			transitions++
		}
		require.Greater(t, transitions, 40, "%s %s", tc.zone, tc.window)
	}
}
