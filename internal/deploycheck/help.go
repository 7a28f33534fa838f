package deploycheck

import (
	"bufio"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// flagInfo is one flag as --help describes it.
type flagInfo struct {
	name, short string
	typ         string // the value placeholder ("duration", "string", ...); "" for a bool
	env         string // its environment variable
	def         string
	hasDef      bool
	usage       string // the description, without the env and default notes
	required    bool
}

func (f *flagInfo) takesValue() bool { return f.typ != "" }

// cli is one command (a binary or a subcommand) as --help describes it.
type cli struct {
	path      string // "dispatcher", "nudgectl migrate"
	flags     map[string]*flagInfo
	short     map[string]*flagInfo
	env       map[string]*flagInfo
	subs      map[string]*cli
	allowArgs bool // the usage line takes positional arguments
}

var (
	reFlag    = regexp.MustCompile(`^\s+(?:-([A-Za-z0-9]), )?--([a-z0-9][a-z0-9-]*)(?: (\S+))?\s{2,}(.*)$`)
	reEnvNote = regexp.MustCompile(`\s*\[(?:\$|env )(NUDGE_[A-Z0-9_]+)\]`)
	reDefault = regexp.MustCompile(`\s*\(default (.*)\)\s*$`)
	reSubcmd  = regexp.MustCompile(`^\s+([a-z][a-z0-9-]*)\s{2,}`)
)

// parseHelp reads cobra --help output.
func parseHelp(cmdPath, help string) (*cli, []string) {
	c := &cli{path: cmdPath, flags: map[string]*flagInfo{}, short: map[string]*flagInfo{},
		env: map[string]*flagInfo{}, subs: map[string]*cli{}}
	var subs []string
	section := ""
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != ' ' && strings.HasSuffix(line, ":") {
			section = line
			continue
		}
		if strings.TrimSpace(line) == "" {
			section = ""
			continue
		}
		switch section {
		case "Usage:":
			for _, w := range strings.Fields(line) {
				if w != "[flags]" && w != "[command]" && !slices.Contains(strings.Fields(cmdPath), w) {
					c.allowArgs = true
				}
			}
		case "Available Commands:":
			if m := reSubcmd.FindStringSubmatch(line); m != nil && m[1] != "help" && m[1] != "completion" {
				subs = append(subs, m[1])
			}
		case "Flags:", "Global Flags:":
			m := reFlag.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			f := &flagInfo{short: m[1], name: m[2], typ: m[3], usage: m[4]}
			if e := reEnvNote.FindStringSubmatch(f.usage); e != nil {
				f.env = e[1]
			}
			f.usage = reEnvNote.ReplaceAllString(f.usage, "")
			if d := reDefault.FindStringSubmatch(f.usage); d != nil {
				f.def, f.hasDef = d[1], true
				if u, err := strconv.Unquote(d[1]); err == nil {
					f.def = u
				}
				f.usage = reDefault.ReplaceAllString(f.usage, "")
			}
			f.required = strings.Contains(f.usage, "(required)")
			c.flags[f.name] = f
			if f.short != "" {
				c.short[f.short] = f
			}
			if f.env != "" {
				c.env[f.env] = f
			}
		}
	}
	return c, subs
}

// clis are the binaries ./cmd/... builds, keyed by name.
type clis map[string]*cli

func (cs clis) names() []string { return slices.Sorted(maps.Keys(cs)) }
