package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Thresholds of the report (issue 27's table).
const (
	longFunc     = 40 // a function over this many lines is counted
	tooLongFunc  = 60 // and listed over this many
	longDoc      = 10 // a doc comment over this many lines is counted
	deepNesting  = 4  // functions nested deeper than this are listed
	backoffType  = "Backoff"
	backoffRetry = "Retry"
)

// pkgStats is what codestats measures in one package directory.
type pkgStats struct {
	Dir    string
	Files  []fileLines // every non-test .go file, by name
	Tagged int         // files with a //go:build line
	Lines  int         // sum of Files

	Funcs []funcStats // every function and method declaration with a body

	Exported []exportedName // the names of a default build (no tags)

	Docs []docComment // every doc comment of a declaration

	Retries []retryLoop
}

type fileLines struct {
	Name  string
	Lines int
}

type funcStats struct {
	Name  string // f, T.m (pointer receivers shown as T.m too)
	Pos   string // file:line of the func keyword
	Lines int    // from the func keyword to the closing brace, both counted
	Depth int    // the deepest statement's indentation level (body statements: 1)
	At    string // file:line of that statement
}

type exportedName struct {
	Kind string // type, func, method, var, const
	Name string // methods as T.m
}

type docComment struct {
	Of       string // the declaration it documents
	Exported bool   // Of is an exported name (a method: both its names)
	Pos      string
	Lines    int
}

type retryLoop struct {
	Func string
	Pos  string // file:line of the for keyword
	Why  string // the pause it calls, or "attempt bound"
}

// analyze measures the non-test .go files of dir (whatever their build
// tags; exported names only from the files of a default build).
func analyze(dir string) (*pkgStats, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	st := &pkgStats{Dir: dir}
	fset := token.NewFileSet()
	var files []*ast.File
	built := map[*ast.File]bool{}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		path := filepath.Join(dir, name)
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		st.Files = append(st.Files, fileLines{name, bytes.Count(src, []byte("\n"))})
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		if hasBuildLine(f) {
			st.Tagged++
		}
		ok, err := build.Default.MatchFile(dir, name)
		if err != nil {
			return nil, err
		}
		built[f] = ok
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no non-test .go files", dir)
	}
	for _, fl := range st.Files {
		st.Lines += fl.Lines
	}
	pauses := pausers(files)
	seen := map[exportedName]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			st.docs(fset, d)
			if built[f] {
				for _, n := range exported(d) {
					if !seen[n] {
						seen[n] = true
						st.Exported = append(st.Exported, n)
					}
				}
			}
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := funcName(fd)
			fs := funcStats{
				Name:  name,
				Pos:   pos(fset, fd.Pos()),
				Lines: fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1,
			}
			n := nesting{fset: fset, max: &fs.Depth, at: &fs.At}
			n.block(fd.Body.List, 0)
			st.Funcs = append(st.Funcs, fs)
			if isBackoffRetry(fd) {
				continue // the one backoff: the loop every retry should use
			}
			st.Retries = append(st.Retries, retries(fset, name, fd.Body, pauses)...)
		}
	}
	sort.Slice(st.Exported, func(i, j int) bool {
		a, b := st.Exported[i], st.Exported[j]
		return a.Kind < b.Kind || a.Kind == b.Kind && a.Name < b.Name
	})
	return st, nil
}

func hasBuildLine(f *ast.File) bool {
	for _, c := range f.Comments {
		if c.Pos() > f.Package {
			break
		}
		for _, l := range c.List {
			if strings.HasPrefix(l.Text, "//go:build ") {
				return true
			}
		}
	}
	return false
}

func pos(fset *token.FileSet, p token.Pos) string {
	ps := fset.Position(p)
	return fmt.Sprintf("%s:%d", filepath.Base(ps.Filename), ps.Line)
}

// recvType is the name of a method's receiver type, without * or type
// parameters.
func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.ParenExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}

func funcName(fd *ast.FuncDecl) string {
	if r := recvType(fd); r != "" {
		return r + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// exported lists the exported names d declares: types, functions, methods
// of exported types (the methods of an exported interface type too), vars
// and consts. Struct fields are not counted (they belong to their type).
func exported(d ast.Decl) []exportedName {
	var out []exportedName
	switch d := d.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			break
		}
		if r := recvType(d); r == "" {
			out = append(out, exportedName{"func", d.Name.Name})
		} else if ast.IsExported(r) {
			out = append(out, exportedName{"method", r + "." + d.Name.Name})
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if !s.Name.IsExported() {
					continue
				}
				out = append(out, exportedName{"type", s.Name.Name})
				if it, ok := s.Type.(*ast.InterfaceType); ok {
					for _, m := range it.Methods.List {
						for _, n := range m.Names {
							if n.IsExported() {
								out = append(out, exportedName{"method", s.Name.Name + "." + n.Name})
							}
						}
					}
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						out = append(out, exportedName{d.Tok.String(), n.Name})
					}
				}
			}
		}
	}
	return out
}

// docs records the doc comments of d: of the declaration, and of each spec
// of a grouped declaration (type, var, const). Package comments, struct
// fields' and interface methods' comments are not counted.
func (st *pkgStats) docs(fset *token.FileSet, d ast.Decl) {
	add := func(of string, cg *ast.CommentGroup) {
		if cg == nil {
			return
		}
		exp := true
		for _, part := range strings.Split(of, ".") {
			exp = exp && ast.IsExported(part)
		}
		st.Docs = append(st.Docs, docComment{of, exp, pos(fset, cg.Pos()), fset.Position(cg.End()).Line - fset.Position(cg.Pos()).Line + 1})
	}
	switch d := d.(type) {
	case *ast.FuncDecl:
		add(funcName(d), d.Doc)
	case *ast.GenDecl:
		first := ""
		for i, s := range d.Specs {
			name := ""
			var doc *ast.CommentGroup
			switch s := s.(type) {
			case *ast.TypeSpec:
				name, doc = s.Name.Name, s.Doc
			case *ast.ValueSpec:
				name, doc = s.Names[0].Name, s.Doc
			default:
				continue // imports
			}
			if i == 0 {
				first = name
			}
			if d.Lparen.IsValid() {
				add(name, doc)
			}
		}
		if first != "" {
			add(first, d.Doc)
		}
	}
}

// nesting finds the deepest statement of a function body, in indentation
// levels as gofmt lays them out: the body's statements are at level 1; a
// block (if, else, for, range, a bare block, a function literal's body)
// puts its statements one level deeper; the case and comm clauses of a
// switch or select stay at the switch's level and their statements go one
// deeper; an else-if stays at its if's level.
type nesting struct {
	fset *token.FileSet
	max  *int
	at   *string
}

func (n nesting) block(list []ast.Stmt, level int) {
	for _, s := range list {
		n.stmt(s, level+1)
	}
}

func (n nesting) stmt(s ast.Stmt, level int) {
	if _, ok := s.(*ast.LabeledStmt); !ok && level > *n.max {
		*n.max, *n.at = level, pos(n.fset, s.Pos())
	}
	switch s := s.(type) {
	case *ast.LabeledStmt:
		n.stmt(s.Stmt, level)
		return
	case *ast.BlockStmt:
		n.block(s.List, level)
		return
	case *ast.IfStmt:
		n.exprs(level, s.Init, s.Cond)
		n.block(s.Body.List, level)
		if s.Else != nil {
			if b, ok := s.Else.(*ast.BlockStmt); ok {
				n.block(b.List, level)
			} else {
				n.stmt(s.Else, level) // else if: the same level
			}
		}
		return
	case *ast.ForStmt:
		n.exprs(level, s.Init, s.Cond, s.Post)
		n.block(s.Body.List, level)
		return
	case *ast.RangeStmt:
		n.exprs(level, s.X)
		n.block(s.Body.List, level)
		return
	case *ast.SwitchStmt:
		n.exprs(level, s.Init, s.Tag)
		n.clauses(s.Body, level)
		return
	case *ast.TypeSwitchStmt:
		n.exprs(level, s.Init, s.Assign)
		n.clauses(s.Body, level)
		return
	case *ast.SelectStmt:
		n.clauses(s.Body, level)
		return
	}
	n.exprs(level, s)
}

func (n nesting) clauses(b *ast.BlockStmt, level int) {
	for _, c := range b.List {
		switch c := c.(type) {
		case *ast.CaseClause:
			for _, e := range c.List {
				n.exprs(level, e)
			}
			n.block(c.Body, level)
		case *ast.CommClause:
			n.exprs(level, c.Comm)
			n.block(c.Body, level)
		}
	}
}

// exprs looks for function literals in the given nodes: their bodies are
// one level deeper than the statement that holds them.
func (n nesting) exprs(level int, nodes ...ast.Node) {
	for _, x := range nodes {
		if x == nil {
			continue
		}
		ast.Inspect(x, func(c ast.Node) bool {
			if fl, ok := c.(*ast.FuncLit); ok {
				n.block(fl.Body.List, level)
				return false
			}
			return true
		})
	}
}

// The retry heuristic. A for or range loop is a hand-rolled retry loop if
// its body (without the function literals and loops inside it, judged on
// their own) makes a request, that is assigns the result of a call to a
// variable whose name ends in "err" (err, lerr, ...), and either
//   - pauses: calls time.Sleep, time.After, time.NewTimer, time.NewTicker,
//     time.Tick or time.AfterFunc, or a sleep helper: a function or method
//     of the package, without a loop of its own, that calls one of them
//     (methods are matched by name alone); or
//   - is bounded by an attempt count: a three-clause for whose condition
//     compares its counter with a constant or a name (not len(x): a walk
//     over a slice), and whose body tests an "err" variable in an if or a
//     switch.
//
// The loop of core.Backoff.Retry (a method Retry of a type Backoff) is the
// one backoff and is not counted; a loop that calls Backoff.Retry makes no
// pause of its own.
var timePauses = map[string]bool{"Sleep": true, "After": true, "NewTimer": true, "NewTicker": true, "Tick": true, "AfterFunc": true}

func isBackoffRetry(fd *ast.FuncDecl) bool {
	return recvType(fd) == backoffType && fd.Name.Name == backoffRetry
}

// pausers returns the package's sleep helpers: functions and methods
// (by name; methods as .m) that pause without a loop of their own.
func pausers(files []*ast.File) map[string]bool {
	out := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil || isBackoffRetry(fd) {
				continue
			}
			loops, pauses := false, false
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.ForStmt, *ast.RangeStmt:
					loops = true
				case *ast.CallExpr:
					pauses = pauses || timePause(n) != ""
				}
				return true
			})
			if pauses && !loops {
				key := fd.Name.Name
				if fd.Recv != nil {
					key = "." + key
				}
				out[key] = true
			}
		}
	}
	return out
}

// timePause returns the name of the time function n calls, if it pauses.
func timePause(n *ast.CallExpr) string {
	if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && timePauses[sel.Sel.Name] {
			return "time." + sel.Sel.Name
		}
	}
	return ""
}

// callee names a call of a function of the package (f) or of a method of a
// local variable or field (.m); "" for anything else.
func callee(n *ast.CallExpr) string {
	switch f := n.Fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		if id, ok := f.X.(*ast.Ident); ok && id.Obj == nil {
			return "" // pkg.F, or a method of a package-level var: not resolved
		}
		return "." + f.Sel.Name
	}
	return ""
}

func retries(fset *token.FileSet, fn string, body *ast.BlockStmt, pauses map[string]bool) []retryLoop {
	var out []retryLoop
	ast.Inspect(body, func(n ast.Node) bool {
		var loop *ast.BlockStmt
		var fs *ast.ForStmt
		switch n := n.(type) {
		case *ast.ForStmt:
			loop, fs = n.Body, n
		case *ast.RangeStmt:
			loop = n.Body
		default:
			return true
		}
		why, request, errTest := "", false, false
		inspectNoLit(loop, func(c ast.Node) {
			switch c := c.(type) {
			case *ast.CallExpr:
				if p := timePause(c); p != "" && why == "" {
					why = p
				} else if k := callee(c); k != "" && pauses[k] && why == "" {
					why = strings.TrimPrefix(k, ".")
				}
			case *ast.AssignStmt:
				if assignsErrCall(c) {
					request = true
				}
			case *ast.IfStmt:
				if mentionsErr(c.Cond) {
					errTest = true
				}
			case *ast.SwitchStmt:
				if mentionsErr(c.Tag) {
					errTest = true
				}
				for _, cc := range c.Body.List {
					for _, e := range cc.(*ast.CaseClause).List {
						if mentionsErr(e) {
							errTest = true
						}
					}
				}
			}
		})
		if !request {
			return true
		}
		if why == "" && fs != nil && errTest && attemptBound(fs) {
			why = "attempt bound"
		}
		if why != "" {
			out = append(out, retryLoop{fn, pos(fset, n.Pos()), why})
		}
		return true
	})
	return out
}

// inspectNoLit visits n's subtree without entering function literals or
// loops nested in it (they are judged on their own).
func inspectNoLit(n ast.Node, f func(ast.Node)) {
	ast.Inspect(n, func(c ast.Node) bool {
		switch c.(type) {
		case *ast.FuncLit, *ast.ForStmt, *ast.RangeStmt:
			return false
		}
		if c != nil {
			f(c)
		}
		return true
	})
}

func isErrName(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && strings.HasSuffix(strings.ToLower(id.Name), "err")
}

func assignsErrCall(a *ast.AssignStmt) bool {
	call := false
	for _, r := range a.Rhs {
		if _, ok := r.(*ast.CallExpr); ok {
			call = true
		}
	}
	return call && slices.ContainsFunc(a.Lhs, isErrName)
}

func mentionsErr(e ast.Expr) bool {
	if e == nil {
		return false
	}
	found := false
	ast.Inspect(e, func(c ast.Node) bool {
		if x, ok := c.(ast.Expr); ok && isErrName(x) {
			found = true
		}
		return !found
	})
	return found
}

// attemptBound reports whether fs is `for i := ...; i < N; i++` with N a
// constant or a name (not len(x) or another call: a walk over a slice).
func attemptBound(fs *ast.ForStmt) bool {
	if fs.Init == nil || fs.Post == nil {
		return false
	}
	b, ok := fs.Cond.(*ast.BinaryExpr)
	if !ok {
		return false
	}
	bound := func(e ast.Expr) bool {
		switch e.(type) {
		case *ast.BasicLit, *ast.Ident, *ast.SelectorExpr:
			return true
		}
		return false
	}
	switch b.Op {
	case token.LSS, token.LEQ:
		return bound(b.Y)
	case token.LAND:
		if c, ok := b.X.(*ast.BinaryExpr); ok && (c.Op == token.LSS || c.Op == token.LEQ) {
			return bound(c.Y)
		}
	}
	return false
}
