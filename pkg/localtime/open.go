package localtime

import "time"

// These walks mirror nudge_window_open and nudge_next_opening in
// schema/migrations/0011_local_time.sql day for day, so that the two agree
// even in a zone's oddest transitions; change both together.

// opening returns the opening that starts on the local date day (a UTC
// midnight), and false when w does not open that day or the opening is empty
// (its close resolves no later than its open, only possible inside a gap).
func (w Window) opening(day time.Time, loc *time.Location) (start, end time.Time, ok bool) {
	if !w.days.Has(day.Weekday()) {
		return time.Time{}, time.Time{}, false
	}
	start = Resolve(wallAt(day, w.open), loc)
	closeDay := day
	if w.close <= w.open {
		closeDay = day.AddDate(0, 0, 1)
	}
	end = Resolve(wallAt(closeDay, w.close), loc)
	return start, end, start.Before(end)
}

// wallAt is the wall time t on the date day (24:00 is the next midnight).
func wallAt(day time.Time, t TimeOfDay) Wall {
	return Wall{Year: day.Year(), Month: day.Month(), Day: day.Day(), Minute: int(t)}
}

// localDate is t's local date in loc, as a UTC midnight.
func localDate(t time.Time, loc *time.Location) time.Time {
	y, m, d := t.In(loc).Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// containing returns the latest end of the openings that contain t. Only
// openings that start on t's local date or up to two days before, or the
// next day (a zone that falls back across midnight), can.
func (w Window) containing(t time.Time, loc *time.Location) (end time.Time, ok bool) {
	d0 := localDate(t, loc)
	for i := -2; i <= 1; i++ {
		s, e, open := w.opening(d0.AddDate(0, 0, i), loc)
		if open && !t.Before(s) && t.Before(e) && (!ok || e.After(end)) {
			end, ok = e, true
		}
	}
	return end, ok
}

// Open reports whether w is open at t in loc.
func Open(w Window, loc *time.Location, t time.Time) bool {
	if !w.limited {
		return true
	}
	_, ok := w.containing(t, loc)
	return ok
}

// nextOpeningDays bounds the search for the next opening: a week holds
// every weekday, and a second week covers an opening a gap made empty.
const nextOpeningDays = 15

// NextOpening returns t if w is open at t, else the instant w next opens
// (in loc). It returns the zero Time only if w never opens, which no Window
// built by NewWindow or ParseWindow does.
func NextOpening(w Window, loc *time.Location, t time.Time) time.Time {
	if Open(w, loc, t) {
		return t
	}
	d0 := localDate(t, loc)
	var best time.Time
	bestDay := 0
	for i := -1; i <= nextOpeningDays; i++ {
		if !best.IsZero() && i > bestDay+1 {
			break // later days open later (checked one more for a gap's reordering)
		}
		s, _, ok := w.opening(d0.AddDate(0, 0, i), loc)
		if ok && s.After(t) && (best.IsZero() || s.Before(best)) {
			best, bestDay = s, i
		}
	}
	return best
}

// maxMerged bounds how many touching openings CloseAfter joins.
const maxMerged = 8

// CloseAfter returns when the opening that holds NextOpening(w, loc, t)
// closes: the end of the current opening if w is open at t, else of the next
// one. Openings that touch or overlap count as one. The zero Time means
// never (AnyTime).
func CloseAfter(w Window, loc *time.Location, t time.Time) time.Time {
	if !w.limited {
		return time.Time{}
	}
	s := NextOpening(w, loc, t)
	if s.IsZero() {
		return time.Time{}
	}
	end, _ := w.containing(s, loc)
	for range maxMerged {
		next, ok := w.containing(end, loc)
		if !ok {
			return end.In(loc)
		}
		end = next
	}
	return time.Time{} // open around the clock (NewWindow makes that AnyTime)
}
