// The graph text format (text.h): a line-oriented lexer, a recursive-descent parser
// into a small expression tree, and an evaluator that drives the Graph builder.
//
// Robustness is part of the contract (the fuzzer checks it): every failure is a
// comfuse::Error with a line and column, nesting is bounded, numbers go through
// std::from_chars (no exceptions, no locale), and input size and node count are capped
// so that the Graph builder's linear name lookups cannot turn into a quadratic hang.
#include "comfuse/text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace comfuse {
namespace {

constexpr size_t kMaxInput = 16u << 20;  // bytes
constexpr size_t kMaxLine = 64u << 10;   // bytes
constexpr int kMaxDepth = 64;            // nested calls in one expression
// Graph::find and Graph::fresh_name scan every node, so building n nodes costs O(n^2).
// Real fusion graphs have tens of nodes; this cap keeps the worst case well under a second.
constexpr size_t kMaxNodes = 20000;

bool ident_start(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '%';
}
bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9') || c == '.'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A name or number as a message shows it: lines may be 64 KiB long, messages stay short.
std::string clip(std::string_view s) {
  constexpr size_t kShown = 64;
  return s.size() <= kShown ? std::string(s) : fmt::format("{}...({} bytes)", s.substr(0, kShown), s.size());
}

std::string show_char(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

enum class TK { Ident, Number, Punct, End };

struct Tok {
  TK kind = TK::End;
  std::string text;  // identifier, the number's spelling, or the punctuation character
  double num = 0.0;
  SourceLoc loc;
};

std::string describe(const Tok& t) {
  switch (t.kind) {
    case TK::End: return "end of line";
    case TK::Number: return fmt::format("number `{}`", clip(t.text));
    case TK::Ident: return fmt::format("`{}`", clip(t.text));
    case TK::Punct: return fmt::format("'{}'", clip(t.text));
  }
  return "?";
}

// Splits one line (already known to be <= kMaxLine) into tokens; '#' starts a comment.
std::vector<Tok> lex_line(std::string_view s, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  auto loc = [&](size_t at) { return SourceLoc{line, static_cast<int>(at) + 1}; };
  while (i < s.size()) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') { ++i; continue; }
    if (c == '#') break;
    Tok t;
    t.loc = loc(i);
    if (ident_start(c)) {
      size_t j = i;
      while (j < s.size() && ident_char(s[j])) ++j;
      t.kind = TK::Ident;
      t.text = std::string(s.substr(i, j - i));
      i = j;
    } else if (is_digit(c) || ((c == '-' || c == '+' || c == '.') && i + 1 < s.size() &&
                               (is_digit(s[i + 1]) || (s[i + 1] == '.' && c != '.') ||
                                (c != '.' && s.substr(i + 1, 3) == "inf")))) {
      size_t j = i;
      if (s[j] == '-' || s[j] == '+') ++j;
      if (s.substr(j, 3) == "inf") {
        j += 3;
      } else {
        while (j < s.size() && (is_digit(s[j]) || s[j] == '.')) ++j;
        if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
          size_t k = j + 1;
          if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
          if (k < s.size() && is_digit(s[k])) {
            while (k < s.size() && is_digit(s[k])) ++k;
            j = k;
          }
        }
      }
      // Swallow the rest of a glued word so `2x` is reported whole.
      size_t end = j;
      while (end < s.size() && ident_char(s[end])) ++end;
      t.kind = TK::Number;
      t.text = std::string(s.substr(i, end - i));
      if (end != j) throw Error(t.loc, fmt::format("malformed number `{}`", clip(t.text)));
      std::string_view body = s.substr(i, j - i);
      const bool neg = body[0] == '-';
      if (body[0] == '-' || body[0] == '+') body.remove_prefix(1);
      if (body == "inf") {
        t.num = INFINITY;
      } else {
        double v = 0.0;
        auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), v);
        if (ec == std::errc::result_out_of_range)
          throw Error(t.loc, fmt::format("number `{}` is out of range", clip(t.text)));
        if (ec != std::errc() || p != body.data() + body.size())
          throw Error(t.loc, fmt::format("malformed number `{}`", clip(t.text)));
        t.num = v;
      }
      if (neg) t.num = -t.num;
      i = j;
    } else if (c == '(' || c == ')' || c == '[' || c == ']' || c == ',' || c == ':' || c == '=') {
      t.kind = TK::Punct;
      t.text = std::string(1, c);
      ++i;
    } else {
      throw Error(t.loc, fmt::format("unexpected character {}", show_char(c)));
    }
    out.push_back(std::move(t));
  }
  Tok end;
  end.loc = loc(s.size());
  out.push_back(end);
  return out;
}

// Parsed expression: a number, a name, or a call. Depth <= kMaxDepth by construction.
struct Expr {
  enum Kind { Num, Name, Call } kind = Num;
  Tok tok;  // the number, the name, or the op name of a call
  std::vector<Expr> args;
  std::vector<std::pair<Tok, Tok>> kws;  // keyword token, value token (number or name)
};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char* const kSpecialOps[] = {"matmul", "cast", "transpose", "const", "layer_norm",
                                   "rms_norm", "softmax", "log_softmax", "l2_normalize", "rope"};

// Every op name the parser knows, enumerated through ops.h (name_of returns "?" past the
// last enumerator), so a new ops.def row shows up in hints without an edit here.
std::vector<std::string> known_op_names() {
  std::vector<std::string> names(std::begin(kSpecialOps), std::end(kSpecialOps));
  names.emplace_back(CausalMaskOp::name);
  names.emplace_back(RotateHalfOp::name);
  names.emplace_back(RotatePairsOp::name);
  auto add = [&](std::string_view n) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.emplace_back(n);
  };
  for (int i = 0; i < 1024; ++i) {
    std::string_view n = name_of(static_cast<UnaryOp>(i));
    if (n == "?") break;
    add(n);
  }
  for (int i = 0; i < 1024; ++i) {
    std::string_view n = name_of(static_cast<BinaryOp>(i));
    if (n == "?") break;
    add(n);
  }
  for (int i = 0; i < 1024; ++i) {
    std::string_view n = name_of(static_cast<ReduceOp>(i));
    if (n == "?") break;
    add(n);
  }
  return names;
}

class Parser {
 public:
  Graph run(const std::string& text) {
    if (text.size() > kMaxInput)
      throw Error(SourceLoc{1, 1}, fmt::format("input is {} bytes; the limit is 16 MiB", text.size()));
    size_t pos = 0;
    int line = 0;
    while (pos <= text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      ++line;
      std::string_view s(text.data() + pos, nl - pos);
      if (s.size() > kMaxLine)
        throw Error(SourceLoc{line, static_cast<int>(kMaxLine) + 1},
                    fmt::format("line is {} bytes long; the limit is 64 KiB", s.size()));
      toks_ = lex_line(s, line);
      at_ = 0;
      if (toks_[0].kind != TK::End) statement();
      if (nl == text.size()) break;
      pos = nl + 1;
    }
    return std::move(g_);
  }

 private:
  const Tok& peek(size_t ahead = 0) const { return toks_[std::min(at_ + ahead, toks_.size() - 1)]; }
  const Tok& next() {
    const Tok& t = peek();
    if (at_ < toks_.size() - 1) ++at_;
    return t;
  }
  bool is_punct(const Tok& t, char c) const { return t.kind == TK::Punct && t.text[0] == c; }
  const Tok& expect_punct(char c, std::string_view what) {
    if (!is_punct(peek(), c))
      throw Error(peek().loc, fmt::format("expected '{}' {}, found {}", c, what, describe(peek())));
    return next();
  }
  const Tok& expect_ident(std::string_view what) {
    if (peek().kind != TK::Ident)
      throw Error(peek().loc, fmt::format("expected {}, found {}", what, describe(peek())));
    return next();
  }
  void expect_end() {
    if (peek().kind != TK::End)
      throw Error(peek().loc, fmt::format("unexpected {} after the statement", describe(peek())));
  }

  DType dtype_of(const Tok& t) {
    if (t.kind == TK::Ident)
      if (auto d = dtype_from_name(t.text)) return *d;
    throw Error(t.loc, fmt::format("bad dtype {} (expected bf16, f16 or f32)", describe(t)));
  }

  void check_new_name(const Tok& name) {
    auto it = names_.find(name.text);
    if (it != names_.end()) {
      const Node& n = g_.node(it->second);
      throw Error(name.loc, n.loc.known() ? fmt::format("redefinition of `{}` (first defined at line {})",
                                                        name.text, n.loc.line)
                                          : fmt::format("redefinition of `{}`", clip(name.text)));
    }
  }

  // Registers the names of nodes built by the statement just finished.
  void commit_nodes() {
    for (size_t i = registered_; i < g_.nodes().size(); ++i) names_[g_.nodes()[i].name] = static_cast<int>(i);
    registered_ = g_.nodes().size();
    if (registered_ > kMaxNodes)
      throw Error(toks_[0].loc, fmt::format("the graph has more than {} nodes", kMaxNodes));
  }

  void statement() {
    const Tok& first = peek();
    if (first.kind != TK::Ident)
      throw Error(first.loc, fmt::format("expected a statement (input, output or NAME = ...), found {}",
                                         describe(first)));
    if (first.text == "input" && !is_punct(peek(1), '=')) return input_stmt();
    if (first.text == "output" && !is_punct(peek(1), '=')) return output_stmt();
    const Tok name = next();
    expect_punct('=', fmt::format("after `{}` (statements are `NAME = OP(...)`)", clip(name.text)));
    check_new_name(name);
    const Tok rhs_start = peek();
    Expr e = parse_expr(0);
    expect_end();
    if (e.kind == Expr::Name)
      throw Error(rhs_start.loc, fmt::format("`{} = {}` only aliases `{}`; a statement must apply an op",
                                             clip(name.text), clip(e.tok.text), clip(e.tok.text)));
    Value v = eval(e);
    g_.set_location(name.loc);
    g_.rename(v, name.text);
    commit_nodes();
  }

  void input_stmt() {
    next();  // `input`
    const Tok name = expect_ident("an input name after `input`");
    check_new_name(name);
    expect_punct(':', fmt::format("after input name `{}`", clip(name.text)));
    const DType dt = dtype_of(next());
    expect_punct('[', "to open the shape (use [] for a scalar)");
    Shape shape;
    if (!is_punct(peek(), ']')) {
      for (;;) {
        const Tok& d = next();
        if (d.kind == TK::Ident) {
          shape.push_back(Dim::of(d.text));
        } else if (d.kind == TK::Number) {
          int64_t v = 0;
          auto [p, ec] = std::from_chars(d.text.data(), d.text.data() + d.text.size(), v);
          if (ec == std::errc::result_out_of_range)
            throw Error(d.loc, fmt::format("bad dim `{}`: out of range", clip(d.text)));
          if (ec != std::errc() || p != d.text.data() + d.text.size())
            throw Error(d.loc, fmt::format("bad dim `{}`: expected a positive integer or a name", clip(d.text)));
          if (v <= 0) throw Error(d.loc, fmt::format("bad dim `{}`: dimensions must be positive", clip(d.text)));
          shape.push_back(Dim::of(v));
        } else {
          throw Error(d.loc, fmt::format("bad dim: expected a name or a positive integer, found {}", describe(d)));
        }
        if (shape.size() > 3)
          throw Error(d.loc, fmt::format("input `{}`: rank {} is not supported (at most 3: [B, rows, cols], a leading "
                                         "batch dim)", clip(name.text), shape.size()));
        if (is_punct(peek(), ']')) break;
        expect_punct(',', "or ']' in the shape");
      }
    }
    next();  // ']'
    expect_end();
    g_.set_location(name.loc);
    g_.input(name.text, dt, std::move(shape));
    commit_nodes();
  }

  void output_stmt() {
    next();  // `output`
    const Tok name = expect_ident("a value name after `output`");
    DType dt = DType::F32;
    if (is_punct(peek(), ':')) {
      next();
      dt = dtype_of(next());
    }
    Tok alias = name;
    if (peek().kind == TK::Ident && peek().text == "as") {
      next();
      alias = expect_ident("an output name after `as`");
    }
    expect_end();
    auto it = names_.find(name.text);
    if (it == names_.end()) throw Error(name.loc, fmt::format("undefined name `{}`", clip(name.text)));
    g_.set_location(alias.loc);
    g_.output(Value{&g_, it->second}, alias.text, dt);
  }

  Expr parse_expr(int depth) {
    if (depth >= kMaxDepth)
      throw Error(peek().loc, fmt::format("expression nested more than {} calls deep", kMaxDepth));
    Expr e;
    const Tok& t = next();
    e.tok = t;
    if (t.kind == TK::Number) { e.kind = Expr::Num; return e; }
    if (t.kind != TK::Ident)
      throw Error(t.loc, fmt::format("expected an operand (a name, a number or OP(...)), found {}", describe(t)));
    if (!is_punct(peek(), '(')) { e.kind = Expr::Name; return e; }
    e.kind = Expr::Call;
    const Tok open = next();
    if (is_punct(peek(), ')')) { next(); return e; }
    for (;;) {
      if (peek().kind == TK::End)
        throw Error(peek().loc, fmt::format("missing ')' to close `{}(` opened at column {}", clip(t.text), open.loc.column));
      if (peek().kind == TK::Ident && is_punct(peek(1), '=')) {
        Tok key = next();
        next();  // '='
        const Tok& val = next();
        if (val.kind != TK::Number && val.kind != TK::Ident)
          throw Error(val.loc, fmt::format("expected a value for `{}=`, found {}", clip(key.text), describe(val)));
        for (auto& [k, v] : e.kws)
          if (k.text == key.text) throw Error(key.loc, fmt::format("keyword `{}` given twice", clip(key.text)));
        e.kws.emplace_back(std::move(key), val);
      } else {
        e.args.push_back(parse_expr(depth + 1));
      }
      if (is_punct(peek(), ')')) { next(); return e; }
      if (peek().kind == TK::End)
        throw Error(peek().loc, fmt::format("missing ')' to close `{}(` opened at column {}", clip(t.text), open.loc.column));
      expect_punct(',', fmt::format("or ')' in the arguments of `{}`", clip(t.text)));
    }
  }

  // ---- evaluation ----

  Value lookup(const Tok& t) {
    auto it = names_.find(t.text);
    if (it != names_.end()) return Value{&g_, it->second};
    if (t.text == "nan") throw Error(t.loc, "NaN literal is not allowed");
    if (t.text == "inf") throw Error(t.loc, "undefined name `inf` (write an infinity as const(inf))");
    throw Error(t.loc, fmt::format("undefined name `{}`", clip(t.text)));
  }

  Value operand(const Expr& e) {
    if (e.kind == Expr::Num) {
      if (std::isnan(e.tok.num)) throw Error(e.tok.loc, "NaN literal is not allowed");
      if (g_.nodes().size() > kMaxNodes)
        throw Error(e.tok.loc, fmt::format("the graph has more than {} nodes", kMaxNodes));
      g_.set_location(e.tok.loc);
      return g_.constant(e.tok.num);
    }
    if (e.kind == Expr::Name) return lookup(e.tok);
    return eval(e);
  }

  // A gamma/beta slot of a composite: `none` leaves it out.
  Value optional_operand(const Expr* e) {
    if (!e || (e->kind == Expr::Name && e->tok.text == "none" && !names_.count("none"))) return Value{&g_, -1};
    return operand(*e);
  }

  void arity(const Expr& e, size_t lo, size_t hi, std::string_view takes) {
    if (e.args.size() < lo || e.args.size() > hi)
      throw Error(e.tok.loc, fmt::format("wrong arity: `{}` takes {}, got {}", clip(e.tok.text), takes, e.args.size()));
  }

  void allow_kws(const Expr& e, std::initializer_list<std::string_view> ok) {
    for (const auto& [k, v] : e.kws)
      if (std::find(ok.begin(), ok.end(), k.text) == ok.end())
        throw Error(k.loc, ok.size() ? fmt::format("`{}` has no keyword `{}` (it takes {}=)", clip(e.tok.text), clip(k.text), *ok.begin())
                                     : fmt::format("`{}` takes no keyword arguments (got `{}=`)", clip(e.tok.text), clip(k.text)));
  }

  const Tok* kw(const Expr& e, std::string_view key) {
    for (const auto& [k, v] : e.kws)
      if (k.text == key) return &v;
    return nullptr;
  }

  double number_kw(const Expr& e, std::string_view key, double dflt) {
    const Tok* v = kw(e, key);
    if (!v) return dflt;
    if (v->kind != TK::Number || !std::isfinite(v->num))
      throw Error(v->loc, fmt::format("`{}=` needs a finite number, found {}", key, describe(*v)));
    return v->num;
  }

  // `segment=` (Node::segment): a whole positive column count, 0 (the default) for the whole row.
  int64_t segment_kw(const Expr& e) {
    const Tok* v = kw(e, "segment");
    if (!v) return 0;
    if (v->kind != TK::Number || v->num != std::floor(v->num) || v->num < 1 || v->num > 1e9)
      throw Error(v->loc, fmt::format("`segment=` needs a positive whole column count, found {}", describe(*v)));
    return static_cast<int64_t>(v->num);
  }

  Value eval(const Expr& e) {
    if (e.kind != Expr::Call) return operand(e);
    const std::string& op = e.tok.text;
    const SourceLoc at = e.tok.loc;
    auto arg = [&](size_t i) { return operand(e.args[i]); };
    auto build = [&](auto&& f) {
      if (g_.nodes().size() > kMaxNodes)
        throw Error(at, fmt::format("the graph has more than {} nodes", kMaxNodes));
      g_.set_location(at);
      return f();
    };

    if (op == "matmul") {
      arity(e, 2, 2, "2 operands (A, B)");
      allow_kws(e, {"layout"});
      BLayout layout = BLayout::NK;
      if (const Tok* v = kw(e, "layout")) {
        if (v->text == "kn") layout = BLayout::KN;
        else if (v->text != "nk") throw Error(v->loc, fmt::format("bad layout {} (expected nk or kn)", describe(*v)));
      }
      Value a = arg(0), b = arg(1);
      return build([&] { return g_.matmul(a, b, layout); });
    }
    if (op == "cast") {
      arity(e, 2, 2, "2 arguments (value, dtype)");
      allow_kws(e, {});
      const Expr& d = e.args[1];
      if (d.kind == Expr::Call) throw Error(d.tok.loc, fmt::format("bad dtype `{}(...)`", clip(d.tok.text)));
      const DType to = dtype_of(d.tok);
      Value x = arg(0);
      return build([&] { return g_.cast(x, to); });
    }
    if (op == "transpose") {
      arity(e, 1, 1, "1 operand");
      allow_kws(e, {});
      Value x = arg(0);
      return build([&] { return g_.transpose(x); });
    }
    if (op == "const") {
      arity(e, 1, 1, "1 number");
      allow_kws(e, {});
      const Expr& a = e.args[0];
      double v;
      if (a.kind == Expr::Num) v = a.tok.num;
      else if (a.kind == Expr::Name && a.tok.text == "inf") v = INFINITY;
      else if (a.kind == Expr::Name && a.tok.text == "nan") throw Error(a.tok.loc, "NaN literal is not allowed");
      else throw Error(a.tok.loc, "const() takes a number");
      if (std::isnan(v)) throw Error(a.tok.loc, "NaN literal is not allowed");
      return build([&] { return g_.constant(v); });
    }
    if (op == "layer_norm") {
      arity(e, 1, 3, "1 to 3 operands (x, gamma, beta)");
      allow_kws(e, {"eps", "segment"});
      const double eps = number_kw(e, "eps", 1e-5);
      const int64_t segment = segment_kw(e);
      Value x = arg(0);
      Value gamma = optional_operand(e.args.size() > 1 ? &e.args[1] : nullptr);
      Value beta = optional_operand(e.args.size() > 2 ? &e.args[2] : nullptr);
      return build([&] { return g_.layer_norm(x, gamma, beta, eps, segment); });
    }
    if (op == "rms_norm") {
      arity(e, 1, 2, "1 or 2 operands (x, gamma)");
      allow_kws(e, {"eps", "segment"});
      const double eps = number_kw(e, "eps", 1e-6);
      const int64_t segment = segment_kw(e);
      Value x = arg(0);
      Value gamma = optional_operand(e.args.size() > 1 ? &e.args[1] : nullptr);
      return build([&] { return g_.rms_norm(x, gamma, eps, segment); });
    }
    if (op == "l2_normalize") {
      arity(e, 1, 1, "1 operand");
      allow_kws(e, {"eps", "segment"});
      const double eps = number_kw(e, "eps", 1e-12);
      const int64_t segment = segment_kw(e);
      Value x = arg(0);
      return build([&] { return g_.l2_normalize(x, eps, segment); });
    }
    if (op == CausalMaskOp::name) {
      arity(e, 1, 1, "1 operand (a matmul's [M, N] output, e.g. the attention scores)");
      allow_kws(e, {});
      Value x = arg(0);
      return build([&] { return g_.causal_mask(x); });
    }
    if (op == RotateHalfOp::name || op == RotatePairsOp::name) {
      arity(e, 1, 1, "1 operand");
      allow_kws(e, {"segment"});
      const int64_t segment = segment_kw(e);
      if (!segment) throw Error(e.tok.loc, fmt::format("{} needs `segment=`: the columns of each run it rotates (a head)", op));
      Value x = arg(0);
      return build([&] { return op == RotateHalfOp::name ? g_.rotate_half(x, segment) : g_.rotate_pairs(x, segment); });
    }
    if (op == "rope") {
      arity(e, 3, 3, "3 operands (x, cos, sin)");
      allow_kws(e, {"segment", "interleaved"});
      const int64_t segment = segment_kw(e);
      if (!segment) throw Error(e.tok.loc, "rope needs `segment=`: the columns of each head it rotates");
      const double inter = number_kw(e, "interleaved", 0);
      if (inter != 0 && inter != 1) throw Error(e.tok.loc, "rope: `interleaved=` is 0 (rotate_half) or 1 (rotate_pairs)");
      Value x = arg(0), c = arg(1), sn = arg(2);
      return build([&] { return g_.rope(x, c, sn, segment, inter == 1); });
    }
    if (op == "softmax" || op == "log_softmax") {
      arity(e, 1, 1, "1 operand");
      allow_kws(e, {"segment"});
      const int64_t segment = segment_kw(e);
      Value x = arg(0);
      return build([&] { return op == "softmax" ? g_.softmax(x, segment) : g_.log_softmax(x, segment); });
    }

    const auto u = unary_op_from_name(op);
    const auto b = binary_op_from_name(op);
    const auto r = reduce_op_from_name(op);
    if (!u && !b && !r) unknown_op(e.tok);
    const size_t n = e.args.size();
    if (n == 1 && (u || r)) {
      if (u) {
        allow_kws(e, {});
        Value x = arg(0);
        return build([&] { return g_.unary(*u, x); });
      }
      allow_kws(e, {"dim", "segment"});
      const int64_t segment = segment_kw(e);
      int dim = -1;
      if (const Tok* v = kw(e, "dim")) {
        if (v->kind != TK::Number || v->num != std::floor(v->num) || std::fabs(v->num) > 1e6)
          throw Error(v->loc, fmt::format("bad dim {}: expected 0, 1 or -1", describe(*v)));
        dim = static_cast<int>(v->num);
      }
      Value x = arg(0);
      return build([&] { return g_.reduce(*r, x, dim, segment); });
    }
    if (n == 2 && b) {
      allow_kws(e, {"segment"});
      const int64_t segment = segment_kw(e);
      Value x = arg(0), y = arg(1);
      return build([&] { return g_.binary(*b, x, y, segment); });
    }
    std::string takes = (u || r) && b ? (u ? "1 operand (unary) or 2 (binary)" : "1 operand (reduction) or 2 (binary)")
                        : b       ? "2 operands"
                                  : "1 operand";
    throw Error(at, fmt::format("wrong arity: `{}` takes {}, got {}", clip(op), takes, n));
  }

  [[noreturn]] void unknown_op(const Tok& t) {
    std::string best;
    size_t best_d = SIZE_MAX;
    for (const std::string& n : known_op_names()) {
      size_t d = edit_distance(t.text.substr(0, 64), n);
      if (d < best_d) best_d = d, best = n;
    }
    if (best_d <= std::max<size_t>(2, best.size() / 3))
      throw Error(t.loc, fmt::format("unknown op `{}`; did you mean `{}`?", clip(t.text), best));
    throw Error(t.loc, fmt::format("unknown op `{}` (ops are listed in include/comfuse/ops.def)", clip(t.text)));
  }

  Graph g_;
  std::unordered_map<std::string, int> names_;
  size_t registered_ = 0;
  std::vector<Tok> toks_;
  size_t at_ = 0;
};

bool printable_ident(const std::string& s) {
  if (s.empty() || !ident_start(s[0])) return false;
  return std::all_of(s.begin(), s.end(), ident_char);
}

const std::string& checked(const std::string& s, std::string_view what) {
  if (!printable_ident(s))
    throw Error(fmt::format("print_graph: {} `{}` is not an identifier the text format can spell", what, s));
  return s;
}

}  // namespace

Graph parse_graph(const std::string& text) { return Parser().run(text); }

namespace {

std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

Graph parse_graph_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer. Only regular files are read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open graph file '{}': {}", printable(path), std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(fmt::format("cannot read graph file '{}': {}", printable(path), std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("graph file '{}' is {}; a graph file must be a regular file", printable(path),
                            file_kind(st.st_mode)));
  if (static_cast<uint64_t>(st.st_size) > kMaxInput)
    throw Error(fmt::format("graph file '{}' is {} bytes; the limit is 16 MiB", printable(path), st.st_size));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) throw Error(fmt::format("cannot read graph file '{}': {}", printable(path), std::strerror(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxInput)  // it grew while being read
      throw Error(fmt::format("graph file '{}' is more than 16 MiB", printable(path)));
  }
  try {
    return parse_graph(text);
  } catch (const Error& e) {
    // Keep the location, put the file name in the message.
    std::string msg = e.what();
    if (e.loc().known()) {
      const std::string prefix = fmt::format("line {}, column {}: ", e.loc().line, e.loc().column);
      if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
      throw Error(e.loc(), fmt::format("{}: {}", path, msg));
    }
    throw Error(fmt::format("{}: {}", path, msg));
  }
}

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > max_bytes) out += fmt::format("...({} bytes)", s.size());
  return out;
}

std::string excerpt(std::string_view line, int column, size_t width) {
  // A window of `width` bytes around the column, then escaped: the caret moves with both.
  const size_t col = column > 0 ? static_cast<size_t>(column - 1) : 0;
  const size_t begin = col > width / 2 ? std::min(col - width / 2, line.size() > width ? line.size() - width : 0) : 0;
  const std::string_view window = line.substr(std::min(begin, line.size()), width);
  std::string text = begin > 0 ? "..." : "";
  const size_t caret_base = text.size() + printable(window.substr(0, std::min(col - begin, window.size()))).size();
  text += printable(window);
  if (begin + window.size() < line.size()) text += "...";
  return fmt::format("  {}\n  {}^", text, std::string(caret_base, ' '));
}

std::string print_graph(const Graph& g) {
  // One statement per node, in id order, constants included: parsing the text back
  // creates exactly one node per statement, so ids and names come back unchanged.
  std::string out = "# comfuse graph\n";
  auto name = [&](int id) -> const std::string& { return checked(g.node(id).name, "node name"); };
  for (const Node& n : g.nodes()) {
    switch (n.kind) {
      case OpKind::Input: {
        std::string dims;
        for (const Dim& d : n.shape) {
          if (!dims.empty()) dims += ", ";
          dims += d.sym.empty() ? std::to_string(d.size) : checked(d.sym, "dimension");
        }
        out += fmt::format("input {}: {}[{}]\n", name(n.id), name_of(n.dtype), dims);
        break;
      }
      case OpKind::Constant:
        if (std::isnan(n.value))
          throw Error(fmt::format("print_graph: constant `{}` is NaN, which the text format cannot express", n.name));
        out += fmt::format("{} = const({})\n", name(n.id), n.value);
        break;
      default: {
        std::vector<std::string> args;
        for (int in : n.inputs) args.push_back(name(in));
        out += fmt::format("{} = {}\n", name(n.id), call_text(g, n, args));
        break;
      }
    }
  }
  for (const GraphOutput& o : g.outputs()) {
    const std::string& node = name(o.node);
    if (o.name == node)
      out += fmt::format("output {}: {}\n", node, name_of(o.dtype));
    else
      out += fmt::format("output {}: {} as {}\n", node, name_of(o.dtype), checked(o.name, "output name"));
  }
  return out;
}

}  // namespace comfuse
