package deploycheck

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/message"
)

// extraEnv lists NUDGE_* variables a deployment may set that are not the
// variable of a flag of the binary it runs, with the reason. Keep it small:
// anything here is a variable the checks cannot vouch for.
var extraEnv = map[string]string{
	// (none yet)
}

// ---------------------------------------------------------------------------
// The binaries and their flags, learned from --help.

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

var loadBinaries = sync.OnceValues(func() (clis, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "deploycheck-bin-")
	if err != nil {
		return nil, err
	}
	// The binaries are only run with --help; the directory is small and
	// removed here once their help is read.
	defer os.RemoveAll(dir)
	build := exec.Command("go", "build", "-buildvcs=false", "-o", dir+string(filepath.Separator), "./cmd/...")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	cs := clis{}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".exe")
		c, err := readCLI(filepath.Join(dir, e.Name()), []string{name})
		if err != nil {
			return nil, err
		}
		cs[name] = c
	}
	if len(cs) == 0 {
		return nil, errors.New("go build ./cmd/... built no binaries")
	}
	return cs, nil
})

// readCLI runs BIN [SUB...] --help and parses it, and its subcommands.
func readCLI(bin string, cmdPath []string) (*cli, error) {
	cmd := exec.Command(bin, append(slices.Clone(cmdPath[1:]), "--help")...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NUDGE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --help: %v", strings.Join(cmdPath, " "), err)
	}
	c, subs := parseHelp(strings.Join(cmdPath, " "), string(out))
	if len(c.flags) == 0 {
		return nil, fmt.Errorf("%s --help: found no flags in:\n%s", c.path, out)
	}
	for _, s := range subs {
		sc, err := readCLI(bin, append(slices.Clone(cmdPath), s))
		if err != nil {
			return nil, err
		}
		c.subs[s] = sc
	}
	return c, nil
}

func binaries(t *testing.T) clis {
	t.Helper()
	cs, err := loadBinaries()
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func mustRoot(t *testing.T) string {
	t.Helper()
	r, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ---------------------------------------------------------------------------
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
		case strings.HasPrefix(a, "--"):
			name, val, hasVal := strings.Cut(a[2:], "=")
			f := c.flags[name]
			if f == nil {
				fail("%s has no flag --%s", c.path, name)
				continue
			}
			if f.takesValue() && !hasVal {
				if i+1 >= len(args) {
					fail("--%s needs a value", name)
					continue
				}
				i++
				val = args[i]
			} else if !hasVal {
				val = "true"
			}
			set(f, val, true, "--"+name)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			name, val, hasVal := strings.Cut(a[1:], "=")
			f := c.short[name]
			if f == nil {
				fail("%s has no flag -%s", c.path, name)
				continue
			}
			if f.takesValue() && !hasVal {
				if i+1 >= len(args) {
					fail("-%s needs a value", name)
					continue
				}
				i++
				val = args[i]
			} else if !hasVal {
				val = "true"
			}
			set(f, val, true, "-"+name)
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

// ---------------------------------------------------------------------------
// docker-compose.yml

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image           string `yaml:"image"`
	Build           any    `yaml:"build"`
	Entrypoint      any    `yaml:"entrypoint"`
	Command         any    `yaml:"command"`
	Environment     any    `yaml:"environment"`
	DependsOn       any    `yaml:"depends_on"`
	Restart         string `yaml:"restart"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	Healthcheck     any    `yaml:"healthcheck"`
}

// ours reports whether the service runs the Nudge image.
func (s composeService) ours() bool {
	return s.Build != nil || s.Image == "nudge" || strings.HasPrefix(s.Image, "nudge:")
}

// words turns a compose command or entrypoint into argv.
func words(v any) ([]string, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		if strings.ContainsAny(v, `"'\$`) {
			return nil, fmt.Errorf("write the command as a list, not the string %q", v)
		}
		return strings.Fields(v), nil
	case []any:
		var out []string
		for _, w := range v {
			s, ok := w.(string)
			if !ok {
				return nil, fmt.Errorf("command word %v is not a string", w)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("command of type %T", v)
}

// composeEnv reads environment in its mapping or list form.
func composeEnv(v any) (map[string]envValue, error) {
	env := map[string]envValue{}
	switch v := v.(type) {
	case nil:
	case map[string]any:
		for k, val := range v {
			if val == nil {
				env[k] = envValue{} // passed through from the host
			} else {
				env[k] = envValue{val: fmt.Sprint(val), known: true}
			}
		}
	case []any:
		for _, item := range v {
			s, _ := item.(string)
			k, val, ok := strings.Cut(s, "=")
			env[k] = envValue{val: val, known: ok}
		}
	default:
		return nil, fmt.Errorf("environment of type %T", v)
	}
	return env, nil
}

// composeDeps reads depends_on in its list or mapping form: service → condition.
func composeDeps(v any) map[string]string {
	deps := map[string]string{}
	switch v := v.(type) {
	case []any:
		for _, s := range v {
			deps[fmt.Sprint(s)] = "service_started"
		}
	case map[string]any:
		for name, spec := range v {
			cond := "service_started"
			if m, ok := spec.(map[string]any); ok {
				if c, ok := m["condition"].(string); ok {
					cond = c
				}
			}
			deps[name] = cond
		}
	}
	return deps
}

// checkCompose checks a compose file against the binaries.
func checkCompose(file string, cs clis) []error {
	data, err := os.ReadFile(file)
	if err != nil {
		return []error{err}
	}
	var cf composeFile
	if err := yaml.Unmarshal(data, &cf); err != nil {
		return []error{fmt.Errorf("%s: %w", file, err)}
	}
	if len(cf.Services) == 0 {
		return []error{fmt.Errorf("%s: no services", file)}
	}
	var errs []error
	base := filepath.Base(file)
	res := map[string]*resolved{}
	migrate := ""
	for _, name := range slices.Sorted(maps.Keys(cf.Services)) {
		s := cf.Services[name]
		if !s.ours() {
			continue
		}
		where := base + ": service " + name
		ep, err1 := words(s.Entrypoint)
		cmd, err2 := words(s.Command)
		env, err3 := composeEnv(s.Environment)
		if err := errors.Join(err1, err2, err3); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		r, e := cs.check(invocation{where: where, argv: append(ep, cmd...), env: env})
		errs = append(errs, e...)
		if r == nil {
			continue
		}
		res[name] = r
		if r.cmd.path == "nudgectl migrate" {
			migrate = name
		}
	}
	fail := func(name, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: service %s: "+format, append([]any{base, name}, a...)...))
	}
	if len(res) == 0 {
		errs = append(errs, fmt.Errorf("%s: no service runs the Nudge image", base))
	}
	if migrate == "" {
		errs = append(errs, fmt.Errorf("%s: no service runs `nudgectl migrate`", base))
	}
	errs = append(errs, checkComposeDeclarer(res, migrate)...)
	for _, name := range slices.Sorted(maps.Keys(res)) {
		r, s := res[name], cf.Services[name]
		deps := composeDeps(s.DependsOn)
		for dep, cond := range deps {
			target, ok := cf.Services[dep]
			switch {
			case !ok:
				fail(name, "depends on %s, which is not a service", dep)
			case cond == "service_healthy" && target.Healthcheck == nil:
				fail(name, "waits for %s to be healthy, but it has no healthcheck", dep)
			}
		}
		// Every URL points at a service of this file, on a port it serves.
		for _, flag := range slices.Sorted(maps.Keys(r.values)) {
			if !strings.HasSuffix(flag, "-url") || !r.known[flag] || r.values[flag] == "" {
				continue
			}
			u, err := url.Parse(r.values[flag])
			if err != nil {
				continue // reported by check
			}
			host := u.Hostname()
			if _, ok := cf.Services[host]; !ok {
				fail(name, "--%s (from %s) points at %q, which is not a service of this file", flag, r.source[flag], host)
				continue
			}
			if tr := res[host]; tr != nil && tr.has("listen") && u.Port() != "" && port(tr.values["listen"]) != u.Port() {
				fail(name, "--%s points at port %s, but %s listens on %s", flag, u.Port(), host, tr.values["listen"])
			}
			switch {
			case host == name:
			case flag == "database-url" && r.cmd.path == "nudgectl migrate":
				if deps[host] != "service_healthy" {
					fail(name, "must wait for %s with condition service_healthy", host)
				}
			case flag == "database-url" && migrate != "" && name != migrate:
				if deps[migrate] != "service_completed_successfully" {
					fail(name, "must wait for %s with condition service_completed_successfully", migrate)
				}
			case flag == "amqp-url":
				if deps[host] != "service_healthy" {
					fail(name, "must wait for %s with condition service_healthy", host)
				}
			}
		}
		if r.has("listen") && isLoopback(r.values["listen"]) {
			fail(name, "listens on %s (from %s), which other containers cannot reach", r.values["listen"], r.source["listen"])
		}
		if name == migrate && s.Restart != "no" {
			fail(name, `a one-shot migration needs restart: "no", not %q`, s.Restart)
		}
		if grace, ok := r.duration("grace"); ok {
			stop := 10 * time.Second // compose's default
			if s.StopGracePeriod != "" {
				d, err := time.ParseDuration(s.StopGracePeriod)
				if err != nil {
					fail(name, "stop_grace_period %q: %v", s.StopGracePeriod, err)
					continue
				}
				stop = d
			}
			if stop <= grace {
				fail(name, "stop_grace_period %s must exceed --grace %s, or a stop kills in-flight sends", stop, grace)
			}
			if err := sendWithinGrace(r, grace); err != nil {
				fail(name, "%v", err)
			}
		}
	}
	return errs
}

// ---------------------------------------------------------------------------
// Kubernetes manifests

// knownKinds are the kinds the base may hold, with their apiVersion.
var knownKinds = map[string]string{
	"Namespace":           "v1",
	"ConfigMap":           "v1",
	"Secret":              "v1",
	"Service":             "v1",
	"Job":                 "batch/v1",
	"CronJob":             "batch/v1",
	"Deployment":          "apps/v1",
	"PodDisruptionBudget": "policy/v1",
	"NetworkPolicy":       "networking.k8s.io/v1",
}

type obj = map[string]any

func at(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(obj)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any, keys ...string) string {
	s, _ := at(v, keys...).(string)
	return s
}

func list(v any, keys ...string) []any {
	l, _ := at(v, keys...).([]any)
	return l
}

func num(v any, keys ...string) (int, bool) {
	switch n := at(v, keys...).(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case float64:
		return int(n), true
	}
	return 0, false
}

func boolAt(v any, keys ...string) (value, ok bool) {
	b, ok := at(v, keys...).(bool)
	return b, ok
}

type manifest struct {
	file string
	doc  obj
}

func (m manifest) where() string {
	return fmt.Sprintf("%s: %s %s", m.file, str(m.doc, "kind"), str(m.doc, "metadata", "name"))
}

// readManifests decodes every YAML document in dir's *.yaml files.
func readManifests(dir string) ([]manifest, []error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, []error{fmt.Errorf("%s: no *.yaml files (%v)", dir, err)}
	}
	var out []manifest
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 1; ; i++ {
			var doc obj
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", filepath.Base(f), i, err))
				break
			}
			if doc != nil {
				out = append(out, manifest{file: filepath.Base(f), doc: doc})
			}
		}
	}
	return out, errs
}

// podTemplate is where a workload keeps its pod template.
func podTemplate(doc obj) (obj, bool) {
	var t any
	switch str(doc, "kind") {
	case "Deployment", "Job":
		t = at(doc, "spec", "template")
	case "CronJob":
		t = at(doc, "spec", "jobTemplate", "spec", "template")
	default:
		return nil, false
	}
	m, _ := t.(obj)
	return m, true
}

// ourImage reports whether image is the Nudge image (any registry, any tag).
func ourImage(image string) bool {
	name, _, _ := strings.Cut(path.Base(image), "@")
	name, _, _ = strings.Cut(name, ":")
	return name == "nudge"
}

// workload is one container of a base workload that runs the Nudge image.
type workload struct {
	m         manifest
	where     string
	labels    obj // the pod template's labels
	container obj
	r         *resolved
}

// baseInfo is what components and overlays are checked against.
type baseInfo struct {
	objects   []manifest
	secrets   map[string]map[string]string
	workloads []workload
}

// checkKustomize checks a kustomize base directory against the binaries.
func checkKustomize(dir string, cs clis) []error {
	_, errs := inspectBase(dir, cs)
	return errs
}

// inspectBase checks a kustomize base directory against the binaries and
// returns what it found.
func inspectBase(dir string, cs clis) (*baseInfo, []error) {
	docs, errs := readManifests(dir)
	fail := func(where, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{where}, a...)...))
	}

	// Shape and kind of every document; the kustomization's resource list.
	var kust obj
	configMaps := map[string]map[string]string{}
	secrets := map[string]map[string]string{}
	var objects []manifest
	for _, m := range docs {
		if m.file == "kustomization.yaml" {
			kust = m.doc
			if str(m.doc, "kind") != "Kustomization" || str(m.doc, "apiVersion") != "kustomize.config.k8s.io/v1beta1" {
				fail(m.file, "want apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization")
			}
			continue
		}
		kind, api, name := str(m.doc, "kind"), str(m.doc, "apiVersion"), str(m.doc, "metadata", "name")
		if kind == "" || api == "" || name == "" {
			fail(m.file, "a document lacks apiVersion, kind or metadata.name")
			continue
		}
		if want, ok := knownKinds[kind]; !ok {
			fail(m.where(), "kind %s is not one the base is expected to hold", kind)
			continue
		} else if api != want {
			fail(m.where(), "apiVersion %s, want %s", api, want)
		}
		objects = append(objects, m)
		switch kind {
		case "ConfigMap":
			data := map[string]string{}
			for k, v := range asObj(at(m.doc, "data")) {
				data[k] = fmt.Sprint(v)
			}
			configMaps[name] = data
		case "Secret":
			data := map[string]string{}
			for k, v := range asObj(at(m.doc, "stringData")) {
				data[k] = fmt.Sprint(v)
			}
			for k, v := range asObj(at(m.doc, "data")) {
				b, err := base64.StdEncoding.DecodeString(fmt.Sprint(v))
				if err != nil {
					fail(m.where(), "data.%s is not base64", k)
				}
				data[k] = string(b)
			}
			secrets[name] = data
		}
	}
	if kust == nil {
		fail(dir, "no kustomization.yaml")
	} else {
		listed := map[string]bool{}
		for _, r := range list(kust, "resources") {
			rs := fmt.Sprint(r)
			listed[rs] = true
			if _, err := os.Stat(filepath.Join(dir, rs)); err != nil {
				fail("kustomization.yaml", "resource %s: %v", rs, err)
			}
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, f := range files {
			b := filepath.Base(f)
			switch {
			case b == "kustomization.yaml":
			case strings.Contains(b, ".example."):
				if listed[b] {
					fail("kustomization.yaml", "%s is an example with placeholder values; it must not be a resource", b)
				}
			case !listed[b]:
				fail("kustomization.yaml", "%s is not listed in resources", b)
			}
		}
		ns := str(kust, "namespace")
		found := false
		for _, m := range objects {
			found = found || (str(m.doc, "kind") == "Namespace" && str(m.doc, "metadata", "name") == ns)
		}
		if ns == "" || !found {
			fail("kustomization.yaml", "namespace %q must be set and created by a Namespace in the base", ns)
		}
	}

	// Workloads.
	type consumer struct {
		where string
		r     *resolved
	}
	var workloads []workload
	sharedReaders := map[string][]consumer{} // "ConfigMap/name" → who reads it
	podLabels := map[string][]obj{}          // kind → pod template labels, for selectors
	ours := 0                                // containers running the nudge image
	for _, m := range objects {
		tmpl, isWorkload := podTemplate(m.doc)
		if !isWorkload {
			continue
		}
		kind := str(m.doc, "kind")
		if tmpl == nil {
			fail(m.where(), "no pod template")
			continue
		}
		podLabels[kind] = append(podLabels[kind], asObj(at(tmpl, "metadata", "labels")))
		spec := asObj(at(tmpl, "spec"))
		checkPodSecurity(m.where(), spec, fail)
		for _, cv := range append(list(spec, "initContainers"), list(spec, "containers")...) {
			c := asObj(cv)
			where := m.where() + ": container " + str(c, "name")
			checkContainerSecurity(where, spec, c, fail)
			if !ourImage(str(c, "image")) {
				continue
			}
			inv := invocation{where: where, env: map[string]envValue{}, shared: map[string]envValue{}}
			for _, w := range append(list(c, "command"), list(c, "args")...) {
				inv.argv = append(inv.argv, fmt.Sprint(w))
			}
			for _, e := range list(c, "env") {
				if v, ok := at(e, "value").(string); ok {
					inv.env[str(e, "name")] = envValue{val: v, known: true}
				} else {
					inv.env[str(e, "name")] = envValue{}
				}
			}
			var sources []string
			for _, ef := range list(c, "envFrom") {
				prefix := str(ef, "prefix")
				var data map[string]string
				var ok bool
				var src string
				if n := str(ef, "configMapRef", "name"); n != "" {
					src = "ConfigMap/" + n
					data, ok = configMaps[n]
				} else if n := str(ef, "secretRef", "name"); n != "" {
					src = "Secret/" + n
					data, ok = secrets[n]
				}
				if !ok {
					fail(where, "envFrom %s: not in the base (nor an example of it)", src)
					continue
				}
				sources = append(sources, src)
				for k, v := range data {
					inv.shared[prefix+k] = envValue{val: v, known: true}
				}
			}
			ours++
			r, e := cs.check(inv)
			errs = append(errs, e...)
			if r == nil {
				continue
			}
			for _, src := range sources {
				sharedReaders[src] = append(sharedReaders[src], consumer{where, r})
			}
			checkWorkloadTiming(m, where, spec, c, r, fail)
			workloads = append(workloads, workload{m: m, where: where, labels: asObj(at(tmpl, "metadata", "labels")), container: c, r: r})
		}
	}

	if ours == 0 {
		fail(dir, "no container runs the nudge image")
	}

	// A shared source's keys are read by someone, and mean the same to all.
	for _, src := range slices.Sorted(maps.Keys(sharedReaders)) {
		kind, name, _ := strings.Cut(src, "/")
		data := configMaps[name]
		if kind == "Secret" {
			data = secrets[name]
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			meaning := map[string][]string{}
			for _, c := range sharedReaders[src] {
				if f := c.r.cmd.env[k]; f != nil {
					m := f.typ + ": " + f.usage
					if !slices.Contains(meaning[m], c.r.cmd.path) {
						meaning[m] = append(meaning[m], c.r.cmd.path)
					}
				}
			}
			switch {
			case len(meaning) == 0:
				fail(src, "%s is not the variable of a flag of any container that reads %s", k, src)
			case len(meaning) > 1:
				var desc []string
				for _, m := range slices.Sorted(maps.Keys(meaning)) {
					desc = append(desc, fmt.Sprintf("%s (%s)", strings.Join(meaning[m], ", "), m))
				}
				fail(src, "%s means different things to %s: set it per container instead", k, strings.Join(desc, " and "))
			}
		}
	}

	// Services and PodDisruptionBudgets select a Deployment's pods.
	for _, m := range objects {
		var sel obj
		switch str(m.doc, "kind") {
		case "Service":
			sel = asObj(at(m.doc, "spec", "selector"))
		case "PodDisruptionBudget":
			sel = asObj(at(m.doc, "spec", "selector", "matchLabels"))
		default:
			continue
		}
		matched := false
		for _, labels := range podLabels["Deployment"] {
			matched = matched || (len(sel) > 0 && subset(sel, labels))
		}
		if !matched {
			fail(m.where(), "selector %v matches no Deployment's pods", sel)
		}
	}
	for _, m := range objects {
		if str(m.doc, "kind") != "Deployment" {
			continue
		}
		sel := asObj(at(m.doc, "spec", "selector", "matchLabels"))
		if len(sel) == 0 || !subset(sel, asObj(at(m.doc, "spec", "template", "metadata", "labels"))) {
			fail(m.where(), "spec.selector.matchLabels must match the pod template's labels")
		}
	}
	errs = append(errs, checkNetworkPolicies(objects, workloads)...)
	errs = append(errs, checkK8sDeclarer(workloads)...)
	errs = append(errs, checkPoolSizes(workloads)...)
	return &baseInfo{objects: objects, secrets: secrets, workloads: workloads}, errs
}

func asObj(v any) obj {
	m, _ := v.(obj)
	return m
}

func subset(sel, labels obj) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkPodSecurity checks the pod-level settings every Nudge pod carries.
func checkPodSecurity(where string, spec obj, fail func(string, string, ...any)) {
	if v, ok := boolAt(spec, "enableServiceLinks"); !ok || v {
		// Service links inject <SERVICE>_PORT and friends; a Service named
		// nudge-* would put NUDGE_* variables next to our flags' variables.
		fail(where, "enableServiceLinks must be false")
	}
	if v, ok := boolAt(spec, "automountServiceAccountToken"); !ok || v {
		fail(where, "automountServiceAccountToken must be false: Nudge does not call the Kubernetes API")
	}
}

// checkContainerSecurity checks a container's effective security context
// (the container's own settings, falling back to the pod's).
func checkContainerSecurity(where string, pod, c obj, fail func(string, string, ...any)) {
	psc, csc := asObj(at(pod, "securityContext")), asObj(at(c, "securityContext"))
	eff := func(key ...string) any {
		if v := at(csc, key...); v != nil {
			return v
		}
		return at(psc, key...)
	}
	if v, _ := eff("runAsNonRoot").(bool); !v {
		fail(where, "runAsNonRoot must be true")
	}
	if v, _ := num(obj{"v": eff("runAsUser")}, "v"); v != 65532 {
		fail(where, "runAsUser must be 65532 (the image's nonroot user)")
	}
	if v, _ := eff("seccompProfile", "type").(string); v != "RuntimeDefault" {
		fail(where, "seccompProfile.type must be RuntimeDefault")
	}
	if v, ok := boolAt(csc, "allowPrivilegeEscalation"); !ok || v {
		fail(where, "allowPrivilegeEscalation must be false")
	}
	if v, ok := boolAt(csc, "readOnlyRootFilesystem"); !ok || !v {
		fail(where, "readOnlyRootFilesystem must be true")
	}
	if !slices.ContainsFunc(list(csc, "capabilities", "drop"), func(v any) bool { return v == "ALL" }) {
		fail(where, "capabilities.drop must include ALL")
	}
	if len(list(csc, "capabilities", "add")) > 0 {
		fail(where, "capabilities.add must be empty")
	}
	for _, kind := range []string{"requests", "limits"} {
		for _, res := range []string{"cpu", "memory"} {
			if at(c, "resources", kind, res) == nil {
				fail(where, "resources.%s.%s must be set", kind, res)
			}
		}
	}
}

// checkWorkloadTiming checks what must agree between a workload's spec and
// its binary's flags.
func checkWorkloadTiming(m manifest, where string, pod, c obj, r *resolved, fail func(string, string, ...any)) {
	kind := str(m.doc, "kind")
	if kind == "CronJob" || kind == "Job" {
		if r.has("every") && r.values["every"] != "" {
			fail(where, "--every (from %s) makes the run loop forever; a %s must exit", r.source["every"], kind)
		}
	}
	if kind == "CronJob" {
		if p := str(m.doc, "spec", "concurrencyPolicy"); p != "Forbid" {
			fail(m.where(), "concurrencyPolicy must be Forbid, not %q", p)
		}
		deadline, ok := num(m.doc, "spec", "jobTemplate", "spec", "activeDeadlineSeconds")
		if !ok {
			fail(m.where(), "jobTemplate.spec.activeDeadlineSeconds must be set")
		} else if budget, ok := r.duration("budget"); ok && time.Duration(deadline)*time.Second <= budget {
			fail(where, "--budget %s (from %s) must be below activeDeadlineSeconds %d", budget, r.source["budget"], deadline)
		}
	}
	if kind != "Deployment" {
		return
	}
	if r.has("every") && r.values["every"] == "" {
		fail(where, "without --every %s runs once and exits; a Deployment would restart it forever", r.bin)
	}
	if grace, ok := r.duration("grace"); ok {
		tgp, set := num(pod, "terminationGracePeriodSeconds")
		if !set {
			tgp = 30
		}
		if time.Duration(tgp)*time.Second <= grace {
			fail(where, "--grace %s (from %s) must be below terminationGracePeriodSeconds %d", grace, r.source["grace"], tgp)
		}
		if err := sendWithinGrace(r, grace); err != nil {
			fail(where, "%v", err)
		}
	}
	if !r.has("listen") {
		return
	}
	listen := r.values["listen"]
	if listen == "" {
		fail(where, "--listen is empty: no /healthz, /readyz or /metrics to probe")
		return
	}
	ports := map[string]string{} // name → number
	for _, p := range list(c, "ports") {
		n, _ := num(p, "containerPort")
		ports[str(p, "name")] = strconv.Itoa(n)
		ports[strconv.Itoa(n)] = strconv.Itoa(n)
	}
	if ports["metrics"] != port(listen) {
		fail(where, "containerPort named metrics (%s) must be the --listen port (%s)", ports["metrics"], port(listen))
	}
	for probe, wantPath := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		h := at(c, probe, "httpGet")
		if h == nil {
			fail(where, "%s must be an httpGet of %s", probe, wantPath)
			continue
		}
		if p := str(h, "path"); p != wantPath {
			fail(where, "%s path %q, want %s", probe, p, wantPath)
		}
		pp := fmt.Sprint(at(h, "port"))
		if ports[pp] != port(listen) {
			fail(where, "%s port %s is not the --listen port %s", probe, pp, port(listen))
		}
	}
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

// checkOverlay checks an overlay builds on the base and pins the image.
func checkOverlay(dir string) []error {
	docs, errs := readManifests(dir)
	if len(errs) > 0 {
		return errs
	}
	var k obj
	for _, m := range docs {
		if m.file == "kustomization.yaml" {
			k = m.doc
		}
	}
	where := filepath.Join(filepath.Base(dir), "kustomization.yaml")
	if k == nil {
		return []error{fmt.Errorf("%s: missing", where)}
	}
	if str(k, "namespace") == "" {
		errs = append(errs, fmt.Errorf("%s: namespace must be set", where))
	}
	hasBase := false
	for _, r := range list(k, "resources") {
		rs := fmt.Sprint(r)
		if _, err := os.Stat(filepath.Join(dir, rs, "kustomization.yaml")); err == nil && filepath.Base(rs) == "base" {
			hasBase = true
		}
	}
	if !hasBase {
		errs = append(errs, fmt.Errorf("%s: resources must include the base", where))
	}
	pinned := false
	for _, img := range list(k, "images") {
		pinned = pinned || (str(img, "name") == "nudge" && (str(img, "newTag") != "" || str(img, "digest") != ""))
	}
	if !pinned {
		errs = append(errs, fmt.Errorf("%s: images must set newTag (or digest) for the image named nudge", where))
	}
	return errs
}

// ---------------------------------------------------------------------------
// Dockerfile, Makefile, .dockerignore

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

func parseDockerfile(src string) []instruction {
	var out []instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
	}
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(t, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(t)
		flush()
	}
	flush()
	return out
}

// goBuild is what a `go build` command line builds.
type goBuild struct {
	packages []string
	cgoOff   bool
	versionX string // the -X target that sets the version, IMPORTPATH.NAME
	out      string
}

var reVersionX = regexp.MustCompile(`-X[= ]+([\w./-]+\.\w+)=`)

func parseGoBuild(line string) (goBuild, bool) {
	i := strings.Index(line, "go build")
	if i < 0 {
		return goBuild{}, false
	}
	b := goBuild{cgoOff: strings.Contains(line[:i], "CGO_ENABLED=0")}
	if m := reVersionX.FindStringSubmatch(line); m != nil {
		b.versionX = m[1]
	}
	f := strings.Fields(line[i:])
	for j, w := range f {
		if strings.HasPrefix(w, "./") {
			b.packages = append(b.packages, w)
		}
		if w == "-o" && j+1 < len(f) {
			b.out = f[j+1]
		}
	}
	return b, true
}

// checkDockerfile checks the Dockerfile builds what `make build` builds and
// runs it as the nonroot user. makefile may be "" when there is none.
func checkDockerfile(dockerfile, makefile, root string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf("Dockerfile: "+format, a...)) }
	type stage struct {
		from, name string
		ins        []instruction
	}
	var stages []*stage
	for _, in := range parseDockerfile(dockerfile) {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			s := &stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	if len(stages) < 2 {
		fail("want a builder stage and a final stage, have %d stage(s)", len(stages))
		return errs
	}
	var build goBuild
	builder := ""
	for _, s := range stages[:len(stages)-1] {
		for _, in := range s.ins {
			if in.cmd == "RUN" {
				if b, ok := parseGoBuild(in.args); ok {
					build, builder = b, s.name
				}
			}
		}
	}
	if builder == "" {
		fail("no builder stage (FROM ... AS NAME) runs go build")
		return errs
	}
	if !slices.Equal(build.packages, []string{"./cmd/..."}) {
		fail("go build builds %v, want ./cmd/... (every binary)", build.packages)
	}
	if !build.cgoOff {
		fail("go build must run with CGO_ENABLED=0: the final image has no libc")
	}
	if err := checkVersionVar(build.versionX, root); err != nil {
		fail("%v", err)
	}
	if makefile != "" {
		mk, ok := makeBuild(makefile)
		switch {
		case !ok:
			fail("the Makefile's build target runs no go build")
		case !slices.Equal(mk.packages, build.packages):
			fail("builds %v but `make build` builds %v", build.packages, mk.packages)
		case mk.versionX != build.versionX:
			fail("sets the version with -X %s but `make build` with -X %s", build.versionX, mk.versionX)
		case mk.cgoOff != build.cgoOff:
			fail("CGO_ENABLED differs from `make build`")
		}
	}
	final := stages[len(stages)-1]
	if !strings.Contains(final.from, "distroless") || !strings.HasSuffix(final.from, ":nonroot") {
		fail("final stage FROM %s, want a distroless :nonroot image", final.from)
	}
	user, copied := "", false
	for _, in := range final.ins {
		switch in.cmd {
		case "USER":
			user = in.args
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+builder && strings.TrimSuffix(f[1], "/") == strings.TrimSuffix(build.out, "/") &&
				strings.TrimSuffix(f[2], "/") == "/usr/local/bin" {
				copied = true
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u != "65532" && u != "nonroot" {
		fail("final stage runs as %q, want USER 65532 (nonroot)", user)
	}
	if !copied {
		fail("final stage must COPY --from=%s %s /usr/local/bin/", builder, build.out)
	}
	return errs
}

var reMakeVar = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|=)\s*(.*)$`)

// makeBuild finds the go build line of the Makefile's build target, with
// the Makefile's simple variables expanded.
func makeBuild(makefile string) (goBuild, bool) {
	vars := map[string]string{}
	for _, line := range strings.Split(makefile, "\n") {
		if m := reMakeVar.FindStringSubmatch(strings.TrimPrefix(line, "export ")); m != nil {
			vars[m[1]] = m[2]
		}
	}
	expand := func(s string) string {
		for range 5 {
			for k, v := range vars {
				s = strings.ReplaceAll(s, "$("+k+")", v)
			}
		}
		return s
	}
	in := false
	for _, line := range strings.Split(makefile, "\n") {
		switch {
		case strings.HasPrefix(line, "build:"):
			in = true
		case in && strings.HasPrefix(line, "\t"):
			if b, ok := parseGoBuild(expand(line)); ok {
				return b, true
			}
		case in && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#"):
			in = false
		}
	}
	return goBuild{}, false
}

// checkVersionVar checks -X IMPORTPATH.Version names a string variable that exists.
func checkVersionVar(target, root string) error {
	if target == "" {
		return errors.New("go build does not set the version with -ldflags -X .../internal/config.Version=")
	}
	modData, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return err
	}
	mod := ""
	for _, line := range strings.Split(string(modData), "\n") {
		if m, ok := strings.CutPrefix(line, "module "); ok {
			mod = strings.TrimSpace(m)
		}
	}
	pkg, name := target[:strings.LastIndex(target, ".")], target[strings.LastIndex(target, ".")+1:]
	rel, ok := strings.CutPrefix(pkg, mod+"/")
	if !ok {
		return fmt.Errorf("-X %s is outside module %s", target, mod)
	}
	files, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(rel), "*.go"))
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("-X %s: %v", target, err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if n.Name == name {
						return nil
					}
				}
			}
		}
	}
	return fmt.Errorf("-X %s: package %s declares no variable %s", target, pkg, name)
}

// checkDockerignore checks the build context keeps what the build needs.
func checkDockerignore(ignore string, needed []string) []error {
	type pattern struct {
		glob   string
		negate bool
	}
	var pats []pattern
	for _, line := range strings.Split(ignore, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		p := pattern{glob: t}
		if s, ok := strings.CutPrefix(t, "!"); ok {
			p = pattern{glob: s, negate: true}
		}
		p.glob = strings.Trim(path.Clean(p.glob), "/")
		pats = append(pats, p)
	}
	var errs []error
	for _, n := range needed {
		excluded, by := false, ""
		for _, p := range pats {
			// A pattern excludes the path or any directory above it.
			for q := n; q != "." && q != "/"; q = path.Dir(q) {
				if globMatch(p.glob, q) {
					excluded, by = !p.negate, p.glob
					break
				}
			}
		}
		if excluded {
			errs = append(errs, fmt.Errorf(".dockerignore: %q excludes %s, which the build needs", by, n))
		}
	}
	return errs
}

// globMatch is path.Match plus a leading "**/" (any directories) and "**".
func globMatch(glob, name string) bool {
	if glob == "**" {
		return true
	}
	if rest, ok := strings.CutPrefix(glob, "**/"); ok {
		for {
			if globMatch(rest, name) {
				return true
			}
			_, tail, ok := strings.Cut(name, "/")
			if !ok {
				return false
			}
			name = tail
		}
	}
	ok, _ := path.Match(glob, name)
	return ok
}

// buildInputs lists what go build ./cmd/... reads: go.mod, go.sum and every
// in-module package directory it compiles (with its embedded files).
func buildInputs(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{range .EmbedFiles}} {{$.Dir}}/{{.}}{{end}}{{end}}", "./cmd/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	need := []string{"go.mod", "go.sum"}
	for _, p := range strings.Fields(string(out)) {
		if rel, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(rel, "..") {
			need = append(need, filepath.ToSlash(rel))
		}
	}
	return need
}

// ---------------------------------------------------------------------------
// Tests of the real files.

func requireNoErrors(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
}

func TestBinariesHelpIsUnderstood(t *testing.T) {
	cs := binaries(t)
	for _, want := range []string{"dispatcher", "email-worker", "sms-worker", "reconciler", "nudgectl", "fake-sms"} {
		if cs[want] == nil {
			t.Errorf("go build ./cmd/... did not build %s (built %v)", want, cs.names())
		}
	}
	// A few flags the checks rely on, to prove the help parser reads them.
	for _, c := range []struct{ bin, flag, env, def string }{
		{"dispatcher", "budget", "NUDGE_BUDGET", "4m0s"},
		{"dispatcher", "every", "NUDGE_EVERY", ""},
		{"email-worker", "grace", "NUDGE_GRACE", "25s"},
		{"sms-worker", "listen", "NUDGE_LISTEN", "127.0.0.1:8080"},
		{"fake-sms", "listen", "NUDGE_FAKE_SMS_LISTEN", "127.0.0.1:9025"},
	} {
		f := cs[c.bin].flags[c.flag]
		if f == nil || f.env != c.env || f.def != c.def {
			t.Errorf("%s --%s: parsed %+v, want env %s default %q", c.bin, c.flag, f, c.env, c.def)
		}
	}
	if f := cs["dispatcher"].flags["signing-keys"]; f == nil || !f.required {
		t.Errorf("dispatcher --signing-keys should parse as required: %+v", f)
	}
	if m := cs["nudgectl"].subs["migrate"]; m == nil || m.flags["database-url"] == nil {
		t.Errorf("nudgectl migrate should inherit --database-url")
	}
}

func TestCompose(t *testing.T) {
	requireNoErrors(t, checkCompose(filepath.Join(mustRoot(t), "docker-compose.yml"), binaries(t)))
}

func TestKustomizeBase(t *testing.T) {
	requireNoErrors(t, checkKustomize(filepath.Join(mustRoot(t), "deploy", "k8s", "base"), binaries(t)))
}

func TestKustomizeOverlays(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(mustRoot(t), "deploy", "k8s", "overlays", "*"))
	if len(dirs) == 0 {
		t.Fatal("no overlays in deploy/k8s/overlays")
	}
	for _, d := range dirs {
		requireNoErrors(t, checkOverlay(d))
	}
}

func TestDockerfile(t *testing.T) {
	root := mustRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if mk == nil {
		t.Log("no Makefile: not comparing with `make build`")
	}
	requireNoErrors(t, checkDockerfile(string(df), string(mk), root))
}

func TestDockerignore(t *testing.T) {
	root := mustRoot(t)
	ig, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	requireNoErrors(t, checkDockerignore(string(ig), buildInputs(t, root)))
}

// ---------------------------------------------------------------------------
// The checkers catch mistakes: each case breaks a copy of a real file.

type breakage struct {
	name     string
	file     string // relative to the copied directory
	old, new string
	want     string // a substring of one of the errors
}

// broken copies src (a file or a directory) to a temp dir, applies b, and
// returns the copy's path.
func broken(t *testing.T, src string, b breakage) string {
	t.Helper()
	dst := t.TempDir()
	info, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if info.IsDir() {
		files, _ := filepath.Glob(filepath.Join(src, "*"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst = filepath.Join(dst, filepath.Base(src))
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	target := dst
	if info.IsDir() {
		target = filepath.Join(dst, b.file)
	}
	data, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(b.old)) {
		t.Fatalf("%s no longer contains %q: update this case", b.file, b.old)
	}
	data = bytes.Replace(data, []byte(b.old), []byte(b.new), 1)
	if err := os.WriteFile(target, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func wantError(t *testing.T, errs []error, want string) {
	t.Helper()
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			t.Logf("caught: %v", e)
			return
		}
	}
	t.Errorf("no error mentions %q; got %v", want, errs)
}

func TestComposeCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "docker-compose.yml")
	for _, b := range []breakage{
		{name: "bogus flag", old: `"--every", "5s"`, new: `"--evry", "5s"`, want: "dispatcher has no flag --evry"},
		{name: "bogus variable", old: "NUDGE_SMTP_URL:", new: "NUDGE_SMTP_URI:", want: "NUDGE_SMTP_URI is not the variable of any flag of email-worker (did you mean NUDGE_SMTP_URL?)"},
		{name: "variable of another binary", old: "NUDGE_FAKE_SMS_TOKEN:", new: "NUDGE_SMS_TOKEN:", want: "NUDGE_SMS_TOKEN is not the variable of any flag of fake-sms"},
		{name: "unknown binary", old: `["dispatcher",`, new: `["dispatch",`, want: `"dispatch" is not a binary`},
		{name: "missing subcommand", old: `["nudgectl", "migrate",`, new: `["nudgectl",`, want: "nudgectl needs a subcommand"},
		{name: "nobody declares the topology", old: `["nudgectl", "migrate", "--declare-topology"]`, new: `["nudgectl", "migrate"]`,
			want: "service migrate must run `nudgectl migrate --declare-topology`: [dispatcher email-worker reconciler sms-worker] only check"},
		{name: "declarer has no broker", old: "      NUDGE_AMQP_URL: amqp://nudge:nudge@rabbitmq:5672/\n    depends_on:\n      postgres:", new: "    depends_on:\n      postgres:",
			want: "--amqp-url (from default) points at \"127.0.0.1\", which is not a service"},
		{name: "bad duration", old: `"--every", "5s"`, new: `"--every", "5 seconds"`, want: `--every (from --every) = "5 seconds"`},
		{name: "bad signing key", old: "dev:compose-dev-signing-key-0123456789abcdef", new: "dev:short", want: "secret must be at least"},
		{name: "bad SMTP URL", old: "smtp://mailpit:1025?tls=none", new: "smtp://mailpit:1025?tls=nope", want: "--smtp-url"},
		{name: "URL to no service", old: "http://fake-sms:9025", new: "http://localhost:9025", want: `points at "localhost", which is not a service`},
		{name: "URL to the wrong port", old: "http://fake-sms:9025", new: "http://fake-sms:9026", want: "points at port 9026, but fake-sms listens on 0.0.0.0:9025"},
		{name: "loopback listener", old: `"--listen", "0.0.0.0:9025"`, new: `"--listen", "127.0.0.1:9025"`, want: "other containers cannot reach"},
		{name: "migrate not awaited", old: "condition: service_completed_successfully", new: "condition: service_started", want: "must wait for migrate with condition service_completed_successfully"},
		{name: "broker not awaited", old: "  rabbitmq:\n    condition: service_healthy", new: "  rabbitmq:\n    condition: service_started", want: "must wait for rabbitmq with condition service_healthy"},
		{name: "migrate restarts", old: `restart: "no"`, new: `restart: on-failure`, want: `restart: "no"`},
		{name: "short stop grace", old: "stop_grace_period: 30s", new: "stop_grace_period: 20s", want: "stop_grace_period 20s must exceed --grace 25s"},
		{name: "send outlives the drain", old: `["email-worker", "--send-timeout", "20s"]`, new: `["email-worker"]`, want: "--send-timeout 30s (from default) must be below --grace 25s (from default)"},
		{name: "missing required flag", old: "  NUDGE_SIGNING_KEYS: dev:compose-dev-signing-key-0123456789abcdef\n", new: "\n", want: "--signing-keys is required"},
	} {
		t.Run(b.name, func(t *testing.T) {
			wantError(t, checkCompose(broken(t, src, b), cs), b.want)
		})
	}
}

func TestKustomizeCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "deploy", "k8s", "base")
	for _, b := range []breakage{
		{name: "bogus flag", file: "reconciler.yaml", old: `"--every=10s"`, new: `"--evrey=10s"`, want: "reconciler has no flag --evrey"},
		{name: "bogus variable", file: "email-worker.yaml", old: "          envFrom:", new: "          env:\n            - name: NUDGE_GRACE_PERIOD\n              value: 25s\n          envFrom:", want: "NUDGE_GRACE_PERIOD is not the variable of any flag of email-worker"},
		{name: "unread shared key", file: "configmap.yaml", old: "  NUDGE_LOG_LEVEL: info", new: "  NUDGE_LOG_LEVL: info", want: "NUDGE_LOG_LEVL is not the variable of a flag of any container"},
		{name: "shared key with two meanings", file: "configmap.yaml", old: "  NUDGE_LOG_LEVEL: info", new: "  NUDGE_LOG_LEVEL: info\n  NUDGE_BATCH: \"100\"", want: "NUDGE_BATCH means different things"},
		{name: "looping CronJob", file: "dispatcher-cronjob.yaml", old: `"--budget=4m"`, new: `"--budget=4m", "--every=5s"`, want: "a CronJob must exit"},
		{name: "budget over deadline", file: "dispatcher-cronjob.yaml", old: `"--budget=4m"`, new: `"--budget=6m"`, want: "must be below activeDeadlineSeconds 300"},
		{name: "send outlives the drain", file: "email-worker.yaml", old: `"--send-timeout=20s"`, new: `"--send-timeout=30s"`, want: "--send-timeout 30s (from --send-timeout) must be below --grace 25s"},
		{name: "grace over termination period", file: "sms-worker.yaml", old: `"--grace=25s"`, new: `"--grace=45s"`, want: "must be below terminationGracePeriodSeconds 40"},
		{name: "probe on the wrong port", file: "reconciler.yaml", old: `"--listen=:8080"`, new: `"--listen=:9090"`, want: "must be the --listen port (9090)"},
		{name: "wrong probe path", file: "email-worker.yaml", old: "path: /readyz", new: "path: /healthz", want: "readinessProbe path"},
		{name: "writable root", file: "reconciler.yaml", old: "readOnlyRootFilesystem: true", new: "readOnlyRootFilesystem: false", want: "readOnlyRootFilesystem must be true"},
		{name: "root user", file: "migrate-job.yaml", old: "runAsUser: 65532", new: "runAsUser: 0", want: "runAsUser must be 65532"},
		{name: "no resource limits", file: "dispatcher-cronjob.yaml", old: "                limits:\n                  cpu: \"1\"\n", new: "                limits:\n", want: "resources.limits.cpu must be set"},
		{name: "service links", file: "sms-worker.yaml", old: "enableServiceLinks: false", new: "enableServiceLinks: true", want: "enableServiceLinks must be false"},
		{name: "unlisted resource", file: "kustomization.yaml", old: "  - reconciler.yaml\n", new: "", want: "reconciler.yaml is not listed in resources"},
		{name: "example secret deployed", file: "kustomization.yaml", old: "  - reconciler.yaml\n", new: "  - reconciler.yaml\n  - secret.example.yaml\n", want: "must not be a resource"},
		{name: "unknown kind", file: "namespace.yaml", old: "kind: Namespace", new: "kind: Namespaces", want: "kind Namespaces is not one"},
		{name: "missing name", file: "configmap.yaml", old: "name: nudge-config", new: "labelz: x", want: "lacks apiVersion, kind or metadata.name"},
		{name: "unknown binary", file: "migrate-job.yaml", old: `["nudgectl", "migrate",`, new: `["nudge-ctl", "migrate",`, want: `"nudge-ctl" is not a binary`},
		{name: "migration does not declare", file: "migrate-job.yaml", old: `["nudgectl", "migrate", "--declare-topology"]`, new: `["nudgectl", "migrate"]`,
			want: "must run `nudgectl migrate --declare-topology`"},
		{name: "a worker declares", file: "sms-worker.yaml", old: `"--grace=25s"`, new: `"--grace=25s", "--declare-topology"`,
			want: "--declare-topology (from --declare-topology) needs configure permission"},
		{name: "declaring by environment", file: "configmap.yaml", old: "  NUDGE_LOG_LEVEL: info", new: "  NUDGE_LOG_LEVEL: info\n  NUDGE_DECLARE_TOPOLOGY: \"true\"",
			want: "--declare-topology (from NUDGE_DECLARE_TOPOLOGY) needs configure permission"},
		{name: "migration cannot reach the broker", file: "networkpolicy.yaml", old: `values: ["migrate", "dispatcher",`, new: `values: ["dispatcher",`,
			want: "no NetworkPolicy allows egress to TCP 5671"},
		{name: "selector matches nothing", file: "email-worker.yaml", old: "kind: Service\nmetadata:\n  name: nudge-email-worker\n  labels:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker\nspec:\n  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker", new: "kind: Service\nmetadata:\n  name: nudge-email-worker\nspec:\n  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: emailworker", want: "matches no Deployment's pods"},
	} {
		t.Run(b.name, func(t *testing.T) {
			wantError(t, checkKustomize(broken(t, src, b), cs), b.want)
		})
	}
}

func TestDockerfileCheckerCatches(t *testing.T) {
	root := mustRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk := "LDFLAGS := -X github.com/nudgehq/nudge/internal/config.Version=$(VERSION)\n\nbuild:\n\tCGO_ENABLED=0 go build -trimpath -ldflags \"$(LDFLAGS)\" -o bin/ ./cmd/...\n"
	for _, b := range []breakage{
		{name: "root user", old: "USER 65532:65532", new: "USER root", want: `runs as "root"`},
		{name: "not every binary", old: "-o /out/ ./cmd/...", new: "-o /out/ ./cmd/dispatcher", want: "want ./cmd/..."},
		{name: "cgo", old: "    CGO_ENABLED=0 go build -trimpath", new: "    go build -trimpath", want: "must run with CGO_ENABLED=0"},
		{name: "wrong version variable", old: "internal/config.Version", new: "internal/config.Verzion", want: "declares no variable Verzion"},
		{name: "not distroless nonroot", old: "static-debian12:nonroot", new: "static-debian12:latest", want: "distroless :nonroot"},
		{name: "binaries not installed", old: "COPY --from=build /out/ /usr/local/bin/", new: "COPY --from=build /out/ /bin/", want: "must COPY --from=build"},
	} {
		t.Run(b.name, func(t *testing.T) {
			if !strings.Contains(string(df), b.old) {
				t.Fatalf("Dockerfile no longer contains %q: update this case", b.old)
			}
			wantError(t, checkDockerfile(strings.Replace(string(df), b.old, b.new, 1), mk, root), b.want)
		})
	}
	t.Run("differs from make build", func(t *testing.T) {
		wantError(t, checkDockerfile(string(df), strings.Replace(mk, "./cmd/...", "./cmd/... ./tools/...", 1), root), "`make build` builds")
	})
}

func TestDockerignoreCheckerCatches(t *testing.T) {
	need := []string{"go.mod", "go.sum", "cmd/dispatcher", "schema", "schema/migrations/0001.sql"}
	wantError(t, checkDockerignore("schema\n", need), `"schema" excludes schema`)
	wantError(t, checkDockerignore("**/*.sql\n", need), `excludes schema/migrations/0001.sql`)
	requireNoErrors(t, checkDockerignore("*.sql\n", need)) // only top-level .sql files, as in Docker
	wantError(t, checkDockerignore("go.*\n", need), "excludes go.mod")
	requireNoErrors(t, checkDockerignore("*\n!go.mod\n!go.sum\n!cmd\n!schema\n", need))
}
