package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// Targets is the targets file: per tenant, the hosts its webhooks may reach.
// A tenant that is not listed may reach none, and no tenant may reach a
// loopback, link-local, private or otherwise special address (Blocked)
// unless its entry lists a network holding it: the worker runs inside the
// operator's network, and a URL naming its database or the cloud's metadata
// service must not be something an application can schedule.
//
//	{
//	  "version": "2026-08-01",
//	  "tenants": {
//	    "acme": {"hosts": ["app.acme.example", "*.jobs.acme.example"]},
//	    "edu":  {"hosts": ["app.internal"], "allow_networks": ["10.20.0.0/16"], "allow_http": true}
//	  }
//	}
type Targets struct {
	// Version names this edition of the file in logs. Required when any
	// tenant is listed.
	Version string `json:"version"`
	// Tenants maps a tenant to what it may reach.
	Tenants map[string]Tenant `json:"tenants"`
}

// Tenant is what one tenant's webhooks may reach.
type Tenant struct {
	// Hosts are the host names (or IP literals) its target URLs may name,
	// compared without case; "*.example.com" matches any name below
	// example.com (not example.com itself). Any port. At least one.
	Hosts []string `json:"hosts"`
	// AllowNetworks are CIDR prefixes (10.20.0.0/16, 127.0.0.1/32) whose
	// addresses it may connect to although Blocked refuses them everywhere
	// else. Empty: public addresses only.
	AllowNetworks []string `json:"allow_networks,omitempty"`
	// AllowHTTP lets its target URLs use plain http. False: https only.
	AllowHTTP bool `json:"allow_http,omitempty"`

	networks []netip.Prefix
}

var (
	// ErrInvalidTargets is wrapped by every error of ParseTargets and LoadTargets.
	ErrInvalidTargets = errors.New("invalid webhook targets")
	// ErrNoTargets: the worker was started without a targets file.
	ErrNoTargets = errors.New("--targets is required: the file that says which hosts each tenant's webhooks may reach")
)

// LoadTargets reads and validates the targets file at path.
func LoadTargets(path string) (*Targets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidTargets, err)
	}
	t, err := ParseTargets(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParseTargets reads and validates a targets file's JSON; unknown fields are
// refused (a misspelt "allow_networks" must not silently allow nothing, or a
// misspelt "hosts" everything).
func ParseTargets(b []byte) (*Targets, error) {
	var t Targets
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidTargets, err)
	}
	if len(t.Tenants) > 0 && strings.TrimSpace(t.Version) == "" {
		return nil, fmt.Errorf("%w: version is required", ErrInvalidTargets)
	}
	for name, ten := range t.Tenants {
		if len(ten.Hosts) == 0 {
			return nil, fmt.Errorf("%w: tenants.%s.hosts: at least one host is required", ErrInvalidTargets, name)
		}
		for i, h := range ten.Hosts {
			h = strings.ToLower(strings.TrimSpace(h))
			if h == "" || h == "*" || strings.Contains(strings.TrimPrefix(h, "*."), "*") || strings.ContainsAny(h, "/:@ ") && !isIPv6(h) {
				return nil, fmt.Errorf("%w: tenants.%s.hosts: %q is not a host name, IP address or *.domain", ErrInvalidTargets, name, ten.Hosts[i])
			}
			ten.Hosts[i] = strings.Trim(h, "[]")
		}
		for _, n := range ten.AllowNetworks {
			p, err := netip.ParsePrefix(strings.TrimSpace(n))
			if err != nil {
				return nil, fmt.Errorf("%w: tenants.%s.allow_networks: %w", ErrInvalidTargets, name, err)
			}
			ten.networks = append(ten.networks, p.Masked())
		}
		t.Tenants[name] = ten
	}
	return &t, nil
}

func isIPv6(h string) bool {
	a, err := netip.ParseAddr(strings.Trim(h, "[]"))
	return err == nil && a.Is6()
}

// allowsHost reports whether host (a URL's hostname, without port or
// brackets) is one of the tenant's hosts.
func (t Tenant) allowsHost(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	return slices.ContainsFunc(t.Hosts, func(h string) bool {
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			return strings.HasSuffix(host, suffix) && len(host) > len(suffix)
		}
		return host == h
	})
}

// allowsAddr reports whether the tenant may connect to a: an address that
// Blocked does not refuse, or one inside an allowed network.
func (t Tenant) allowsAddr(a netip.Addr) bool {
	a = a.Unmap()
	return !Blocked(a) || slices.ContainsFunc(t.networks, func(p netip.Prefix) bool { return p.Contains(a) })
}

// special are the ranges Blocked refuses beyond what netip classifies:
// "this network", shared address space (carrier-grade NAT), IETF protocol
// assignments, benchmarking, the reserved block and broadcast, and the IPv6
// ranges that embed IPv4 addresses (NAT64, 6to4, Teredo) which could lead
// back to a private one.
var special = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("2002::/16"),
}

// Blocked reports whether a is an address no webhook may reach unless its
// tenant's entry allows it: loopback, private (RFC 1918, fc00::/7),
// link-local (169.254.0.0/16, where cloud metadata services answer, and
// fe80::/10), unspecified, multicast, and the special ranges above.
func Blocked(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() ||
		slices.ContainsFunc(special, func(p netip.Prefix) bool { return p.Contains(a) })
}
