package email

import (
	"bytes"
	htmltemplate "html/template"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	texttemplate "text/template"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/tmplrender"
)

// directCases are templates written the way the defaults are, and some
// that are not (the direct render must leave those to the template).
var directCases = map[string]string{
	"or-with-else":  `Hi {{or .a "there"}}, {{with .b}}on <b>{{.}}</b>{{else}}soon{{end}}.`,
	"time-methods":  `{{if not .d.IsZero}}on {{.d.Format "Monday 2 January 2006 15:04 MST"}}{{else}}soon{{end}} {{.reminder_id}}`,
	"if-else":       `{{if .a}}A{{else if .b}}B{{else}}none{{end}}|{{or .a .b .c}}|{{not .a}}|{{.c}}`,
	"nested":        `{{with .a}}<{{with .}}{{.}}{{end}}>{{else}}{{if not .b}}{{.reminder_id}}{{end}}{{end}}`,
	"missing-time":  `{{.d.IsZero}} {{.a.Format "2006"}}`,
	"plain-fields":  `<p>{{.a}}-{{.b}}-{{.c}}-{{.d}}</p><!-- c -->`,
	"attribute":     `<a href="{{.a}}" title="{{.b}}">{{.c}}</a>`,
	"script":        `<script>var x = {{.a}};</script>`,
	"printf":        `{{printf "%v" .a}}`,
	"range":         `{{range .a}}{{.}}{{end}}`,
	"variable":      `{{with .a}}{{$.b}}{{end}}`,
	"field-in-with": `{{with .a}}{{.b}}{{end}}`,
}

// values are what a reminder's data may hold under a key.
var values = []any{
	nil, "", "Ada", `<&>"'+` + "\x00", "a\xffb", "2030-01-31T23:59:00Z", 0, 42, int64(7), int64(0), int64(-3), 3.5, true, false,
	time.Time{}, time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC),
	time.Date(2030, 6, 1, 8, 0, 0, 0, time.FixedZone("X", 3600)), new(time.Time),
	[]string{"a"}, map[string]any{"b": "c"}, []any{},
}

// TestDirectRenderMatchesTemplates: whatever the template and the data, a
// render gives text/template's output (subject and text) and
// html/template's (HTML body), or their error.
func TestDirectRenderMatchesTemplates(t *testing.T) {
	t.Parallel()
	textSrcs, htmlSrcs := map[string]string{}, map[string]string{}
	for name, src := range directCases {
		textSrcs[name], htmlSrcs[name] = src, src
	}
	defaults, err := LoadTemplates("")
	require.NoError(t, err)
	for name := range defaults.set {
		for kind, srcs := range map[string]map[string]string{"subject": textSrcs, "txt": textSrcs, "html": htmlSrcs} {
			src, err := defaultTemplates.ReadFile("templates/" + name + "." + kind + ".tmpl")
			require.NoError(t, err)
			srcs["default "+kind+" "+name] = string(src)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	data := func() map[string]any {
		d := map[string]any{}
		for _, k := range []string{"a", "b", "c", "d", "owner", "certificate", "host", "learner", "course",
			"customer", "plan", "deadline", "reminder_id", "tenant"} {
			if v := values[rng.IntN(len(values))]; rng.IntN(4) > 0 {
				d[k] = v
			}
		}
		return d
	}
	// Each case is the template as Render executes it (its fast tree beside
	// it) and, to compare with, another parse of the same source that only
	// its own package executes.
	type tcase struct {
		key       string
		ref, tmpl interface{ Execute(io.Writer, any) error }
		fast      *tmplrender.Tree
	}
	// In a fixed order, so the seeded data each case draws is the same in
	// every run (a map's order would deal it out anew each time).
	var cases []tcase
	for _, name := range slices.Sorted(maps.Keys(textSrcs)) {
		src := textSrcs[name]
		tmpl := texttemplate.Must(texttemplate.New(name).Parse(src))
		cases = append(cases, tcase{"text " + name, tmpl, tmpl, tmplrender.Text(tmpl, nil)})
	}
	for _, name := range slices.Sorted(maps.Keys(htmlSrcs)) {
		src := htmlSrcs[name]
		tmpl := htmltemplate.Must(htmltemplate.New(name).Parse(src))
		cases = append(cases, tcase{"html " + name, htmltemplate.Must(htmltemplate.New(name).Parse(src)), tmpl, tmplrender.HTML(tmpl)})
	}
	direct := map[string]int{}
	for _, c := range cases {
		for range 400 {
			d := data()
			if c.fast.Execute(&bytes.Buffer{}, d) {
				direct[c.key]++
			}
			var want, got bytes.Buffer
			wantErr := c.ref.Execute(&want, d)
			gotErr := execute(&got, c.fast, c.tmpl, d)
			require.Equal(t, wantErr != nil, gotErr != nil, "%s with %v: errors %v, %v", c.key, d, wantErr, gotErr)
			require.Equal(t, want.String(), got.String(), "%s with %v", c.key, d)
		}
	}
	for _, name := range []string{"or-with-else", "time-methods", "if-else", "nested", "plain-fields"} {
		require.Positive(t, direct["text "+name], "text %s rendered directly at least once", name)
		require.Positive(t, direct["html "+name], "html %s rendered directly at least once", name)
	}
	for name := range defaults.set {
		for _, k := range []string{"text default subject ", "text default txt ", "html default html "} {
			require.Positive(t, direct[k+name], "%s%s rendered directly at least once", k, name)
		}
	}
	for _, name := range []string{"printf", "range", "variable"} {
		require.Zero(t, direct["text "+name], "text %s is left to text/template", name)
	}
	for _, name := range []string{"attribute", "script", "printf", "range", "variable"} {
		require.Zero(t, direct["html "+name], "html %s is left to html/template", name)
	}
}

// TestDefaultTemplatesRenderDirectly: the default templates, with the data
// every reminder carries, take the direct path (the cost it saves).
func TestDefaultTemplatesRenderDirectly(t *testing.T) {
	t.Parallel()
	tmpl, err := LoadTemplates("")
	require.NoError(t, err)
	for name, ts := range tmpl.set {
		data := map[string]any{"course": "Go 101", "reminder_id": int64(1), "tenant": "t",
			"deadline": time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC)}
		for kind, fast := range map[string]*tmplrender.Tree{"subject": ts.fastSubject, "text": ts.fastText, "html": ts.fastHTML} {
			require.True(t, fast.Execute(&bytes.Buffer{}, data), "%s %s renders directly", name, kind)
		}
	}
}
