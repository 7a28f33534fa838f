package deploycheck

import (
	"encoding/base64"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The kustomize base (deploy/k8s/base) and the overlays, checked against the
// binaries: every container that runs the Nudge image runs a real command
// with real flags and variables, and the settings that must agree with its
// flags (grace periods, deadlines, probes, security) do.

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

// workload is one container of a base workload that runs the Nudge image.
type workload struct {
	m         document
	where     string
	labels    obj // the pod template's labels
	container obj
	r         *resolved
}

// baseInfo is what components and overlays are checked against.
type baseInfo struct {
	objects    []document
	configMaps map[string]map[string]string
	secrets    map[string]map[string]string
	workloads  []workload
	// clis are the binaries' command lines, to check a component's workloads.
	clis clis
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
	var objects []document
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
		if !checkKind(m, knownKinds, "the base", fail) {
			continue
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
		checkResourcesListed(dir, kust, fail)
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
			inv := containerInvocation(where, c)
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
	return &baseInfo{objects: objects, configMaps: configMaps, secrets: secrets, workloads: workloads, clis: cs}, errs
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
func checkWorkloadTiming(m document, where string, pod, c obj, r *resolved, fail func(string, string, ...any)) {
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

// checkPoolSizes: every database URL must bound its pool. pgx's default is
// the number of CPUs of the node, not of the container, so a pod on a large
// node would open dozens of connections; a worker needs --concurrency of them
// at once, plus room for the probe and the recovery loop.
func checkPoolSizes(workloads []workload) []error {
	var errs []error
	for _, w := range workloads {
		v, known := w.r.values["database-url"], w.r.known["database-url"]
		if !w.r.has("database-url") || !known || v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil {
			continue // reported by check
		}
		n, err := strconv.Atoi(u.Query().Get("pool_max_conns"))
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s: --database-url (from %s) must set pool_max_conns: the default is the node's CPU count", w.where, w.r.source["database-url"]))
			continue
		}
		if c, err := strconv.Atoi(w.r.values["concurrency"]); err == nil && w.r.has("concurrency") && n < c+1 {
			errs = append(errs, fmt.Errorf("%s: pool_max_conns=%d is below --concurrency %d + 1: batches would wait for connections", w.where, n, c))
		}
	}
	return errs
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
