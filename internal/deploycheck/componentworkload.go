package deploycheck

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// checkComponentWorkloads checks the Deployments a component adds (the
// console) as the base's are checked: pod and container security, the
// command line against the binary's flags with the environment the base's
// ConfigMaps and Secrets (or the component's examples) give it, every
// Secret it reads shown by an example, a file flag (--token-file) read from
// a mounted Secret, and its Services and NetworkPolicies selecting its pods.
func checkComponentWorkloads(name string, objects []document, base *baseInfo, examples map[string]map[string]bool, exampleData map[string]map[string]string) []error {
	var errs []error
	fail := func(where, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: "+format, append([]any{name, where}, a...)...))
	}
	var podLabels []obj
	for _, m := range objects {
		if str(m.doc, "kind") != "Deployment" {
			continue
		}
		tmpl, _ := podTemplate(m.doc)
		labels := asObj(at(tmpl, "metadata", "labels"))
		podLabels = append(podLabels, labels)
		if sel := asObj(at(m.doc, "spec", "selector", "matchLabels")); len(sel) == 0 || !subset(sel, labels) {
			fail(m.where(), "spec.selector.matchLabels must match the pod template's labels")
		}
		spec := asObj(at(tmpl, "spec"))
		checkPodSecurity(m.where(), spec, fail)
		secretVolumes := map[string]obj{} // volume name → its secret source
		for _, v := range list(spec, "volumes") {
			if sec := asObj(at(v, "secret")); sec != nil {
				secretVolumes[str(v, "name")] = sec
			}
		}
		for _, cv := range list(spec, "containers") {
			c := asObj(cv)
			where := m.where() + ": container " + str(c, "name")
			checkContainerSecurity(where, spec, c, fail)
			if !ourImage(str(c, "image")) {
				continue
			}
			inv := containerInvocation(where, c)
			for _, ef := range list(c, "envFrom") {
				var data map[string]string
				var ok bool
				if n := str(ef, "configMapRef", "name"); n != "" {
					data, ok = base.configMaps[n]
				} else if n := str(ef, "secretRef", "name"); n != "" {
					if data, ok = base.secrets[n]; !ok {
						data, ok = exampleData[n]
					}
				}
				if !ok {
					fail(where, "envFrom %v: neither in the base nor shown by a secret.example.yaml of the component", ef)
					continue
				}
				for k, v := range data {
					inv.shared[str(ef, "prefix")+k] = envValue{val: v, known: true}
				}
			}
			r, e := base.clis.check(inv)
			for _, err := range e {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			if r == nil {
				continue
			}
			// A file flag names a file in a read-only mount of a Secret the
			// component's examples show, with that key.
			for _, flag := range []string{"token-file"} {
				file, ok := r.values[flag]
				if !r.has(flag) || !ok || file == "" {
					continue
				}
				found := false
				for _, vm := range list(c, "volumeMounts") {
					dir := str(vm, "mountPath")
					if path.Dir(file) != path.Clean(dir) {
						continue
					}
					found = true
					if ro, _ := boolAt(asObj(vm), "readOnly"); !ro {
						fail(where, "the mount of --%s must be readOnly", flag)
					}
					sec := secretVolumes[str(vm, "name")]
					if sec == nil {
						fail(where, "--%s %s: volume %s is not a Secret", flag, file, str(vm, "name"))
						continue
					}
					key := path.Base(file)
					for _, it := range list(sec, "items") {
						if str(it, "path") == key {
							key = str(it, "key")
						}
					}
					if !examples[str(sec, "secretName")][key] {
						fail(where, "--%s reads key %s of Secret %s, which no secret.example.yaml of the component shows", flag, key, str(sec, "secretName"))
					}
				}
				if !found {
					fail(where, "--%s %s is in no volume mount", flag, file)
				}
			}
			ports := map[string]bool{}
			for _, p := range list(c, "ports") {
				ports[str(p, "name")] = true
			}
			for _, probe := range []string{"readinessProbe", "livenessProbe"} {
				if p := str(c, probe, "httpGet", "port"); !ports[p] {
					fail(where, "%s port %q is not a named port of the container", probe, p)
				}
			}
		}
	}
	for _, m := range objects {
		var sel obj
		switch str(m.doc, "kind") {
		case "Service":
			sel = asObj(at(m.doc, "spec", "selector"))
		case "NetworkPolicy":
			sel = asObj(at(m.doc, "spec", "podSelector", "matchLabels"))
		default:
			continue
		}
		if !slices.ContainsFunc(podLabels, func(l obj) bool { return len(sel) > 0 && subset(sel, l) }) {
			fail(m.where(), "selector %v matches no Deployment of the component (keys %s)", sel, strings.Join(slices.Sorted(maps.Keys(sel)), ", "))
		}
	}
	return errs
}

// containerInvocation is a container's command line and the variables it
// sets itself (env); the caller adds what envFrom gives (shared).
func containerInvocation(where string, c obj) invocation {
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
	return inv
}
