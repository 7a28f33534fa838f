package sms

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/provider"
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

// templateSources are directCases and the default templates ("default
// NAME"), by name.
func templateSources() map[string]string {
	srcs := maps.Clone(directCases)
	for name, tmpl := range DefaultTemplates().byName {
		srcs["default "+name] = tmpl.tmpl.Root.String()
	}
	return srcs
}

// TestDirectRenderMatchesTextTemplate: whatever the template and the data,
// a render gives text/template's output, or its error.
func TestDirectRenderMatchesTextTemplate(t *testing.T) {
	t.Parallel()
	srcs := templateSources()
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

// TestMessageRenderMatchesTemplate: a send renders a reminder's message
// (its facts read from the message, no map built when the render is
// direct) to text/template's output on templateData's map of it, or its
// error, whatever the template and the data, the data's own reminder_id,
// tenant and deadline (which the facts win over) included.
func TestMessageRenderMatchesTemplate(t *testing.T) {
	t.Parallel()
	srcs := templateSources()
	srcs["facts"] = `{{.reminder_id}} {{.tenant}} {{date .deadline "2006-01-02"}} {{or .learner .tenant}}`
	rng := rand.New(rand.NewPCG(3, 4))
	direct := map[string]int{}
	for _, name := range slices.Sorted(maps.Keys(srcs)) {
		parsed, err := template.New(name).Option("missingkey=zero").Funcs(funcs).Parse(srcs[name])
		require.NoError(t, err, name)
		fast := newFastTemplate(parsed)
		for range 400 {
			var data map[string]any
			if rng.IntN(8) > 0 {
				data = map[string]any{}
				for _, k := range []string{"a", "b", "c", "d", "owner", "certificate", "host", "learner", "course",
					"customer", "plan", "deadline", "reminder_id", "tenant"} {
					if v := values[rng.IntN(len(values))]; rng.IntN(4) > 0 {
						data[k] = v
					}
				}
			}
			msg := provider.Message{ReminderID: rng.Int64N(1000) - 10, Tenant: []string{"", "t-1", "<&>"}[rng.IntN(3)],
				Data: data, Deadline: []time.Time{{}, time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC)}[rng.IntN(2)]}
			want := map[string]any{}
			templateData(want, msg)
			var wantOut, got bytes.Buffer
			wantErr := parsed.Execute(&wantOut, want)
			st := &renderState{data: map[string]any{}}
			gotErr := fast.executeMessage(&got, msg, st)
			require.Equal(t, wantErr != nil, gotErr != nil, "%s with %+v: errors %v, %v", name, msg, wantErr, gotErr)
			require.Equal(t, wantOut.String(), got.String(), "%s with %+v", name, msg)
			var d bytes.Buffer
			if fast.root.Execute(&d, want) {
				direct[name]++
			}
		}
	}
	for _, name := range []string{"or-with-else", "date", "facts", "default course-expiry", "default subscription-renewal",
		"default certificate-cleanup"} {
		require.Positive(t, direct[name], "%s rendered directly at least once", name)
	}
}

// FuzzMessageRender: the default templates render any strings a reminder's
// data holds (unicode, markup, long values, invalid UTF-8) as text/template
// renders templateData's map of the message.
func FuzzMessageRender(f *testing.F) {
	f.Add("Ada", "Go 101", "tenant-1", int64(1), int64(1893455940))
	f.Add("", "", "", int64(0), int64(0))
	f.Add("Zoë 😀", "<b>&'\"+", "t\x00", int64(-5), int64(-62135596800))
	f.Add(strings.Repeat("ab€", 500), "\xff\xfe", "日本", int64(1<<62), int64(253402300799))
	templates := DefaultTemplates()
	f.Fuzz(func(t *testing.T, name, course, tenant string, id, deadline int64) {
		for _, tmplName := range templates.Names() {
			fast := templates.byName[tmplName]
			msg := provider.Message{ReminderID: id, Tenant: tenant, Template: tmplName,
				Data: map[string]any{"learner": name, "owner": name, "customer": name, "course": course,
					"certificate": course, "plan": course, "host": tenant},
				Deadline: time.Unix(deadline, 0).UTC()}
			if deadline == 0 {
				msg.Deadline = time.Time{}
			}
			want := map[string]any{}
			templateData(want, msg)
			var wantOut, got bytes.Buffer
			wantErr := fast.tmpl.Execute(&wantOut, want)
			gotErr := fast.executeMessage(&got, msg, &renderState{data: map[string]any{}})
			require.Equal(t, wantErr != nil, gotErr != nil, "%s: errors %v, %v", tmplName, wantErr, gotErr)
			require.Equal(t, wantOut.String(), got.String(), tmplName)
		}
	})
}
