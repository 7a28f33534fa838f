package sms

import (
	"bytes"
	"text/template"

	"github.com/nudgehq/nudge/internal/tmplrender"
)

// fastTemplate is a template with the tree internal/tmplrender renders
// directly (the defaults, and any template written like them), nil when it
// holds anything else: text/template then executes it, as it does whenever
// the direct render meets a value it does not reproduce exactly, so the
// output is text/template's in every case
// (TestDirectRenderMatchesTextTemplate).
type fastTemplate struct {
	tmpl *template.Template
	root *tmplrender.Tree
}

func newFastTemplate(t *template.Template) fastTemplate {
	return fastTemplate{tmpl: t, root: tmplrender.Text(t, formatDate)}
}

// execute renders data into b, directly when it can, else with
// text/template (b is reset first).
func (f fastTemplate) execute(b *bytes.Buffer, data map[string]any) error {
	if f.root.Execute(b, data) {
		return nil
	}
	b.Reset()
	return f.tmpl.Execute(b, data)
}
