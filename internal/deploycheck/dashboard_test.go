package deploycheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDashboardQueriesNameRealMetrics fails when the Grafana dashboard
// queries a nudge_ metric that no package defines (a rename would otherwise
// leave an empty panel nobody notices until an incident).
func TestDashboardQueriesNameRealMetrics(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "nudge-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	defined := definedMetrics(t, filepath.Join(root, "internal", "metrics"))
	name := regexp.MustCompile(`nudge_[a-z0-9_]+`)
	if len(dash.Panels) < 8 {
		t.Fatalf("dashboard has %d panels", len(dash.Panels))
	}
	// Issue 17: one Prometheus holds several deployments; every query is
	// scoped by the cluster and namespace variables.
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"datasource", "cluster", "namespace"} {
		if !vars[v] {
			t.Errorf("the dashboard has no $%s variable", v)
		}
	}
	selector := regexp.MustCompile(`nudge_[a-z0-9_]+(\{[^}]*\})?`)
	// Issue 17: the attempt's hop is shown by channel and outcome (a slow
	// failure path hides in an all-outcomes p99).
	byOutcome := regexp.MustCompile(`histogram_quantile\(0\.99, sum by \(([^)]*)\) \(rate\(nudge_hop_latency_seconds_bucket\{[^}]*hop="start_to_terminal"[^}]*\}`)
	split := false
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if m := byOutcome.FindStringSubmatch(tg.Expr); m != nil {
				by := strings.Split(strings.ReplaceAll(m[1], " ", ""), ",")
				split = split || (slices.Contains(by, "le") && slices.Contains(by, "channel") && slices.Contains(by, "outcome"))
			}
		}
	}
	if !split {
		t.Error("no panel shows the p99 of nudge_hop_latency_seconds{hop=\"start_to_terminal\"} by channel and outcome")
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, sel := range selector.FindAllString(tg.Expr, -1) {
				if !strings.Contains(sel, `namespace=~"$namespace"`) || !strings.Contains(sel, `cluster=~"$cluster"`) {
					t.Errorf("panel %q: %s is not scoped by $cluster and $namespace", p.Title, sel)
				}
			}
			for _, m := range name.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !defined[base] {
					t.Errorf("panel %q queries %s, which no metric in internal/metrics defines", p.Title, m)
				}
			}
		}
	}
}

func definedMetrics(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	quoted := regexp.MustCompile(`"(nudge_[a-z0-9_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range quoted.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d metric names in %s", len(out), dir)
	}
	return out
}
