// Package localtime turns a recipient's local wall-clock time into an instant
// and decides when a send window in that local time is open. Reminders are
// written in the recipient's terms ("09:00 Stockholm time", "SMS only
// 08:00-21:00 their time"), while everything Nudge stores and compares is an
// instant; this package is the one place where the two meet, and migration
// 0011 (schema/migrations/0011_local_time.sql) is its SQL twin, held to the
// same answers by a test over every zone both databases know.
//
// # Resolving a wall-clock time
//
// A local time names zero, one or two instants. Resolve always picks one, by
// two rules that every intake path shares:
//
//   - Gap (spring forward): a local time the clock skips moves forward by the
//     length of the gap. 02:30 on the day Stockholm jumps from 02:00 to 03:00
//     is 03:30 CEST; 02:15 on the day Lord Howe jumps from 02:00 to 02:30 is
//     02:45. Equivalently: the wall time is read with the offset in force
//     just before the transition. A reminder meant for "02:30" goes out at
//     the first moment after it that the local clock shows.
//   - Overlap (fall back): a local time the clock shows twice is the earlier
//     instant (the offset in force before the transition). A reminder is
//     never later than the recipient could expect.
//
// Go's time.Date and PostgreSQL's AT TIME ZONE do not implement these rules
// (time.Date does not say which instant it picks; PostgreSQL picks the later
// one in an overlap), so Resolve and nudge_resolve_local compute the
// candidate instants and choose explicitly.
//
// # Zones
//
// A zone is an IANA name such as "Europe/Stockholm" or "UTC", matched exactly
// (case included). LoadZone rejects the empty name and "Local" (which would
// make a reminder's meaning depend on the machine), "localtime",
// "posixrules", "Factory", the "posix/" and "right/" copies some systems
// install, and the legacy names CET, EET, MET, WET, EST, MST and HST, which
// PostgreSQL reads as fixed-offset abbreviations rather than as zones. The
// binaries import time/tzdata, so a minimal container resolves zones as a
// laptop does.
//
// # Send windows
//
// A Window is a daily interval of local time, optionally on chosen weekdays:
// "08:00-21:00", "mon-fri 09:00-17:30", "sat,sun", "21:00-08:00" (overnight:
// opens at 21:00 and closes at 08:00 the next day; the weekday is the day it
// opens), or "any". Each day's opening is the interval from Resolve(day,
// open) to Resolve(day, close), so its ends follow the rules above: a window
// opening at 02:30 on a spring-forward day opens at 03:30, and an opening
// whose close resolves no later than its open (only possible inside a gap)
// does not happen that day. Openings that touch or overlap count as one
// (mon-fri 00:00-24:00 closes at Saturday 00:00).
//
// See docs/local-time.md for the text syntax and the SQL functions.
package localtime
