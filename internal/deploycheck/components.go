package deploycheck

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nudgehq/nudge/internal/broker"
)

// Components: deploy/k8s/components/*, kinds of cluster add-ons (KEDA,
// Prometheus Operator), checked against the base they patch.

// componentKinds are the kinds a component may hold, with their apiVersion.
var componentKinds = map[string]string{
	"ScaledObject":          "keda.sh/v1alpha1",
	"TriggerAuthentication": "keda.sh/v1alpha1",
	"ServiceMonitor":        "monitoring.coreos.com/v1",
	"PrometheusRule":        "monitoring.coreos.com/v1",
	// The console component's own workload.
	"Deployment":    "apps/v1",
	"Service":       "v1",
	"NetworkPolicy": "networking.k8s.io/v1",
}

// alertMetrics are the metrics the alert rules must cover (the runbook's
// questions), and the metrics they may use that Nudge does not export.
var (
	alertMetrics = []string{"nudge_oldest_due_age_seconds", "nudge_deadline_misses_total", "nudge_dead_letter_messages",
		"nudge_reconcile_lag_seconds", "nudge_dispatch_last_success_timestamp_seconds",
		"nudge_campaign_oldest_runnable_seconds", "nudge_db_oldest_transaction_age_seconds",
		"nudge_db_activity_readable"}
	// RunbookURL is where every alert's runbook_url points: its own section
	// of docs/runbook.md, "#" and the alert's name in lower case.
	RunbookURL      = "https://github.com/nudgehq/nudge/blob/main/docs/runbook.md"
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
	var objects []document
	examples := map[string]map[string]bool{} // Secret name → keys, from *.example.yaml
	exampleData := map[string]map[string]string{}
	for _, m := range docs {
		switch {
		case m.file == "kustomization.yaml":
			kust = m.doc
			if str(m.doc, "kind") != "Component" || str(m.doc, "apiVersion") != "kustomize.config.k8s.io/v1alpha1" {
				fail(m.file, "want apiVersion kustomize.config.k8s.io/v1alpha1, kind Component")
			}
		case strings.Contains(m.file, ".example."):
			if str(m.doc, "kind") == "Secret" {
				keys, data := map[string]bool{}, map[string]string{}
				for k, v := range asObj(at(m.doc, "stringData")) {
					keys[k], data[k] = true, fmt.Sprint(v)
				}
				examples[str(m.doc, "metadata", "name")] = keys
				exampleData[str(m.doc, "metadata", "name")] = data
			}
		default:
			if checkKind(m, componentKinds, "a component", fail) {
				objects = append(objects, m)
			}
		}
	}
	if kust == nil {
		return append(errs, fmt.Errorf("%s: no kustomization.yaml", name))
	}
	checkResourcesListed(dir, kust, fail)

	byKind := func(kind string) map[string]document {
		out := map[string]document{}
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
		if str(w.m.doc, "kind") == "Deployment" && (strings.HasSuffix(w.r.bin, "-worker") || w.r.bin == "planner") {
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
			if w.r.bin == "planner" { // it consumes the planning queue
				topo, channel = topo.Planning(), broker.PlanChannel
			}
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
			var matched []document
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
	errs = append(errs, checkComponentWorkloads(name, objects, base, examples, exampleData)...)
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
			if u, want := str(r, "annotations", "runbook_url"), RunbookURL+"#"+strings.ToLower(name); u != want {
				fail("alert %s: runbook_url %q, want %q (its section of the runbook)", name, u, want)
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
