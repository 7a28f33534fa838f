package sms

import (
	"bytes"
	"text/template"
	"text/template/parse"
	"time"
)

// A direct render: the templates every deployment sends (the defaults, and
// any written like them) use a handful of actions: text, {{.key}},
// {{or .key "default"}}, {{with ...}}/{{if ...}} with {{else}}, {{.}} and
// the date function. text/template executes them through reflection, which
// was most of a render's cost and allocations. fastTree walks the parsed
// tree itself for exactly those actions on the values whose meaning in
// text/template is plain (a string, a missing key, a time.Time), and gives
// up on anything else, in which case the template is executed as before:
// the output is text/template's in every case (TestDirectRenderMatchesTextTemplate).

// fastable reports whether every node of list is one the direct render
// knows, so it is worth trying for this template.
func fastable(list *parse.ListNode) bool {
	if list == nil {
		return true
	}
	for _, n := range list.Nodes {
		switch n := n.(type) {
		case *parse.TextNode, *parse.CommentNode:
		case *parse.ActionNode:
			if !fastablePipe(n.Pipe) {
				return false
			}
		case *parse.IfNode:
			if !fastablePipe(n.Pipe) || !fastable(n.List) || !fastable(n.ElseList) {
				return false
			}
		case *parse.WithNode:
			if !fastablePipe(n.Pipe) || !fastable(n.List) || !fastable(n.ElseList) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// fastablePipe: one command, no variables: a field or dot or a string, or
// a call of or or date on those.
func fastablePipe(p *parse.PipeNode) bool {
	if p == nil || len(p.Decl) != 0 || p.IsAssign || len(p.Cmds) != 1 {
		return false
	}
	args := p.Cmds[0].Args
	if id, ok := args[0].(*parse.IdentifierNode); ok {
		if (id.Ident != "or" && id.Ident != "date") || len(args) < 2 || (id.Ident == "date" && len(args) > 3) {
			return false
		}
		args = args[1:]
	} else if len(args) != 1 {
		return false
	}
	for _, a := range args {
		switch a := a.(type) {
		case *parse.DotNode, *parse.StringNode:
		case *parse.FieldNode:
			if len(a.Ident) != 1 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// fastTemplate is a template with the tree the direct render walks, nil
// when it is not fastable.
type fastTemplate struct {
	tmpl *template.Template
	root *parse.ListNode
}

func newFastTemplate(t *template.Template) fastTemplate {
	f := fastTemplate{tmpl: t}
	// A template that defines others ({{define}}, {{block}}) is left to
	// text/template, as is one whose tree is not fastable.
	if t.Tree != nil && len(t.Templates()) == 1 && fastable(t.Tree.Root) {
		f.root = t.Tree.Root
	}
	return f
}

// execute renders data into b, directly when it can, else with
// text/template (b is reset first).
func (f fastTemplate) execute(b *bytes.Buffer, data map[string]any) error {
	if f.root != nil {
		r := directRender{out: b}
		if r.list(f.root, data) {
			return nil
		}
		b.Reset()
	}
	return f.tmpl.Execute(b, data)
}

// directRender walks a fastable tree over data. Every method returns false
// when it meets a value whose rendering it does not reproduce exactly.
type directRender struct {
	out *bytes.Buffer
}

// plain reports whether v is a value the direct render handles: nil (a
// missing key), a string or a time.Time.
func plain(v any) bool {
	switch v.(type) {
	case nil, string, time.Time:
		return true
	}
	return false
}

// truth is text/template's truth of a plain value: a non-empty string, any
// time.Time (a struct), never nil.
func truth(v any) bool {
	switch v := v.(type) {
	case string:
		return v != ""
	case time.Time:
		return true
	}
	return false
}

func (r *directRender) list(l *parse.ListNode, dot any) bool {
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
			s, isString := v.(string)
			if !ok || !isString {
				return false // text/template prints the rest through fmt
			}
			r.out.WriteString(s)
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

func (r *directRender) branch(n *parse.BranchNode, dot any, with bool) bool {
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

func (r *directRender) pipe(p *parse.PipeNode, dot any) (any, bool) {
	args := p.Cmds[0].Args
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
		return formatDate(v, layout...), true
	}
	return nil, false
}

func (r *directRender) arg(n parse.Node, dot any) (any, bool) {
	switch n := n.(type) {
	case *parse.StringNode:
		return n.Text, true
	case *parse.DotNode:
		return dot, plain(dot)
	case *parse.FieldNode:
		m, ok := dot.(map[string]any)
		if !ok || m == nil {
			return nil, false // a field of something else: text/template's error or method call
		}
		v := m[n.Ident[0]]
		return v, plain(v)
	}
	return nil, false
}
