package localtime

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Wall is a local wall-clock time with no zone or offset: what a calendar in
// the recipient's kitchen shows. Fields out of range are normalised as
// time.Date does (Day 32 of January is 1 February).
type Wall struct {
	Year   int
	Month  time.Month
	Day    int
	Hour   int
	Minute int
	Second int
}

// WallOf returns the wall-clock reading of t in its own location.
func WallOf(t time.Time) Wall {
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	return Wall{Year: y, Month: mo, Day: d, Hour: h, Minute: mi, Second: s}
}

// String formats w as ParseWall reads it: 2027-03-28T09:00:00.
func (w Wall) String() string {
	return w.utc().Format("2006-01-02T15:04:05")
}

// utc is w normalised, read as if it were UTC: the instant whose UTC clock
// shows w. Offsets are measured from it.
func (w Wall) utc() time.Time {
	return time.Date(w.Year, w.Month, w.Day, w.Hour, w.Minute, w.Second, 0, time.UTC)
}

// ParseWall reads a local time written YYYY-MM-DDTHH:MM or
// YYYY-MM-DDTHH:MM:SS (a space may replace the T). A trailing offset or Z is
// refused: a local time has none, and an instant should be given as one. The
// error wraps ErrWall and names the part that is wrong.
func ParseWall(s string) (Wall, error) {
	bad := func(format string, args ...any) (Wall, error) {
		return Wall{}, fmt.Errorf("%w %q: %s", ErrWall, s, fmt.Sprintf(format, args...))
	}
	date, clock, ok := strings.Cut(s, "T")
	if !ok {
		date, clock, ok = strings.Cut(s, " ")
	}
	if !ok {
		return bad("want YYYY-MM-DDTHH:MM[:SS]")
	}
	if i := strings.IndexAny(clock, "Zz+-"); i >= 0 {
		return bad("has a UTC offset %q: a local time has none (give the instant instead, or drop the offset)", clock[i:])
	}
	if strings.Contains(clock, ".") {
		return bad("fractional seconds are not supported")
	}
	dp := strings.Split(date, "-")
	cp := strings.Split(clock, ":")
	if len(dp) != 3 || len(dp[0]) != 4 || len(dp[1]) != 2 || len(dp[2]) != 2 || (len(cp) != 2 && len(cp) != 3) {
		return bad("want YYYY-MM-DDTHH:MM[:SS]")
	}
	if len(cp) == 2 {
		cp = append(cp, "00")
	}
	var n [6]int
	parts := [6]struct {
		name     string
		text     string
		min, max int
	}{
		{"year", dp[0], 1, 9999}, {"month", dp[1], 1, 12}, {"day", dp[2], 1, 31},
		{"hour", cp[0], 0, 23}, {"minute", cp[1], 0, 59}, {"second", cp[2], 0, 59},
	}
	for i, p := range parts {
		digits := 2
		if i == 0 {
			digits = 4
		}
		v, err := strconv.Atoi(p.text)
		if err != nil || len(p.text) != digits || strings.Trim(p.text, "0123456789") != "" {
			return bad("%s %q must be %d digits", p.name, p.text, digits)
		}
		if v < p.min || v > p.max {
			return bad("%s %d is out of range %d-%d", p.name, v, p.min, p.max)
		}
		n[i] = v
	}
	w := Wall{Year: n[0], Month: time.Month(n[1]), Day: n[2], Hour: n[3], Minute: n[4], Second: n[5]}
	if last := daysIn(w.Year, w.Month); w.Day > last {
		return bad("day %d is out of range: %s %d has %d days", w.Day, w.Month, w.Year, last)
	}
	return w, nil
}

func daysIn(year int, m time.Month) int {
	return time.Date(year, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// ParseLocal parses wall (ParseWall) in zone (LoadZone) and resolves it to
// an instant. It is what an intake path calls for "2027-03-28T09:00" +
// "Europe/Stockholm"; the error wraps ErrWall or ErrZone.
func ParseLocal(wall, zone string) (time.Time, error) {
	loc, err := LoadZone(zone)
	if err != nil {
		return time.Time{}, err
	}
	w, err := ParseWall(wall)
	if err != nil {
		return time.Time{}, err
	}
	return Resolve(w, loc), nil
}

// maxOffset bounds the UTC offset any zone has ever had (the largest is local
// mean time in the nineteenth century, under 16 hours): every instant whose
// local clock shows a wall time w lies within it of w read as UTC.
const maxOffset = 16 * time.Hour

// sampleStep is how far apart Resolve samples a zone's offset around a wall
// time; transitions are found between samples that differ. Two transitions
// closer than this that return to the same offset would go unseen; no zone
// has had any.
const sampleStep = 4 * time.Hour

// Resolve returns the instant at which the local clock in loc shows w, in loc.
// When the clock skips w (a gap) the result is w moved forward by the gap;
// when it shows w twice (an overlap), the earlier instant. See the package doc.
//
// It reads the zone only through offsets at instants: time.Time.ZoneBounds
// reports false bounds at year ends for zones described by a rule rather than
// a transition table, as the slim files of time/tzdata are.
func Resolve(w Wall, loc *time.Location) time.Time {
	u := w.utc()
	var (
		best    time.Time
		hasBest bool
	)
	consider := func(off time.Duration) {
		if c := u.Add(-off); offsetAt(c, loc) == off && (!hasBest || c.Before(best)) {
			best, hasBest = c, true
		}
	}
	// Walk the offsets in force from maxOffset before u to maxOffset after:
	// each is a candidate (u read with it; valid if the clock shows w then),
	// and each rise from o1 to o2 at an instant T is a gap that swallows the
	// wall times [T+o1, T+o2).
	var gap time.Time
	hasGap := false
	from := u.Add(-maxOffset)
	off := offsetAt(from, loc)
	consider(off)
	for from.Before(u.Add(maxOffset)) {
		to := from.Add(sampleStep)
		next := offsetAt(to, loc)
		if next != off {
			t := transition(from, to, off, loc)
			consider(next)
			if next > off && !hasGap && !u.Before(t.Add(off)) && u.Before(t.Add(next)) {
				gap, hasGap = u.Add(-off), true // read with the offset before the gap
			}
			off = next
		}
		from = to
	}
	switch {
	case hasBest:
		return best.In(loc)
	case hasGap:
		return gap.In(loc)
	default: // unreachable: a wall time is either shown or skipped
		return time.Date(w.Year, w.Month, w.Day, w.Hour, w.Minute, w.Second, 0, loc)
	}
}

// offsetAt is loc's UTC offset at t.
func offsetAt(t time.Time, loc *time.Location) time.Duration {
	_, off := t.In(loc).Zone()
	return time.Duration(off) * time.Second
}

// transition returns the first instant after a, to the second, at which the
// offset is no longer off (a has it, b does not).
func transition(a, b time.Time, off time.Duration, loc *time.Location) time.Time {
	for b.Sub(a) > time.Second {
		m := a.Add(b.Sub(a) / 2).Truncate(time.Second)
		if !m.After(a) {
			m = a.Add(time.Second)
		}
		if offsetAt(m, loc) == off {
			a = m
		} else {
			b = m
		}
	}
	return b
}
