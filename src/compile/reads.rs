//! What an expression or template reads from its scope: every dotted name (`state.messages`,
//! `input.q`, `item`) with where it is first read, as a byte range of the text.
//!
//! minijinja's own analysis (`undeclared_variables`) is the model, with three differences: the
//! value a slice is taken of is read (`state.messages[:-1]` reads `state.messages`; minijinja
//! skips it, so a typo there went unreported), a subscript by a string literal reads like an
//! attribute (`state['messages']` is `state.messages`), and each name keeps its place so a
//! defect can be shown where it is written. Names a template binds itself (`set`, loop and
//! macro variables, imports) are not reads.

use std::collections::HashSet;
use std::ops::Range;

use minijinja::machinery::ast::{self, CallArg, Expr, Stmt};

/// A name read, dotted as `root.field.field`, and where it is first read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Read {
    pub name: String,
    pub range: Range<usize>,
}

/// What the expression `text` reads, or nothing when it does not parse (that is reported
/// by its compilation).
pub(super) fn of_expr(text: &str) -> Vec<Read> {
    match minijinja::machinery::parse_expr(text) {
        Ok(expr) => {
            let mut t = Tracker::default();
            t.expr(&expr);
            t.out
        }
        Err(_) => Vec::new(),
    }
}

/// What the template `text` reads, or nothing when it does not parse.
pub(super) fn of_template(text: &str) -> Vec<Read> {
    match minijinja::machinery::parse(text, "<template>", Default::default()) {
        Ok(stmt) => {
            let mut t = Tracker::default();
            t.stmt(&stmt);
            t.out
        }
        Err(_) => Vec::new(),
    }
}

#[derive(Default)]
struct Tracker<'a> {
    out: Vec<Read>,
    seen: HashSet<String>,
    /// Names bound by the template, one set per scope (innermost last).
    bound: Vec<HashSet<&'a str>>,
}

impl<'a> Tracker<'a> {
    fn is_bound(&self, name: &str) -> bool {
        self.bound.iter().any(|s| s.contains(name))
    }

    fn bind(&mut self, name: &'a str) {
        if self.bound.is_empty() {
            self.bound.push(HashSet::new());
        }
        if let Some(scope) = self.bound.last_mut() {
            scope.insert(name);
        }
    }

    fn push(&mut self) {
        self.bound.push(HashSet::new());
    }

    fn pop(&mut self) {
        self.bound.pop();
    }

    fn read(&mut self, name: String, span: minijinja::machinery::Span) {
        if self.seen.insert(name.clone()) {
            self.out.push(Read {
                name,
                range: span.start_offset as usize..span.end_offset as usize,
            });
        }
    }

    /// Binds the names an assignment target introduces (`x`, `(a, b)`).
    fn bind_target(&mut self, target: &Expr<'a>) {
        match target {
            Expr::Var(v) => self.bind(v.id),
            Expr::List(l) => l.items.iter().for_each(|x| self.bind_target(x)),
            Expr::Tuple(t) => t.items.iter().for_each(|x| self.bind_target(x)),
            _ => {}
        }
    }

    /// The dotted name a chain of attribute lookups and string subscripts ending in a variable
    /// reads (`state.a['b'].c` → `state.a.b.c`), when the variable is not bound.
    fn chain(&self, expr: &Expr<'a>) -> Option<String> {
        let mut parts: Vec<String> = Vec::new();
        let mut cur = expr;
        loop {
            match cur {
                Expr::Var(v) => {
                    if self.is_bound(v.id) {
                        return None;
                    }
                    let mut name = v.id.to_string();
                    for p in parts.iter().rev() {
                        name.push('.');
                        name.push_str(p);
                    }
                    return Some(name);
                }
                Expr::GetAttr(g) => {
                    parts.push(g.name.to_string());
                    cur = &g.expr;
                }
                Expr::GetItem(g) => match &g.subscript_expr {
                    Expr::Const(c) if c.value.as_str().is_some() => {
                        parts.push(c.value.as_str().unwrap_or_default().to_string());
                        cur = &g.expr;
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    fn expr(&mut self, expr: &Expr<'a>) {
        match expr {
            Expr::Var(v) => {
                if !self.is_bound(v.id) {
                    self.read(v.id.to_string(), v.span());
                }
            }
            Expr::Const(_) => {}
            Expr::GetAttr(g) => match self.chain(expr) {
                Some(name) => self.read(name, g.span()),
                None => self.expr(&g.expr),
            },
            Expr::GetItem(g) => match self.chain(expr) {
                Some(name) => self.read(name, g.span()),
                None => {
                    self.expr(&g.expr);
                    self.expr(&g.subscript_expr);
                }
            },
            Expr::Slice(s) => {
                self.expr(&s.expr);
                for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.expr(part);
                }
            }
            Expr::UnaryOp(u) => self.expr(&u.expr),
            Expr::BinOp(b) => {
                self.expr(&b.left);
                self.expr(&b.right);
            }
            Expr::Compare(c) => {
                self.expr(&c.expr);
                c.ops.iter().for_each(|op| self.expr(&op.expr));
            }
            Expr::IfExpr(i) => {
                self.expr(&i.test_expr);
                self.expr(&i.true_expr);
                if let Some(f) = &i.false_expr {
                    self.expr(f);
                }
            }
            Expr::Filter(f) => {
                if let Some(e) = &f.expr {
                    self.expr(e);
                }
                self.args(&f.args);
            }
            Expr::Test(t) => {
                self.expr(&t.expr);
                self.args(&t.args);
            }
            Expr::Call(c) => {
                self.expr(&c.expr);
                self.args(&c.args);
            }
            Expr::List(l) => l.items.iter().for_each(|x| self.expr(x)),
            Expr::Tuple(t) => t.items.iter().for_each(|x| self.expr(x)),
            Expr::Map(m) => {
                for (k, v) in m.keys.iter().zip(&m.values) {
                    self.expr(k);
                    self.expr(v);
                }
            }
        }
    }

    fn args(&mut self, args: &[CallArg<'a>]) {
        for arg in args {
            match arg {
                CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => self.expr(e),
            }
        }
    }

    fn body(&mut self, body: &[Stmt<'a>]) {
        body.iter().for_each(|s| self.stmt(s));
    }

    fn scoped(&mut self, body: &[Stmt<'a>]) {
        self.push();
        self.body(body);
        self.pop();
    }

    fn macro_decl(&mut self, m: &ast::Macro<'a>) {
        self.bind("caller");
        m.args.iter().for_each(|a| self.bind_target(a));
        m.defaults.iter().for_each(|d| self.expr(d));
        self.body(&m.body);
    }

    fn stmt(&mut self, stmt: &Stmt<'a>) {
        match stmt {
            Stmt::Template(t) => {
                self.bind("self");
                self.body(&t.children);
            }
            Stmt::EmitExpr(e) => self.expr(&e.expr),
            Stmt::EmitRaw(_) => {}
            Stmt::ForLoop(f) => {
                self.push();
                self.bind("loop");
                self.expr(&f.iter);
                self.bind_target(&f.target);
                if let Some(filter) = &f.filter_expr {
                    self.expr(filter);
                }
                self.body(&f.body);
                self.pop();
                self.scoped(&f.else_body);
            }
            Stmt::IfCond(i) => {
                self.expr(&i.expr);
                self.scoped(&i.true_body);
                self.scoped(&i.false_body);
            }
            Stmt::WithBlock(w) => {
                self.push();
                for (target, value) in &w.assignments {
                    self.bind_target(target);
                    self.expr(value);
                }
                self.body(&w.body);
                self.pop();
            }
            Stmt::Set(s) => {
                self.bind_target(&s.target);
                self.expr(&s.expr);
            }
            Stmt::SetBlock(s) => {
                self.bind_target(&s.target);
                if let Some(filter) = &s.filter {
                    self.expr(filter);
                }
                self.scoped(&s.body);
            }
            Stmt::AutoEscape(a) => {
                self.expr(&a.enabled);
                self.scoped(&a.body);
            }
            Stmt::FilterBlock(f) => {
                self.expr(&f.filter);
                self.scoped(&f.body);
            }
            Stmt::Block(b) => {
                self.push();
                self.bind("super");
                self.body(&b.body);
                self.pop();
            }
            Stmt::Extends(_) | Stmt::Include(_) => {}
            Stmt::Import(i) => self.bind_target(&i.name),
            Stmt::FromImport(f) => {
                for (name, alias) in &f.names {
                    self.bind_target(alias.as_ref().unwrap_or(name));
                }
            }
            Stmt::Macro(m) => {
                self.bind(m.name);
                self.push();
                self.macro_decl(m);
                self.pop();
            }
            Stmt::CallBlock(c) => {
                self.expr(&c.call.expr);
                self.args(&c.call.args);
                self.push();
                self.macro_decl(&c.macro_decl);
                self.pop();
            }
            Stmt::Continue(_) | Stmt::Break(_) => {}
            Stmt::Do(d) => {
                self.expr(&d.call.expr);
                self.args(&d.call.args);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(reads: Vec<Read>) -> Vec<String> {
        let mut v: Vec<String> = reads.into_iter().map(|r| r.name).collect();
        v.sort();
        v
    }

    #[test]
    fn a_sliced_value_is_read() {
        assert_eq!(names(of_expr("state.message[:-1]")), ["state.message"]);
        assert_eq!(names(of_expr("nothing[1:]")), ["nothing"]);
        assert_eq!(
            names(of_expr("state.a[state.i:state.j]")),
            ["state.a", "state.i", "state.j"]
        );
    }

    #[test]
    fn string_subscripts_read_like_attributes() {
        assert_eq!(names(of_expr("state['mesages']")), ["state.mesages"]);
        assert_eq!(names(of_expr("state.a['b'].c")), ["state.a.b.c"]);
        assert_eq!(names(of_expr("state.items[state.i]")), ["state.i", "state.items"]);
    }

    #[test]
    fn names_keep_where_they_are_first_read() {
        let text = "output ~ state.anser ~ state.anser";
        let reads = of_expr(text);
        let anser = reads.iter().find(|r| r.name == "state.anser").unwrap();
        assert_eq!(&text[anser.range.clone()], "state.anser");
        assert_eq!(anser.range.start, 9);
    }

    #[test]
    fn names_a_template_binds_are_not_reads() {
        let t = "{% set n = state.n %}{% for m in state.messages %}{{ m.content[:10] }}{{ loop.index }}\
                 {% endfor %}{{ n }}{% macro f(x) %}{{ x }}{% endmacro %}{{ f(1) }}";
        assert_eq!(names(of_template(t)), ["state.messages", "state.n"]);
        assert!(of_template("{% if %}").is_empty());
    }
}
