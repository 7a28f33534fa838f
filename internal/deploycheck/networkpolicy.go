package deploycheck

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/nudgehq/nudge/internal/email"
)

// NetworkPolicies of the base: default deny in and out for every Nudge pod,
// egress only to the ports its URLs name (and DNS), ingress only to its
// metrics port, only from a namespace given by selector.

// port families: the ports a URL flag may legitimately point at.
var portFamilies = map[string][]int{
	"database-url": {5432},
	"amqp-url":     {5671}, // AMQPS only (issue 13)
	"smtp-url":     {25, 465, 587},
	"sms-url":      {80, 443},
}

// targetFamilies are the ports a flag naming a file of targets may lead to:
// the webhook worker's --targets lists the hosts tenants' requests go to
// (http or https), so egress to them is allowed, and none is required (the
// overlay's NetworkPolicy names the targets' addresses).
var targetFamilies = map[string][]int{"targets": {80, 443}}

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

func hasType(np document, typ string) bool {
	return slices.ContainsFunc(list(np.doc, "spec", "policyTypes"), func(v any) bool { return v == typ })
}

// checkNetworkPolicies checks what the base's NetworkPolicies allow each
// workload against what its binary connects to and serves.
func checkNetworkPolicies(objects []document, workloads []workload) []error {
	var errs []error
	fail := func(where, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{where}, a...)...))
	}
	var policies []document
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
		for flag, ports := range targetFamilies {
			if w.r.has(flag) {
				for _, p := range ports {
					family[portRule{"TCP", strconv.Itoa(p)}] = true
				}
			}
		}
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

func cmpPort(a, b portRule) int {
	return strings.Compare(a.proto+" "+a.port, b.proto+" "+b.port)
}
