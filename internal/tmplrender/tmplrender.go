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
package tmplrender

import (
	"bytes"
	"errors"
	htmltemplate "html/template"
	"io"
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

// Tree is a template's parse tree prepared for a direct render. The zero
// Tree (or a nil one) renders nothing directly.
type Tree struct {
	root *parse.ListNode
	date DateFunc
}

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
	tr := &Tree{root: root, date: date}
	if !tr.fastable(root) {
		return nil
	}
	return tr
}

// Execute renders data into b and reports whether it could; when it could
// not, b holds part of an output and the caller resets it and executes the
// template.
func (t *Tree) Execute(b *bytes.Buffer, data map[string]any) bool {
	if t == nil || t.root == nil {
		return false // a zero Tree knows no template: rendering nothing would lose its text
	}
	r := render{out: b, date: t.date}
	return r.list(t.root, data)
}

// fastable reports whether every node of list is one the direct render
// knows, so it is worth trying for this template.
func (t *Tree) fastable(list *parse.ListNode) bool {
	if list == nil {
		return true
	}
	for _, n := range list.Nodes {
		switch n := n.(type) {
		case *parse.TextNode, *parse.CommentNode:
		case *parse.ActionNode:
			if !t.fastablePipe(n.Pipe, true) {
				return false
			}
		case *parse.IfNode:
			if !t.fastablePipe(n.Pipe, false) || !t.fastable(n.List) || !t.fastable(n.ElseList) {
				return false
			}
		case *parse.WithNode:
			if !t.fastablePipe(n.Pipe, false) || !t.fastable(n.List) || !t.fastable(n.ElseList) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// fastablePipe: no variables; one command, followed in an action (printed)
// by html/template's HTML text escaper at most. The command is an argument,
// a time's Format with a string, or a call of or, not or date on arguments.
func (t *Tree) fastablePipe(p *parse.PipeNode, printed bool) bool {
	if p == nil || len(p.Decl) != 0 || p.IsAssign || len(p.Cmds) == 0 || len(p.Cmds) > 2 {
		return false
	}
	if len(p.Cmds) == 2 && (!printed || !isEscaper(p.Cmds[1])) {
		return false
	}
	args := p.Cmds[0].Args
	if id, ok := args[0].(*parse.IdentifierNode); ok {
		switch {
		case id.Ident == "or" && len(args) >= 2:
		case id.Ident == "not" && len(args) == 2:
		case id.Ident == "date" && t.date != nil && (len(args) == 2 || len(args) == 3):
		default:
			return false
		}
		args = args[1:]
	} else if isFormat(args) {
		return true
	} else if len(args) != 1 {
		return false
	}
	for _, a := range args {
		if !fastableArg(a) {
			return false
		}
	}
	return true
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

// fastableArg: dot, a string, .key or .key.IsZero.
func fastableArg(a parse.Node) bool {
	switch a := a.(type) {
	case *parse.DotNode, *parse.StringNode:
		return true
	case *parse.FieldNode:
		return len(a.Ident) == 1 || (len(a.Ident) == 2 && a.Ident[1] == "IsZero")
	}
	return false
}

// render walks a fastable tree over data. Every method returns false when
// it meets a value whose rendering it does not reproduce exactly.
type render struct {
	out  *bytes.Buffer
	date DateFunc
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

func (r *render) list(l *parse.ListNode, dot any) bool {
	if l == nil {
		return true
	}
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			r.out.Write(n.Text)
		case *parse.CommentNode:
		case *parse.ActionNode:
			v, ok := r.pipe(n.Pipe, dot)
			if !ok || !r.print(v, len(n.Pipe.Cmds) == 2) {
				return false
			}
		case *parse.IfNode:
			if !r.branch(&n.BranchNode, dot, false) {
				return false
			}
		case *parse.WithNode:
			if !r.branch(&n.BranchNode, dot, true) {
				return false
			}
		default:
			return false
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

func (r *render) branch(n *parse.BranchNode, dot any, with bool) bool {
	v, ok := r.pipe(n.Pipe, dot)
	if !ok {
		return false
	}
	if truth(v) {
		if with {
			dot = v
		}
		return r.list(n.List, dot)
	}
	return r.list(n.ElseList, dot)
}

func (r *render) pipe(p *parse.PipeNode, dot any) (any, bool) {
	args := p.Cmds[0].Args
	if isFormat(args) {
		v, ok := r.field(args[0].(*parse.FieldNode).Ident[0], dot)
		t, isTime := v.(time.Time)
		if !ok || !isTime {
			return nil, false // a missing key, or Format of something else: the template's error
		}
		return t.Format(args[1].(*parse.StringNode).Text), true
	}
	id, call := args[0].(*parse.IdentifierNode)
	if !call {
		return r.arg(args[0], dot)
	}
	switch id.Ident {
	case "or": // the first true argument, else the last; later ones are not evaluated
		var v any
		for _, a := range args[1:] {
			var ok bool
			if v, ok = r.arg(a, dot); !ok {
				return nil, false
			}
			if truth(v) {
				break
			}
		}
		return v, true
	case "not":
		v, ok := r.arg(args[1], dot)
		return !truth(v), ok
	case "date":
		v, ok := r.arg(args[1], dot)
		if !ok {
			return nil, false
		}
		var layout []string
		if len(args) == 3 {
			l, ok := r.arg(args[2], dot)
			s, isString := l.(string)
			if !ok || !isString {
				return nil, false // text/template refuses a non-string layout
			}
			layout = []string{s}
		}
		return r.date(v, layout...), true
	}
	return nil, false
}

// field is .key of dot, when dot is a map.
func (r *render) field(key string, dot any) (any, bool) {
	m, ok := dot.(map[string]any)
	if !ok || m == nil {
		return nil, false // a field of something else: text/template's error or method call
	}
	v := m[key]
	return v, plain(v)
}

func (r *render) arg(n parse.Node, dot any) (any, bool) {
	switch n := n.(type) {
	case *parse.StringNode:
		return n.Text, true
	case *parse.DotNode:
		return dot, plain(dot)
	case *parse.FieldNode:
		v, ok := r.field(n.Ident[0], dot)
		if !ok || len(n.Ident) == 1 {
			return v, ok
		}
		t, isTime := v.(time.Time) // .key.IsZero
		if !isTime {
			return nil, false
		}
		return t.IsZero(), true
	}
	return nil, false
}
