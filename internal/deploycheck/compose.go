package deploycheck

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

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
	errs = append(errs, checkSigningKeys(base, res)...)
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
			if !strings.HasSuffix(flag, "-url") || !r.known[flag] || r.values[flag] == "" || unusedURL(r, flag) {
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

// unusedURL reports whether flag is a provider URL that the binary's
// settings leave unused: the sms-worker speaks one SMS API, and the other's
// URL (its default, an external host) is never dialled. With
// --sms-providers, every listed API's URL is used.
func unusedURL(r *resolved, flag string) bool {
	if list := strings.Trim(r.values["sms-providers"], "[] "); r.known["sms-providers"] && list != "" && (flag == "twilio-url" || flag == "sms-url") {
		api := map[string]string{"twilio-url": "twilio", "sms-url": "generic"}[flag]
		return !slices.Contains(strings.Split(strings.ReplaceAll(list, " ", ""), ","), api)
	}
	api := r.values["sms-api"]
	switch flag {
	case "twilio-url":
		return api != "twilio"
	case "sms-url":
		return r.known["sms-api"] && api == "twilio"
	}
	return false
}
