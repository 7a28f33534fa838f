package localtime

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// TimeOfDay is a local clock reading in minutes after midnight: 0 is 00:00,
// 1440 is 24:00 (midnight at the end of the day, allowed only as a close).
type TimeOfDay int

// Midnight and EndOfDay bound a whole day.
const (
	Midnight TimeOfDay = 0
	EndOfDay TimeOfDay = 24 * 60
)

// Clock returns the time of day h:m.
func Clock(h, m int) TimeOfDay { return TimeOfDay(h*60 + m) }

// String formats t as HH:MM.
func (t TimeOfDay) String() string { return fmt.Sprintf("%02d:%02d", int(t)/60, int(t)%60) }

// Weekdays is a set of days of the week: bit 1<<time.Weekday (Sunday is bit
// 0, as PostgreSQL's extract(dow)). The empty set means every day.
type Weekdays uint8

// EveryDay is the set of all seven days, which Window stores as the empty set.
const EveryDay Weekdays = 1<<7 - 1

// Days returns the set of ds.
func Days(ds ...time.Weekday) Weekdays {
	var s Weekdays
	for _, d := range ds {
		s |= 1 << d
	}
	return s
}

// Has reports whether d is in the set (always, for the empty set).
func (s Weekdays) Has(d time.Weekday) bool { return s == 0 || s&(1<<d) != 0 }

var dayNames = [7]string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

// String lists the days Monday first, runs of three or more as a range:
// "mon-fri", "sat,sun", "mon,wed-fri". Every day is "".
func (s Weekdays) String() string {
	if s == 0 || s == EveryDay {
		return ""
	}
	var parts []string
	order := [8]time.Weekday{time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday, time.Saturday, time.Sunday}
	for i := 0; i < 7; {
		if !s.Has(order[i]) {
			i++
			continue
		}
		j := i
		for j+1 < 7 && s.Has(order[j+1]) {
			j++
		}
		switch {
		case j-i >= 2:
			parts = append(parts, dayNames[order[i]]+"-"+dayNames[order[j]])
		default:
			for k := i; k <= j; k++ {
				parts = append(parts, dayNames[order[k]])
			}
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Window is when a send may start, in the recipient's local time: every day
// (or on chosen weekdays) from Opens to Closes. Closes before Opens is an
// overnight window that closes the next day; the weekday is the day it
// opens. The zero Window is AnyTime. Build one with NewWindow or
// ParseWindow; it is comparable, and its text form round-trips.
type Window struct {
	limited     bool // false: any time
	days        Weekdays
	open, close TimeOfDay
}

// AnyTime is the window that never closes.
var AnyTime = Window{}

// NewWindow returns the window open on days (empty: every day) from open to
// close. open is 00:00 to 23:59, close 00:01 to 24:00 and different from
// open; a close before the open means the next day. Every day from 00:00 to
// 24:00 is AnyTime.
func NewWindow(days Weekdays, open, close TimeOfDay) (Window, error) {
	switch {
	case open < 0 || open >= EndOfDay:
		return Window{}, fmt.Errorf("%w: opening time %d minutes is out of range 00:00-23:59", ErrWindow, open)
	case close <= 0 || close > EndOfDay:
		return Window{}, fmt.Errorf("%w: closing time %d minutes is out of range 00:01-24:00", ErrWindow, close)
	case open == close:
		return Window{}, fmt.Errorf("%w: opens and closes at %s; a window open all day is 00:00-24:00", ErrWindow, open)
	case days > EveryDay:
		return Window{}, fmt.Errorf("%w: weekday set %#x has bits beyond Saturday", ErrWindow, uint8(days))
	}
	if days == EveryDay {
		days = 0
	}
	if days == 0 && open == Midnight && close == EndOfDay {
		return AnyTime, nil
	}
	return Window{limited: true, days: days, open: open, close: close}, nil
}

// IsAnyTime reports whether w never closes.
func (w Window) IsAnyTime() bool { return !w.limited }

// Days returns the days w opens on (empty: every day).
func (w Window) Days() Weekdays { return w.days }

// Opens returns the daily opening time (00:00 for AnyTime).
func (w Window) Opens() TimeOfDay { return w.open }

// Closes returns the daily closing time (24:00 for AnyTime).
func (w Window) Closes() TimeOfDay {
	if !w.limited {
		return EndOfDay
	}
	return w.close
}

// String formats w as ParseWindow reads it: "any", "08:00-21:00",
// "mon-fri 08:00-21:00", "sat,sun" (all day).
func (w Window) String() string {
	if !w.limited {
		return "any"
	}
	days := w.days.String()
	if w.open == Midnight && w.close == EndOfDay {
		return days
	}
	hours := w.open.String() + "-" + w.close.String()
	if days == "" {
		return hours
	}
	return days + " " + hours
}

// MarshalText is String, for JSON and text columns.
func (w Window) MarshalText() ([]byte, error) { return []byte(w.String()), nil }

// UnmarshalText is ParseWindow.
func (w *Window) UnmarshalText(b []byte) error {
	p, err := ParseWindow(string(b))
	if err != nil {
		return err
	}
	*w = p
	return nil
}

// ParseWindow reads a window: "any"; or HH:MM-HH:MM ("08:00-21:00", the
// close may be 24:00, and a close before the open is overnight); or days
// ("mon-fri", "sat,sun", "mon,wed-fri", "fri-mon"), all day on those days;
// or days and hours, "mon-fri 08:00-21:00". Day names are the English
// three-letter ones; case does not matter. The error wraps ErrWindow.
func ParseWindow(s string) (Window, error) {
	bad := func(format string, args ...any) (Window, error) {
		return Window{}, fmt.Errorf("%w %q: %s", ErrWindow, s, fmt.Sprintf(format, args...))
	}
	fields := strings.Fields(strings.ToLower(s))
	switch {
	case len(fields) == 0:
		return bad(`empty (want "any", "08:00-21:00" or "mon-fri 08:00-21:00")`)
	case len(fields) == 1 && fields[0] == "any":
		return AnyTime, nil
	case len(fields) > 2:
		return bad(`want at most days and hours, as "mon-fri 08:00-21:00"`)
	}
	var days Weekdays
	hours := fields[len(fields)-1]
	if !strings.Contains(hours, ":") {
		hours = "" // days only
	}
	if len(fields) == 2 || hours == "" {
		var err error
		if days, err = parseDays(fields[0]); err != nil {
			return bad("%v", err)
		}
		if len(fields) == 2 && hours == "" {
			return bad("hours %q: want HH:MM-HH:MM", fields[1])
		}
	}
	open, close := Midnight, EndOfDay
	if hours != "" {
		o, c, ok := strings.Cut(hours, "-")
		if !ok {
			return bad("hours %q: want HH:MM-HH:MM", hours)
		}
		var err error
		if open, err = parseTimeOfDay("opening time", o, false); err != nil {
			return bad("%v", err)
		}
		if close, err = parseTimeOfDay("closing time", c, true); err != nil {
			return bad("%v", err)
		}
		if open == close {
			return bad("opens and closes at %s; a window open all day is 00:00-24:00, or \"any\"", open)
		}
	}
	w, err := NewWindow(days, open, close)
	if err != nil {
		return bad("%v", err)
	}
	return w, nil
}

// parseTimeOfDay reads HH:MM; 24:00 only when endOK.
func parseTimeOfDay(what, s string, endOK bool) (TimeOfDay, error) {
	h, m, ok := strings.Cut(s, ":")
	hv, herr := strconv.Atoi(h)
	mv, merr := strconv.Atoi(m)
	if !ok || len(h) != 2 || len(m) != 2 || herr != nil || merr != nil || hv < 0 || mv < 0 {
		return 0, fmt.Errorf("%s %q: want HH:MM", what, s)
	}
	switch {
	case hv == 24 && mv == 0 && endOK:
		return EndOfDay, nil
	case hv > 23:
		if endOK {
			return 0, fmt.Errorf("%s %q: hour must be 00-23 (or 24:00)", what, s)
		}
		return 0, fmt.Errorf("%s %q: hour must be 00-23", what, s)
	case mv > 59:
		return 0, fmt.Errorf("%s %q: minute must be 00-59", what, s)
	}
	return Clock(hv, mv), nil
}

// parseDays reads "mon-fri", "sat,sun", "fri-mon" (wrapping).
func parseDays(s string) (Weekdays, error) {
	day := func(name string) (time.Weekday, error) {
		for i, n := range dayNames {
			if n == name {
				return time.Weekday(i), nil
			}
		}
		return 0, fmt.Errorf("day %q: want mon, tue, wed, thu, fri, sat or sun", name)
	}
	var set Weekdays
	for _, item := range strings.Split(s, ",") {
		from, to, isRange := strings.Cut(item, "-")
		a, err := day(from)
		if err != nil {
			return 0, err
		}
		b := a
		if isRange {
			if b, err = day(to); err != nil {
				return 0, err
			}
		}
		for d := a; ; d = (d + 1) % 7 {
			set |= 1 << d
			if d == b {
				break
			}
		}
	}
	return set, nil
}
