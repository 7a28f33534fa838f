// Package localtimetest holds the daylight-saving cases every intake path is
// tested with (the SQL functions, pkg/intake, JSON Lines, nudgectl
// schedule), so that each path is held to the same instants: both
// transitions of Europe/Stockholm and America/New_York, and Lord Howe's
// half-hour ones (docs/local-time.md).
package localtimetest

import "time"

// Case is a due time and a deadline given as local wall-clock times in Zone,
// and the instants they resolve to.
type Case struct {
	Name                    string
	Zone                    string
	DueLocal, DeadlineLocal string
	WantDue, WantDeadline   time.Time
}

func utc(y int, m time.Month, d, h, min int) time.Time {
	return time.Date(y, m, d, h, min, 0, 0, time.UTC)
}

// DST are the cases: each due time is in a gap (moved forward by it) or an
// overlap (the earlier reading), each deadline at noon on the other side of
// the transition.
var DST = []Case{
	{"Stockholm spring forward", "Europe/Stockholm", "2027-03-28T02:30", "2027-03-28T12:00",
		utc(2027, 3, 28, 1, 30), utc(2027, 3, 28, 10, 0)},
	{"Stockholm fall back", "Europe/Stockholm", "2027-10-31T02:30", "2027-10-31T12:00",
		utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 11, 0)},
	{"New York spring forward", "America/New_York", "2027-03-14T02:30", "2027-03-14T12:00",
		utc(2027, 3, 14, 7, 30), utc(2027, 3, 14, 16, 0)},
	{"New York fall back", "America/New_York", "2027-11-07T01:30", "2027-11-07T12:00",
		utc(2027, 11, 7, 5, 30), utc(2027, 11, 7, 17, 0)},
	{"Lord Howe spring forward (30 minutes)", "Australia/Lord_Howe", "2027-10-03T02:15", "2027-10-03T12:00",
		utc(2027, 10, 2, 15, 45), utc(2027, 10, 3, 1, 0)},
	{"Lord Howe fall back (30 minutes)", "Australia/Lord_Howe", "2027-04-04T01:45", "2027-04-04T12:00",
		utc(2027, 4, 3, 14, 45), utc(2027, 4, 4, 1, 30)},
}
