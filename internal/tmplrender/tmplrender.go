// Package tmplrender renders the parse tree of a text/template or an
// html/template template directly, without reflection, for the handful of
// actions Nudge's message templates are written with, and reports when it
// cannot, so that the caller executes the template as before.
//
// text/template executes a template through reflection, which is most of a
// message render's cost and allocations. The templates every deployment
// sends (the SMS and email defaults, and any written like them) use: text,
// {{.key}}, {{or .key "default"}}, {{not ...}}, {{with ...}} and {{if ...}}
// with {{else}}, {{.}}, a time's {{.key.IsZero}} and {{.key.Format
// "layout"}}, a date function (SMS), and in an HTML template the escaper
// html/template adds to an action in HTML text. A Tree walks exactly those,
// on the values whose meaning in text/template is plain (a string, an
// int64, a bool, a missing key, a time.Time), and gives up on anything
// else: the output is the template's own in every case (the tests of the
// sms and email packages compare both on random data).
//
// A Tree is compiled once, when the template is loaded, into nodes that
// hold their text, their function and the index of each field they read
// (issue 18: the walk of the parse tree and a map lookup per field part
// were most of an SMS render's CPU). A render looks each field of the data
// up once, or takes the caller's values for them (ExecuteValues: the SMS
// channel reads a reminder's own facts from the message, with no map), and
// every part then reads its value by index.
package tmplrender

import (
	"bytes"
	"errors"
	htmltemplate "html/template"
	"io"
	"slices"
	"strconv"
	"text/template"
	"text/template/parse"
	"time"
)

// htmlEscaper is the function html/template puts at the end of an action's
// pipeline in HTML text.
const htmlEscaper = "_html_template_htmlescaper"

// DateFunc is a template function called as {{date X}} or {{date X
// "layout"}}: the SMS templates' date.
type DateFunc func(v any, layout ...string) string

// Tree is a template compiled for a direct render. The zero Tree (or a nil
// one) renders nothing directly.
type Tree struct {
	code   []node
	fields []string // the keys the template reads of its data, in order of first use
	date   DateFunc
	ok     bool
}

// maxFields bounds the fields a Tree reads (the values of a render live on
// the stack); a template reading more is left to its template.
const maxFields = 16

// node is one part of a compiled template: text, an action (a printed
// pipeline), or an if or with over a pipeline, with its lists.
type node struct {
	kind      nodeKind
	text      []byte
	pipe      pipe
	escape    bool // an action html/template escapes as HTML text
	list, els []node
}

type nodeKind uint8

const (
	textNode nodeKind = iota
	actionNode
	ifNode
	withNode
)

// pipe is a pipeline's one command: an argument, or, not, date, or a
// time's Format.
type pipe struct {
	kind   pipeKind
	args   []arg
	layout string // format: Format's layout
}

type pipeKind uint8

const (
	argPipe pipeKind = iota
	orPipe
	notPipe
	datePipe
	formatPipe // args[0] is the field
)

// arg is dot, a string, .key, or .key.IsZero; field is the key's index in
// Tree.fields.
type arg struct {
	kind  argKind
	s     string
	field int
}

type argKind uint8

const (
	stringArg argKind = iota
	dotArg
	fieldArg
	isZeroArg
)

// Text prepares t (parsed with date as its "date" function, nil when it has
// none) and returns nil when the template holds anything the direct render
// does not know, or defines other templates.
func Text(t *template.Template, date DateFunc) *Tree {
	if t == nil || t.Tree == nil || len(t.Templates()) != 1 {
		return nil
	}
	return prepare(t.Tree.Root, date)
}

// HTML prepares t as Text does, from the tree html/template has escaped:
// it escapes t first (by executing it once on nil data, whose output and
// error are discarded), so t must be complete. An action whose escaping is
// other than HTML text's (an attribute, a URL, a script) leaves the
// template to html/template.
func HTML(t *htmltemplate.Template) *Tree {
	if t == nil {
		return nil
	}
	var escaping *htmltemplate.Error
	if err := t.Execute(io.Discard, nil); errors.As(err, &escaping) {
		return nil // every render fails the same way: html/template says how
	}
	if t.Tree == nil || len(t.Templates()) != 1 {
		return nil
	}
	return prepare(t.Tree.Root, nil)
}

func prepare(root *parse.ListNode, date DateFunc) *Tree {
	tr := &Tree{date: date}
	code, ok := tr.compile(root)
	if !ok || len(tr.fields) > maxFields {
		return nil
	}
	tr.code, tr.ok = code, true
	return tr
}

// Fields returns the keys the template reads of its data, in the order
// ExecuteValues takes their values (nil for a nil Tree).
func (t *Tree) Fields() []string {
	if t == nil {
		return nil
	}
	return t.fields
}

// Execute renders data into b and reports whether it could; when it could
// not, b holds part of an output and the caller resets it and executes the
// template.
func (t *Tree) Execute(b *bytes.Buffer, data map[string]any) bool {
	if t == nil || !t.ok {
		return false // a zero Tree knows no template: rendering nothing would lose its text
	}
	var values [maxFields]any
	for i, k := range t.fields {
		values[i] = data[k]
	}
	r := render{out: b, date: t.date, values: values[:len(t.fields)], noData: data == nil}
	return r.list(t.code, dot{root: true})
}

// ExecuteValues is Execute on a map (never nil) that holds values[i] under
// Fields()[i] (nil for a key it does not hold), whatever else it holds.
func (t *Tree) ExecuteValues(b *bytes.Buffer, values []any) bool {
	if t == nil || !t.ok || len(values) != len(t.fields) {
		return false
	}
	r := render{out: b, date: t.date, values: values}
	return r.list(t.code, dot{root: true})
}

// field is the index of key in t.fields, added when new.
func (t *Tree) field(key string) int {
	for i, k := range t.fields {
		if k == key {
			return i
		}
	}
	t.fields = append(t.fields, key)
	return len(t.fields) - 1
}

// compile compiles list, and reports false when it holds a node the direct
// render does not know.
func (t *Tree) compile(list *parse.ListNode) ([]node, bool) {
	if list == nil {
		return nil, true
	}
	var out []node
	for _, n := range list.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			if k := len(out) - 1; k >= 0 && out[k].kind == textNode {
				out[k].text = append(out[k].text, n.Text...) // adjacent texts (a comment between) as one
				continue
			}
			out = append(out, node{kind: textNode, text: slices.Clone(n.Text)})
		case *parse.CommentNode:
		case *parse.ActionNode:
			p, ok := t.compilePipe(n.Pipe, true)
			if !ok {
				return nil, false
			}
			out = append(out, node{kind: actionNode, pipe: p, escape: len(n.Pipe.Cmds) == 2})
		case *parse.IfNode:
			c, ok := t.compileBranch(ifNode, &n.BranchNode)
			if !ok {
				return nil, false
			}
			out = append(out, c)
		case *parse.WithNode:
			c, ok := t.compileBranch(withNode, &n.BranchNode)
			if !ok {
				return nil, false
			}
			out = append(out, c)
		default:
			return nil, false
		}
	}
	return out, true
}

func (t *Tree) compileBranch(kind nodeKind, n *parse.BranchNode) (node, bool) {
	p, ok := t.compilePipe(n.Pipe, false)
	if !ok {
		return node{}, false
	}
	list, ok := t.compile(n.List)
	if !ok {
		return node{}, false
	}
	els, ok := t.compile(n.ElseList)
	return node{kind: kind, pipe: p, list: list, els: els}, ok
}

// compilePipe: no variables; one command, followed in an action (printed)
// by html/template's HTML text escaper at most. The command is an argument,
// a time's Format with a string, or a call of or, not or date on arguments.
func (t *Tree) compilePipe(p *parse.PipeNode, printed bool) (pipe, bool) {
	if p == nil || len(p.Decl) != 0 || p.IsAssign || len(p.Cmds) == 0 || len(p.Cmds) > 2 {
		return pipe{}, false
	}
	if len(p.Cmds) == 2 && (!printed || !isEscaper(p.Cmds[1])) {
		return pipe{}, false
	}
	args := p.Cmds[0].Args
	var c pipe
	if id, ok := args[0].(*parse.IdentifierNode); ok {
		switch {
		case id.Ident == "or" && len(args) >= 2:
			c.kind = orPipe
		case id.Ident == "not" && len(args) == 2:
			c.kind = notPipe
		case id.Ident == "date" && t.date != nil && (len(args) == 2 || len(args) == 3):
			c.kind = datePipe
		default:
			return pipe{}, false
		}
		args = args[1:]
	} else if isFormat(args) {
		f := args[0].(*parse.FieldNode)
		return pipe{kind: formatPipe, args: []arg{{kind: fieldArg, field: t.field(f.Ident[0])}},
			layout: args[1].(*parse.StringNode).Text}, true
	} else if len(args) != 1 {
		return pipe{}, false
	}
	for _, a := range args {
		ca, ok := t.compileArg(a)
		if !ok {
			return pipe{}, false
		}
		c.args = append(c.args, ca)
	}
	return c, true
}

func isEscaper(c *parse.CommandNode) bool {
	id, ok := c.Args[0].(*parse.IdentifierNode)
	return ok && len(c.Args) == 1 && id.Ident == htmlEscaper
}

// isFormat: .key.Format "layout".
func isFormat(args []parse.Node) bool {
	f, ok := args[0].(*parse.FieldNode)
	if !ok || len(args) != 2 || len(f.Ident) != 2 || f.Ident[1] != "Format" {
		return false
	}
	_, ok = args[1].(*parse.StringNode)
	return ok
}

// compileArg: dot, a string, .key or .key.IsZero.
func (t *Tree) compileArg(a parse.Node) (arg, bool) {
	switch a := a.(type) {
	case *parse.DotNode:
		return arg{kind: dotArg}, true
	case *parse.StringNode:
		return arg{kind: stringArg, s: a.Text}, true
	case *parse.FieldNode:
		switch {
		case len(a.Ident) == 1:
			return arg{kind: fieldArg, field: t.field(a.Ident[0])}, true
		case len(a.Ident) == 2 && a.Ident[1] == "IsZero":
			return arg{kind: isZeroArg, field: t.field(a.Ident[0])}, true
		}
	}
	return arg{}, false
}

// dot is what . is: the data (root), or a plain value a with set.
type dot struct {
	root bool
	v    any
}

// render runs a compiled tree over the values of its fields. Every method
// returns false when it meets a value whose rendering it does not
// reproduce exactly.
type render struct {
	out    *bytes.Buffer
	date   DateFunc
	values []any
	noData bool // the data is a nil map: text/template fails on any field of it
}

// plain reports whether v is a value the direct render handles.
func plain(v any) bool {
	switch v.(type) {
	case nil, string, int64, bool, time.Time:
		return true
	}
	return false
}

// truth is text/template's truth of a plain value: a non-empty string, a
// non-zero number, true, any time.Time (a struct), never nil.
func truth(v any) bool {
	switch v := v.(type) {
	case string:
		return v != ""
	case int64:
		return v != 0
	case bool:
		return v
	case time.Time:
		return true
	}
	return false
}

func (r *render) list(code []node, d dot) bool {
	for i := range code {
		n := &code[i]
		switch n.kind {
		case textNode:
			r.out.Write(n.text)
		case actionNode:
			v, ok := r.pipe(&n.pipe, d)
			if !ok || !r.print(v, n.escape) {
				return false
			}
		case ifNode, withNode:
			v, ok := r.pipe(&n.pipe, d)
			if !ok {
				return false
			}
			switch {
			case !truth(v):
				ok = r.list(n.els, d)
			case n.kind == withNode:
				ok = r.list(n.list, dot{v: v})
			default:
				ok = r.list(n.list, d)
			}
			if !ok {
				return false
			}
		}
	}
	return true
}

// print writes v as text/template prints it (fmt's form of a string, an
// int64, a bool), HTML-escaped as html/template's escaper does when escape
// is set; other values (nil prints "<no value>", a time its String) are
// left to the template.
func (r *render) print(v any, escape bool) bool {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case int64:
		var b [20]byte
		r.out.Write(strconv.AppendInt(b[:0], v, 10)) // digits and '-': nothing to escape
		return true
	case bool:
		s = strconv.FormatBool(v)
	default:
		return false
	}
	if escape {
		writeHTMLEscaped(r.out, s)
	} else {
		r.out.WriteString(s)
	}
	return true
}

// writeHTMLEscaped writes s as html/template's escaper writes plain text
// into HTML text: NUL as U+FFFD, " & ' + < > as character references,
// everything else (invalid UTF-8 too) as it is.
func writeHTMLEscaped(b *bytes.Buffer, s string) {
	written := 0
	for i := 0; i < len(s); i++ {
		var repl string
		switch s[i] {
		case 0:
			repl = "\uFFFD"
		case '"':
			repl = "&#34;"
		case '&':
			repl = "&amp;"
		case '\'':
			repl = "&#39;"
		case '+':
			repl = "&#43;"
		case '<':
			repl = "&lt;"
		case '>':
			repl = "&gt;"
		default:
			continue
		}
		b.WriteString(s[written:i])
		b.WriteString(repl)
		written = i + 1
	}
	b.WriteString(s[written:])
}

func (r *render) pipe(p *pipe, d dot) (any, bool) {
	switch p.kind {
	case argPipe:
		return r.arg(&p.args[0], d)
	case formatPipe:
		v, ok := r.field(p.args[0].field, d)
		t, isTime := v.(time.Time)
		if !ok || !isTime {
			return nil, false // a missing key, or Format of something else: the template's error
		}
		return t.Format(p.layout), true
	case orPipe: // the first true argument, else the last; later ones are not evaluated
		var v any
		for i := range p.args {
			var ok bool
			if v, ok = r.arg(&p.args[i], d); !ok {
				return nil, false
			}
			if truth(v) {
				break
			}
		}
		return v, true
	case notPipe:
		v, ok := r.arg(&p.args[0], d)
		return !truth(v), ok
	case datePipe:
		v, ok := r.arg(&p.args[0], d)
		if !ok {
			return nil, false
		}
		if len(p.args) == 2 {
			l, ok := r.arg(&p.args[1], d)
			s, isString := l.(string)
			if !ok || !isString {
				return nil, false // text/template refuses a non-string layout
			}
			return r.date(v, s), true
		}
		return r.date(v), true
	}
	return nil, false
}

// field is .key of dot, when dot is the data.
func (r *render) field(i int, d dot) (any, bool) {
	if !d.root || r.noData {
		return nil, false // a field of a value: text/template's error or method call
	}
	v := r.values[i]
	return v, plain(v)
}

func (r *render) arg(a *arg, d dot) (any, bool) {
	switch a.kind {
	case stringArg:
		return a.s, true
	case dotArg:
		if d.root {
			return nil, false // the data itself (a map) is not plain
		}
		return d.v, plain(d.v)
	case fieldArg:
		return r.field(a.field, d)
	case isZeroArg:
		v, ok := r.field(a.field, d)
		t, isTime := v.(time.Time)
		if !ok || !isTime {
			return nil, false
		}
		return t.IsZero(), true
	}
	return nil, false
}
