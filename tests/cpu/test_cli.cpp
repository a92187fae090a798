// The `comfuse` binary end to end on examples/*.cf: exit codes, what each subcommand
// prints, and error messages. The binary is found beside this test binary (both are
// built into the same build directory), the examples through COMFUSE_SOURCE_DIR.
#include <gtest/gtest.h>
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

// Runs `comfuse ARGS`, capturing stdout and stderr apart.
Result comfuse(const std::string& args) {
  const fs::path err = fs::temp_directory_path() / ("comfuse_cli_err_" + std::to_string(getpid()));
  const std::string cmd = "'" + binary().string() + "' " + args + " 2>'" + err.string() + "'";
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

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(binary())) << "comfuse binary not found at " << binary() << " (build target comfuse)";
  }
};

const char* kExamples[] = {"gemm_bias_gelu.cf", "gemm_layernorm.cf", "gemm_rmsnorm.cf",
                           "gemm_softmax.cf",   "ffn.cf",            "attention.cf"};

// Extra dims some examples need beyond the first GEMM's M, N, K.
std::string extra_dims(const std::string& ex) {
  if (ex == "ffn.cf") return " --dim D=192";
  if (ex == "attention.cf") return " --dim DV=64";
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
  EXPECT_EQ(bad.rc, 1);
  EXPECT_TRUE(has(bad.err, "--stash wants fp32 or bf16")) << bad.err;
  // Paired reductions: softmax's max and sum of exp in one round by default at 8192 rows (16
  // jobs a CTA), forced at 256 (one job a CTA: two rounds by default), refused by name.
  Result sm = comfuse("explain '" + example("gemm_softmax.cf") + "' --shape 8192,4096,4096");
  ASSERT_EQ(sm.rc, 0) << sm.err;
  EXPECT_TRUE(has(sm.out, "max and sum of exp in one round")) << sm.out;
  Result sm256 = comfuse("explain '" + example("gemm_softmax.cf") + "' --shape 256,4096,4096");
  ASSERT_EQ(sm256.rc, 0) << sm256.err;
  EXPECT_FALSE(has(sm256.out, "max and sum of exp in one round")) << sm256.out;
  Result forced = comfuse("explain '" + example("gemm_softmax.cf") + "' --shape 256,4096,4096 --pairs one-round");
  ASSERT_EQ(forced.rc, 0) << forced.err;
  EXPECT_TRUE(has(forced.out, "max and sum of exp in one round")) << forced.out;
  Result bad_pairs = comfuse("explain '" + example("gemm_softmax.cf") + "' --shape 8192,4096,4096 --pairs three");
  EXPECT_EQ(bad_pairs.rc, 1);
  EXPECT_TRUE(has(bad_pairs.err, "--pairs wants one-round or two-rounds, got 'three'")) << bad_pairs.err;
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
    EXPECT_TRUE(has(r.out, "plan for fusion")) << r.out;
  }
}

TEST_F(Cli, RunReferenceEveryExample) {
  for (const char* ex : kExamples) {
    SCOPED_TRACE(ex);
    Result r = comfuse("run '" + example(ex) + "' --reference --shape 300,520,64 --seed 3" + extra_dims(ex));
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    EXPECT_TRUE(has(r.out, "max_abs")) << r.out;
    EXPECT_TRUE(has(r.out, " OK")) << r.out;
    EXPECT_FALSE(has(r.out, "MISMATCH")) << r.out;
  }
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

  r = comfuse("explain '" + example("gemm_layernorm.cf") + "' --shape 128,4096,64 --aggregation ring");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "--aggregation")) << r.err;
}

TEST_F(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(comfuse("").rc, 2);
  EXPECT_EQ(comfuse("explain").rc, 2);  // FILE missing
  EXPECT_EQ(comfuse("--help").rc, 0);
}

}  // namespace
