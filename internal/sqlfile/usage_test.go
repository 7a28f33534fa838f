package sqlfile_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/internal/sqlfile"
)

// Every package that reads statements from a .sql file asks only for names
// the file has, and uses every statement the file has: a mistyped name fails
// here rather than panicking (Queries.Get) when the code path first runs, and
// a statement nobody runs does not linger untested.
func TestEveryQueryNameExistsAndIsUsed(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" ||
			fileExists(filepath.Join(path, "go.mod"))) {
			return filepath.SkipDir // another module (bench, deploy/check) or not code
		}
		found, problems := checkPackage(path)
		if found {
			checked++
		}
		for _, p := range problems {
			t.Errorf("%s: %s", relTo(root, path), p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 3 {
		t.Fatalf("found %d packages reading .sql files; want internal/store, internal/ops and internal/dispatch at least", checked)
	}
}

// The check itself: a package with a mistyped name, an unused statement, a
// name chosen at run time it cannot follow, and the shapes it must follow
// (a wrapper, a helper taking the name as a parameter, a local variable).
func TestCheckPackageFindsWhatIsWrong(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("q.sql", "-- name: Direct\nSELECT 1;\n-- name: ViaHelper\nSELECT 2;\n-- name: ViaLocal\nSELECT 3;\n"+
		"-- name: ViaGet\nSELECT 4;\n-- name: Unused\nSELECT 5;\n")
	write("p.go", `package p

import "github.com/nudgehq/nudge/internal/sqlfile"

var queries = sqlfile.Parse("q.sql", "")

func query(name string) string { return queries.Get(name) }

func helper(op, name string) string { return op + query(name) }

func use(b bool, names []string) {
	_ = query("Direct")
	_ = helper("op", "ViaHelper")
	n := "ViaLocal"
	if b {
		n = "Mistyped"
	}
	_ = query(n)
	_ = queries.Get("ViaGet")
	_ = query(names[0])
}
`)
	write("p_test.go", `package p

func testOnly() { _ = query("Unused") }
`)
	found, problems := checkPackage(dir)
	if !found {
		t.Fatal("the package reading q.sql was not recognised")
	}
	want := []string{
		`p.go:20: cannot tell which statement query(names[0]) names: pass a string literal`,
		`q.sql has no statement "Mistyped" (p.go:16)`,
		`statement "Unused" in q.sql is never used`,
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n got %q\nwant %q", problems, want)
	}
}

// checkPackage checks the package in dir (its non-test files) if it calls
// sqlfile.Parse, and reports whether it did and what is wrong.
func checkPackage(dir string) (bool, []string) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, []string{err.Error()}
	}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return false, []string{err.Error()}
		}
		files = append(files, f)
	}
	// The variables holding a parsed file: var queries = sqlfile.Parse("queries.sql", src).
	sqlFiles := map[string]string{} // variable → file name
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
				return true
			}
			if call, ok := vs.Values[0].(*ast.CallExpr); ok && isSel(call.Fun, "sqlfile", "Parse") && len(call.Args) == 2 {
				if name, ok := stringLit(call.Args[0]); ok {
					sqlFiles[vs.Names[0].Name] = name
				}
			}
			return true
		})
	}
	if len(sqlFiles) == 0 {
		return false, nil
	}
	if len(sqlFiles) > 1 {
		return true, []string{"more than one .sql file per package: the check cannot tell which a name belongs to"}
	}
	var varName, sqlName string
	for varName, sqlName = range sqlFiles {
	}
	src, err := os.ReadFile(filepath.Join(dir, sqlName))
	if err != nil {
		return true, []string{err.Error()}
	}
	statements := sqlfile.Parse(sqlName, string(src)).Names()

	// Which functions take a statement name, and at which argument: Get on
	// the variable, then every function passing a parameter of its own on to
	// one of those (query(name), s.ids(ctx, op, name, args)), to a fixpoint.
	takes := map[string]int{varName + ".Get": 0}
	for changed := true; changed; {
		changed = false
		eachCall(files, takes, func(fn *ast.FuncDecl, _ *ast.CallExpr, arg ast.Expr) {
			if fn == nil || fn.Name == nil {
				return
			}
			if i := paramIndex(fn, arg); i >= 0 {
				if _, ok := takes[fn.Name.Name]; !ok {
					takes[fn.Name.Name] = i
					changed = true
				}
			}
		})
	}

	used := map[string]bool{}
	var problems []string
	eachCall(files, takes, func(fn *ast.FuncDecl, call *ast.CallExpr, arg ast.Expr) {
		pos := fset.Position(arg.Pos())
		at := filepath.Base(pos.Filename) + ":" + strconv.Itoa(pos.Line)
		if s, ok := stringLit(arg); ok {
			used[s] = true
			if !slices.Contains(statements, s) {
				problems = append(problems, fmt.Sprintf("%s has no statement %q (%s)", sqlName, s, at))
			}
			return
		}
		if fn != nil && paramIndex(fn, arg) >= 0 {
			return // its callers pass the name; they are checked
		}
		if id, ok := arg.(*ast.Ident); ok && fn != nil {
			lits := assignedLiterals(fset, fn, id.Name)
			if len(lits) > 0 {
				for s, at := range lits {
					used[s] = true
					if !slices.Contains(statements, s) {
						problems = append(problems, fmt.Sprintf("%s has no statement %q (%s)", sqlName, s, at))
					}
				}
				return
			}
		}
		problems = append(problems, fmt.Sprintf("%s: cannot tell which statement %s names: pass a string literal",
			at, exprString(fset, call)))
	})
	for _, s := range statements {
		if !used[s] {
			problems = append(problems, fmt.Sprintf("statement %q in %s is never used", s, sqlName))
		}
	}
	slices.Sort(problems)
	return true, problems
}

// eachCall calls f for every call to a function of takes, with the function
// declaration it is in (nil at package level) and the name's argument.
func eachCall(files []*ast.File, takes map[string]int, f func(fn *ast.FuncDecl, call *ast.CallExpr, arg ast.Expr)) {
	for _, file := range files {
		var fn *ast.FuncDecl
		ast.Inspect(file, func(n ast.Node) bool {
			if d, ok := n.(*ast.FuncDecl); ok {
				fn = d
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var key string
			switch fun := call.Fun.(type) {
			case *ast.Ident:
				key = fun.Name
			case *ast.SelectorExpr:
				key = fun.Sel.Name
				if x, ok := fun.X.(*ast.Ident); ok && fun.Sel.Name == "Get" {
					key = x.Name + ".Get"
				}
			}
			if i, ok := takes[key]; ok && i < len(call.Args) {
				f(fn, call, call.Args[i])
			}
			return true
		})
	}
}

// paramIndex is the position of arg among fn's parameters, or -1.
func paramIndex(fn *ast.FuncDecl, arg ast.Expr) int {
	id, ok := arg.(*ast.Ident)
	if !ok {
		return -1
	}
	i := 0
	for _, field := range fn.Type.Params.List {
		for _, n := range field.Names {
			if n.Name == id.Name {
				return i
			}
			i++
		}
		if len(field.Names) == 0 {
			i++
		}
	}
	return -1
}

// assignedLiterals are the string literals assigned to the variable name in
// fn, with where.
func assignedLiterals(fset *token.FileSet, fn *ast.FuncDecl, name string) map[string]string {
	out := map[string]string{}
	ast.Inspect(fn, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != len(as.Rhs) {
			return true
		}
		for i, l := range as.Lhs {
			if id, ok := l.(*ast.Ident); ok && id.Name == name {
				if s, ok := stringLit(as.Rhs[i]); ok {
					pos := fset.Position(as.Rhs[i].Pos())
					out[s] = filepath.Base(pos.Filename) + ":" + strconv.Itoa(pos.Line)
				}
			}
		}
		return true
	})
	return out
}

func isSel(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == pkg && sel.Sel.Name == name
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

func exprString(fset *token.FileSet, e ast.Expr) string {
	start, end := fset.Position(e.Pos()), fset.Position(e.End())
	src, err := os.ReadFile(start.Filename)
	if err != nil || end.Offset > len(src) {
		return "?"
	}
	return string(src[start.Offset:end.Offset])
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for !fileExists(filepath.Join(dir, "go.mod")) {
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	return dir
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func relTo(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}
