package deploycheck

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
)

// Every message is signed with the key of the channel it names, derived
// from the root keys (internal/message). The dispatcher and the reconciler
// hold the root keys; a worker holds the same root keys or, better, only its
// channel's keys derived from them (nudgectl keys derive; the planner, the
// "plan" channel's). A worker whose
// keys are neither verifies nothing the dispatcher signs and dead-letters
// all of it, which no start-up check can see.

// checkSigningKeys checks, over the resolved services of one file, that the
// publishers share one root key list and that each worker holds it or its
// channel's keys derived from it, in the same order.
func checkSigningKeys(base string, res map[string]*resolved) []error {
	var errs []error
	root, rootFrom := "", ""
	for _, name := range slices.Sorted(maps.Keys(res)) {
		r := res[name]
		if (r.bin != "dispatcher" && r.bin != "reconciler") || r.values["signing-keys"] == "" {
			continue
		}
		switch spec := r.values["signing-keys"]; {
		case root == "":
			root, rootFrom = spec, name
		case spec != root:
			errs = append(errs, fmt.Errorf("%s: service %s: --signing-keys differ from those of %s: what one signs the other may not verify", base, name, rootFrom))
		}
	}
	keys, err := message.ParseKeys(root)
	if root == "" || err != nil {
		return errs // no publisher, or reported with the flag
	}
	for _, name := range slices.Sorted(maps.Keys(res)) {
		r := res[name]
		channel, ok := strings.CutSuffix(r.bin, "-worker")
		if r.bin == "planner" {
			channel, ok = broker.PlanChannel, true
		}
		if !ok || r.values["signing-keys"] == "" || r.values["signing-keys"] == root {
			continue
		}
		if want, err := keys.ChannelSpec(channel); err == nil && r.values["signing-keys"] != want {
			errs = append(errs, fmt.Errorf("%s: service %s: --signing-keys (from %s) are neither %s's root keys nor the %s keys derived from them "+
				"(nudgectl keys derive --channel %s): it would dead-letter every message", base, name, r.source["signing-keys"], rootFrom, channel, channel))
		}
	}
	return errs
}
