// Fusion Spec text form. Printing is deterministic (the text feeds a cache key) and
// exact: parse_spec(print(s)) == s, doubles in shortest round-trip form. Layout:
//
//   fusion NAME (b_layout=nk, m=M, n=N, k=K) {      (batched: ..., k=K, batch=B)
//     args {
//       a0: operand_a x bf16[M, K] node=0
//       a3: output y bf16[M, N] tile node=9
//     }
//     stage {
//       n0: tile = acc origin="%matmul2"
//       (a gated GEMM's second accumulator, A x the operand_gate arg: `tile = acc a2`)
//       n1: row = bcast.row a2
//       n2: tile = add n0, n1
//       n3: col = reduce.mean n2 -> post 0
//       terminal n3
//       post 0: stage {
//         n0: col = stat
//         n1: tile = bypass from n2
//         n2: tile = sub n1, n0
//         n3: tile = store n2 -> a3
//         terminal n3
//       }
//     }
//   }
//
// The grammar is token based (newlines are whitespace, `#` comments). Names that are
// not identifiers are written as "quoted strings". Malformed specs print too: an index
// that is negative is written as a plain integer, so verify() tests can round-trip them.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <ostream>
#include <string_view>

#include "comfuse/spec.h"

namespace comfuse {
namespace {

constexpr size_t kMaxInput = 16u << 20;
constexpr int kMaxDepth = 64;  // nested post stages

bool ident_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '%'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool ident_char(char c) { return ident_start(c) || is_digit(c) || c == '.'; }
int hex(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string word(const std::string& s) {
  if (!s.empty() && ident_start(s[0]) && std::all_of(s.begin(), s.end(), ident_char)) return s;
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (u < 0x20 || u >= 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out + "\"";
}

std::string dim_text(const Dim& d) {
  if (!d.sym.empty()) return word(d.sym);
  return d.size == -1 ? "?" : std::to_string(d.size);
}

std::string ref(char prefix, int i) { return i >= 0 ? fmt::format("{}{}", prefix, i) : std::to_string(i); }

std::string_view bcast_name(BroadcastKind k) {
  return k == BroadcastKind::Row ? "row" : k == BroadcastKind::Col ? "col" : k == BroadcastKind::Tile ? "tile" : "scalar";
}

void print_stage(std::string& out, const Spec& sp, int indent) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (size_t i = 0; i < sp.nodes.size(); ++i) {
    const SpecNode& n = sp.nodes[i];
    std::string body;
    switch (n.category) {
      case NodeCategory::AccEntry: body = n.arg != -1 ? "acc " + ref('a', n.arg) : "acc"; break;
      case NodeCategory::Broadcast:
        body = fmt::format("bcast.{} {}", bcast_name(n.broadcast), n.arg >= 0 ? ref('a', n.arg) : fmt::format("{}", n.literal));
        break;
      case NodeCategory::Compute:
        body = n.compute == ComputeKind::Unary        ? std::string(name_of(n.unary))
               : n.compute == ComputeKind::Binary     ? std::string(name_of(n.binary))
               : n.compute == ComputeKind::CausalMask ? std::string(CausalMaskOp::name)
               : n.compute == ComputeKind::RotateHalf ? std::string(RotateHalfOp::name)
               : n.compute == ComputeKind::RotatePairs ? std::string(RotatePairsOp::name)
                                                      : fmt::format("cast.{}", name_of(n.cast_to));
        break;
      case NodeCategory::Reduction: body = fmt::format("reduce.{}", name_of(n.reduce)); break;
      case NodeCategory::Placeholder: body = n.placeholder == PlaceholderKind::Stat ? "stat" : "bypass"; break;
      case NodeCategory::Store: body = "store"; break;
    }
    for (size_t k = 0; k < n.operands.size(); ++k)
      body += (k == 0 && n.category != NodeCategory::Broadcast ? " " : ", ") + ref('n', n.operands[k]);
    if (n.category == NodeCategory::Reduction && n.post != -1) body += fmt::format(" -> post {}", n.post);
    if (n.category == NodeCategory::Store && n.arg != -1) body += " -> " + ref('a', n.arg);
    if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass && n.source != -1)
      body += " from " + ref('n', n.source);
    if (!n.origin.empty()) body += " origin=" + word(n.origin);
    out += fmt::format("{}n{}: {} = {}\n", pad, i, name_of(n.value_class), body);
  }
  out += fmt::format("{}terminal {}\n", pad, sp.terminal == -1 ? std::string("none") : ref('n', sp.terminal));
  for (size_t c = 0; c < sp.children.size(); ++c) {
    out += fmt::format("{}post {}: stage {{\n", pad, c);
    print_stage(out, sp.children[c], indent + 2);
    out += pad + "}\n";
  }
}

// ---- parsing ----

enum class TK { Ident, Number, String, Punct, Arrow, End };

struct Tok {
  TK kind = TK::End;
  std::string text;  // identifier / number spelling / decoded string / punctuation
  SourceLoc loc;
};

class SpecParser {
 public:
  explicit SpecParser(const std::string& text) : s_(text) {}

  FusionSpec run() {
    if (s_.size() > kMaxInput)
      throw Error(SourceLoc{1, 1}, fmt::format("input is {} bytes; the limit is 16 MiB", s_.size()));
    advance();
    FusionSpec fs;
    keyword("fusion");
    fs.name = name("a fusion name");
    punct('(');
    bool first = true;
    while (!is_punct(')')) {
      if (!first) punct(',');
      first = false;
      const Tok key = ident("a header key (b_layout, m, n, k, batch, segment)");
      punct('=');
      if (key.text == "b_layout") {
        const Tok v = ident("nk or kn");
        if (v.text != "nk" && v.text != "kn") throw Error(v.loc, fmt::format("bad b_layout `{}` (expected nk or kn)", v.text));
        fs.b_layout = v.text == "kn" ? BLayout::KN : BLayout::NK;
      } else if (key.text == "m") fs.m = dim();
      else if (key.text == "n") fs.n = dim();
      else if (key.text == "k") fs.k = dim();
      else if (key.text == "batch") fs.batch = dim();
      else if (key.text == "segment") {
        const Dim d = dim();
        if (!d.sym.empty() || d.size < 1) throw Error(key.loc, "segment: a positive column count");
        fs.segment = d.size;
      } else throw Error(key.loc, fmt::format("unknown header key `{}` (expected b_layout, m, n, k, batch or segment)", key.text));
    }
    punct(')');
    punct('{');
    keyword("args");
    punct('{');
    while (!is_punct('}')) fs.args.push_back(arg(fs.args.size()));
    punct('}');
    keyword("stage");
    fs.root = stage(0);
    punct('}');
    if (tok_.kind != TK::End) fail(fmt::format("unexpected {} after the spec", describe(tok_)));
    return fs;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw Error(tok_.loc, msg); }

  static std::string describe(const Tok& t) {
    switch (t.kind) {
      case TK::End: return "end of input";
      case TK::String: return "a string";
      case TK::Arrow: return "'->'";
      case TK::Punct: return fmt::format("'{}'", t.text);
      default: return fmt::format("`{}`", t.text);
    }
  }

  // Lexer: fills tok_ with the next token.
  void advance() {
    for (;;) {
      if (i_ >= s_.size()) { tok_ = Tok{TK::End, "", here()}; return; }
      const char c = s_[i_];
      if (c == '\n') { ++line_; ++i_; line_start_ = i_; continue; }
      if (c == ' ' || c == '\t' || c == '\r') { ++i_; continue; }
      if (c == '#') { while (i_ < s_.size() && s_[i_] != '\n') ++i_; continue; }
      break;
    }
    tok_ = Tok{TK::Punct, "", here()};
    const char c = s_[i_];
    const char d = i_ + 1 < s_.size() ? s_[i_ + 1] : '\0';
    if (c == '-' && d == '>') { tok_.kind = TK::Arrow; tok_.text = "->"; i_ += 2; return; }
    if (ident_start(c)) {
      size_t j = i_;
      while (j < s_.size() && ident_char(s_[j])) ++j;
      tok_.kind = TK::Ident;
      tok_.text = s_.substr(i_, j - i_);
      i_ = j;
      return;
    }
    if (is_digit(c) || (c == '.' && is_digit(d)) ||
        ((c == '-' || c == '+') && (is_digit(d) || d == '.' || d == 'i' || d == 'n'))) {
      size_t j = i_ + 1;
      while (j < s_.size() && (ident_char(s_[j]) ||
                               ((s_[j] == '-' || s_[j] == '+') && (s_[j - 1] == 'e' || s_[j - 1] == 'E'))))
        ++j;
      tok_.kind = TK::Number;
      tok_.text = s_.substr(i_, j - i_);
      i_ = j;
      return;
    }
    if (c == '"') {
      tok_.kind = TK::String;
      ++i_;
      for (;;) {
        if (i_ >= s_.size() || s_[i_] == '\n') fail("unterminated string");
        const char e = s_[i_++];
        if (e == '"') return;
        if (e != '\\') { tok_.text += e; continue; }
        if (i_ >= s_.size()) fail("unterminated string");
        const char x = s_[i_++];
        if (x == '"' || x == '\\') tok_.text += x;
        else if (x == 'n') tok_.text += '\n';
        else if (x == 't') tok_.text += '\t';
        else if (x == 'x' && i_ + 2 <= s_.size() && hex(s_[i_]) >= 0 && hex(s_[i_ + 1]) >= 0) {
          tok_.text += static_cast<char>(hex(s_[i_]) * 16 + hex(s_[i_ + 1]));
          i_ += 2;
        } else {
          throw Error(SourceLoc{line_, static_cast<int>(i_ - line_start_)}, "bad escape in string");
        }
      }
    }
    if (std::string_view("{}()[],:=?").find(c) != std::string_view::npos) {
      tok_.text = std::string(1, c);
      ++i_;
      return;
    }
    auto u = static_cast<unsigned char>(c);
    fail(u >= 0x21 && u < 0x7f ? fmt::format("unexpected character '{}'", c)
                               : fmt::format("unexpected character (byte 0x{:02x})", u));
  }

  SourceLoc here() const { return SourceLoc{line_, static_cast<int>(i_ - line_start_) + 1}; }

  bool is_punct(char c) const { return tok_.kind == TK::Punct && tok_.text[0] == c; }
  bool is_ident(std::string_view w) const { return tok_.kind == TK::Ident && tok_.text == w; }
  Tok take() {
    Tok t = tok_;
    advance();
    return t;
  }
  void punct(char c) {
    if (!is_punct(c)) fail(fmt::format("expected '{}', found {}", c, describe(tok_)));
    advance();
  }
  void keyword(std::string_view w) {
    if (!is_ident(w)) fail(fmt::format("expected `{}`, found {}", w, describe(tok_)));
    advance();
  }
  Tok ident(std::string_view what) {
    if (tok_.kind != TK::Ident) fail(fmt::format("expected {}, found {}", what, describe(tok_)));
    return take();
  }
  std::string name(std::string_view what) {
    if (tok_.kind != TK::Ident && tok_.kind != TK::String) fail(fmt::format("expected {}, found {}", what, describe(tok_)));
    return take().text;
  }

  int64_t integer(const Tok& t, int64_t lo, int64_t hi, std::string_view what, size_t skip = 0) {
    int64_t v = 0;
    std::string_view sv(t.text);
    sv.remove_prefix(skip);
    auto [p, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), v);
    if (ec != std::errc() || p != sv.data() + sv.size() || sv.empty() || v < lo || v > hi)
      throw Error(t.loc, fmt::format("bad {} `{}`", what, t.text));
    return v;
  }

  double number(const Tok& t) {
    std::string_view sv(t.text);
    if (!sv.empty() && sv[0] == '+') sv.remove_prefix(1);
    double v = 0.0;
    auto [p, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), v);
    if (ec == std::errc::result_out_of_range) throw Error(t.loc, fmt::format("number `{}` is out of range", t.text));
    if (ec != std::errc() || p != sv.data() + sv.size()) throw Error(t.loc, fmt::format("malformed number `{}`", t.text));
    return v;
  }

  // `nI`/`aI`, or a plain (possibly negative) integer for malformed specs.
  int index_ref(char prefix, std::string_view what) {
    const Tok t = take();
    if (t.kind == TK::Ident && t.text.size() > 1 && t.text[0] == prefix)
      return static_cast<int>(integer(t, 0, INT32_MAX, what, 1));
    if (t.kind == TK::Number) return static_cast<int>(integer(t, INT32_MIN, INT32_MAX, what));
    throw Error(t.loc, fmt::format("expected {} ({}N), found {}", what, prefix, describe(t)));
  }
  bool at_node_ref() const {
    return (tok_.kind == TK::Ident && tok_.text.size() > 1 && tok_.text[0] == 'n' && is_digit(tok_.text[1])) ||
           tok_.kind == TK::Number;
  }

  Dim dim() {
    if (is_punct('?')) { advance(); return Dim{}; }
    if (tok_.kind == TK::Number) return Dim::of(integer(take(), INT64_MIN, INT64_MAX, "dimension"));
    return Dim::of(name("a dimension"));
  }

  ValueClass value_class(const Tok& t) {
    for (ValueClass c : {ValueClass::Tile, ValueClass::Col, ValueClass::Row, ValueClass::Scalar})
      if (t.kind == TK::Ident && t.text == name_of(c)) return c;
    throw Error(t.loc, fmt::format("bad value class {} (expected tile, col, row or scalar)", describe(t)));
  }

  RuntimeArg arg(size_t index) {
    const Tok label = take();
    if (label.kind != TK::Ident || label.text != fmt::format("a{}", index))
      throw Error(label.loc, fmt::format("expected arg label `a{}`, found {}", index, describe(label)));
    punct(':');
    RuntimeArg a;
    const Tok role = ident("an arg role");
    bool found = false;
    for (ArgRole r : {ArgRole::OperandA, ArgRole::OperandB, ArgRole::OperandGate, ArgRole::Scalar, ArgRole::RowVector,
                      ArgRole::ColVector, ArgRole::TileInput, ArgRole::Output})
      if (role.text == name_of(r)) a.role = r, found = true;
    if (!found)
      throw Error(role.loc, fmt::format("bad arg role `{}` (expected operand_a, operand_b, operand_gate, scalar, "
                                        "row_vector, col_vector, tile_input or output)", role.text));
    a.name = name("an arg name");
    const Tok dt = ident("a dtype");
    auto d = dtype_from_name(dt.text);
    if (!d) throw Error(dt.loc, fmt::format("bad dtype `{}`", dt.text));
    a.dtype = *d;
    punct('[');
    while (!is_punct(']')) {
      if (!a.shape.empty()) punct(',');
      if (a.shape.size() >= 16) fail("too many dimensions");
      a.shape.push_back(dim());
    }
    advance();
    if (tok_.kind == TK::Ident && tok_.text != "node" && !(tok_.text.size() > 1 && tok_.text[0] == 'a' && is_digit(tok_.text[1])))
      a.value_class = value_class(take());
    if (is_ident("node")) {
      advance();
      punct('=');
      a.graph_node = static_cast<int>(integer(take(), INT32_MIN, INT32_MAX, "graph node"));
    }
    return a;
  }

  Spec stage(int depth) {
    if (depth >= kMaxDepth) fail(fmt::format("stages nested more than {} deep", kMaxDepth));
    Spec sp;
    punct('{');
    bool have_terminal = false;
    while (!is_punct('}')) {
      if (tok_.kind == TK::End) fail("missing '}' to close a stage");
      if (is_ident("terminal")) {
        if (have_terminal) fail("a second `terminal` in one stage");
        have_terminal = true;
        advance();
        if (is_ident("none")) { advance(); sp.terminal = -1; }
        else sp.terminal = index_ref('n', "a terminal node");
      } else if (is_ident("post")) {
        advance();
        const Tok idx = take();
        if (idx.kind != TK::Number || idx.text != std::to_string(sp.children.size()))
          throw Error(idx.loc, fmt::format("expected post stage number {}, found {}", sp.children.size(), describe(idx)));
        punct(':');
        keyword("stage");
        sp.children.push_back(stage(depth + 1));
      } else {
        sp.nodes.push_back(node(sp.nodes.size()));
      }
    }
    advance();
    return sp;
  }

  SpecNode node(size_t index) {
    const Tok label = take();
    if (label.kind != TK::Ident || label.text != fmt::format("n{}", index))
      throw Error(label.loc, fmt::format("expected node `n{}` (or terminal, post, '}}'), found {}", index, describe(label)));
    punct(':');
    SpecNode n;
    n.value_class = value_class(take());
    punct('=');
    const Tok op = ident("an op (acc, bcast.*, a compute op, causal_mask, cast.*, reduce.*, stat, bypass, store)");
    const std::string& w = op.text;
    auto suffix = [&](std::string_view pre) -> std::optional<std::string_view> {
      if (w.size() > pre.size() && w.compare(0, pre.size(), pre) == 0) return std::string_view(w).substr(pre.size());
      return std::nullopt;
    };
    if (w == "acc") {
      n.category = NodeCategory::AccEntry;
      if (tok_.kind == TK::Ident && tok_.text.size() > 1 && tok_.text[0] == 'a' && is_digit(tok_.text[1]))
        n.arg = index_ref('a', "an arg");  // the gated GEMM's second accumulator, A x Gate
    } else if (auto k = suffix("bcast.")) {
      n.category = NodeCategory::Broadcast;
      if (*k == "row") n.broadcast = BroadcastKind::Row;
      else if (*k == "col") n.broadcast = BroadcastKind::Col;
      else if (*k == "scalar") n.broadcast = BroadcastKind::Scalar;
      else if (*k == "tile") n.broadcast = BroadcastKind::Tile;
      else throw Error(op.loc, fmt::format("bad broadcast `{}` (expected bcast.row, bcast.col, bcast.scalar or bcast.tile)", w));
      if (tok_.kind == TK::Ident && tok_.text.size() > 1 && tok_.text[0] == 'a' && is_digit(tok_.text[1]))
        n.arg = index_ref('a', "an arg");
      else if (tok_.kind == TK::Number || is_ident("inf") || is_ident("nan")) {
        n.literal = tok_.kind == TK::Number ? number(tok_) : (tok_.text == "inf" ? INFINITY : NAN);
        advance();
      } else {
        fail(fmt::format("expected an arg (aN) or a number after `{}`, found {}", w, describe(tok_)));
      }
      // Operands of a broadcast (malformed, but printable) follow its source after ','.
      while (is_punct(',')) {
        advance();
        n.operands.push_back(index_ref('n', "an operand"));
      }
      return finish(n);
    } else if (auto k = suffix("cast.")) {
      n.category = NodeCategory::Compute;
      n.compute = ComputeKind::Cast;
      auto d = dtype_from_name(*k);
      if (!d) throw Error(op.loc, fmt::format("bad cast dtype `{}`", *k));
      n.cast_to = *d;
    } else if (auto k = suffix("reduce.")) {
      n.category = NodeCategory::Reduction;
      auto r = reduce_op_from_name(*k);
      if (!r) throw Error(op.loc, fmt::format("unknown reduction `{}`", *k));
      n.reduce = *r;
    } else if (w == "stat" || w == "bypass") {
      n.category = NodeCategory::Placeholder;
      n.placeholder = w == "stat" ? PlaceholderKind::Stat : PlaceholderKind::Bypass;
    } else if (w == "store") {
      n.category = NodeCategory::Store;
    } else if (w == CausalMaskOp::name) {
      n.category = NodeCategory::Compute;
      n.compute = ComputeKind::CausalMask;
    } else if (w == RotateHalfOp::name) {
      n.category = NodeCategory::Compute;
      n.compute = ComputeKind::RotateHalf;
    } else if (w == RotatePairsOp::name) {
      n.category = NodeCategory::Compute;
      n.compute = ComputeKind::RotatePairs;
    } else if (auto u = unary_op_from_name(w)) {
      n.category = NodeCategory::Compute;
      n.compute = ComputeKind::Unary;
      n.unary = *u;
    } else if (auto b = binary_op_from_name(w)) {
      n.category = NodeCategory::Compute;
      n.compute = ComputeKind::Binary;
      n.binary = *b;
    } else {
      throw Error(op.loc, fmt::format("unknown spec op `{}`", w));
    }
    // A node label `nK:` starts the next statement; anything else that looks like a
    // node reference is an operand.
    if (at_node_ref() && !(tok_.kind == TK::Ident && peek_is_colon())) {
      n.operands.push_back(index_ref('n', "an operand"));
      while (is_punct(',')) {
        advance();
        n.operands.push_back(index_ref('n', "an operand"));
      }
    }
    return finish(n);
  }

  // The optional tail of a node: `-> post P` / `-> aN`, `from nS`, `origin=NAME`.
  SpecNode finish(SpecNode& n) {
    if (tok_.kind == TK::Arrow) {
      if (n.category != NodeCategory::Reduction && n.category != NodeCategory::Store)
        fail("'->' only follows a reduction (-> post P) or a store (-> aN)");
      advance();
      if (n.category == NodeCategory::Reduction) {
        keyword("post");
        n.post = static_cast<int>(integer(take(), INT32_MIN, INT32_MAX, "post index"));
      } else {
        n.arg = index_ref('a', "an output arg");
      }
    }
    if (is_ident("from")) {
      if (n.category != NodeCategory::Placeholder || n.placeholder != PlaceholderKind::Bypass)
        fail("`from` only follows a bypass placeholder");
      advance();
      n.source = index_ref('n', "a parent node");
    }
    if (is_ident("origin")) {
      advance();
      punct('=');
      n.origin = name("an origin name");
    }
    return n;
  }

  // Is the token after the current one a ':'? (Scans ahead without consuming.)
  bool peek_is_colon() const {
    size_t j = i_;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\r' || s_[j] == '\n')) ++j;
    return j < s_.size() && s_[j] == ':';
  }

  const std::string& s_;
  size_t i_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
  Tok tok_;
};

}  // namespace

std::string print(const FusionSpec& s) {
  // `batch` only where there is one: an unbatched spec prints (and keys the JIT cache) as before.
  std::string out = fmt::format("fusion {} (b_layout={}, m={}, n={}, k={}{}{}) {{\n  args {{\n", word(s.name),
                                s.b_layout == BLayout::KN ? "kn" : "nk", dim_text(s.m), dim_text(s.n), dim_text(s.k),
                                s.batched() ? ", batch=" + dim_text(s.batch) : std::string(),
                                s.segment ? fmt::format(", segment={}", s.segment) : std::string());
  for (size_t i = 0; i < s.args.size(); ++i) {
    const RuntimeArg& a = s.args[i];
    std::string dims;
    for (const Dim& d : a.shape) dims += (dims.empty() ? "" : ", ") + dim_text(d);
    out += fmt::format("    a{}: {} {} {}[{}]", i, name_of(a.role), word(a.name), name_of(a.dtype), dims);
    if (a.role == ArgRole::Output || a.value_class != ValueClass::Tile) out += fmt::format(" {}", name_of(a.value_class));
    if (a.graph_node != -1) out += fmt::format(" node={}", a.graph_node);
    out += "\n";
  }
  out += "  }\n  stage {\n";
  print_stage(out, s.root, 4);
  out += "  }\n}\n";
  return out;
}

std::ostream& operator<<(std::ostream& os, const FusionSpec& s) { return os << print(s); }

FusionSpec parse_spec(const std::string& text) { return SpecParser(text).run(); }

}  // namespace comfuse
