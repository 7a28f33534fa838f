package deploycheck

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/email"
)

// ---------------------------------------------------------------------------
// NetworkPolicies of the base: default deny in and out for every Nudge pod,
// egress only to the ports its URLs name (and DNS), ingress only to its
// metrics port, only from a namespace given by selector.

// selects reports whether a LabelSelector (matchLabels, matchExpressions)
// matches labels. An empty selector matches everything.
func selects(sel obj, labels obj) bool {
	if !subset(asObj(at(sel, "matchLabels")), labels) {
		return false
	}
	for _, e := range list(sel, "matchExpressions") {
		key, op := str(e, "key"), str(e, "operator")
		v, has := labels[key]
		in := slices.ContainsFunc(list(e, "values"), func(x any) bool { return x == v })
		switch op {
		case "In":
			if !has || !in {
				return false
			}
		case "NotIn":
			if has && in {
				return false
			}
		case "Exists":
			if !has {
				return false
			}
		case "DoesNotExist":
			if has {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// port families: the ports a URL flag may legitimately point at.
var portFamilies = map[string][]int{
	"database-url": {5432},
	"amqp-url":     {5671}, // AMQPS only (issue 13)
	"smtp-url":     {25, 465, 587},
	"sms-url":      {80, 443},
}

// urlPort is the TCP port a URL flag's value connects to.
func urlPort(flag, value string) (int, error) {
	if flag == "smtp-url" {
		cfg, err := email.ParseSMTPURL(value)
		if err != nil {
			return 0, err
		}
		switch {
		case cfg.Port != 0:
			return cfg.Port, nil
		case cfg.TLS == email.TLSImplicit:
			return email.DefaultSMTPSPort, nil
		}
		return email.DefaultPort, nil
	}
	u, err := url.Parse(value)
	if err != nil {
		return 0, err
	}
	if p := u.Port(); p != "" {
		return strconv.Atoi(p)
	}
	defaults := map[string]int{"postgres": 5432, "postgresql": 5432, "amqp": 5672, "amqps": 5671, "http": 80, "https": 443}
	if p, ok := defaults[u.Scheme]; ok {
		return p, nil
	}
	return 0, fmt.Errorf("no default port for scheme %q", u.Scheme)
}

type portRule struct {
	proto string
	port  string // a number or a container port name
}

func rulePorts(rule any) []portRule {
	var out []portRule
	for _, p := range list(rule, "ports") {
		proto := str(p, "protocol")
		if proto == "" {
			proto = "TCP"
		}
		out = append(out, portRule{proto, fmt.Sprint(at(p, "port"))})
	}
	return out
}

func hasType(np manifest, typ string) bool {
	return slices.ContainsFunc(list(np.doc, "spec", "policyTypes"), func(v any) bool { return v == typ })
}

// checkNetworkPolicies checks what the base's NetworkPolicies allow each
// workload against what its binary connects to and serves.
func checkNetworkPolicies(objects []manifest, workloads []workload) []error {
	var errs []error
	fail := func(where, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{where}, a...)...))
	}
	var policies []manifest
	for _, m := range objects {
		if str(m.doc, "kind") == "NetworkPolicy" {
			policies = append(policies, m)
		}
	}
	if len(policies) == 0 {
		return []error{fmt.Errorf("the base has no NetworkPolicy")}
	}
	selected := map[string]bool{}
	for _, w := range workloads {
		var ingress, egress bool
		allowedOut := map[portRule]string{} // → the policy allowing it
		var ins []portRule
		for _, np := range policies {
			if !selects(asObj(at(np.doc, "spec", "podSelector")), w.labels) {
				continue
			}
			selected[np.where()] = true
			if hasType(np, "Ingress") {
				ingress = true
				for _, rule := range list(np.doc, "spec", "ingress") {
					if len(list(rule, "from")) == 0 {
						fail(np.where(), "an ingress rule without from admits any source")
					}
					for _, f := range list(rule, "from") {
						if at(f, "ipBlock") == nil && at(f, "namespaceSelector") == nil {
							fail(np.where(), "ingress from pods of the policy's own namespace only: want a namespaceSelector (monitoring)")
						}
					}
					ps := rulePorts(rule)
					if len(ps) == 0 {
						fail(np.where(), "an ingress rule without ports admits every port")
					}
					ins = append(ins, ps...)
				}
			}
			if hasType(np, "Egress") {
				egress = true
				for _, rule := range list(np.doc, "spec", "egress") {
					ps := rulePorts(rule)
					if len(ps) == 0 {
						fail(np.where(), "an egress rule without ports allows every port")
					}
					if len(list(rule, "to")) == 0 {
						fail(np.where(), "an egress rule without to allows every address")
					}
					for _, p := range ps {
						allowedOut[p] = np.where()
					}
				}
			}
		}
		if !ingress || !egress {
			fail(w.where, "no NetworkPolicy denies by default (policyTypes Ingress and Egress) for these pods")
			continue
		}
		// Egress: DNS, and the port of every URL the binary connects to.
		need := map[portRule]string{{"UDP", "53"}: "DNS", {"TCP", "53"}: "DNS"}
		family := map[portRule]bool{{"UDP", "53"}: true, {"TCP", "53"}: true}
		for flag, ports := range portFamilies {
			if !w.r.has(flag) {
				continue
			}
			for _, p := range ports {
				family[portRule{"TCP", strconv.Itoa(p)}] = true
			}
			v, known := w.r.values[flag], w.r.known[flag]
			if !known || v == "" {
				continue
			}
			p, err := urlPort(flag, v)
			if err != nil {
				fail(w.where, "--%s (from %s): %v", flag, w.r.source[flag], err)
				continue
			}
			need[portRule{"TCP", strconv.Itoa(p)}] = fmt.Sprintf("--%s (from %s)", flag, w.r.source[flag])
			family[portRule{"TCP", strconv.Itoa(p)}] = true
		}
		for _, p := range slices.SortedFunc(maps.Keys(need), cmpPort) {
			if _, ok := allowedOut[p]; !ok {
				fail(w.where, "no NetworkPolicy allows egress to %s %s, which %s needs", p.proto, p.port, need[p])
			}
		}
		for _, p := range slices.SortedFunc(maps.Keys(allowedOut), cmpPort) {
			if !family[p] {
				fail(w.where, "%s allows egress to %s %s, which %s never connects to", allowedOut[p], p.proto, p.port, w.r.cmd.path)
			}
		}
		// Ingress: only the metrics port, and only to a binary serving one.
		listen := ""
		if w.r.has("listen") {
			listen = port(w.r.values["listen"])
		}
		named := map[string]string{}
		for _, cp := range list(w.container, "ports") {
			n, _ := num(cp, "containerPort")
			named[str(cp, "name")] = strconv.Itoa(n)
		}
		for _, p := range ins {
			num := p.port
			if n, ok := named[p.port]; ok {
				num = n
			}
			switch {
			case listen == "":
				fail(w.where, "a NetworkPolicy admits ingress to port %s, but %s serves nothing", p.port, w.r.cmd.path)
			case num != listen || p.proto != "TCP":
				fail(w.where, "a NetworkPolicy admits ingress to %s %s, which is not the --listen port %s", p.proto, p.port, listen)
			}
		}
	}
	for _, np := range policies {
		if !selected[np.where()] {
			fail(np.where(), "podSelector matches no Nudge workload's pods")
		}
	}
	return errs
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

func cmpPort(a, b portRule) int {
	return strings.Compare(a.proto+" "+a.port, b.proto+" "+b.port)
}

// ---------------------------------------------------------------------------
// Components: deploy/k8s/components/*, kinds of cluster add-ons (KEDA,
// Prometheus Operator), checked against the base they patch.

var componentKinds = map[string]string{
	"ScaledObject":          "keda.sh/v1alpha1",
	"TriggerAuthentication": "keda.sh/v1alpha1",
	"ServiceMonitor":        "monitoring.coreos.com/v1",
	"PrometheusRule":        "monitoring.coreos.com/v1",
}

// alertMetrics are the metrics the alert rules must cover (the runbook's
// questions), and the metrics they may use that Nudge does not export.
var (
	alertMetrics    = []string{"nudge_oldest_due_age_seconds", "nudge_deadline_misses_total", "nudge_dead_letter_messages", "nudge_reconcile_lag_seconds"}
	externalMetrics = []string{"up", "kube_cronjob_status_last_successful_time"}
	reMetricName    = regexp.MustCompile(`\b([a-z_][a-z0-9_]*)\s*(?:\{|\[|\)|\s*[<>=!])`)
)

func checkComponent(dir string, base *baseInfo) []error {
	docs, errs := readManifests(dir)
	name := filepath.Base(dir)
	fail := func(where, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: "+format, append([]any{name, where}, a...)...))
	}
	var kust obj
	var objects []manifest
	examples := map[string]map[string]bool{} // Secret name → keys, from *.example.yaml
	for _, m := range docs {
		switch {
		case m.file == "kustomization.yaml":
			kust = m.doc
			if str(m.doc, "kind") != "Component" || str(m.doc, "apiVersion") != "kustomize.config.k8s.io/v1alpha1" {
				fail(m.file, "want apiVersion kustomize.config.k8s.io/v1alpha1, kind Component")
			}
		case strings.Contains(m.file, ".example."):
			if str(m.doc, "kind") == "Secret" {
				keys := map[string]bool{}
				for k := range asObj(at(m.doc, "stringData")) {
					keys[k] = true
				}
				examples[str(m.doc, "metadata", "name")] = keys
			}
		default:
			kind, api := str(m.doc, "kind"), str(m.doc, "apiVersion")
			if want, ok := componentKinds[kind]; !ok {
				fail(m.where(), "kind %s is not one a component is expected to hold", kind)
				continue
			} else if api != want {
				fail(m.where(), "apiVersion %s, want %s", api, want)
			}
			objects = append(objects, m)
		}
	}
	if kust == nil {
		return append(errs, fmt.Errorf("%s: no kustomization.yaml", name))
	}
	listed := map[string]bool{}
	for _, r := range list(kust, "resources") {
		listed[fmt.Sprint(r)] = true
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

	byKind := func(kind string) map[string]manifest {
		out := map[string]manifest{}
		for _, m := range base.objects {
			if str(m.doc, "kind") == kind {
				out[str(m.doc, "metadata", "name")] = m
			}
		}
		for _, m := range objects {
			if str(m.doc, "kind") == kind {
				out[str(m.doc, "metadata", "name")] = m
			}
		}
		return out
	}
	deployments, services, triggerAuths := byKind("Deployment"), byKind("Service"), byKind("TriggerAuthentication")
	workerOf := map[string]workload{} // Deployment name → its worker container
	for _, w := range base.workloads {
		if str(w.m.doc, "kind") == "Deployment" && strings.HasSuffix(w.r.bin, "-worker") {
			workerOf[str(w.m.doc, "metadata", "name")] = w
		}
	}
	// Deployments whose replicas the component's patches remove.
	unreplicated := map[string]bool{}
	for _, p := range list(kust, "patches") {
		if str(p, "target", "kind") == "Deployment" && regexp.MustCompile(`op:\s*remove\s+path:\s*/spec/replicas\b`).MatchString(str(p, "patch")) {
			unreplicated[str(p, "target", "name")] = true
		}
	}
	scaled := map[string]bool{}

	for _, m := range objects {
		switch str(m.doc, "kind") {
		case "ScaledObject":
			target := str(m.doc, "spec", "scaleTargetRef", "name")
			if k := str(m.doc, "spec", "scaleTargetRef", "kind"); k != "" && k != "Deployment" {
				fail(m.where(), "scaleTargetRef.kind %s: the workers are Deployments", k)
			}
			if _, ok := deployments[target]; !ok {
				fail(m.where(), "scaleTargetRef.name %q is not a Deployment of the base", target)
				continue
			}
			w, ok := workerOf[target]
			if !ok {
				fail(m.where(), "scales %s, which runs no worker", target)
				continue
			}
			scaled[target] = true
			if !unreplicated[target] {
				fail(m.where(), "the component must remove spec.replicas from %s (a patch `op: remove, path: /spec/replicas`), or each apply resets what the autoscaler set", target)
			}
			topo := broker.Topology{Prefix: w.r.values["queue-prefix"]}.WithDefaults()
			channel := strings.TrimSuffix(w.r.bin, "-worker")
			if !slices.Contains(topo.Channels, channel) {
				fail(m.where(), "%s consumes channel %q, which the topology does not have", w.r.bin, channel)
				continue
			}
			minR, minOK := num(m.doc, "spec", "minReplicaCount")
			maxR, maxOK := num(m.doc, "spec", "maxReplicaCount")
			if !minOK || minR < 1 {
				fail(m.where(), "minReplicaCount must be at least 1: a due reminder must not wait for a pod to start")
			}
			if !maxOK || maxR < minR {
				fail(m.where(), "maxReplicaCount must be set and at least minReplicaCount")
			}
			triggers := list(m.doc, "spec", "triggers")
			if len(triggers) == 0 {
				fail(m.where(), "no triggers")
			}
			for _, tr := range triggers {
				if t := str(tr, "type"); t != "rabbitmq" {
					fail(m.where(), "trigger type %q, want rabbitmq (the queue backlog)", t)
					continue
				}
				if q, want := str(tr, "metadata", "queueName"), topo.Queue(channel); q != want {
					fail(m.where(), "trigger queueName %q, but %s consumes %s (prefix %q from %s)", q, w.r.bin, want, topo.Prefix, w.r.source["queue-prefix"])
				}
				if p := str(tr, "metadata", "protocol"); p != "amqp" {
					fail(m.where(), "trigger protocol %q, want amqp: its passive declare needs no broker permission (http needs the management API and a tagged user)", p)
				}
				if mode := str(tr, "metadata", "mode"); mode != "QueueLength" {
					fail(m.where(), "trigger mode %q, want QueueLength", mode)
				}
				if v, err := strconv.Atoi(str(tr, "metadata", "value")); err != nil || v < 1 {
					fail(m.where(), "trigger value %q must be a positive integer (a string)", str(tr, "metadata", "value"))
				}
				if str(tr, "metadata", "host") != "" {
					fail(m.where(), "the broker URL holds a password: take it from a TriggerAuthentication, not metadata.host")
				}
				ta, ok := triggerAuths[str(tr, "authenticationRef", "name")]
				if !ok {
					fail(m.where(), "authenticationRef %q is not a TriggerAuthentication of the component", str(tr, "authenticationRef", "name"))
					continue
				}
				hostRef := false
				for _, ref := range list(ta.doc, "spec", "secretTargetRef") {
					if str(ref, "parameter") != "host" {
						continue
					}
					hostRef = true
					sec, key := str(ref, "name"), str(ref, "key")
					if !examples[sec][key] {
						fail(ta.where(), "reads key %s of Secret %s, which no secret.example.yaml of the component shows", key, sec)
					}
				}
				if !hostRef {
					fail(ta.where(), "no secretTargetRef for the parameter host (the broker URL)")
				}
			}
		case "ServiceMonitor":
			sel := asObj(at(m.doc, "spec", "selector", "matchLabels"))
			var matched []manifest
			for _, sn := range slices.Sorted(maps.Keys(services)) {
				s := services[sn]
				if len(sel) > 0 && subset(sel, asObj(at(s.doc, "metadata", "labels"))) {
					matched = append(matched, s)
				}
			}
			if len(matched) != 1 {
				fail(m.where(), "selector %v must match exactly one Service of the base, matches %d", sel, len(matched))
				continue
			}
			svcPorts := map[string]bool{}
			for _, p := range list(matched[0].doc, "spec", "ports") {
				svcPorts[str(p, "name")] = true
			}
			eps := list(m.doc, "spec", "endpoints")
			if len(eps) == 0 {
				fail(m.where(), "no endpoints")
			}
			for _, ep := range eps {
				if p := str(ep, "port"); !svcPorts[p] {
					fail(m.where(), "endpoint port %q is not a port name of Service %s", p, str(matched[0].doc, "metadata", "name"))
				}
				if p := str(ep, "path"); p != "/metrics" {
					fail(m.where(), "endpoint path %q, want /metrics", p)
				}
			}
		case "PrometheusRule":
			errs = append(errs, checkRules(name+": "+m.where(), m.doc)...)
		}
	}
	for target := range unreplicated {
		if !scaled[target] {
			fail("kustomization.yaml", "removes spec.replicas from %s, which no ScaledObject scales: it would run one pod", target)
		}
	}
	return errs
}

// checkRules checks a PrometheusRule's shape and coverage. deploy/check
// parses the expressions with Prometheus's own parser.
func checkRules(where string, doc obj) []error {
	var errs []error
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{where}, a...)...))
	}
	used := map[string]bool{}
	alerts := map[string]bool{}
	groups := list(doc, "spec", "groups")
	if len(groups) == 0 {
		fail("no rule groups")
	}
	for _, g := range groups {
		for _, r := range list(g, "rules") {
			name, expr := str(r, "alert"), str(r, "expr")
			if !regexp.MustCompile(`^Nudge[A-Z][A-Za-z]+$`).MatchString(name) {
				fail("alert %q: name it NudgeSomething (CamelCase), so it is recognisably ours", name)
			}
			if alerts[name] {
				fail("alert %s is defined twice", name)
			}
			alerts[name] = true
			if strings.TrimSpace(expr) == "" {
				fail("alert %s has no expr", name)
			}
			for _, mm := range reMetricName.FindAllStringSubmatch(expr, -1) {
				if strings.HasPrefix(mm[1], "nudge_") || slices.Contains(externalMetrics, mm[1]) {
					used[mm[1]] = true
				}
			}
			if f := str(r, "for"); f != "" {
				if _, err := time.ParseDuration(f); err != nil {
					fail("alert %s: for %q: %v", name, f, err)
				}
			}
			if s := str(r, "labels", "severity"); !slices.Contains([]string{"critical", "warning", "info"}, s) {
				fail("alert %s: labels.severity %q, want critical, warning or info", name, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if str(r, "annotations", a) == "" {
					fail("alert %s: annotations.%s is empty", name, a)
				}
			}
		}
	}
	for _, mn := range alertMetrics {
		if !used[mn] {
			fail("no alert uses %s", mn)
		}
	}
	for mn := range used {
		if !strings.HasPrefix(mn, "nudge_") {
			continue
		}
		if !slices.Contains(alertMetrics, mn) {
			fail("%s is not a metric Nudge exports or specifies (%s)", mn, strings.Join(alertMetrics, ", "))
		}
	}
	return errs
}

// checkOverlayComponents checks an overlay's components exist and are Components.
func checkOverlayComponents(dir string) []error {
	docs, errs := readManifests(dir)
	if len(errs) > 0 {
		return errs
	}
	for _, m := range docs {
		if m.file != "kustomization.yaml" {
			continue
		}
		for _, c := range list(m.doc, "components") {
			k, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(c), "kustomization.yaml"))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: component %v: %v", filepath.Base(dir), c, err))
				continue
			}
			if !regexp.MustCompile(`(?m)^kind:\s*Component\s*$`).Match(k) {
				errs = append(errs, fmt.Errorf("%s: component %v is not a kustomize Component", filepath.Base(dir), c))
			}
		}
	}
	return errs
}

// ---------------------------------------------------------------------------

func baseInfoOf(t *testing.T, cs clis) *baseInfo {
	t.Helper()
	b, errs := inspectBase(filepath.Join(mustRoot(t), "deploy", "k8s", "base"), cs)
	requireNoErrors(t, errs)
	return b
}

func componentDirs(t *testing.T) []string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(mustRoot(t), "deploy", "k8s", "components", "*"))
	if len(dirs) == 0 {
		t.Fatal("no components in deploy/k8s/components")
	}
	return dirs
}

func TestKustomizeComponents(t *testing.T) {
	base := baseInfoOf(t, binaries(t))
	kinds := map[string]bool{}
	for _, d := range componentDirs(t) {
		requireNoErrors(t, checkComponent(d, base))
		docs, _ := readManifests(d)
		for _, m := range docs {
			kinds[str(m.doc, "kind")] = true
		}
	}
	for _, k := range []string{"ScaledObject", "ServiceMonitor", "PrometheusRule"} {
		if !kinds[k] {
			t.Errorf("no component holds a %s", k)
		}
	}
	overlays, _ := filepath.Glob(filepath.Join(mustRoot(t), "deploy", "k8s", "overlays", "*"))
	for _, o := range overlays {
		requireNoErrors(t, checkOverlayComponents(o))
	}
}

func TestNetworkPolicyCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "deploy", "k8s", "base")
	for _, b := range []breakage{
		{name: "no broker egress", file: "networkpolicy.yaml", old: "        - protocol: TCP\n          port: 5671\n", new: "",
			want: "no NetworkPolicy allows egress to TCP 5671, which --amqp-url (from NUDGE_AMQP_URL) needs"},
		{name: "SMTP port of the URL not allowed", file: "secret.example.yaml", old: "smtp.example.com:587", new: "smtp.example.com:2525",
			want: "no NetworkPolicy allows egress to TCP 2525"},
		{name: "SMTP egress for everyone", file: "networkpolicy.yaml", old: "  name: nudge-email-worker-smtp\n  labels:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: nudge\n      app.kubernetes.io/component: email-worker\n",
			new: "  name: nudge-email-worker-smtp\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: nudge\n", want: "which sms-worker never connects to"},
		{name: "metrics ingress from anywhere", file: "networkpolicy.yaml", old: "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n      ports:",
			new: "    - ports:", want: "an ingress rule without from admits any source"},
		{name: "ingress to the wrong port", file: "networkpolicy.yaml", old: "          port: metrics", new: "          port: 9090",
			want: "admits ingress to TCP 9090, which is not the --listen port 8080"},
		{name: "ingress to the dispatcher", file: "networkpolicy.yaml", old: `values: ["email-worker", "sms-worker", "reconciler"]`, new: `values: ["email-worker", "sms-worker", "reconciler", "dispatcher"]`,
			want: "dispatcher serves nothing"},
		{name: "no default deny", file: "networkpolicy.yaml", old: `  policyTypes: ["Ingress", "Egress"]`, new: `  policyTypes: ["Egress"]`,
			want: "no NetworkPolicy denies by default"},
		{name: "egress without ports", file: "networkpolicy.yaml", old: "      ports:\n        - protocol: TCP\n          port: 443\n", new: "",
			want: "an egress rule without ports allows every port"},
		// Issue 13, finding 9: plain AMQP and any address by port.
		{name: "plain AMQP", file: "networkpolicy.yaml", old: "          port: 5671\n", new: "          port: 5671\n        - protocol: TCP\n          port: 5672\n",
			want: "allows egress to TCP 5672, which"},
		{name: "egress to any address", file: "networkpolicy.yaml", old: "    - to:\n        - ipBlock:\n            cidr: 192.0.2.40/32 # CHANGE-ME: the SMS provider's published ranges\n      ports:", new: "    - ports:",
			want: "an egress rule without to allows every address"},
		{name: "unbounded pool", file: "secret.example.yaml", old: "verify-full&pool_max_conns=4\n  NUDGE_AMQP_URL: amqps://nudge-reconciler", new: "verify-full\n  NUDGE_AMQP_URL: amqps://nudge-reconciler",
			want: "reconciler: --database-url (from NUDGE_DATABASE_URL) must set pool_max_conns"},
		{name: "pool below concurrency", file: "secret.example.yaml", old: "sms_worker:CHANGE-ME@postgres.example.internal:5432/nudge?sslmode=verify-full&pool_max_conns=6", new: "sms_worker:CHANGE-ME@postgres.example.internal:5432/nudge?sslmode=verify-full&pool_max_conns=2",
			want: "pool_max_conns=2 is below --concurrency 4 + 1"},
		{name: "policy selecting nothing", file: "networkpolicy.yaml", old: "      app.kubernetes.io/component: sms-worker\n  policyTypes", new: "      app.kubernetes.io/component: sms-wroker\n  policyTypes",
			want: "podSelector matches no Nudge workload's pods"},
	} {
		t.Run(b.name, func(t *testing.T) {
			wantError(t, checkKustomize(broken(t, src, b), cs), b.want)
		})
	}
}

func TestComponentCheckerCatches(t *testing.T) {
	base := baseInfoOf(t, binaries(t))
	root := filepath.Join(mustRoot(t), "deploy", "k8s", "components")
	for _, b := range []breakage{
		{name: "wrong queue", file: "autoscaling/scaledobjects.yaml", old: "queueName: nudge.sms", new: "queueName: nudge.email",
			want: `trigger queueName "nudge.email", but sms-worker consumes nudge.sms`},
		{name: "unknown target", file: "autoscaling/scaledobjects.yaml", old: "    name: nudge-email-worker\n  minReplicaCount", new: "    name: nudge-mail-worker\n  minReplicaCount",
			want: `scaleTargetRef.name "nudge-mail-worker" is not a Deployment of the base`},
		{name: "scale to zero", file: "autoscaling/scaledobjects.yaml", old: "minReplicaCount: 2", new: "minReplicaCount: 0", want: "minReplicaCount must be at least 1"},
		{name: "replicas kept", file: "autoscaling/kustomization.yaml", old: "      name: nudge-sms-worker\n", new: "      name: nudge-reconciler\n",
			want: "must remove spec.replicas from nudge-sms-worker"},
		{name: "password inline", file: "autoscaling/scaledobjects.yaml", old: "        protocol: amqp\n        queueName: nudge.email", new: "        protocol: amqp\n        host: amqp://u:p@rabbitmq/nudge\n        queueName: nudge.email",
			want: "take it from a TriggerAuthentication"},
		{name: "management API", file: "autoscaling/scaledobjects.yaml", old: "        protocol: amqp\n        queueName: nudge.sms", new: "        protocol: http\n        queueName: nudge.sms",
			want: `trigger protocol "http", want amqp`},
		{name: "secret key not shown", file: "autoscaling/scaledobjects.yaml", old: "      key: host", new: "      key: url", want: "reads key url of Secret nudge-keda"},
		{name: "monitor selects nothing", file: "monitoring/servicemonitors.yaml", old: "      app.kubernetes.io/component: reconciler\n  endpoints", new: "      app.kubernetes.io/component: reconcilor\n  endpoints",
			want: "must match exactly one Service of the base, matches 0"},
		{name: "monitor on an unnamed port", file: "monitoring/servicemonitors.yaml", old: "    - port: metrics", new: "    - port: http", want: `endpoint port "http" is not a port name`},
		{name: "alert without severity", file: "monitoring/prometheusrule.yaml", old: "            severity: critical\n          annotations:\n            summary: \"Reminders due", new: "            team: nudge\n          annotations:\n            summary: \"Reminders due",
			want: "alert NudgeOldestDueReminderTooOld: labels.severity"},
		{name: "metric not covered", file: "monitoring/prometheusrule.yaml", old: "max by (namespace) (nudge_reconcile_lag_seconds)", new: "max by (namespace) (nudge_reconcile_lag)",
			want: "no alert uses nudge_reconcile_lag_seconds"},
		{name: "bad for", file: "monitoring/prometheusrule.yaml", old: "          for: 5m\n          labels:\n            severity: warning", new: "          for: 5 minutes\n          labels:\n            severity: warning",
			want: `for "5 minutes"`},
		{name: "unlisted resource", file: "monitoring/kustomization.yaml", old: "  - prometheusrule.yaml\n", new: "", want: "prometheusrule.yaml is not listed in resources"},
		{name: "unknown kind", file: "monitoring/servicemonitors.yaml", old: "kind: ServiceMonitor", new: "kind: PodMonitor", want: "kind PodMonitor is not one"},
	} {
		t.Run(b.name, func(t *testing.T) {
			comp, file, _ := strings.Cut(b.file, "/")
			b.file = file
			wantError(t, checkComponent(broken(t, filepath.Join(root, comp), b), base), b.want)
		})
	}
}
