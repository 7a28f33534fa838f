package deploycheck

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// The broker topology is declared by the migration step, never by the fleet
// (internal/broker, check.go): the fleet's RabbitMQ users have no configure
// permission (definitions.json), so a fleet binary started with
// --declare-topology fails against a production broker, and a fleet whose
// migration step does not declare stops at start on a missing queue.

// declares reports whether r runs with --declare-topology on, and whether
// its binary has the flag at all.
func declares(r *resolved) (on, has bool) {
	if !r.has("declare-topology") {
		return false, false
	}
	on, _ = strconv.ParseBool(r.values["declare-topology"])
	return on && r.known["declare-topology"], true
}

// fleetBinary reports whether r is a long-running broker binary (dispatcher,
// a worker, the reconciler): it has --declare-topology but is not nudgectl.
func fleetBinary(r *resolved) bool {
	_, has := declares(r)
	return has && r.bin != "nudgectl"
}

// checkComposeDeclarer: compose may let the fleet declare (development), but
// then every broker service must; otherwise the migrate service declares.
func checkComposeDeclarer(res map[string]*resolved, migrate string) []error {
	var undeclared []string
	for _, name := range slices.Sorted(maps.Keys(res)) {
		if on, _ := declares(res[name]); fleetBinary(res[name]) && !on {
			undeclared = append(undeclared, name)
		}
	}
	if len(undeclared) == 0 || migrate == "" {
		return nil
	}
	if on, _ := declares(res[migrate]); on {
		return nil
	}
	return []error{fmt.Errorf("docker-compose.yml: service %s must run `nudgectl migrate --declare-topology`: %v only check the broker topology at start and stop when it is missing",
		migrate, undeclared)}
}

// checkK8sDeclarer: in the manifests the migration Job declares the
// topology, with the one user allowed to, and no fleet container does.
func checkK8sDeclarer(workloads []workload) []error {
	var errs []error
	migrate := false
	for _, w := range workloads {
		on, _ := declares(w.r)
		switch {
		case w.r.cmd.path == "nudgectl migrate":
			migrate = true
			if !on {
				errs = append(errs, fmt.Errorf("%s: must run `nudgectl migrate --declare-topology`: the fleet only checks the broker topology at start", w.where))
			}
		case fleetBinary(w.r) && on:
			errs = append(errs, fmt.Errorf("%s: --declare-topology (from %s) needs configure permission, which the component's RabbitMQ user does not have: the migration Job declares the topology",
				w.where, w.r.source["declare-topology"]))
		}
	}
	if !migrate {
		errs = append(errs, fmt.Errorf("no workload runs `nudgectl migrate --declare-topology`"))
	}
	return errs
}
