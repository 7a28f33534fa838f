package email

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	texttemplate "text/template"

	"github.com/nudgehq/nudge/internal/tmplrender"
)

//go:embed templates/*.tmpl
var defaultTemplates embed.FS

// Template file suffixes. A template named "course-expiry" is made of
// course-expiry.subject.tmpl and course-expiry.txt.tmpl (both required) and
// course-expiry.html.tmpl (optional).
const (
	subjectSuffix = ".subject.tmpl"
	textSuffix    = ".txt.tmpl"
	htmlSuffix    = ".html.tmpl"
)

// ErrUnknownTemplate means a message named a template that was not loaded.
var ErrUnknownTemplate = errors.New("unknown template")

// Templates is a parsed, immutable set of message templates, safe for
// concurrent use. Everything is parsed by LoadTemplates so that a broken
// template stops the process at start instead of failing reminders one by one.
type Templates struct {
	set map[string]*templateSet
}

type templateSet struct {
	subject *texttemplate.Template
	text    *texttemplate.Template
	html    *htmltemplate.Template // nil: plain-text only
	// The trees internal/tmplrender renders directly, each nil when its
	// template holds anything else (Render then executes the template).
	fastSubject, fastText, fastHTML *tmplrender.Tree
}

// Rendered is one message rendered from a template.
type Rendered struct {
	Subject string
	Text    string
	HTML    string // empty when the template has no HTML body
}

// LoadTemplates parses the embedded default templates and then every *.tmpl
// file directly in dir, which override defaults of the same file name or add
// new templates. dir "" loads the embedded defaults only. Files in dir that do
// not end in .tmpl are ignored; a .tmpl file that is not
// <name>.subject.tmpl, <name>.txt.tmpl or <name>.html.tmpl is an error, as is
// a template without a subject or a text body.
func LoadTemplates(dir string) (*Templates, error) {
	sources := map[string]string{} // file name -> source description
	contents := map[string][]byte{}

	embedded, err := fs.Sub(defaultTemplates, "templates")
	if err != nil {
		return nil, fmt.Errorf("loading embedded templates: %w", err)
	}
	embeddedName := func(file string) string { return path.Join("embedded:templates", file) }
	if err := readTemplateFiles(embedded, embeddedName, sources, contents); err != nil {
		return nil, err
	}
	if dir != "" {
		dirName := func(file string) string { return filepath.Join(dir, file) }
		if err := readTemplateFiles(os.DirFS(dir), dirName, sources, contents); err != nil {
			return nil, err
		}
	}

	t := &Templates{set: map[string]*templateSet{}}
	names := make([]string, 0, len(contents))
	for file := range contents {
		names = append(names, file)
	}
	sort.Strings(names)
	for _, file := range names {
		src := sources[file]
		body := string(contents[file])
		name, kind, ok := splitTemplateFile(file)
		if !ok {
			return nil, fmt.Errorf("loading template %s: name must end in %s, %s or %s", src, subjectSuffix, textSuffix, htmlSuffix)
		}
		ts := t.set[name]
		if ts == nil {
			ts = &templateSet{}
			t.set[name] = ts
		}
		switch kind {
		case subjectSuffix:
			ts.subject, err = texttemplate.New(file).Parse(body)
		case textSuffix:
			ts.text, err = texttemplate.New(file).Parse(body)
		case htmlSuffix:
			ts.html, err = htmltemplate.New(file).Parse(body)
		}
		if err != nil {
			return nil, fmt.Errorf("parsing template %s: %w", src, err)
		}
	}
	for name, ts := range t.set {
		if ts.subject == nil {
			return nil, fmt.Errorf("loading template %q: missing %s%s", name, name, subjectSuffix)
		}
		if ts.text == nil {
			return nil, fmt.Errorf("loading template %q: missing %s%s", name, name, textSuffix)
		}
		ts.fastSubject, ts.fastText, ts.fastHTML = tmplrender.Text(ts.subject, nil), tmplrender.Text(ts.text, nil), tmplrender.HTML(ts.html)
	}
	return t, nil
}

// readTemplateFiles reads every *.tmpl file at the top of fsys into contents,
// replacing files of the same name, and records in sources where each came
// from (displayName) so errors name the file an operator can fix.
func readTemplateFiles(fsys fs.FS, displayName func(string) string, sources map[string]string, contents map[string][]byte) error {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return fmt.Errorf("reading template directory %s: %w", displayName(""), err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".tmpl") {
			continue
		}
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return fmt.Errorf("reading template %s: %w", displayName(e.Name()), err)
		}
		contents[e.Name()] = b
		sources[e.Name()] = displayName(e.Name())
	}
	return nil
}

// splitTemplateFile splits "course-expiry.txt.tmpl" into "course-expiry" and
// ".txt.tmpl".
func splitTemplateFile(file string) (name, suffix string, ok bool) {
	for _, s := range []string{subjectSuffix, textSuffix, htmlSuffix} {
		if n, found := strings.CutSuffix(file, s); found && n != "" {
			return n, s, true
		}
	}
	return "", "", false
}

// Names lists the loaded template names, sorted.
func (t *Templates) Names() []string {
	names := make([]string, 0, len(t.set))
	for n := range t.set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Render executes the named template with data. The subject is trimmed and
// folded onto one line. An unknown name returns an error wrapping
// ErrUnknownTemplate.
func (t *Templates) Render(name string, data map[string]any) (Rendered, error) {
	ts, ok := t.set[name]
	if !ok {
		return Rendered{}, fmt.Errorf("rendering %q: %w", name, ErrUnknownTemplate)
	}
	var r Rendered
	buf := renderBuffers.Get().(*bytes.Buffer)
	defer func() {
		buf.Reset()
		if buf.Cap() <= maxPooledRender {
			renderBuffers.Put(buf)
		}
	}()
	if err := execute(buf, ts.fastSubject, ts.subject, data); err != nil {
		return Rendered{}, fmt.Errorf("rendering %q subject: %w", name, err)
	}
	r.Subject = strings.Join(strings.Fields(buf.String()), " ")
	buf.Reset()
	if err := execute(buf, ts.fastText, ts.text, data); err != nil {
		return Rendered{}, fmt.Errorf("rendering %q text body: %w", name, err)
	}
	r.Text = buf.String()
	if ts.html != nil {
		buf.Reset()
		if err := execute(buf, ts.fastHTML, ts.html, data); err != nil {
			return Rendered{}, fmt.Errorf("rendering %q HTML body: %w", name, err)
		}
		r.HTML = buf.String()
	}
	return r, nil
}

// maxPooledRender bounds the buffer a render keeps for the next one: an
// outsized message's buffer is left to the collector.
const maxPooledRender = 16 << 10

var renderBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// execute renders data into buf (empty) with fast when it can, else with
// tmpl (a text/template or html/template template).
func execute(buf *bytes.Buffer, fast *tmplrender.Tree, tmpl interface {
	Execute(io.Writer, any) error
}, data map[string]any) error {
	if fast.Execute(buf, data) {
		return nil
	}
	buf.Reset()
	return tmpl.Execute(buf, data)
}
