// Fusion Spec text form and verifier: exact round trips (hand-built specs and, through
// Φ, every example), parse errors with positions, and one test per verifier rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>

#include "comfuse/lower.h"
#include "comfuse/spec.h"
#include "comfuse/text.h"

namespace comfuse {
namespace {

std::string source_dir() {
  if (const char* env = std::getenv("COMFUSE_SOURCE_DIR")) return env;
  return COMFUSE_SOURCE_DIR;
}

SpecNode node(NodeCategory c, ValueClass vc, std::vector<int> ops = {}) {
  SpecNode n;
  n.category = c;
  n.value_class = vc;
  n.operands = std::move(ops);
  return n;
}
SpecNode bcast(BroadcastKind k, ValueClass vc, int arg, double lit = 0.0) {
  SpecNode n = node(NodeCategory::Broadcast, vc);
  n.broadcast = k;
  n.arg = arg;
  n.literal = lit;
  return n;
}
SpecNode binary(BinaryOp op, ValueClass vc, int a, int b) {
  SpecNode n = node(NodeCategory::Compute, vc, {a, b});
  n.compute = ComputeKind::Binary;
  n.binary = op;
  return n;
}
SpecNode unary(UnaryOp op, ValueClass vc, int a) {
  SpecNode n = node(NodeCategory::Compute, vc, {a});
  n.compute = ComputeKind::Unary;
  n.unary = op;
  return n;
}
SpecNode causal_mask(ValueClass vc, int a) {
  SpecNode n = node(NodeCategory::Compute, vc, {a});
  n.compute = ComputeKind::CausalMask;
  return n;
}
SpecNode reduction(ReduceOp op, int a, int post) {
  SpecNode n = node(NodeCategory::Reduction, ValueClass::Col, {a});
  n.reduce = op;
  n.post = post;
  return n;
}
SpecNode stat() {
  SpecNode n = node(NodeCategory::Placeholder, ValueClass::Col);
  n.placeholder = PlaceholderKind::Stat;
  return n;
}
SpecNode bypass(int source, ValueClass vc) {
  SpecNode n = node(NodeCategory::Placeholder, vc);
  n.placeholder = PlaceholderKind::Bypass;
  n.source = source;
  return n;
}
SpecNode store(int a, int arg, ValueClass vc) {
  SpecNode n = node(NodeCategory::Store, vc, {a});
  n.arg = arg;
  return n;
}

// y = layer_norm-ish: x = alpha*acc + bias; mean; (x - mean) -> store, plus a col output.
FusionSpec gemm_ln() {
  FusionSpec fs;
  fs.name = "gemm_ln";
  fs.m = Dim::of("M");
  fs.n = Dim::of("N");
  fs.k = Dim::of("K");
  auto arg = [&](std::string name, ArgRole role, DType dt, Shape shape, ValueClass vc = ValueClass::Tile) {
    RuntimeArg a;
    a.name = std::move(name);
    a.role = role;
    a.dtype = dt;
    a.shape = std::move(shape);
    a.value_class = vc;
    a.graph_node = static_cast<int>(fs.args.size());
    fs.args.push_back(a);
  };
  arg("x", ArgRole::OperandA, DType::BF16, {Dim::of("M"), Dim::of("K")});
  arg("w", ArgRole::OperandB, DType::BF16, {Dim::of("N"), Dim::of("K")});
  arg("alpha", ArgRole::Scalar, DType::F32, {});
  arg("bias", ArgRole::RowVector, DType::BF16, {Dim::of("N")});
  arg("y", ArgRole::Output, DType::BF16, {Dim::of("M"), Dim::of("N")});
  arg("mean", ArgRole::Output, DType::F32, {Dim::of("M"), Dim::of(1)}, ValueClass::Col);
  arg("rowscale", ArgRole::ColVector, DType::F32, {Dim::of("M"), Dim::of(1)}, ValueClass::Col);

  Spec& s0 = fs.root;
  s0.nodes = {node(NodeCategory::AccEntry, ValueClass::Tile),      // n0
              bcast(BroadcastKind::Scalar, ValueClass::Scalar, 2),  // n1 alpha
              binary(BinaryOp::Mul, ValueClass::Tile, 0, 1),        // n2
              bcast(BroadcastKind::Row, ValueClass::Row, 3),        // n3 bias
              binary(BinaryOp::Add, ValueClass::Tile, 2, 3),        // n4 x
              reduction(ReduceOp::Mean, 4, 0)};                     // n5
  s0.nodes[4].origin = "%binary7";
  s0.terminal = 5;
  Spec s1;
  s1.nodes = {stat(),                                               // n0 mean
              bypass(4, ValueClass::Tile),                          // n1 x
              binary(BinaryOp::Sub, ValueClass::Tile, 1, 0),        // n2
              bcast(BroadcastKind::Scalar, ValueClass::Scalar, -1, 1e-5),  // n3
              binary(BinaryOp::Pow, ValueClass::Tile, 2, 3),        // n4
              bcast(BroadcastKind::Col, ValueClass::Col, 6),        // n5
              binary(BinaryOp::Mul, ValueClass::Tile, 4, 5),        // n6
              unary(UnaryOp::GeluTanh, ValueClass::Tile, 6),        // n7
              store(0, 5, ValueClass::Col),                         // n8
              store(7, 4, ValueClass::Tile)};                       // n9
  s1.nodes[7].origin = "weird \"name\"\n";
  s1.terminal = 9;
  s0.children.push_back(s1);
  return fs;
}

void expect_round_trip(const FusionSpec& s) {
  const std::string text = print(s);
  FusionSpec back;
  try {
    back = parse_spec(text);
  } catch (const Error& e) {
    FAIL() << e.what() << "\n" << text;
  }
  EXPECT_TRUE(back == s) << text << "\n---\n" << print(back);
  EXPECT_EQ(print(back), text);
}

TEST(SpecText, HandBuiltRoundTripAndVerify) {
  const FusionSpec fs = gemm_ln();
  EXPECT_NO_THROW(verify(fs));
  expect_round_trip(fs);
  EXPECT_EQ(fs.reduction_count(), 1);
  EXPECT_EQ(fs.stage_count(), 2);
  EXPECT_EQ(fs.arg_index(ArgRole::RowVector), 3);
  EXPECT_EQ(fs.arg_index(ArgRole::Output), 4);
  const std::string text = print(fs);
  EXPECT_NE(text.find("n3: row = bcast.row a3"), std::string::npos) << text;
  EXPECT_NE(text.find("n5: col = reduce.mean n4 -> post 0"), std::string::npos) << text;
  EXPECT_NE(text.find("n1: tile = bypass from n4"), std::string::npos) << text;
  EXPECT_NE(text.find("bcast.scalar 1e-05"), std::string::npos) << text;
  EXPECT_NE(text.find("a5: output mean f32[M, 1] col node=5"), std::string::npos) << text;
  EXPECT_NE(text.find("origin=\"weird \\\"name\\\"\\x0a\""), std::string::npos) << text;
  std::ostringstream os;
  os << fs;
  EXPECT_EQ(os.str(), text);
}

// The causal mask is a compute node of its own kind: printed by name, parsed back, verified.
TEST(SpecText, CausalMaskRoundTrips) {
  FusionSpec fs = gemm_ln();
  fs.root.children[0].nodes[7] = causal_mask(ValueClass::Tile, 6);
  fs.root.children[0].nodes[7].origin = "masked";
  EXPECT_NO_THROW(verify(fs));
  expect_round_trip(fs);
  EXPECT_NE(print(fs).find("n7: tile = causal_mask n6 origin=masked"), std::string::npos) << print(fs);
  FusionSpec other = fs;
  other.root.children[0].nodes[7] = unary(UnaryOp::GeluTanh, ValueClass::Tile, 6);
  other.root.children[0].nodes[7].origin = "masked";
  EXPECT_FALSE(fs == other);
}

TEST(SpecText, ExactDoublesNamesAndDims) {
  for (double v : {0.1, -0.0, 0.0, 1e-300, 5e-324, 1.7976931348623157e308, -2.5, 1.0 / 3.0, double(INFINITY),
                   -double(INFINITY), double(NAN), -double(NAN), 123456789012345678.0}) {
    FusionSpec fs = gemm_ln();
    fs.root.children[0].nodes[3].literal = v;
    SCOPED_TRACE(print(fs));
    expect_round_trip(fs);
  }
  FusionSpec fs = gemm_ln();
  fs.name = "";
  fs.args[0].name = "%x.0";
  fs.args[1].name = "has space\t\xc3\xa9";
  fs.args[2].shape = {Dim{}, Dim::of(0), Dim::of("my dim"), Dim::of(-7)};
  fs.args[3].value_class = ValueClass::Row;  // printed because it is not the default
  fs.args[3].graph_node = -1;
  fs.b_layout = BLayout::KN;
  fs.k = Dim::of(4096);
  fs.m = Dim{};
  expect_round_trip(fs);
}

TEST(SpecText, MalformedSpecsStillRoundTrip) {
  FusionSpec fs = gemm_ln();
  fs.root.nodes[2].operands = {-3, 9};
  fs.root.nodes[0].operands = {1};
  fs.root.nodes[3].operands = {0, 2};  // a broadcast with operands
  fs.root.terminal = -1;
  fs.root.children[0].terminal = -4;
  fs.root.children[0].nodes[1].source = -2;
  fs.root.children[0].nodes[9].arg = -5;
  fs.root.nodes[5].post = -1;
  expect_round_trip(fs);
  EXPECT_THROW(verify(fs), Error);
}

TEST(SpecText, Visitor) {
  struct Trace : SpecVisitor {
    std::string log;
    void enter_stage(const Spec&, int d) override { log += "{" + std::to_string(d); }
    void leave_stage(const Spec&, int d) override { log += "}" + std::to_string(d); }
    void visit(const Spec&, int i, const SpecNode&, int) override { log += " " + std::to_string(i); }
  } t;
  t.walk(gemm_ln().root);
  EXPECT_EQ(t.log, "{0 0 1 2 3 4 5{1 0 1 2 3 4 5 6 7 8 9}1}0");
}

struct ParseCase {
  std::string text;
  int line, col;
  std::string msg;
};

TEST(SpecText, ParseErrorsHavePositions) {
  const std::string good = print(gemm_ln());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  const ParseCase cases[] = {
      {"", 1, 1, "expected `fusion`"},
      {replaced("b_layout=nk", "b_layout=xx"), 1, 26, "bad b_layout `xx`"},
      {replaced("m=M", "q=M"), 1, 30, "unknown header key `q`"},
      {replaced("a2: scalar", "a2: vector"), 5, 9, "bad arg role `vector`"},
      {replaced("a1:", "a7:"), 4, 5, "expected arg label `a1`"},
      {replaced("bf16[N, K]", "bf17[N, K]"), 4, 21, "bad dtype `bf17`"},
      {replaced("n2: tile = mul", "n2: tile = mull"), 14, 16, "unknown spec op `mull`"},
      {replaced("n2: tile = mul", "n2: blob = mul"), 14, 9, "bad value class `blob`"},
      {replaced("n2: tile", "n3: tile"), 14, 5, "expected node `n2`"},
      {replaced("reduce.mean", "reduce.median"), 17, 15, "unknown reduction `median`"},
      {replaced("bcast.row a3", "bcast.row $"), 15, 25, "unexpected character '$'"},
      {replaced("post 0:", "post 1:"), 19, 10, "expected post stage number 0"},
      {replaced("origin=\"weird", "origin=\"we\nird"), 27, 38, "unterminated string"},
      {replaced("bcast.scalar 1e-05", "bcast.scalar 1e999"), 23, 33, "out of range"},
      {replaced("acc\n", "acc -> a1\n"), 12, 20, "'->' only follows a reduction"},
      {good + "junk", 34, 1, "unexpected `junk` after the spec"},
      {good.substr(0, good.size() - 10), 31, 3, "missing '}' to close a stage"},
  };
  for (const ParseCase& c : cases) {
    try {
      parse_spec(c.text);
      ADD_FAILURE() << "parsed: " << c.msg;
    } catch (const Error& e) {
      EXPECT_EQ(e.loc().line, c.line) << e.what();
      EXPECT_EQ(e.loc().column, c.col) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.msg), std::string::npos) << e.what();
    }
  }
  // Bounded nesting of post stages.
  std::string deep = "fusion f () { args {} stage ";
  for (int i = 0; i < 100; ++i) deep += "{ post 0: stage ";
  EXPECT_THROW(parse_spec(deep), Error);
}

struct VerifyCase {
  const char* what;
  std::function<void(FusionSpec&)> mutate;
  const char* expect;
};

TEST(SpecVerify, RejectsMalformedSpecs) {
  const VerifyCase cases[] = {
      {"operand out of range", [](FusionSpec& s) { s.root.nodes[2].operands[1] = 17; },
       "stage 0: node n2: operand 17 is out of range"},
      {"topological order", [](FusionSpec& s) { s.root.nodes[2].operands[1] = 3; },
       "stage 0: node n2: operand n3 does not precede it"},
      {"acc with operand", [](FusionSpec& s) { s.root.nodes[1].operands = {0}; },
       "node n1: a broadcast takes 0 operands, has 1"},
      {"acc in nested stage",
       [](FusionSpec& s) { s.root.children[0].nodes[2] = node(NodeCategory::AccEntry, ValueClass::Tile); },
       "stage 0 > post of n5 (stage 1): node n2: an acc entry may only appear in the root stage"},
      {"binary arity", [](FusionSpec& s) { s.root.nodes[4].operands = {2}; }, "node n4: binary `add` takes 2 operands, has 1"},
      {"unary arity", [](FusionSpec& s) { s.root.children[0].nodes[7].operands = {6, 6}; },
       "node n7: unary `gelu_tanh` takes 1 operand, has 2"},
      {"class of tile op row", [](FusionSpec& s) { s.root.nodes[4].value_class = ValueClass::Row; },
       "node n4: value class is row, expected tile (tile op row)"},
      {"reduction class", [](FusionSpec& s) { s.root.nodes[5].value_class = ValueClass::Tile; },
       "node n5: value class is tile, expected col"},
      {"reduction of a col", [](FusionSpec& s) { s.root.children[0].nodes[2] = reduction(ReduceOp::Sum, 0, -1); },
       "a reduction reduces a tile; operand n0 is a col"},
      {"reduction not terminal", [](FusionSpec& s) { s.root.terminal = 4; },
       "node n5: a reduction must be its stage's terminal (the terminal is n4)"},
      {"two reductions",
       [](FusionSpec& s) {
         s.root.nodes.insert(s.root.nodes.end() - 1, reduction(ReduceOp::Max, 4, -1));
         s.root.terminal = 6;
         s.root.nodes[6].post = 0;
       },
       "a reduction must be its stage's terminal (the terminal is n6)"},
      {"post out of range", [](FusionSpec& s) { s.root.nodes[5].post = 3; }, "post 3 does not name a child stage"},
      {"placeholder in root", [](FusionSpec& s) { s.root.nodes[1] = stat(); },
       "stage 0: node n1: a placeholder may only appear in a nested (post) stage"},
      {"two stats", [](FusionSpec& s) { s.root.children[0].nodes[3] = stat(); }, "a second stat placeholder (n0 is the first)"},
      {"stat class", [](FusionSpec& s) { s.root.children[0].nodes[0].value_class = ValueClass::Tile; },
       "node n0: value class is tile, expected col"},
      {"bypass source", [](FusionSpec& s) { s.root.children[0].nodes[1].source = 6; },
       "bypass source 6 is not a node of the parent stage (6 nodes)"},
      {"bypass class", [](FusionSpec& s) { s.root.children[0].nodes[1].source = 3; },
       "node n1: value class is tile, expected row (the class of bypassed n3)"},
      {"pow exponent", [](FusionSpec& s) { s.root.children[0].nodes[4].operands = {2, 1}; },
       "node n4: pow's exponent n1 must be a scalar, is a tile"},
      {"row broadcast arg role", [](FusionSpec& s) { s.root.nodes[3].arg = 2; },
       "node n3: a row broadcast names arg a2 (`alpha`), a scalar arg; expected a row_vector arg"},
      {"col broadcast arg role", [](FusionSpec& s) { s.root.children[0].nodes[5].arg = 3; },
       "a col broadcast names arg a3 (`bias`), a row_vector arg; expected a col_vector arg"},
      {"scalar broadcast missing arg", [](FusionSpec& s) { s.root.nodes[1].arg = 40; },
       "a scalar broadcast names arg 40, which does not exist (7 args)"},
      {"store to non-output", [](FusionSpec& s) { s.root.children[0].nodes[9].arg = 3; },
       "node n9: a store names arg a3 (`bias`), a row_vector arg; expected a output arg"},
      {"store class mismatch", [](FusionSpec& s) { s.root.children[0].nodes[9].arg = 5; },
       "node n9: stores a tile value into output a5 (`mean`), declared col"},
      {"operand is a store", [](FusionSpec& s) { s.root.children[0].nodes[9].operands = {8}; },
       "node n9: operand n8 is a store, which has no value"},
      {"leaf terminal not a store", [](FusionSpec& s) { s.root.children[0].terminal = 7; },
       "stage 0 > post of n5 (stage 1): a stage without a reduction must end in a store; terminal n7 is a compute"},
      {"no terminal", [](FusionSpec& s) { s.root.children[0].terminal = -1; }, "(stage 1): the stage has no terminal"},
      {"unreferenced child", [](FusionSpec& s) { s.root.children.push_back(s.root.children[0]); },
       "stage 0: child stage 1 is not the post stage of any reduction"},
      {"reduction without post leaves child orphan", [](FusionSpec& s) { s.root.nodes[5].post = -1; },
       "child stage 0 is not the post stage of any reduction"},
      {"two operand_a", [](FusionSpec& s) { s.args[1].role = ArgRole::OperandA; },
       "exactly one operand_a arg, found 2"},
      {"no operand_b", [](FusionSpec& s) { s.args[1].role = ArgRole::RowVector; }, "exactly one operand_b arg, found 0"},
      {"output of row class", [](FusionSpec& s) { s.args[4].value_class = ValueClass::Row; },
       "arg a4 (`y`): an output holds a tile or a col, not a row"},
      {"uses own reduction", [](FusionSpec& s) {
         s.root.nodes.push_back(unary(UnaryOp::Exp, ValueClass::Col, 5));
       },
       "node n6: operand n5 is this stage's reduction"},
      {"empty stage", [](FusionSpec& s) { s.root.children[0].nodes.clear(); }, "(stage 1): the stage has no nodes"},
      {"causal mask of a col", [](FusionSpec& s) { s.root.children[0].nodes[7] = causal_mask(ValueClass::Col, 5); },
       "node n7: causal_mask masks a tile (it reads each element's row and column); operand n5 is a col"},
      {"causal mask arity",
       [](FusionSpec& s) {
         s.root.children[0].nodes[7] = causal_mask(ValueClass::Tile, 6);
         s.root.children[0].nodes[7].operands = {6, 6};
       },
       "node n7: causal_mask takes 1 operand, has 2"},
      {"causal mask class", [](FusionSpec& s) { s.root.nodes[4] = causal_mask(ValueClass::Col, 2); },
       "node n4: value class is col, expected tile (a causal mask keeps its tile)"},
  };
  for (const VerifyCase& c : cases) {
    SCOPED_TRACE(c.what);
    FusionSpec fs = gemm_ln();
    c.mutate(fs);
    try {
      verify(fs);
      ADD_FAILURE() << "verify accepted: " << c.what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
}

TEST(SpecVerify, ClassAlgebra) {
  // Row op Col -> Tile, Col op Col -> Col, Scalar op Col -> Col.
  FusionSpec fs = gemm_ln();
  Spec& s1 = fs.root.children[0];
  s1.nodes.insert(s1.nodes.begin() + 8, {bcast(BroadcastKind::Row, ValueClass::Row, 3),   // n8
                                         binary(BinaryOp::Add, ValueClass::Tile, 8, 5),  // n9 row+col
                                         binary(BinaryOp::Mul, ValueClass::Col, 0, 5),   // n10 col*col
                                         binary(BinaryOp::Sub, ValueClass::Col, 3, 10)}); // n11 scalar-col
  s1.nodes[12].operands = {11};  // store col
  s1.nodes[13].operands = {9};   // store tile
  s1.terminal = 13;
  EXPECT_NO_THROW(verify(fs)) << print(fs);
  expect_round_trip(fs);
}

// Φ on every example: the specs it produces verify and round-trip exactly.
TEST(SpecText, LoweredExamplesRoundTrip) {
  int regions = 0;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/examples")) {
    if (e.path().extension() != ".cf") continue;
    SCOPED_TRACE(e.path().string());
    Graph g = parse_graph_file(e.path().string());
    LoweringResult r = lower(g);
    for (const FusedRegion& fr : r.regions) {
      ++regions;
      EXPECT_NO_THROW(verify(fr.spec)) << print(fr.spec);
      expect_round_trip(fr.spec);
    }
  }
  EXPECT_GE(regions, 6);
}

TEST(SpecText, GarbageNeverCrashes) {
  const std::string seed = print(gemm_ln());
  std::mt19937 rng(99);
  const std::string alphabet = "{}()[],:=?->\"\\#nat0123456789.e+ \nxyz\x01\xfe";
  int parsed = 0;
  for (int m = 0; m < 3000; ++m) {
    std::string t = seed;
    for (int k = 0, edits = 1 + static_cast<int>(rng() % 4); k < edits && !t.empty(); ++k) {
      const size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: t.erase(at, 1 + rng() % 6); break;
        default: t.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    try {
      FusionSpec s = parse_spec(t);
      ++parsed;
      EXPECT_TRUE(parse_spec(print(s)) == s);
      try { verify(s); } catch (const Error&) {}
      (void)s.stage_count();
    } catch (const Error&) {
    }
  }
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace comfuse
