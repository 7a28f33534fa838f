package sms

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/require"
)

// directCases are templates written the way the defaults are, and some that
// are not (the direct render must leave those to text/template).
var directCases = map[string]string{
	"or-with-else":  `Hi {{or .a "there"}}, {{with .b}}on {{.}}{{else}}soon{{end}}.`,
	"date":          `{{with date .d}}due {{.}}{{else}}no date{{end}} {{date .d "2006-01-02 15:04 MST"}}`,
	"if-else-with":  `{{if .a}}A{{else if .b}}B{{else}}none{{end}}{{with .a}}A={{.}}{{else with .b}}B={{.}}{{else}}none{{end}}|{{or .a .b .c}}`,
	"nested":        `{{with .a}}<{{with .}}{{.}}{{end}}>{{else}}{{if .b}}{{with date .b}}{{.}}{{end}}{{end}}{{end}}`,
	"variable":      `{{with .a}}{{with date $.d}}x{{end}}{{end}}`,
	"dot-root":      `{{.}}`,
	"field-in-with": `{{with .a}}{{.b}}{{end}}`,
	"plain-fields":  `{{.a}}-{{.b}}-{{.c}}-{{.d}}`,
	"printf":        `{{printf "%v" .a}}`,
	"range":         `{{range .a}}{{.}}{{end}}`,
	"define":        `{{define "x"}}{{.a}}{{end}}{{template "x" .}}`,
	"or-one":        `{{or .a}}`,
	"date-args":     `{{date .d "2006" "x"}}`,
	"comment":       `{{/* c */ -}} {{.a -}} !`,
	"time-methods":  `{{if not .d.IsZero}}on {{.d.Format "2006-01-02"}}{{else}}soon{{end}} {{not .a}} {{.b}} {{or .c .reminder_id}}`,
}

// values are what a reminder's data may hold under a key.
var values = []any{
	nil, "", "Ada", `<&>"'`, "2030-01-31T23:59:00Z", "not a date", 0, 42, int64(7), 3.5, true, false,
	time.Time{}, time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC),
	time.Date(2030, 6, 1, 8, 0, 0, 0, time.FixedZone("X", 3600)), new(time.Time),
	[]string{"a"}, map[string]any{"b": "c"}, []any{},
}

// TestDirectRenderMatchesTextTemplate: whatever the template and the data,
// a render gives text/template's output, or its error.
func TestDirectRenderMatchesTextTemplate(t *testing.T) {
	t.Parallel()
	srcs := map[string]string{}
	for name, src := range directCases {
		srcs[name] = src
	}
	for name, tmpl := range DefaultTemplates().byName {
		srcs["default "+name] = tmpl.tmpl.Root.String()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	direct := map[string]int{}
	// In a fixed order, so the seeded data each template draws is the same
	// in every run (a map's order would deal it out anew each time).
	for _, name := range slices.Sorted(maps.Keys(srcs)) {
		src := srcs[name]
		parsed, err := template.New(name).Option("missingkey=zero").Funcs(funcs).Parse(src)
		require.NoError(t, err, name)
		fast := newFastTemplate(parsed)
		for range 400 {
			data := map[string]any{}
			for _, k := range []string{"a", "b", "c", "d", "owner", "certificate", "host", "learner", "course",
				"customer", "plan", "deadline", "reminder_id", "tenant"} {
				if v := values[rng.IntN(len(values)+1)%len(values)]; rng.IntN(4) > 0 {
					data[k] = v
				}
			}
			if fast.root.Execute(&bytes.Buffer{}, data) {
				direct[name]++
			}
			var want, got bytes.Buffer
			wantErr := parsed.Execute(&want, data)
			gotErr := fast.execute(&got, data)
			require.Equal(t, wantErr != nil, gotErr != nil, "%s with %v: errors %v, %v", name, data, wantErr, gotErr)
			require.Equal(t, want.String(), got.String(), "%s with %v", name, data)
		}
	}
	for _, name := range []string{"or-with-else", "date", "if-else-with", "nested", "comment", "or-one", "time-methods",
		"default course-expiry", "default subscription-renewal", "default certificate-cleanup"} {
		require.Positive(t, direct[name], "%s rendered directly at least once", name)
	}
	for _, name := range []string{"dot-root", "variable", "printf", "range", "define", "date-args"} {
		require.Zero(t, direct[name], "%s is left to text/template", name)
	}
}

// TestDefaultTemplatesRenderDirectly: the default templates, with the data
// every reminder carries, take the direct path (the cost it saves).
func TestDefaultTemplatesRenderDirectly(t *testing.T) {
	t.Parallel()
	for name, tmpl := range DefaultTemplates().byName {
		require.NotNil(t, tmpl.root, "%s is fastable", name)
		data := map[string]any{"course": "Go 101", "reminder_id": int64(1), "tenant": "t",
			"deadline": time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC)}
		require.True(t, tmpl.root.Execute(&bytes.Buffer{}, data), "%s renders directly", name)
	}
}
