package tmplrender_test

import (
	"bytes"
	"fmt"
	htmltemplate "html/template"
	"io"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/tmplrender"
)

// How a direct render is used (sms.fastTemplate, email's execute).
type how int

const (
	// direct: the Tree renders the data itself.
	direct how = iota
	// fallback: the Tree is prepared but gives this data back to the template.
	fallback
	// refused: no Tree: the template holds something the direct render does not know.
	refused
)

func (h how) String() string { return [...]string{"direct", "fallback", "refused"}[h] }

// executer is a text/template or an html/template template.
type executer interface{ Execute(io.Writer, any) error }

// tcase is a template, data, and what rendering it gives.
type tcase struct {
	name, src string
	data      map[string]any
	want      string // the output (when the template does not fail)
	how       how
	err       bool // the template's own execution fails (only where the Tree gives it back)
}

// cases parses each case's source with parse and checks its render.
func cases(t *testing.T, parse func(name, src string) (*tmplrender.Tree, executer), tcs []tcase) {
	for _, tc := range tcs {
		t.Run(tc.name, func(t *testing.T) {
			tr, tmpl := parse(tc.name, tc.src)
			got, h, err := run(t, tr, tmpl, tc.data)
			require.Equal(t, tc.how, h, "rendered %s", h)
			require.Equal(t, tc.err, err != nil, "the template's error: %v", err)
			if err == nil {
				require.Equal(t, tc.want, got)
			}
		})
	}
}

// run renders data as a caller does: directly when the Tree can, else (the
// buffer reset) with the template. It says which way it went, and checks
// that a direct render wrote exactly what the template writes.
func run(t *testing.T, tr *tmplrender.Tree, tmpl executer, data map[string]any) (string, how, error) {
	t.Helper()
	var ref bytes.Buffer
	refErr := tmpl.Execute(&ref, data)
	if tr == nil {
		return ref.String(), refused, refErr
	}
	var b bytes.Buffer
	executed := tr.Execute(&b, data)
	if data != nil {
		// The caller's values for the fields, as a map holds them: the same
		// render, the same way.
		values := make([]any, len(tr.Fields()))
		for i, k := range tr.Fields() {
			values[i] = data[k]
		}
		var v bytes.Buffer
		require.Equal(t, executed, tr.ExecuteValues(&v, values), "ExecuteValues renders as Execute does")
		if executed {
			require.Equal(t, b.String(), v.String(), "ExecuteValues writes what Execute writes")
		}
	}
	if executed {
		require.NoError(t, refErr, "rendered directly where the template fails")
		require.Equal(t, ref.String(), b.String(), "a direct render differs from the template's")
		return b.String(), direct, nil
	}
	return ref.String(), fallback, refErr
}

// date stands for the SMS templates' date function.
func date(v any, layout ...string) string {
	l := "2 Jan 2006"
	if len(layout) > 0 {
		l = layout[0]
	}
	if t, ok := v.(time.Time); ok {
		return t.Format(l)
	}
	return "?"
}

var at = time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)

// sixteen prints fields f0 to f15, as many as a Tree reads.
var sixteen = func() string {
	var b strings.Builder
	for i := range 16 {
		fmt.Fprintf(&b, "{{.f%d}}", i)
	}
	return b.String()
}()

// fields is data with n fields f0, f1, ..., each "v".
func fields(n int) map[string]any {
	m := map[string]any{}
	for i := range n {
		m[fmt.Sprintf("f%d", i)] = "v"
	}
	return m
}

// Text templates: what the package doc says a Tree walks is rendered
// directly, to the template's own output; values whose printing is not
// plain are given back to text/template; and templates with anything else
// get no Tree at all.
func TestText(t *testing.T) {
	t.Parallel()
	cases(t, func(name, src string) (*tmplrender.Tree, executer) {
		tmpl := template.Must(template.New(name).Funcs(template.FuncMap{"date": date}).Parse(src))
		return tmplrender.Text(tmpl, date), tmpl
	}, []tcase{
		{"empty", "", nil, "", direct, false},
		{"text only", "Hello, world.\n", nil, "Hello, world.\n", direct, false},
		{"comment", "a{{/* not printed */}}b", nil, "ab", direct, false},
		{"a string", "Hi {{.name}}!", map[string]any{"name": "Ada"}, "Hi Ada!", direct, false},
		{"a string is not escaped in text", "{{.s}}", map[string]any{"s": "<&>\"'+\x00"}, "<&>\"'+\x00", direct, false},
		{"an int64", "{{.n}} left", map[string]any{"n": int64(-42)}, "-42 left", direct, false},
		{"a bool", "{{.ok}}", map[string]any{"ok": true}, "true", direct, false},
		{"or: the key", `Hi {{or .name "there"}}`, map[string]any{"name": "Ada"}, "Hi Ada", direct, false},
		{"or: a missing key takes the default", `Hi {{or .name "there"}}`, map[string]any{}, "Hi there", direct, false},
		{"or: an empty string takes the default", `Hi {{or .name "there"}}`, map[string]any{"name": ""}, "Hi there", direct, false},
		{"or: the last when none is true", `[{{or .a .b}}]`, map[string]any{"a": "", "b": int64(0)}, "[0]", direct, false},
		{"or on nil data", `{{or .name "x"}}`, nil, "x", fallback, false},
		{"not of a missing key", `{{if not .done}}to do{{end}}`, map[string]any{}, "to do", direct, false},
		{"if: zero int64 is false", `{{if .n}}some{{else}}none{{end}}`, map[string]any{"n": int64(0)}, "none", direct, false},
		{"if: a false bool", `{{if .ok}}yes{{else}}no{{end}}`, map[string]any{"ok": false}, "no", direct, false},
		{"if: a time is true, even zero", `{{if .at}}set{{end}}`, map[string]any{"at": time.Time{}}, "set", direct, false},
		{"with: dot is the value", `{{with .course}}in {{.}}{{else}}none{{end}}`, map[string]any{"course": "Go 101"}, "in Go 101", direct, false},
		{"with: a missing key takes else", `{{with .course}}in {{.}}{{else}}none{{end}}`, map[string]any{}, "none", direct, false},
		{"a time's IsZero and Format", `{{if .at.IsZero}}never{{else}}{{.at.Format "2006-01-02 15:04"}}{{end}}`,
			map[string]any{"at": at}, "2026-12-02 03:04", direct, false},
		{"a zero time's IsZero", `{{if .at.IsZero}}never{{else}}{{.at.Format "2006"}}{{end}}`,
			map[string]any{"at": time.Time{}}, "never", direct, false},
		{"date", `{{date .at}}`, map[string]any{"at": at}, "2 Dec 2026", direct, false},
		{"date with a layout", `{{date .at "Jan 2"}}`, map[string]any{"at": at}, "Dec 2", direct, false},
		{"unicode", `{{or .s "–"}} ✓`, map[string]any{"s": "Zoë, 日本語 😀"}, "Zoë, 日本語 😀 ✓", direct, false},
		{"a long value", `[{{.s}}]`, map[string]any{"s": strings.Repeat("ab€", 2000)}, "[" + strings.Repeat("ab€", 2000) + "]", direct, false},
		{"a field read in several parts", `{{.a}}{{with .a}}{{.}}{{end}}{{or .b .a}}{{if .a}}!{{end}}`,
			map[string]any{"a": "x"}, "xxx!", direct, false},
		{"sixteen fields", sixteen, fields(16), strings.Repeat("v", 16), direct, false},

		// Values printed otherwise than plainly: left to text/template.
		{"a missing key printed", "[{{.missing}}]", map[string]any{}, "[<no value>]", fallback, false},
		{"a time printed", "{{.at}}", map[string]any{"at": at}, "2026-12-02 03:04:05 +0000 UTC", fallback, false},
		{"an int, not int64", "{{.n}}", map[string]any{"n": 3}, "3", fallback, false},
		{"a float", "{{.x}}", map[string]any{"x": 1.5}, "1.5", fallback, false},
		{"a map", "{{.user}}", map[string]any{"user": map[string]any{"name": "Ada"}}, "map[name:Ada]", fallback, false},
		{"dot is the data map", "{{.}}", map[string]any{"a": "b"}, "map[a:b]", fallback, false},
		{"or meets a float", `{{or .x "d"}}`, map[string]any{"x": 1.5}, "1.5", fallback, false},
		{"if on a float", `{{if .x}}y{{end}}`, map[string]any{"x": 0.0}, "", fallback, false},
		{"Format of a missing key", `[{{.at.Format "2006"}}]`, map[string]any{}, "[<no value>]", fallback, false},
		{"Format of a string", `{{.at.Format "2006"}}`, map[string]any{"at": "2026"}, "", fallback, true},
		{"IsZero of a string", `{{if .at.IsZero}}z{{end}}`, map[string]any{"at": "x"}, "", fallback, true},
		{"date with a layout that is not a string", `{{date .at .n}}`, map[string]any{"at": at, "n": int64(1)}, "", fallback, true},

		// Templates the direct render does not know.
		{"range", `{{range .xs}}{{.}}{{end}}`, map[string]any{"xs": []string{"a", "b"}}, "ab", refused, false},
		{"a variable", `{{$n := .name}}{{$n}}`, map[string]any{"name": "Ada"}, "Ada", refused, false},
		{"a pipeline", `{{.name | printf "%q"}}`, map[string]any{"name": "Ada"}, `"Ada"`, refused, false},
		{"another function", `{{printf "%s!" .name}}`, map[string]any{"name": "Ada"}, "Ada!", refused, false},
		{"len", `{{len .name}}`, map[string]any{"name": "Ada"}, "3", refused, false},
		{"a nested field", `{{.user.name}}`, map[string]any{"user": map[string]any{"name": "Ada"}}, "Ada", refused, false},
		{"a method other than IsZero and Format", `{{.at.Year}}`, map[string]any{"at": at}, "2026", refused, false},
		{"not of two arguments", `{{if not .a .b}}x{{end}}`, map[string]any{}, "", refused, true},
		{"a defined template", `{{define "x"}}y{{end}}[{{template "x"}}]`, nil, "[y]", refused, false},
		{"a block", `{{block "x" .}}y{{end}}`, nil, "y", refused, false},
		{"seventeen fields", sixteen + "{{.f16}}", fields(17), strings.Repeat("v", 17), refused, false},
	})
}

// A template that calls date, prepared without the date function (an email
// template has none), is left to the template.
func TestTextWithoutADateFunction(t *testing.T) {
	t.Parallel()
	tmpl := template.Must(template.New("d").Funcs(template.FuncMap{"date": date}).Parse(`{{date .at}}`))
	require.Nil(t, tmplrender.Text(tmpl, nil))
	require.NotNil(t, tmplrender.Text(tmpl, date))
}

// No template, or no Tree: nothing is rendered directly.
func TestNothingToRender(t *testing.T) {
	t.Parallel()
	require.Nil(t, tmplrender.Text(nil, nil))
	require.Nil(t, tmplrender.Text(template.New("unparsed"), nil))
	require.Nil(t, tmplrender.HTML(nil))
	var tr *tmplrender.Tree
	var b bytes.Buffer
	require.False(t, tr.Execute(&b, map[string]any{"a": "b"}))
	require.False(t, (&tmplrender.Tree{}).Execute(&b, map[string]any{"a": "b"}), "the zero Tree gives the render back")
}

// HTML templates: an action in HTML text is rendered directly and escaped
// as html/template escapes it; an action anywhere else (an attribute, a
// URL, a script, a style) leaves the whole template to html/template, as
// does one that html/template cannot escape.
func TestHTML(t *testing.T) {
	t.Parallel()
	cases(t, func(name, src string) (*tmplrender.Tree, executer) {
		tmpl := htmltemplate.Must(htmltemplate.New(name).Parse(src))
		return tmplrender.HTML(tmpl), tmpl
	}, []tcase{
		{"escaped in HTML text", `<p>{{.s}}</p>`, map[string]any{"s": "<b>Tom & \"Jerry\"'s</b> 1+1\x00!"},
			"<p>&lt;b&gt;Tom &amp; &#34;Jerry&#34;&#39;s&lt;/b&gt; 1&#43;1\uFFFD!</p>", direct, false},
		{"each of <&>\"'+ and NUL alone", `{{.a}}|{{.b}}|{{.c}}|{{.d}}|{{.e}}|{{.f}}|{{.g}}`,
			map[string]any{"a": "<", "b": "&", "c": ">", "d": `"`, "e": "'", "f": "+", "g": "\x00"},
			"&lt;|&amp;|&gt;|&#34;|&#39;|&#43;|\uFFFD", direct, false},
		{"invalid UTF-8 is kept", `{{.s}}`, map[string]any{"s": "a\xffb"}, "a\xffb", direct, false},
		{"nothing to escape", `<p>Hi {{.name}}</p>`, map[string]any{"name": "Ada"}, "<p>Hi Ada</p>", direct, false},
		{"an int64 and a bool", `<p>{{.n}} {{.ok}}</p>`, map[string]any{"n": int64(-7), "ok": false}, "<p>-7 false</p>", direct, false},
		{"or, if, with and a time", `{{with .course}}<b>{{.}}</b>{{end}} {{or .name "you"}}{{if not .at.IsZero}} by {{.at.Format "Jan 2"}}{{end}}`,
			map[string]any{"course": "Go & Rust", "at": at}, "<b>Go &amp; Rust</b> you by Dec 2", direct, false},
		{"a missing key printed", `<p>{{.missing}}</p>`, map[string]any{}, "<p></p>", fallback, false},
		{"a float", `<p>{{.x}}</p>`, map[string]any{"x": 2.5}, "<p>2.5</p>", fallback, false},

		{"in an attribute", `<p title="{{.s}}">x</p>`, map[string]any{"s": `a"b`}, `<p title="a&#34;b">x</p>`, refused, false},
		{"in a URL", `<a href="/c/{{.s}}">x</a>`, map[string]any{"s": "a b"}, `<a href="/c/a%20b">x</a>`, refused, false},
		{"in a script", `<script>var s = {{.s}};</script>`, map[string]any{"s": "x"}, `<script>var s = "x";</script>`, refused, false},
		{"in a style", `<style>p { color: {{.c}} }</style>`, map[string]any{"c": "red"}, `<style>p { color: red }</style>`, refused, false},
		{"branches ending in different contexts", `{{if .x}}<a href="{{end}}x`, map[string]any{"x": true}, "", refused, true},
	})
}
