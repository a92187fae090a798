// Graph text format: every op, every composite, errors with line and column, exact
// print/parse round trips on examples/, and no crash on garbage.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <filesystem>
#include <random>
#include <string>

#include "comfuse/text.h"

namespace comfuse {
namespace {

std::string source_dir() {
  if (const char* env = std::getenv("COMFUSE_SOURCE_DIR")) return env;
  return COMFUSE_SOURCE_DIR;
}

std::vector<std::string> example_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/examples"))
    if (e.path().extension() == ".cf") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool same_double(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// Equivalent graphs: same nodes in the same order, same names, ops, shapes, outputs.
void expect_same_graph(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.nodes().size(), b.nodes().size());
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node &x = a.nodes()[i], &y = b.nodes()[i];
    SCOPED_TRACE("node " + x.name);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.inputs, y.inputs);
    if (x.kind == OpKind::Unary) {
      EXPECT_EQ(x.unary, y.unary);
    }
    if (x.kind == OpKind::Binary) {
      EXPECT_EQ(x.binary, y.binary);
    }
    if (x.kind == OpKind::Reduce) {
      EXPECT_EQ(x.reduce, y.reduce);
      EXPECT_EQ(x.reduce_dim, y.reduce_dim);
    }
    if (x.kind == OpKind::Constant) {
      EXPECT_TRUE(same_double(x.value, y.value)) << x.value << " vs " << y.value;
    }
    if (x.kind == OpKind::MatMul) {
      EXPECT_EQ(x.b_layout, y.b_layout);
    }
  }
  ASSERT_EQ(a.outputs().size(), b.outputs().size());
  for (size_t i = 0; i < a.outputs().size(); ++i) {
    EXPECT_EQ(a.outputs()[i].node, b.outputs()[i].node);
    EXPECT_EQ(a.outputs()[i].name, b.outputs()[i].name);
    EXPECT_EQ(a.outputs()[i].dtype, b.outputs()[i].dtype);
  }
}

void expect_round_trip(const Graph& g) {
  const std::string text = print_graph(g);
  Graph back;
  try {
    back = parse_graph(text);
  } catch (const Error& e) {
    FAIL() << e.what() << "\n" << text;
  }
  expect_same_graph(g, back);
  EXPECT_EQ(print_graph(back), text);
}

// Runs the parser and returns the error, failing the test when it succeeds.
Error parse_error(const std::string& text) {
  try {
    parse_graph(text);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "parsed without error:\n" << text;
  return Error("");
}

#define EXPECT_PARSE_ERROR(text, line_, col_, substr)                                  \
  do {                                                                                 \
    Error e_ = parse_error(text);                                                      \
    EXPECT_EQ(e_.loc().line, line_) << e_.what();                                      \
    EXPECT_EQ(e_.loc().column, col_) << e_.what();                                     \
    EXPECT_NE(std::string(e_.what()).find(substr), std::string::npos) << e_.what();    \
  } while (0)

const char* kHeader = "input x: f32[M, N]\ninput y: f32[M, N]\n";

TEST(Text, EveryUnaryOp) {
  int count = 0;
  for (int i = 0;; ++i) {
    const std::string_view name = name_of(static_cast<UnaryOp>(i));
    if (name == "?") break;
    Graph g = parse_graph(std::string(kHeader) + "z = " + std::string(name) + "(x)\noutput z\n");
    const Node& z = g.node(g.find("z"));
    EXPECT_EQ(z.kind, OpKind::Unary) << name;
    EXPECT_EQ(z.unary, static_cast<UnaryOp>(i));
    EXPECT_EQ(z.shape, (Shape{Dim::of("M"), Dim::of("N")}));
    expect_round_trip(g);
    ++count;
  }
  EXPECT_GE(count, 14);
}

TEST(Text, EveryBinaryOp) {
  for (int i = 0;; ++i) {
    const std::string_view name = name_of(static_cast<BinaryOp>(i));
    if (name == "?") break;
    const std::string rhs = name == "pow" ? "(x, 2)" : "(x, y)";
    Graph g = parse_graph(std::string(kHeader) + "z = " + std::string(name) + rhs + "\noutput z: bf16\n");
    const Node& z = g.node(g.find("z"));
    EXPECT_EQ(z.kind, OpKind::Binary) << name;
    EXPECT_EQ(z.binary, static_cast<BinaryOp>(i));
    EXPECT_EQ(g.outputs().at(0).dtype, DType::BF16);
    expect_round_trip(g);
  }
}

TEST(Text, Reductions) {
  for (const char* op : {"sum", "mean", "max", "min"}) {
    Graph g = parse_graph(std::string(kHeader) + "a = " + op + "(x)\nb = " + op + "(x, dim=0)\nc = " + op +
                          "(x, dim=-1)\noutput a\noutput b\noutput c\n");
    const Node &a = g.node(g.find("a")), &b = g.node(g.find("b")), &c = g.node(g.find("c"));
    EXPECT_EQ(a.kind, OpKind::Reduce) << op;
    EXPECT_EQ(a.reduce, *reduce_op_from_name(op));
    EXPECT_EQ(a.shape, (Shape{Dim::of("M"), Dim::of(1)}));
    EXPECT_EQ(b.shape, (Shape{Dim::of(1), Dim::of("N")}));
    EXPECT_EQ(b.reduce_dim, 0);
    EXPECT_EQ(c.reduce_dim, 1);
    expect_round_trip(g);
  }
  // max/min with two operands are binary.
  Graph g = parse_graph(std::string(kHeader) + "m = max(x, y)\n");
  EXPECT_EQ(g.node(g.find("m")).kind, OpKind::Binary);
}

TEST(Text, MatmulCastTransposeConst) {
  Graph g = parse_graph(
      "input a: bf16[M, K]\ninput b: bf16[N, K]\ninput c: f16[K, N]\ninput s: f32[]\ninput col: f32[M, 1]\n"
      "p = matmul(a, b)\nq = matmul(a, c, layout=kn)\nr = cast(p, bf16)\nt = transpose(q)\n"
      "k = const(2.5)\nn = const(-inf)\nu = mul(add(p, q), s)\nv = sub(u, col)\nw = div(v, 1e-3)\n"
      "output w: f16\noutput r: bf16 as r_out\n");
  EXPECT_EQ(g.node(g.find("p")).shape, (Shape{Dim::of("M"), Dim::of("N")}));
  EXPECT_EQ(g.node(g.find("q")).b_layout, BLayout::KN);
  EXPECT_EQ(g.node(g.find("q")).shape, (Shape{Dim::of("M"), Dim::of("N")}));
  EXPECT_EQ(g.node(g.find("r")).kind, OpKind::Cast);
  EXPECT_EQ(g.node(g.find("r")).dtype, DType::BF16);
  EXPECT_EQ(g.node(g.find("t")).shape, (Shape{Dim::of("N"), Dim::of("M")}));
  EXPECT_EQ(g.node(g.find("k")).value, 2.5);
  EXPECT_EQ(g.node(g.find("n")).value, -INFINITY);
  EXPECT_EQ(g.node(g.find("s")).shape, Shape{});
  EXPECT_EQ(g.node(g.find("w")).kind, OpKind::Binary);
  EXPECT_EQ(g.node(g.node(g.find("w")).inputs[1]).value, 1e-3);  // literal -> constant
  EXPECT_EQ(g.outputs()[1].name, "r_out");
  EXPECT_EQ(g.node(g.find("p")).loc.line, 6);
  expect_round_trip(g);
}

TEST(Text, ConcreteDimsAndComments) {
  Graph g = parse_graph("# header\n\n  input a: bfloat16[128, 64]   # trailing\r\ninput b: half[256, 64]\n"
                        "c = relu(matmul(a, b))  # nested\noutput c: fp32\n");
  EXPECT_EQ(g.node(g.find("a")).dtype, DType::BF16);
  EXPECT_EQ(g.node(g.find("c")).shape, (Shape{Dim::of(128), Dim::of(256)}));
  expect_round_trip(g);
}

// Composites expand exactly as the builder API expands them.
TEST(Text, Composites) {
  struct Case {
    const char* text;
    std::function<Value(Graph&, Value, Value, Value)> build;
  };
  const Case cases[] = {
      {"layer_norm(x, g, b, eps=1e-3)", [](Graph& G, Value x, Value g, Value b) { return G.layer_norm(x, g, b, 1e-3); }},
      {"layer_norm(x, none, none)", [](Graph& G, Value x, Value, Value) { return G.layer_norm(x, {&G, -1}, {&G, -1}); }},
      {"layer_norm(x)", [](Graph& G, Value x, Value, Value) { return G.layer_norm(x, {&G, -1}, {&G, -1}); }},
      {"layer_norm(x, g)", [](Graph& G, Value x, Value g, Value) { return G.layer_norm(x, g, {&G, -1}); }},
      {"layer_norm(x, none, b)", [](Graph& G, Value x, Value, Value b) { return G.layer_norm(x, {&G, -1}, b); }},
      {"rms_norm(x, g, eps=1e-6)", [](Graph& G, Value x, Value g, Value) { return G.rms_norm(x, g, 1e-6); }},
      {"rms_norm(x)", [](Graph& G, Value x, Value, Value) { return G.rms_norm(x, {&G, -1}); }},
      {"softmax(x)", [](Graph& G, Value x, Value, Value) { return G.softmax(x); }},
      {"log_softmax(x)", [](Graph& G, Value x, Value, Value) { return G.log_softmax(x); }},
      {"l2_normalize(x, eps=1e-8)", [](Graph& G, Value x, Value, Value) { return G.l2_normalize(x, 1e-8); }},
      {"l2_normalize(x)", [](Graph& G, Value x, Value, Value) { return G.l2_normalize(x); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    Graph parsed = parse_graph(std::string("input x: f32[M, N]\ninput g: bf16[N]\ninput b: bf16[N]\ny = ") + c.text +
                               "\noutput y: bf16\n");
    Graph built;
    Value x = built.input("x", DType::F32, {Dim::of("M"), Dim::of("N")});
    Value g = built.input("g", DType::BF16, {Dim::of("N")});
    Value b = built.input("b", DType::BF16, {Dim::of("N")});
    Value y = c.build(built, x, g, b);
    built.rename(y, "y");
    built.output(y, "y", DType::BF16);
    expect_same_graph(built, parsed);
    expect_round_trip(parsed);
  }
}

// The causal mask: a statement of its own kind, built as the builder builds it, printed back
// as written; refused where it cannot mean "the scores' row and column", at its line and column.
TEST(Text, CausalMask) {
  const std::string h = "input q: bf16[M, K]\ninput k: bf16[N, K]\ns = matmul(q, k)\n";
  Graph parsed = parse_graph(h + "m = causal_mask(mul(s, 0.125))\noutput m: f32\n");
  const Node& m = parsed.node(parsed.find("m"));
  EXPECT_EQ(m.kind, OpKind::CausalMask);
  EXPECT_EQ(m.shape, (Shape{Dim::of("M"), Dim::of("N")}));
  EXPECT_EQ(name_of(m.kind), "causal_mask");
  expect_round_trip(parsed);
  EXPECT_NE(print_graph(parsed).find("m = causal_mask(%binary4)\n"), std::string::npos) << print_graph(parsed);
  Graph built;
  Value q = built.input("q", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value k = built.input("k", DType::BF16, {Dim::of("N"), Dim::of("K")});
  Value s = built.matmul(q, k);
  built.rename(s, "s");
  Value y = built.causal_mask(s * 0.125);
  built.rename(y, "m");
  built.output(y, "m", DType::F32);
  expect_same_graph(built, parsed);

  EXPECT_PARSE_ERROR(h + "m = causal_mask(q)\n", 4, 5, "causal_mask: 'q' is not computed from a matmul");
  EXPECT_PARSE_ERROR(h + "m = causal_mask(sum(s))\n", 4, 5,
                     "causal_mask: sum(s) has shape [M, 1], which is not the output shape of a matmul it "
                     "is computed from");
  EXPECT_PARSE_ERROR(h + "input b: f32[N]\nm = causal_mask(b)\n", 5, 5, "'b' has shape [N]; the mask applies to a tile [M, N]");
  EXPECT_PARSE_ERROR(h + "m = causal_mask(s, s)\n", 4, 5, "wrong arity: `causal_mask` takes 1 operand");
  EXPECT_PARSE_ERROR(h + "m = causal_mask(s, offset=1)\n", 4, 20, "`causal_mask` takes no keyword arguments");
  EXPECT_PARSE_ERROR(h + "m = causal_msk(s)\n", 4, 5, "did you mean `causal_mask`?");
  // Only a value computed from the matmul's output tile: not its transpose's [N, M].
  EXPECT_PARSE_ERROR(h + "m = causal_mask(transpose(s))\n", 4, 5, "causal_mask: transpose(s) has shape [N, M]");
}

TEST(Text, ErrorsCarryLineAndColumn) {
  const std::string h = kHeader;  // two lines
  EXPECT_PARSE_ERROR(h + "z = gelu_tan(x)\n", 3, 5, "unknown op `gelu_tan`; did you mean `gelu_tanh`?");
  EXPECT_PARSE_ERROR(h + "z = relu(q)\n", 3, 10, "undefined name `q`");
  EXPECT_PARSE_ERROR(h + "z = relu(x)\n  z = exp(x)\n", 4, 3, "redefinition of `z` (first defined at line 3)");
  EXPECT_PARSE_ERROR(h + "input x: f32[N]\n", 3, 7, "redefinition of `x`");
  EXPECT_PARSE_ERROR(h + "z = add(x)\n", 3, 5, "wrong arity: `add` takes 2 operands, got 1");
  EXPECT_PARSE_ERROR(h + "z = max(x, y, x)\n", 3, 5, "`max` takes 1 operand (reduction) or 2 (binary), got 3");
  EXPECT_PARSE_ERROR(h + "z = relu(x, y)\n", 3, 5, "`relu` takes 1 operand, got 2");
  EXPECT_PARSE_ERROR("input a: bf17[M, K]\n", 1, 10, "bad dtype `bf17`");
  EXPECT_PARSE_ERROR("input a: bf16[M, 0]\n", 1, 18, "bad dim `0`");
  EXPECT_PARSE_ERROR("input a: bf16[M, -4]\n", 1, 18, "dimensions must be positive");
  EXPECT_PARSE_ERROR("input a: bf16[M, 2.5]\n", 1, 18, "bad dim `2.5`");
  EXPECT_PARSE_ERROR("input a: bf16[B, M, K, L]\n", 1, 24, "rank 4 is not supported (at most 3: [B, rows, cols]");
  EXPECT_PARSE_ERROR(h + "z = relu(x) $\n", 3, 13, "unexpected character '$'");
  EXPECT_PARSE_ERROR(h + "z = add(x, relu(y)\n", 3, 19, "missing ')' to close `add(`");
  EXPECT_PARSE_ERROR(h + "z = relu(x) y\n", 3, 13, "unexpected `y` after the statement");
  EXPECT_PARSE_ERROR(h + "z = mul(x, 1e999)\n", 3, 12, "number `1e999` is out of range");
  EXPECT_PARSE_ERROR(h + "z = const(nan)\n", 3, 11, "NaN literal is not allowed");
  EXPECT_PARSE_ERROR(h + "z = mul(x, nan)\n", 3, 12, "NaN literal is not allowed");
  EXPECT_PARSE_ERROR(h + "output x\noutput x: bf16\n", 4, 8, "output 'x' is declared twice");
  EXPECT_PARSE_ERROR(h + "output q\n", 3, 8, "undefined name `q`");
  EXPECT_PARSE_ERROR(h + "output x: int8\n", 3, 11, "bad dtype `int8`");
  EXPECT_PARSE_ERROR(h + "z = mul(x, 2x)\n", 3, 12, "malformed number `2x`");
  EXPECT_PARSE_ERROR(h + "z = sum(x, axis=0)\n", 3, 12, "`sum` has no keyword `axis`");
  EXPECT_PARSE_ERROR(h + "z = sum(x, dim=0.5)\n", 3, 16, "bad dim");
  EXPECT_PARSE_ERROR(h + "z = sum(x, dim=2)\n", 3, 5, "dim 2 is out of range");
  EXPECT_PARSE_ERROR(h + "z = matmul(x, y, layout=mn)\n", 3, 25, "bad layout `mn`");
  EXPECT_PARSE_ERROR(h + "z = cast(x, int8)\n", 3, 13, "bad dtype `int8`");
  EXPECT_PARSE_ERROR(h + "z = x\n", 3, 5, "only aliases `x`");
  EXPECT_PARSE_ERROR(h + "z = pow(x, y)\n", 3, 5, "pow: the exponent must be a scalar");
  EXPECT_PARSE_ERROR("input a: f32[M, N]\ninput b: f32[K, N]\nc = add(a, b)\n", 3, 5, "shape mismatch in add");
  EXPECT_PARSE_ERROR("input a: f32[M, N]\ninput b: f32[N, K]\nc = matmul(a, b)\n", 3, 5, "contraction dims differ");
  EXPECT_PARSE_ERROR(h + "z = layer_norm(x, eps=1e-5, eps=1e-6)\n", 3, 29, "keyword `eps` given twice");
  EXPECT_PARSE_ERROR(h + "z relu(x)\n", 3, 3, "expected '=' after `z`");
  EXPECT_PARSE_ERROR(h + "= relu(x)\n", 3, 1, "expected a statement");
  EXPECT_PARSE_ERROR(h + "z = relu(,)\n", 3, 10, "expected an operand");
  EXPECT_PARSE_ERROR(h + "z = softmax(x, dim=0)\n", 3, 16, "`softmax` has no keyword `dim` (it takes segment=)");
  EXPECT_PARSE_ERROR(h + "z = relu(x, dim=0)\n", 3, 13, "`relu` takes no keyword arguments");
}

TEST(Text, Limits) {
  // Nesting is bounded (no unbounded recursion).
  std::string deep = "input x: f32[M, N]\nz = ";
  for (int i = 0; i < 200; ++i) deep += "relu(";
  deep += "x";
  for (int i = 0; i < 200; ++i) deep += ")";
  EXPECT_PARSE_ERROR(deep + "\n", 2, 325, "nested more than 64 calls deep");
  std::string ok = "input x: f32[M, N]\nz = ";
  for (int i = 0; i < 60; ++i) ok += "relu(";
  ok += "x";
  for (int i = 0; i < 60; ++i) ok += ")";
  EXPECT_EQ(parse_graph(ok).nodes().size(), 61u);

  EXPECT_PARSE_ERROR("# x\n" + std::string(70000, ' ') + "\n", 2, 65537, "limit is 64 KiB");
  Error big = parse_error(std::string(17u << 20, '\n'));
  EXPECT_NE(std::string(big.what()).find("16 MiB"), std::string::npos);

  // The node cap stops quadratic blow-up: 30000 tiny statements are refused quickly.
  std::string many = "input x: f32[M, N]\n";
  for (int i = 0; i < 30000; ++i) many += "v" + std::to_string(i) + " = relu(x)\n";
  Error e = parse_error(many);
  EXPECT_NE(std::string(e.what()).find("more than"), std::string::npos) << e.what();
}

TEST(Text, ParseGraphFileNamesTheFile) {
  EXPECT_THROW(parse_graph_file("/nonexistent/x.cf"), Error);
  const std::string path = testing::TempDir() + "/bad_graph.cf";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("input x: f32[M, N]\ny = frobnicate(x)\n", f);
    std::fclose(f);
  }
  try {
    parse_graph_file(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.loc().line, 2);
    EXPECT_EQ(e.loc().column, 5);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// Only regular files are read: a FIFO must not block (no writer ever comes), a directory
// must not be sized, and an unreadable path says the OS's reason.
TEST(Text, ParseGraphFileRefusesWhatIsNotARegularFile) {
  auto says = [](const std::string& path, const std::string& needle) {
    try {
      parse_graph_file(path);
      ADD_FAILURE() << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string fifo = testing::TempDir() + "/graph_fifo_" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  says(fifo, "is a FIFO; a graph file must be a regular file");
  std::remove(fifo.c_str());
  says(testing::TempDir(), "is a directory; a graph file must be a regular file");
  says("/nonexistent/x.cf", "cannot open graph file '/nonexistent/x.cf': No such file or directory");
}

// What an error echoes of the user's text: escaped (no terminal control sequence), clipped.
TEST(Text, ExcerptsAreEscapedAndClipped) {
  EXPECT_EQ(printable("a\x1b[2Jb\x07"), "a\\x1b[2Jb\\x07");
  EXPECT_EQ(printable(std::string(300, 'x'), 4), "xxxx...(300 bytes)");
  // The caret stays under the column once bytes before it are escaped.
  EXPECT_EQ(excerpt("ab\x1b" "cd", 4), "  ab\\x1bcd\n        ^");  // under the c
  const std::string line(1 << 20, 'y');
  const std::string ex = excerpt(line, 500000);
  EXPECT_LT(ex.size(), 300u);
  EXPECT_EQ(ex.find('^') - ex.find('\n') - 1, ex.find("...") + 3 + 60) << ex;
  // Names in messages are clipped too: a 60 KB name is not repeated whole.
  try {
    parse_graph("y = relu(" + std::string(60000, 'n') + ")\n");
    FAIL();
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);
    EXPECT_NE(std::string(e.what()).find("...(60000 bytes)"), std::string::npos) << e.what();
  }
}

TEST(Text, ExamplesRoundTrip) {
  const auto files = example_files();
  EXPECT_GE(files.size(), 6u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    Graph g = parse_graph_file(f);
    EXPECT_FALSE(g.outputs().empty());
    int matmuls = 0;
    for (const Node& n : g.nodes()) matmuls += n.kind == OpKind::MatMul;
    EXPECT_GE(matmuls, 1);
    expect_round_trip(g);
  }
}

TEST(Text, ExampleShapes) {
  Graph att = parse_graph_file(source_dir() + "/examples/attention.cf");
  const Node& o = att.node(att.outputs().at(0).node);
  EXPECT_EQ(o.shape, (Shape{Dim::of("M"), Dim::of("DV")}));
  Graph ln = parse_graph_file(source_dir() + "/examples/gemm_layernorm.cf");
  EXPECT_EQ(ln.node(ln.find("alpha")).shape, Shape{});
}

TEST(Text, BuilderGraphsRoundTrip) {
  Graph g;
  Value a = g.input("a", DType::BF16, {Dim::of("M"), Dim::of(64)});
  Value b = g.input("b", DType::F16, {Dim::of(64), Dim::of("N")});
  Value acc = g.matmul(a, b, BLayout::KN);
  Value t = g.binary(BinaryOp::Max, acc, g.constant(-0.0));
  t = g.binary(BinaryOp::Min, t, g.constant(INFINITY));
  t = g.binary(BinaryOp::Add, t, g.constant(0.1));
  t = g.binary(BinaryOp::Mul, t, g.constant(1e-300));
  Value r = g.reduce(ReduceOp::Max, t, 0);
  Value s = g.softmax(t);
  g.output(s, "probs", DType::BF16);
  g.output(r, "colmax", DType::F32);
  g.output(g.transpose(s), "st", DType::F16);
  expect_round_trip(g);

  Graph bad;
  bad.input("has space", DType::F32, {Dim::of("N")});
  EXPECT_THROW(print_graph(bad), Error);
}

// Mutations of the examples and random bytes: the parser returns or throws Error.
TEST(Text, GarbageNeverCrashes) {
  std::vector<std::string> seeds;
  for (const std::string& f : example_files()) {
    std::ifstream in(f);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  seeds.push_back("input x: f32[M, N]\ny = layer_norm(x, none, none, eps=1e-5)\noutput y\n");
  std::mt19937 rng(1234);
  const std::string alphabet = "()[],:=#%._-+eE0123456789 \n\tabcxyzMNK\"$\x01\xff";
  int parsed = 0, rejected = 0;
  auto attempt = [&](const std::string& text) {
    try {
      Graph g = parse_graph(text);
      ++parsed;
      Graph back = parse_graph(print_graph(g));
      EXPECT_EQ(back.nodes().size(), g.nodes().size());
    } catch (const Error&) {
      ++rejected;
    }
  };
  for (const std::string& seed : seeds) {
    for (size_t cut = 0; cut < seed.size(); cut += 3) attempt(seed.substr(0, cut));
    for (int m = 0; m < 400; ++m) {
      std::string t = seed;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < edits && !t.empty(); ++k) {
        const size_t at = rng() % t.size();
        switch (rng() % 3) {
          case 0: t[at] = alphabet[rng() % alphabet.size()]; break;
          case 1: t.erase(at, 1 + rng() % 8); break;
          default: t.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        }
      }
      attempt(t);
    }
  }
  for (int m = 0; m < 500; ++m) {
    std::string t(rng() % 200, ' ');
    for (char& c : t) c = static_cast<char>(rng() % 256);
    attempt(t);
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace comfuse
