package sms

import (
	"bytes"
	"text/template"

	"github.com/nudgehq/nudge/internal/provider"
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
	// sources says where each of root's fields comes from in a message,
	// as templateData puts it in the data (issue 18: a send builds no map
	// for a direct render).
	sources []source
}

// source is where a template's field comes from in a message: one of the
// reminder's facts, which win over its data, or its data's key.
type source struct {
	fact fact
	key  string
}

type fact uint8

const (
	fromData fact = iota
	reminderID
	tenant
	deadline
)

func newFastTemplate(t *template.Template) fastTemplate {
	f := fastTemplate{tmpl: t, root: tmplrender.Text(t, formatDate)}
	for _, k := range f.root.Fields() {
		s := source{key: k}
		switch k {
		case "reminder_id":
			s.fact = reminderID
		case "tenant":
			s.fact = tenant
		case "deadline":
			s.fact = deadline
		}
		f.sources = append(f.sources, s)
	}
	return f
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

// executeMessage renders msg as execute renders templateData's map of it:
// directly from the message's fields when it can, else (b reset) with
// text/template on that map, filled into st.data.
func (f fastTemplate) executeMessage(b *bytes.Buffer, msg provider.Message, st *renderState) error {
	if f.root != nil {
		values := st.values[:0]
		for _, s := range f.sources {
			var v any
			switch s.fact {
			case reminderID:
				v = msg.ReminderID
			case tenant:
				v = msg.Tenant
			case deadline:
				v = msg.Deadline
			default:
				v = msg.Data[s.key]
			}
			values = append(values, v)
		}
		ok := f.root.ExecuteValues(b, values)
		clear(values)
		st.values = values[:0]
		if ok {
			return nil
		}
		b.Reset()
	}
	templateData(st.data, msg)
	return f.tmpl.Execute(b, st.data)
}
