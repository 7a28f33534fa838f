package intake

import (
	"github.com/nudgehq/nudge/pkg/localtime"
)

// localArgs are the local-time columns of a ScheduleMany batch: the zone,
// the local wall times (as PostgreSQL timestamps, resolved in SQL by
// nudge_resolve_local, so that every path resolves with the same zone
// database) and the window as the SQL twin's (open, close, days).
type localArgs struct {
	tz, due, deadline, open, close []*string
	days                           []*int32
}

func newLocalArgs(n int) localArgs {
	return localArgs{tz: make([]*string, n), due: make([]*string, n), deadline: make([]*string, n),
		open: make([]*string, n), close: make([]*string, n), days: make([]*int32, n)}
}

// set checks request i's local-time fields and fills its columns. What it
// refuses here (a zone Go does not know, a malformed wall time) could not be
// sent as its type, or would fail the whole batch in SQL; the rest
// (nudge_invalid_local) is checked in SQL for every path alike.
func (a localArgs) set(i int, r Request) *ValidationError {
	if r.TZ != "" {
		if verr := CheckString("tz", r.TZ); verr != nil {
			return verr
		}
		if _, err := localtime.LoadZone(r.TZ); err != nil {
			return &ValidationError{Field: "tz", Reason: "must be an IANA time zone name such as \"Europe/Stockholm\" or \"UTC\": " + err.Error()}
		}
		a.tz[i] = &r.TZ
	}
	for _, f := range []struct {
		name, instant, value string
		set                  bool
		dst                  []*string
	}{
		{"due_local", "due_at", r.DueLocal, !r.DueAt.IsZero(), a.due},
		{"deadline_local", "deadline", r.DeadlineLocal, !r.Deadline.IsZero(), a.deadline},
	} {
		if f.value == "" {
			continue
		}
		if f.set {
			return &ValidationError{Field: f.name, Reason: "must not be given with " + f.instant + ": give the instant or the local time"}
		}
		if r.TZ == "" {
			return &ValidationError{Field: "tz", Reason: "is required with " + f.name + " (the zone the local time is read in)"}
		}
		w, err := localtime.ParseWall(f.value)
		if err != nil {
			return &ValidationError{Field: f.name, Reason: "must be a local time like 2027-03-28T09:00: " + err.Error()}
		}
		s := w.String()
		f.dst[i] = &s
	}
	if r.Window != nil {
		o, c := windowColumns(*r.Window)
		d := int32(r.Window.Days())
		a.open[i], a.close[i], a.days[i] = o, &c, &d
	}
	return nil
}

// windowColumns is w as the SQL twin's open (nil: any time) and close.
func windowColumns(w localtime.Window) (open *string, close string) {
	if w.IsAnyTime() {
		return nil, localtime.EndOfDay.String()
	}
	o := w.Opens().String()
	return &o, w.Closes().String()
}
