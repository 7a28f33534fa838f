package deploycheck

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/message"
)

// extraEnv lists NUDGE_* variables a deployment may set that are not the
// variable of a flag of the binary it runs, with the reason. Keep it small:
// anything here is a variable the checks cannot vouch for.
var extraEnv = map[string]string{
	// (none yet)
}

// One invocation: a command line and its environment, resolved against a cli.

// envValue is an environment variable's value; known is false when it is
// supplied from outside (compose pass-through, Kubernetes valueFrom).
type envValue struct {
	val   string
	known bool
}

type invocation struct {
	where  string              // for messages
	argv   []string            // command and arguments
	env    map[string]envValue // set directly: checked strictly
	shared map[string]envValue // from shared sources (envFrom): may hold others' variables
}

// resolved is what an invocation runs: the command and each flag's effective
// value (command line, then environment, then default).
type resolved struct {
	bin    string
	cmd    *cli
	values map[string]string
	known  map[string]bool   // false: value supplied from outside, not checked
	source map[string]string // "flag", "NUDGE_X", "default"
}

func (r *resolved) has(flag string) bool { return r != nil && r.cmd.flags[flag] != nil }

func (r *resolved) duration(flag string) (time.Duration, bool) {
	if !r.has(flag) || !r.known[flag] || r.values[flag] == "" {
		return 0, false
	}
	d, err := time.ParseDuration(r.values[flag])
	return d, err == nil
}

// check resolves inv against the binaries and returns what is wrong.
func (cs clis) check(inv invocation) (*resolved, []error) {
	var errs []error
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{inv.where}, a...)...))
	}
	if len(inv.argv) == 0 {
		fail("no command: the image has no entrypoint, so the command must name a binary (%s)", strings.Join(cs.names(), ", "))
		return nil, errs
	}
	bin := path.Base(inv.argv[0])
	c := cs[bin]
	if c == nil {
		fail("%q is not a binary built from ./cmd/... (have %s)", inv.argv[0], strings.Join(cs.names(), ", "))
		return nil, errs
	}
	args := inv.argv[1:]
	for len(args) > 0 && c.subs[args[0]] != nil {
		c, args = c.subs[args[0]], args[1:]
	}
	if len(c.subs) > 0 {
		fail("%s needs a subcommand (one of %s)", c.path, strings.Join(slices.Sorted(maps.Keys(c.subs)), ", "))
	}
	r := &resolved{bin: bin, cmd: c, values: map[string]string{}, known: map[string]bool{}, source: map[string]string{}}
	set := func(f *flagInfo, v string, known bool, src string) {
		r.values[f.name], r.known[f.name], r.source[f.name] = v, known, src
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if !c.allowArgs && i+1 < len(args) {
				fail("%s takes no arguments, got %q", c.path, args[i+1:])
			}
			i = len(args)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			dash, byName := "-", c.short
			if strings.HasPrefix(a, "--") {
				dash, byName = "--", c.flags
			}
			name, val, hasVal := strings.Cut(a[len(dash):], "=")
			f := byName[name]
			if f == nil {
				fail("%s has no flag %s%s", c.path, dash, name)
				continue
			}
			if f.takesValue() && !hasVal {
				if i+1 >= len(args) {
					fail("%s%s needs a value", dash, name)
					continue
				}
				i++
				val = args[i]
			} else if !hasVal {
				val = "true"
			}
			set(f, val, true, dash+name)
		default:
			if !c.allowArgs {
				fail("%s takes no arguments, got %q", c.path, a)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(inv.env)) {
		if !strings.HasPrefix(k, "NUDGE_") {
			continue
		}
		f := c.env[k]
		if f == nil {
			if _, ok := extraEnv[k]; !ok {
				fail("%s is not the variable of any flag of %s%s", k, c.path, suggest(k, c))
			}
			continue
		}
		if _, done := r.values[f.name]; !done {
			set(f, inv.env[k].val, inv.env[k].known, k)
		}
	}
	for k, v := range inv.shared {
		if f := c.env[k]; f != nil {
			if _, done := r.values[f.name]; !done {
				set(f, v.val, v.known, k)
			}
		}
	}
	for _, f := range c.flags {
		if _, done := r.values[f.name]; !done && f.hasDef {
			set(f, f.def, true, "default")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.flags)) {
		f := c.flags[name]
		v, ok := r.values[name]
		if f.required && (!ok || (r.known[name] && v == "")) {
			fail("--%s is required: set it or %s", name, f.env)
			continue
		}
		if !ok || !r.known[name] {
			continue
		}
		if err := validate(f, v); err != nil {
			fail("--%s (from %s) = %q: %v", name, r.source[name], v, err)
		}
	}
	return r, errs
}

// validate parses a flag's value the way the binary will.
func validate(f *flagInfo, v string) error {
	if v == "" {
		return nil // the zero value: "unset" for every optional flag here
	}
	switch f.name {
	case "signing-keys":
		_, err := message.ParseKeys(v)
		return err
	case "smtp-url":
		_, err := email.ParseSMTPURL(v)
		return err
	case "database-url":
		return checkURL(v, "postgres", "postgresql")
	case "amqp-url":
		return checkURL(v, "amqp", "amqps")
	case "sms-url":
		return checkURL(v, "http", "https")
	case "listen":
		_, _, err := net.SplitHostPort(v)
		return err
	}
	var err error
	switch f.typ {
	case "duration":
		_, err = time.ParseDuration(v)
	case "int":
		_, err = strconv.Atoi(v)
	case "uint":
		_, err = strconv.ParseUint(v, 10, 64)
	case "float":
		_, err = strconv.ParseFloat(v, 64)
	case "":
		_, err = strconv.ParseBool(v)
	}
	return err
}

func checkURL(v string, schemes ...string) error {
	u, err := url.Parse(v)
	if err != nil {
		return err
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("scheme %q: want %s", u.Scheme, strings.Join(schemes, " or "))
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	return nil
}

// suggest names the closest real variable, for a typo.
func suggest(k string, c *cli) string {
	best, bestD := "", 4
	for e := range c.env {
		if d := editDistance(k, e); d < bestD {
			best, bestD = e, d
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + best + "?)"
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func port(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}

// sendWithinGrace: a provider call in flight at SIGTERM may take up to
// --send-timeout; if that is not below --grace the drain gives up on it, the
// message is redelivered and (email) the recipient may get it twice.
func sendWithinGrace(r *resolved, grace time.Duration) error {
	st, ok := r.duration("send-timeout")
	if !ok || st < grace {
		return nil
	}
	return fmt.Errorf("--send-timeout %s (from %s) must be below --grace %s (from %s), so that a send in flight when the drain starts can finish",
		st, r.source["send-timeout"], grace, r.source["grace"])
}
