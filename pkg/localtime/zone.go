package localtime

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The kinds of input this package rejects; every error it returns wraps one,
// so a caller can tell them apart with errors.Is and add the name of its own
// field (tz, due_at, window …) around the message.
var (
	// ErrZone means the zone name is empty, unknown, or not allowed.
	ErrZone = errors.New("invalid time zone")
	// ErrWall means a local wall-clock time could not be parsed.
	ErrWall = errors.New("invalid local time")
	// ErrWindow means a send window could not be parsed or built.
	ErrWindow = errors.New("invalid send window")
)

// deniedZones are names the zone databases know but a reminder must not use:
// they mean "this machine's zone" or "no zone", not a place.
var deniedZones = map[string]string{
	"Local":      "means the zone of whichever machine reads it",
	"localtime":  "means the zone of whichever machine reads it",
	"posixrules": "is a template for POSIX TZ strings, not a place",
	"Factory":    "means no zone was configured",
	// PostgreSQL reads these legacy names as time zone abbreviations first
	// (timezone_abbreviations): CET as a fixed +01:00 without summer time,
	// EST as +10:00 under the Australia set. UTC, GMT, UCT and Zulu mean
	// UTC in every set and stay allowed.
	"CET": abbreviation, "EET": abbreviation, "MET": abbreviation, "WET": abbreviation,
	"EST": abbreviation, "MST": abbreviation, "HST": abbreviation,
}

const abbreviation = "is read by PostgreSQL as a fixed-offset abbreviation; use a city zone such as \"Europe/Paris\" or \"America/New_York\""

// LoadZone returns the IANA zone name, matched exactly. The error wraps
// ErrZone and says why; the caller names its field.
func LoadZone(name string) (*time.Location, error) {
	if err := checkZoneName(name); err != nil {
		return nil, err
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w: unknown zone %q (want an IANA name such as \"Europe/Stockholm\" or \"UTC\")", ErrZone, name)
	}
	return loc, nil
}

// checkZoneName rejects what LoadZone refuses before looking the name up.
func checkZoneName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty (want an IANA name such as \"Europe/Stockholm\" or \"UTC\")", ErrZone)
	case deniedZones[name] != "":
		return fmt.Errorf("%w: %q is not allowed: it %s", ErrZone, name, deniedZones[name])
	case strings.HasPrefix(name, "posix/") || strings.HasPrefix(name, "right/"):
		return fmt.Errorf("%w: %q is not allowed: use the name without its %q prefix", ErrZone, name, name[:strings.IndexByte(name, '/')+1])
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%w: %q has surrounding spaces", ErrZone, name)
	}
	return nil
}
