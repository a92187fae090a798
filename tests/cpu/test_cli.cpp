// The `comfuse` binary end to end on examples/*.cf: exit codes, what each subcommand
// prints, and error messages. The binary is found beside this test binary (both are
// built into the same build directory), the examples through COMFUSE_SOURCE_DIR.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
};

fs::path binary() { return fs::read_symlink("/proc/self/exe").parent_path() / "comfuse"; }

std::string example(const std::string& name) {
  const char* env = std::getenv("COMFUSE_SOURCE_DIR");
  return (fs::path(env ? env : COMFUSE_SOURCE_DIR) / "examples" / name).string();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `comfuse ARGS` (after the environment assignments `env`, e.g. "COMFUSE_LOG=debug"),
// capturing stdout and stderr apart. `timeout 120` ends a run that would hang.
Result comfuse(const std::string& args, const std::string& env = "") {
  const fs::path err = fs::temp_directory_path() / ("comfuse_cli_err_" + std::to_string(getpid()));
  const std::string cmd = env + " timeout 120 '" + binary().string() + "' " + args + " 2>'" + err.string() + "'";
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  int status = pclose(pipe);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err);
  fs::remove(err);
  return r;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// A graph file for one test, removed after it.
struct GraphFile {
  fs::path path;
  explicit GraphFile(const std::string& text, const std::string& tag = "g") {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("comfuse_cli_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".cf");
    std::ofstream(path, std::ios::binary) << text;
  }
  ~GraphFile() { fs::remove(path); }
  std::string arg() const { return "'" + path.string() + "'"; }
};

constexpr const char* kGemm = "input x: bf16[M, K]\ninput w: bf16[N, K]\nacc = matmul(x, w)\n";

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(binary())) << "comfuse binary not found at " << binary() << " (build target comfuse)";
  }
};

const char* kExamples[] = {"gemm_bias_gelu.cf",   "gemm_bias_gelu_erf.cf", "gemm_layernorm.cf",
                           "gemm_rmsnorm.cf",     "gemm_softmax.cf",       "ffn.cf",
                           "ffn_swiglu.cf",       "attention.cf",          "attention_causal.cf",
                           "attention_batched.cf", "attention_batched_causal.cf", "gemm_swiglu.cf",
                           "gemm_head_rmsnorm.cf", "gemm_rope.cf",         "gemm_head_rmsnorm_rope.cf"};

bool is_b2b_pair(const std::string& ex) { return ex == "ffn.cf" || ex == "ffn_swiglu.cf" || ex.rfind("attention", 0) == 0; }

// Extra dims some examples need beyond the first GEMM's M, N, K.
std::string extra_dims(const std::string& ex) {
  if (ex == "ffn.cf" || ex == "ffn_swiglu.cf") return " --dim D=192";
  if (ex == "attention.cf" || ex == "attention_causal.cf") return " --dim DV=64";
  if (ex == "attention_batched.cf" || ex == "attention_batched_causal.cf") return " --dim DV=64 --dim B=3";
  return "";
}

TEST_F(Cli, LowerEveryExample) {
  for (const char* ex : kExamples) {
    SCOPED_TRACE(ex);
    ASSERT_TRUE(fs::exists(example(ex)));
    Result r = comfuse("lower '" + example(ex) + "'");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(has(r.out, "region 0")) << r.out;
    EXPECT_TRUE(has(r.out, "fusion ")) << r.out;  // the printed Fusion Spec
    EXPECT_TRUE(r.err.empty()) << r.err;
  }
}

TEST_F(Cli, ExplainLayerNormAtLargeShape) {
  Result r = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 8192,4096,4096");
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* needle : {"M=8192 N=4096 K=4096", "cluster      ", "aggregation", "unified reduction buffer",
                             "stage 1", "stage 2", "stage 3", "SMEM budget", "reasons:", "estimate"})
    EXPECT_TRUE(has(r.out, needle)) << needle << "\n" << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("aggregation  (peer-to-peer|leader-follower|l2)"))) << r.out;
  // Row groups show how many clusters share a row; forcing one is a flag away.
  Result rg = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 8192,4096,4096 --row-group 4 --cluster-m 2");
  ASSERT_EQ(rg.rc, 0) << rg.err;
  EXPECT_TRUE(has(rg.out, "row group    4 clusters share each row")) << rg.out;
  EXPECT_TRUE(has(rg.out, "cluster      2x1")) << rg.out;
  Result bad = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 8192,4096,4096 --stash fp16");
  EXPECT_EQ(bad.rc, 2);  // a usage error
  EXPECT_TRUE(has(bad.err, "--stash: fp16 not in {fp32,bf16}")) << bad.err;
  // Paired reductions: softmax's max and sum of exp in one round by default at 8192 rows (16
  // jobs a CTA) and at 256 (one job a CTA), two rounds when forced, refused by name. The poll's
  // pause: the planner's at 256 rows (every CTA rounds at once), none at 8192; --poll-pause forces
  // either way.
  struct Case {
    std::string args;
    bool one_round, pauses;
  };
  for (const Case& c : {Case{"8192,4096,4096", true, false}, Case{"256,4096,4096", true, true},
                        Case{"256,4096,4096 --pairs two-rounds", false, true},
                        Case{"256,4096,4096 --poll-pause off", true, false},
                        Case{"8192,4096,4096 --poll-pause on", true, true}}) {
    Result sm = comfuse("explain '" + example("gemm_softmax.cf") + "' --shape " + c.args);
    ASSERT_EQ(sm.rc, 0) << c.args << "\n" << sm.err;
    EXPECT_EQ(has(sm.out, "max and sum of exp in one round"), c.one_round) << c.args << "\n" << sm.out;
    EXPECT_EQ(has(sm.out, "two rounds, forced by option"), !c.one_round) << c.args << "\n" << sm.out;
    EXPECT_EQ(has(sm.out, "  polls        pause"), c.pauses) << c.args << "\n" << sm.out;
  }
  Result bad_pairs = comfuse("explain '" + example("gemm_softmax.cf") + "' --shape 8192,4096,4096 --pairs three");
  EXPECT_EQ(bad_pairs.rc, 2);
  EXPECT_TRUE(has(bad_pairs.err, "--pairs: three not in {one-round,two-rounds}")) << bad_pairs.err;
}

// The GPU planned for: the one --gpu-model names (without it this machine's, else the H200; the
// H100 takes cooperative 128x256 at this prefill shape, calibration.cpp device_model).
TEST_F(Cli, ExplainNamesTheGpuItPlansFor) {
  const std::string ln = "explain '" + example("gemm_layernorm.cf") + "' --shape 4096,8192,4096";
  Result h200 = comfuse(ln + " --gpu-model h200"), h100 = comfuse(ln + " --gpu-model h100");
  ASSERT_EQ(h200.rc, 0) << h200.err;
  ASSERT_EQ(h100.rc, 0) << h100.err;
  EXPECT_TRUE(has(h200.out, "gpu          H200\n")) << h200.out;
  EXPECT_TRUE(has(h200.out, "(PingPong")) << h200.out;
  EXPECT_TRUE(has(h100.out, "gpu          H100 (")) << h100.out;
  EXPECT_TRUE(has(h100.out, "128x256x64 (cooperative")) << h100.out;
}

TEST_F(Cli, ExplainForcedOptions) {
  Result r = comfuse("explain '" + example("gemm_layernorm.cf") +
                     "' --shape 8192,4096,4096 --cluster-n 16 --tile-n 256 --aggregation p2p");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "cluster      1x16")) << r.out;
  EXPECT_TRUE(has(r.out, "aggregation  peer-to-peer")) << r.out;
  EXPECT_TRUE(has(r.out, "strategy     on-chip")) << r.out;
  EXPECT_TRUE(has(r.out, "without the forced options")) << r.out;
}

TEST_F(Cli, ExplainDot) {
  Result r = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 256,4096,4096 --dot");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("digraph", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '{'), std::count(r.out.begin(), r.out.end(), '}'));
  size_t clusters = 0;
  for (size_t at = r.out.find("subgraph cluster_"); at != std::string::npos; at = r.out.find("subgraph cluster_", at + 1))
    ++clusters;
  EXPECT_EQ(clusters, 3u);  // mean, variance, normalize
  EXPECT_TRUE(has(r.out, "bypass"));
}

TEST_F(Cli, ExplainEveryExample) {
  for (const char* ex : kExamples) {
    SCOPED_TRACE(ex);
    Result r = comfuse("explain '" + example(ex) + "' --shape 4096,4096,4096" + extra_dims(ex));
    EXPECT_EQ(r.rc, 0) << r.err;
    // A graph of two chained GEMMs: the planner says whether it runs as one B2B kernel or two
    // (most of these shapes: two); forced, one. Every other example plans as one GEMM kernel.
    EXPECT_EQ(has(r.out, "b2b pair: "), is_b2b_pair(ex)) << r.out;
    EXPECT_TRUE(has(r.out, "plan for fusion") || has(r.out, "b2b plan for")) << r.out;
    const Result f =
        is_b2b_pair(ex) ? comfuse("explain '" + example(ex) + "' --shape 4096,4096,4096 --b2b force" + extra_dims(ex)) : r;
    EXPECT_EQ(f.rc, 0) << f.err;
    EXPECT_EQ(has(f.out, "b2b plan for"), is_b2b_pair(ex)) << f.out;
    // The causal mask before attention's softmax: the B2B kernel walks the chunks causally.
    EXPECT_EQ(has(f.out, "causal mask 'masked': a job walks only the chunks of N1 that reach its rows"),
              std::string(ex) == "attention_causal.cf" || std::string(ex) == "attention_batched_causal.cf")
        << f.out;
  }
}

TEST_F(Cli, RunReferenceEveryExample) {
  for (const char* ex : kExamples) {
    SCOPED_TRACE(ex);
    // A per-head norm's and RoPE's N is a whole number of heads (of 128).
    const std::string e = ex;
    const bool heads = e.find("head_") != std::string::npos || e.find("rope") != std::string::npos;
    const char* shape = heads ? "300,512,64" : "300,520,64";
    Result r = comfuse("run '" + example(ex) + "' --reference --shape " + shape + " --seed 3" + extra_dims(ex));
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    EXPECT_TRUE(has(r.out, "max_abs")) << r.out;
    EXPECT_TRUE(has(r.out, " OK")) << r.out;
    EXPECT_FALSE(has(r.out, "MISMATCH")) << r.out;
  }
}

// A B2B pair runs as one kernel where the planner expects it to pay, else as two single-GEMM
// kernels (S through memory; a gated pair three); --b2b force|off overrides; a batched pair has
// no unfused path.
TEST_F(Cli, B2bPairOneKernelOrTwo) {
  const std::string ffn = "'" + example("ffn.cf") + "' --dim M=8192 --dim K=1024 --dim N=4096 --dim D=256";
  Result a = comfuse("explain " + ffn);
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_TRUE(has(a.out, "b2b pair: two kernels: the B2B kernel is not expected to pay (estimate ")) << a.out;
  EXPECT_TRUE(has(a.out, "# region 0 (of 2)") && has(a.out, "# region 1 (of 2)")) << a.out;
  Result f = comfuse("explain " + ffn + " --b2b force");
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_TRUE(has(f.out, "b2b pair: one B2B kernel (b2b force; estimate ")) << f.out;
  EXPECT_TRUE(has(f.out, "b2b plan for 'region0_h' -> 'region1_y'")) << f.out;
  Result e = comfuse("emit " + ffn);
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_TRUE(has(e.out, "// b2b pair: two kernels")) << e.out;
  EXPECT_TRUE(has(e.out, "COMFUSE_DEFINE_KERNEL(") && !has(e.out, "COMFUSE_DEFINE_B2B_KERNEL(")) << e.out;
  // Attention at a long sequence pays as one kernel; off makes it two.
  const std::string att = "'" + example("attention.cf") + "' --dim M=16384 --dim N=16384 --dim K=128 --dim DV=128";
  Result at = comfuse("explain " + att);
  ASSERT_EQ(at.rc, 0) << at.err;
  EXPECT_TRUE(has(at.out, "b2b pair: one B2B kernel: estimate ")) << at.out;
  Result off = comfuse("explain " + att + " --b2b off");
  ASSERT_EQ(off.rc, 0) << off.err;
  EXPECT_TRUE(has(off.out, "b2b pair: two kernels (b2b off)")) << off.out;
  // SwiGLU: the gated pair unfused is two kernels (one gated GEMM1: W1 and W3 share X's tiles),
  // or three with --gated-gemm off (X W3^T stored as the graph's `up`, read by GEMM1's F);
  // forced, one gated B2B kernel.
  const std::string swiglu = "'" + example("ffn_swiglu.cf") + "' --dim M=8192 --dim K=1024 --dim N=4096 --dim D=1024";
  Result g = comfuse("explain " + swiglu);
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_TRUE(has(g.out, "b2b pair: two kernels: the B2B kernel is not expected to pay")) << g.out;
  EXPECT_TRUE(has(g.out, "# region 1 (of 2)") && has(g.out, "gated        one 256-column wgmma a k-block")) << g.out;
  Result g3 = comfuse("explain " + swiglu + " --gated-gemm off");
  ASSERT_EQ(g3.rc, 0) << g3.err;
  EXPECT_TRUE(has(g3.out, "b2b pair: three kernels: the B2B kernel is not expected to pay")) << g3.out;
  EXPECT_TRUE(has(g3.out, "# region 2 (of 3)") && has(g3.out, "stage 1: 2 node(s): n0 acc; n1 store up <- n0")) << g3.out;
  EXPECT_TRUE(has(comfuse("explain " + swiglu + " --b2b force").out, "(gated: X W1^T and X W3^T)"));
  Result goff = comfuse("explain " + swiglu + " --b2b off");
  ASSERT_EQ(goff.rc, 0) << goff.err;
  EXPECT_TRUE(has(goff.out, "b2b pair: two kernels (b2b off)")) << goff.out;
  Result ge = comfuse("emit " + swiglu);
  ASSERT_EQ(ge.rc, 0) << ge.err;
  EXPECT_TRUE(has(ge.out, "comfuse::epi::GateEntry") && has(ge.out, ".gated = true")) << ge.out;
  Result ge3 = comfuse("emit " + swiglu + " --gated-gemm off");
  ASSERT_EQ(ge3.rc, 0) << ge3.err;
  EXPECT_TRUE(has(ge3.out, "comfuse::epi::TileInput<") && !has(ge3.out, "GateEntry")) << ge3.out;
  // A batched pair has no unfused path: off refuses it.
  Result boff = comfuse("explain '" + example("attention_batched.cf") +
                        "' --dim B=16 --dim M=1024 --dim N=1024 --dim K=64 --dim DV=64 --b2b off");
  EXPECT_EQ(boff.rc, 1);
  EXPECT_TRUE(has(boff.err, "comfuse: error: b2b off: a batched pair has no unfused path")) << boff.err;
  Result bad = comfuse("explain " + ffn + " --b2b maybe");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(has(bad.err, "--b2b: maybe not in {auto,force,off}")) << bad.err;
  // The CPU check takes no plan options: --b2b beside --reference is a usage error.
  EXPECT_EQ(comfuse("run " + ffn + " --reference --b2b force").rc, 2);
  Result low = comfuse("lower '" + example("ffn_swiglu.cf") + "'");
  ASSERT_EQ(low.rc, 0) << low.err;
  EXPECT_TRUE(has(low.out, "gated pair: 'gate' (W1 'w1') and 'up' (W3 'w3') meet in mul(silu(gate), up) inside 's' (line 12): one "
                           "gated GEMM1 (region 0, two accumulators)"))
      << low.out;
  EXPECT_TRUE(has(low.out, "n1: tile = acc a2 origin=up")) << low.out;
}

TEST_F(Cli, MalformedFileNamesLineAndColumn) {
  const fs::path bad = fs::temp_directory_path() / ("comfuse_cli_bad_" + std::to_string(getpid()) + ".cf");
  {
    std::ofstream out(bad);
    out << "input x: bf16[M, K]\ninput w: bf16[N, K]\nacc = matmul(x, w)\ny = frobnicate(acc)\noutput y: bf16\n";
  }
  const std::string file = " '" + bad.string() + "'";
  for (const std::string& args : {"lower" + file, "explain" + file + " --shape 64,64,64",
                                  "run" + file + " --shape 64,64,64 --reference"}) {
    SCOPED_TRACE(args);
    Result r = comfuse(args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(has(r.err, "comfuse: error: " + bad.string() + ":4:")) << r.err;
    EXPECT_TRUE(std::regex_search(r.err, std::regex(":4:[0-9]+: "))) << r.err;
  }
  fs::remove(bad);
}

TEST_F(Cli, ErrorsExitOne) {
  Result r = comfuse("lower /nonexistent/graph.cf");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "comfuse: error:")) << r.err;

  r = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 128,4096,100");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "K = 100")) << r.err;

  r = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 128,4096");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "--shape")) << r.err;

  r = comfuse("explain '" + example("ffn.cf") + "' --shape 128,4096,64");  // D unbound
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "'D'")) << r.err;

}

TEST_F(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(comfuse("").rc, 2);
  EXPECT_EQ(comfuse("explain").rc, 2);  // FILE missing
  EXPECT_EQ(comfuse("--help").rc, 0);
  // A value outside an option's choices is a usage error too, named with the choices.
  const std::string ln = " '" + example("gemm_layernorm.cf") + "' --shape 128,4096,64";
  for (const auto& [opt, shown] : std::vector<std::pair<std::string, std::string>>{
           {"--aggregation bogus", "--aggregation: bogus not in {p2p,leader,l2}"},
           {"--strategy bogus", "--strategy: bogus not in {on-chip,smem-stash,workspace-stash}"},
           {"--stash bogus", "--stash: bogus not in {fp32,bf16}"},
           {"--pairs bogus", "--pairs: bogus not in {one-round,two-rounds}"},
           {"--poll-pause maybe", "--poll-pause: maybe not in {on,off}"},
           {"--cluster-n 3", "--cluster-n: '3' is not one of 1, 2, 4, 8, 16"},
           {"--gpu-model a100", "not a GPU the planner models (h200, h100): a100"}}) {
    for (const char* cmd : {"explain", "emit", "compile", "run"}) {
      SCOPED_TRACE(std::string(cmd) + " " + opt);
      Result r = comfuse(cmd + ln + " " + opt);
      EXPECT_EQ(r.rc, 2);
      EXPECT_TRUE(has(r.err, shown)) << r.err;
    }
  }
}

// Every numeric option's error names the option and, in words, what it takes.
TEST_F(Cli, NumericOptionsNameTheOptionAndWhatItTakes) {
  const std::string ln = " '" + example("gemm_layernorm.cf") + "' --shape 128,4096,64";
  for (const auto& [opt, shown] : std::vector<std::pair<std::string, std::string>>{
           {"--ring-stages abc", "--ring-stages: 'abc' is not a whole number from 2 to 16\n"},
           {"--ring-stages 17", "--ring-stages: '17' is not a whole number from 2 to 16\n"},
           {"--ring-stages -3", "--ring-stages: '-3' is not a whole number from 2 to 16\n"},
           {"--k-splits x", "--k-splits: 'x' is not a whole number from 1 to 16\n"},
           {"--consumer-wgs 1.5", "--consumer-wgs: '1.5' is not a whole number from 2 to 3\n"},
           {"--row-group abc", "--row-group: 'abc' is not one of 1, 2, 4, 8, 16, 32, 64\n"},
           {"--row-group 3", "--row-group: '3' is not one of 1, 2, 4, 8, 16, 32, 64\n"},
           {"--cluster-n two", "--cluster-n: 'two' is not one of 1, 2, 4, 8, 16\n"},
           {"--tile-n 100", "--tile-n: '100' is not one of 64, 128, 192, 256\n"},
           {"--tile-m 0x40", "--tile-m: '0x40' is not one of 64, 128\n"},
           {"--cluster-m 3", "--cluster-m: '3' is not one of 1, 2\n"},
           {"--b2b-job-rows 32", "--b2b-job-rows: '32' is not one of 64, 128\n"},
           {"--fma-exp-every 3", "--fma-exp-every: '3' is not one of 0, 2, 4, 8, 16\n"},
           {"--b2b-x-buffers 3", "--b2b-x-buffers: '3' is not one of 1, 2\n"}}) {
    for (const char* cmd : {"explain", "emit", "compile", "run"}) {
      SCOPED_TRACE(std::string(cmd) + " " + opt);
      Result r = comfuse(cmd + ln + " " + opt);
      EXPECT_EQ(r.rc, 2);
      EXPECT_EQ(r.err, shown + "Run with --help for more information.\n");
    }
  }
  // A number is read in decimal ("016" is 16, not octal 14).
  Result dec = comfuse("explain" + ln + " --cluster-n 016");
  EXPECT_EQ(dec.rc, 0) << dec.err;
  EXPECT_TRUE(has(dec.out, "(C_N = 16)")) << dec.out;
}

TEST_F(Cli, UnknownCommandListsTheCommands) {
  Result r = comfuse("explian '" + example("gemm_layernorm.cf") + "'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.err, "unknown command 'explian' (commands: lower, explain, emit, compile, run)\n"
                   "Run with --help for more information.\n");
  Result none = comfuse("");
  EXPECT_EQ(none.rc, 2);
  EXPECT_EQ(none.err, "a command is required (commands: lower, explain, emit, compile, run)\n"
                      "Run with --help for more information.\n");
  // An option first: the command comes first (an option's value is not taken for a command).
  Result option = comfuse("--shape 64,64,64 explian x.cf");
  EXPECT_EQ(option.rc, 2);
  EXPECT_EQ(option.err, "'--shape' before a command: a command comes first, its options after it (commands: lower, "
                        "explain, emit, compile, run)\nRun with --help for more information.\n");
  // An unknown option after a command stays CLI11's: it names the option.
  Result opt = comfuse("explain '" + example("gemm_layernorm.cf") + "' --bogus");
  EXPECT_EQ(opt.rc, 2);
  EXPECT_TRUE(has(opt.err, "--bogus")) << opt.err;
}

// ---- wrong or internal results, late refusals, input limits --------------------------------

// X x X^T: one input bound to both operands (two arguments of the same name, A and B).
TEST_F(Cli, OneInputAsBothGemmOperands) {
  GraphFile f("input x: bf16[M, K]\nacc = matmul(x, x)\ny = gelu(acc)\noutput y: bf16\n");
  Result lo = comfuse("lower " + f.arg());
  ASSERT_EQ(lo.rc, 0) << lo.err;
  EXPECT_TRUE(has(lo.out, "a0: operand_a x bf16[M, K]")) << lo.out;
  EXPECT_TRUE(has(lo.out, "a1: operand_b x bf16[M, K]")) << lo.out;
  Result em = comfuse("emit " + f.arg() + " --shape 256,256,64");
  ASSERT_EQ(em.rc, 0) << em.err;
  EXPECT_TRUE(std::regex_search(em.out, std::regex("//   tma_a +x bf16"))) << em.out;
  EXPECT_TRUE(std::regex_search(em.out, std::regex("//   tma_b +x bf16"))) << em.out;
  Result ref = comfuse("run " + f.arg() + " --reference --shape 96,96,64");
  EXPECT_EQ(ref.rc, 0) << ref.out << ref.err;
  EXPECT_TRUE(has(ref.out, "output y [96 x 96] bf16")) << ref.out;
  EXPECT_TRUE(has(ref.out, " OK")) << ref.out;
  // M and N are one dimension here: --shape must not give them two values.
  Result two = comfuse("explain " + f.arg() + " --shape 256,128,64");
  EXPECT_EQ(two.rc, 1);
  EXPECT_TRUE(has(two.err, "--shape's N = 128 contradicts --shape's M = 256 (both are the graph's dimension 'M')"))
      << two.err;
}

// A GEMM whose operands are another GEMM's f32 result: refused by name, never a crash.
TEST_F(Cli, GemmOfAnotherGemmsF32ResultIsRefusedByName) {
  GraphFile f(std::string(kGemm) + "acc2 = matmul(acc, acc)\noutput acc2: bf16\n");
  for (const char* cmd : {"explain", "emit", "compile"}) {
    SCOPED_TRACE(cmd);
    Result r = comfuse(std::string(cmd) + " " + f.arg() + " --shape 128,128,128");
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(has(r.err, "GEMM 'acc2' reads operand A 'acc' (stored by another fused kernel) in f32")) << r.err;
    EXPECT_TRUE(has(r.err, "cast(acc, bf16)")) << r.err;
    EXPECT_FALSE(has(r.err, "internal")) << r.err;
  }
  Result ref = comfuse("run " + f.arg() + " --reference --shape 64,64,64");
  EXPECT_EQ(ref.rc, 0) << ref.out << ref.err;  // the CPU executes it
}

TEST_F(Cli, OutputsThatAliasInputsAreRefused) {
  GraphFile input_out(std::string(kGemm) + "output x: bf16\n");
  Result r = comfuse("lower " + input_out.arg());
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, ":4:8: output 'x' is the graph input 'x' itself")) << r.err;
  GraphFile renamed(std::string(kGemm) + "y = relu(acc)\noutput y: bf16 as x\n");
  for (const char* cmd : {"lower", "explain", "emit"}) {
    SCOPED_TRACE(cmd);
    Result a = comfuse(std::string(cmd) + " " + renamed.arg() + (cmd[0] == 'l' ? "" : " --shape 128,128,64"));
    EXPECT_EQ(a.rc, 1);
    EXPECT_TRUE(has(a.err, ":5:19: output name 'x' is already the name of the input 'x' (line 1)")) << a.err;
  }
}

// A check whose both sides are NaN fails; the output says what `run --reference` compares.
TEST_F(Cli, ReferenceCheckFailsOnNaNAndSaysWhatItCompares) {
  GraphFile f(std::string(kGemm) + "y = rsqrt(mul(add(mul(acc, acc), 1), -1))\noutput y: bf16\n");
  Result r = comfuse("run " + f.arg() + " --reference --shape 64,64,64");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "MISMATCH")) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("nonfinite [1-9][0-9]*  MISMATCH"))) << r.out;
  EXPECT_TRUE(has(r.err, "is NaN or inf")) << r.err;
  EXPECT_TRUE(has(r.out, "CPU, fp64 on both sides")) << r.out;
  EXPECT_TRUE(has(r.out, "No kernel runs")) << r.out;
}

// A norm's epsilon below 0 (NaN in every row of a smaller variance) or not finite is refused,
// naming the op and its statement (the graph's check, which API graphs reach too).
TEST_F(Cli, NegativeOrInfiniteNormEpsilonIsRefused) {
  for (const auto& [call, shown] : std::vector<std::pair<std::string, std::string>>{
           {"layer_norm(acc, eps=-1)", ":4:5: layer_norm: eps = -1 is not a finite number >= 0"},
           {"rms_norm(acc, eps=-1e-6)", ":4:5: rms_norm: eps = -1e-06 is not a finite number >= 0"},
           {"l2_normalize(acc, eps=-2)", ":4:5: l2_normalize: eps = -2 is not a finite number >= 0"},
           {"layer_norm(acc, eps=inf)", ":4:25: `eps=` needs a finite number, found `inf`"}}) {
    SCOPED_TRACE(call);
    GraphFile f(std::string(kGemm) + "y = " + call + "\noutput y: bf16\n");
    Result r = comfuse("lower " + f.arg());
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(has(r.err, "comfuse: error: " + f.path.string() + shown + "\n")) << r.err;
  }
  GraphFile zero(std::string(kGemm) + "y = layer_norm(acc, eps=0)\noutput y: bf16\n");
  EXPECT_EQ(comfuse("lower " + zero.arg()).rc, 0);
}

// Values the graph made up (a composite's steps, a nested call: "%reduce4") are listed as the
// expression that computes them and the statement they are part of.
TEST_F(Cli, LowerListsUnnamedValuesInTheUsersNames) {
  GraphFile f("input a: bf16[M, K]\ninput w: bf16[N, K]\ninput h: bf16[M, N]\nacc = matmul(a, w)\n"
              "y = sub(acc, mean(h))\nz = rms_norm(h)\nq = add(y, z)\nt = rms_norm(h)\noutput q: bf16\n");
  Result r = comfuse("lower " + f.arg());
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string why = ": does not depend on a GEMM accumulator: computed before the kernel and passed as a runtime "
                          "argument\n";
  for (const std::string& line :
       {"fallback: mean(h) inside 'y' (line 5)" + why, "fallback: square(h) inside 'z' (line 6)" + why,
        "fallback: mean(square(h)) inside 'z' (line 6)" + why,
        "fallback: add(mean(square(h)), 1e-06) inside 'z' (line 6)" + why,
        "fallback: rsqrt(add(mean(...), 1e-06)) inside 'z' (line 6)" + why, "fallback: 'z' (binary)" + why,
        std::string("dead: square(h) inside 't' (line 8) reaches no output\n"),
        std::string("dead: 't' reaches no output\n")})
    EXPECT_TRUE(has(r.out, line)) << line << "\n" << r.out;
  EXPECT_FALSE(has(r.out, "fallback: '%")) << r.out;
  EXPECT_FALSE(has(r.out, "dead: '%")) << r.out;
}

// A fallback reading a stored f32 intermediate rounds it: the tolerance follows that dtype.
TEST_F(Cli, ReferenceToleranceFollowsStoredIntermediates) {
  GraphFile f(std::string(kGemm) + "y = gelu(acc)\nt = transpose(y)\nz = exp(t)\noutput z: f32\n");
  Result r = comfuse("run " + f.arg() + " --reference --shape 64,64,64");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "(tolerance 1e-06)")) << r.out;
  EXPECT_TRUE(has(r.out, " OK")) << r.out;
}

TEST_F(Cli, DeviceLimitsAreRefusedByThePlannerInTheUsersNames) {
  // A per-row value leaving the kernel (the auto-named inner sum read by the outer one) is a
  // stored [M, 1] output; five of them exceed the kernel's per-row output slots.
  GraphFile per_row(std::string(kGemm) + "s = sum(sum(acc))\noutput s: f32\n");
  GraphFile five(std::string(kGemm) + "s1 = sum(acc)\ns2 = max(acc)\ns3 = min(acc)\ns4 = sum(relu(acc))\n"
                 "s5 = max(relu(acc))\noutput s1: f32\noutput s2: f32\noutput s3: f32\noutput s4: f32\n"
                 "output s5: f32\n");
  // f32 GEMM operands.
  GraphFile f32(std::string("input xf: f32[M, K]\ninput w: bf16[N, K]\nacc = matmul(xf, w)\noutput acc: bf16\n"));
  for (const char* cmd : {"explain", "emit", "compile"}) {
    SCOPED_TRACE(cmd);
    Result r = comfuse(std::string(cmd) + " " + per_row.arg() + " --shape 128,128,64");
    EXPECT_EQ(r.rc, 0) << r.err;
    Result f = comfuse(std::string(cmd) + " " + five.arg() + " --shape 128,128,64");
    EXPECT_EQ(f.rc, 1);
    EXPECT_TRUE(has(f.err, "the epilogue of GEMM 'acc' stores 5 per-row [M, 1] outputs ('s1'; 's2'")) << f.err;
    EXPECT_FALSE(has(f.err, "%")) << f.err;
    Result o = comfuse(std::string(cmd) + " " + f32.arg() + " --shape 128,128,64");
    EXPECT_EQ(o.rc, 1);
    EXPECT_TRUE(has(o.err, "plan: GEMM 'acc' reads operand A 'xf' in f32; the tensor cores take bf16 or f16")) << o.err;
  }
  // The CPU reference still runs them.
  EXPECT_EQ(comfuse("run " + per_row.arg() + " --reference --shape 64,64,64").rc, 0);
  EXPECT_EQ(comfuse("run " + five.arg() + " --reference --shape 64,64,64").rc, 0);
}

// A transposed operand is computed before the kernel and keeps its input's dtype.
TEST_F(Cli, TransposedOperandKeepsItsDtype) {
  GraphFile f("input x: bf16[K, M]\ninput w: bf16[N, K]\nxt = transpose(x)\nacc = matmul(xt, w)\noutput acc: bf16\n");
  Result lo = comfuse("lower " + f.arg());
  ASSERT_EQ(lo.rc, 0) << lo.err;
  EXPECT_TRUE(has(lo.out, "a0: operand_a xt bf16[M, K]")) << lo.out;
  EXPECT_TRUE(has(lo.out, "give 'x' to matmul 'acc' already transposed")) << lo.out;
  Result em = comfuse("emit " + f.arg() + " --shape 128,128,64");
  EXPECT_EQ(em.rc, 0) << em.err;
  GraphFile b("input x: bf16[M, K]\ninput w: bf16[K, N]\nwt = transpose(w)\nacc = matmul(x, wt)\noutput acc: bf16\n");
  Result hint = comfuse("lower " + b.arg());
  EXPECT_TRUE(has(hint.out, "matmul(x, w, layout=kn) reads B = 'w' in the other layout without a transpose")) << hint.out;
}

TEST_F(Cli, NothingToFuseIsOneErrorEverywhere) {
  const std::vector<std::pair<std::string, std::string>> graphs = {
      {"input x: bf16[M, K]\ny = relu(x)\noutput y: bf16\n", "nothing to fuse: the graph has no matmul"},
      {kGemm, "nothing to fuse: the graph has no outputs"},
      {"c = add(1, 2)\noutput c: f32\n", "nothing to fuse: the graph has no matmul"},
      {"c = const(2)\noutput c: f32\n", "output 'c' is the constant 2"},
      {std::string(kGemm) + "input b: bf16[N]\nb2 = mul(b, 2)\noutput b2: bf16\n",
       "nothing to fuse: no output depends on a matmul (matmul 'acc' reaches no output)"}};
  for (const auto& [text, says] : graphs) {
    GraphFile f(text);
    for (const char* cmd : {"lower", "explain", "emit", "compile", "run --reference"}) {
      SCOPED_TRACE(text + cmd);
      Result r = comfuse(std::string(cmd) + " " + f.arg() + (cmd[0] == 'l' ? "" : " --shape 64,64,64"));
      EXPECT_EQ(r.rc, 1);
      EXPECT_TRUE(has(r.err, says)) << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
    }
  }
}

TEST_F(Cli, DimensionsAndOptionsAreNeverIgnoredSilently) {
  const std::string ln = "'" + example("gemm_layernorm.cf") + "'";
  Result unknown = comfuse("explain " + ln + " --shape 128,4096,64 --dim Q=5");
  EXPECT_EQ(unknown.rc, 1);
  EXPECT_TRUE(has(unknown.err, "--dim Q: the graph has no dimension 'Q' (its dimensions: K, M, N)")) << unknown.err;
  GraphFile fixed("input x: bf16[M, K]\ninput w: bf16[4096, K]\nacc = matmul(x, w)\noutput acc: bf16\n");
  Result differs = comfuse("explain " + fixed.arg() + " --shape 128,256,64");
  EXPECT_EQ(differs.rc, 1);
  EXPECT_TRUE(has(differs.err, "--shape's N = 256, but the graph fixes N = 4096 (GEMM 'acc')")) << differs.err;
  EXPECT_EQ(comfuse("explain " + fixed.arg() + " --shape 128,4096,64").rc, 0);  // agreeing is fine
  Result twice = comfuse("explain " + ln + " --shape 128,4096,64 --dim M=256");
  EXPECT_EQ(twice.rc, 1);
  EXPECT_TRUE(has(twice.err, "--dim M = 256 contradicts --shape's M = 128")) << twice.err;
  // The CPU check takes no plan and runs no kernel: GPU-only options are usage errors.
  for (const char* opt : {"--tile-n 128", "--cluster-m 2", "--aggregation l2", "--trace t.csv", "--gpu"}) {
    SCOPED_TRACE(opt);
    Result r = comfuse("run " + ln + " --reference --shape 128,4096,64 " + opt);
    EXPECT_EQ(r.rc, 2);
    EXPECT_TRUE(has(r.err, "--reference excludes")) << r.err;
  }
  // Every bound dim is checked in the graph's name, whether a kernel reads it or not.
  Result dim = comfuse("explain " + ln + " --shape 128,512,64 --dim M=0");
  EXPECT_EQ(dim.rc, 1);
  EXPECT_TRUE(has(dim.err, "M = 0 contradicts")) << dim.err;
  GraphFile unused(std::string(kGemm) + "input extra: bf16[Q]\noutput acc: bf16\n");
  Result q = comfuse("explain " + unused.path.string() + " --shape 128,512,64 --dim Q=-5");
  EXPECT_EQ(q.rc, 1);
  EXPECT_TRUE(has(q.err, "--dim Q = -5: a dimension must be at least 1")) << q.err;
  // A seed is a whole number that fits 64 bits (a larger one was once saturated silently).
  for (const char* bad : {"-1", "99999999999999999999", "1.5"}) {
    Result seed = comfuse("run " + ln + " --reference --shape 128,512,64 --seed " + bad);
    EXPECT_EQ(seed.rc, 2);
    EXPECT_TRUE(has(seed.err, std::string("--seed: '") + bad + "' is not a whole number from 0 to 18446744073709551615"))
        << seed.err;
  }
}

TEST_F(Cli, InfiniteAndOutOfRangeLiterals) {
  GraphFile f(std::string(kGemm) + "y = max(acc, const(-inf))\nz = add(y, 1e300)\nq = mul(z, 1e-50)\noutput q: bf16\n");
  Result r = comfuse("emit " + f.arg() + " --shape 128,128,64");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "static constexpr float value = __builtin_bit_cast(float, 0xff800000u);")) << r.out;
  EXPECT_TRUE(has(r.out, "static constexpr float value = __builtin_bit_cast(float, 0x7f800000u);")) << r.out;
  EXPECT_FALSE(has(r.out, "__builtin_inff")) << r.out;
  EXPECT_TRUE(has(r.err, "warning: the constant 1e+300 inside 'z' (line 5) rounds to inf in f32")) << r.err;
  EXPECT_TRUE(has(r.err, "warning: the constant 1e-50 inside 'q' (line 6) rounds to 0 in f32")) << r.err;
}

// NVRTC compiles an infinite literal itself: no nvcc fallback (debug logs would show it).
TEST_F(Cli, InfiniteLiteralCompilesWithNvrtcAlone) {
  GraphFile f(std::string(kGemm) + "y = max(acc, const(-inf))\noutput y: bf16\n");
  const fs::path cache = fs::temp_directory_path() / ("comfuse_cli_cache_" + std::to_string(getpid()));
  Result r = comfuse("compile " + f.arg() + " --shape 128,128,64",
                     "COMFUSE_LOG=debug COMFUSE_JIT_COMPILER=nvrtc COMFUSE_NVCC=/nonexistent/nvcc COMFUSE_CACHE_DIR='" +
                         cache.string() + "'");
  fs::remove_all(cache);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "nvrtc-")) << r.out;
  EXPECT_TRUE(has(r.out, "stack 0 B, spills 0 B")) << r.out;  // ptxas's report of the kernel
  EXPECT_FALSE(has(r.out + r.err, "nvcc")) << r.out << r.err;
}

TEST_F(Cli, ProblemSizesAreValidatedOnEveryPath) {
  const std::string ln = "'" + example("gemm_bias_gelu.cf") + "'";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"2147483648,4096,4096", "M = 2147483648 exceeds 2147483392 (2^31 - 256)"},
      {"99999999999,4096,4096", "M = 99999999999 exceeds 2147483392"},
      {"2147483647,4096,4096", "M = 2147483647 exceeds 2147483392"},
      {"-5,4096,4096", "M = -5: a dimension must be at least 1"},
      {"0,4096,4096", "M = 0: a dimension must be at least 1"},
      {"64,64,0", "K = 0: a dimension must be at least 1"},
      {"2147483392,2147483392,64", "is 1125899638407184 tiles of 64 x 64"}};
  for (const auto& [shape, says] : cases)
    for (const char* cmd : {"explain", "emit", "run --reference"}) {
      SCOPED_TRACE(std::string(cmd) + " " + shape);
      Result r = comfuse(std::string(cmd) + " " + ln + " --shape " + shape);
      EXPECT_EQ(r.rc, 1);
      EXPECT_TRUE(has(r.err, says)) << r.err;
      EXPECT_FALSE(has(r.err, "internal")) << r.err;
    }
}

TEST_F(Cli, ReferenceMemoryIsBoundedAndLargeShapesSampleRows) {
  // 5000 chained nodes at a small shape: freed after their last use, so it runs.
  std::string chain = std::string(kGemm) + "v0 = relu(acc)\n";
  for (int i = 1; i < 5000; ++i) chain += "v" + std::to_string(i) + " = mul(v" + std::to_string(i - 1) + ", 1.0001)\n";
  chain += "output v4999: f32\n";
  GraphFile f(chain);
  Result r = comfuse("run " + f.arg() + " --reference --shape 64,64,64");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, " OK")) << r.out;
  // What would not fit is refused with the estimate, before any allocation.
  Result big = comfuse("run '" + example("gemm_bias_gelu.cf") + "' --reference --shape 64,100000,100000");
  EXPECT_EQ(big.rc, 1);
  EXPECT_TRUE(std::regex_search(big.err, std::regex("would hold about [0-9.]+ GiB .* its budget is 4.00 GiB"))) << big.err;
  // A large M checks 48 rows: every op is row-local.
  Result rows = comfuse("run '" + example("gemm_layernorm.cf") + "' --reference --shape 100000,256,256");
  EXPECT_EQ(rows.rc, 0) << rows.err;
  EXPECT_TRUE(has(rows.out, "(48 of 100000 rows: every op is row-local in M)")) << rows.out;
}

TEST_F(Cli, FilesThatAreNotGraphs) {
  const fs::path fifo = fs::temp_directory_path() / ("comfuse_cli_fifo_" + std::to_string(getpid()));
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Result f = comfuse("lower '" + fifo.string() + "'");  // must not block waiting for a writer
  fs::remove(fifo);
  EXPECT_EQ(f.rc, 1);
  EXPECT_TRUE(has(f.err, "is a FIFO; a graph file must be a regular file")) << f.err;
  Result d = comfuse("lower '" + fs::temp_directory_path().string() + "'");
  EXPECT_EQ(d.rc, 1);
  EXPECT_TRUE(has(d.err, "is a directory; a graph file must be a regular file")) << d.err;
  EXPECT_FALSE(has(d.err, "9223372036854775807")) << d.err;
  Result missing = comfuse("lower /nonexistent/graph.cf");
  EXPECT_TRUE(has(missing.err, "cannot open graph file '/nonexistent/graph.cf': No such file or directory"))
      << missing.err;
  Result notdir = comfuse("lower /etc/hostname/graph.cf");
  EXPECT_TRUE(has(notdir.err, ": Not a directory")) << notdir.err;
}

TEST_F(Cli, ParseErrorsShowAShortEscapedExcerpt) {
  GraphFile longline(std::string(kGemm) + "y = relu(acc) " + std::string(1 << 20, 'x') + "\noutput y: bf16\n");
  Result l = comfuse("lower " + longline.arg());
  EXPECT_EQ(l.rc, 1);
  EXPECT_LT(l.err.size(), 1000u) << l.err.size();
  EXPECT_TRUE(has(l.err, ":4:65537: line is 1048590 bytes long; the limit is 64 KiB")) << l.err.substr(0, 300);
  GraphFile esc(std::string(kGemm) + "y = relu(acc) \x1b]0;pwned\x07\x1b[2J\noutput y: bf16\n");
  Result e = comfuse("lower " + esc.arg());
  EXPECT_EQ(e.rc, 1);
  EXPECT_EQ(e.err.find('\x1b'), std::string::npos) << "a raw ESC reached the terminal";
  EXPECT_EQ(e.err.find('\x07'), std::string::npos);
  EXPECT_TRUE(has(e.err, "unexpected character byte 0x1b")) << e.err;
  EXPECT_TRUE(has(e.err, "y = relu(acc) \\x1b]0;pwned\\x07\\x1b[2J\n")) << e.err;
  // The caret stays under the offending byte after escaping.
  EXPECT_TRUE(has(e.err, "\n  " + std::string(14, ' ') + "^")) << e.err;
}

TEST_F(Cli, LoggingAndCacheDirectoryErrors) {
  const std::string ex = "compile '" + example("gemm_bias_gelu.cf") + "' --shape 128,128,64";
  Result log = comfuse(ex, "COMFUSE_LOG=bogus");
  EXPECT_EQ(log.rc, 1);
  EXPECT_TRUE(has(log.err, "COMFUSE_LOG='bogus' is not a log level (trace, debug, info, warn, error, critical, off)"))
      << log.err;
  Result cache = comfuse(ex, "COMFUSE_CACHE_DIR=/etc/hostname/cache");
  EXPECT_EQ(cache.rc, 1);
  EXPECT_TRUE(has(cache.err, "the JIT cache directory '/etc/hostname/cache' (from $COMFUSE_CACHE_DIR) is not writable"))
      << cache.err;
  EXPECT_FALSE(has(cache.err, "set COMFUSE_CACHE_DIR")) << cache.err;
}

}  // namespace
