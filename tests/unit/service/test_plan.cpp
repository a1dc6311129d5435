// attntune plan: reading config.json files, the regimes' problems, the plan file, and the command.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "../../common/input_error.hpp"
#include "../../common/run_attntune.hpp"
#include "core/error.hpp"
#include "service/plan.hpp"

namespace test_plan {
using namespace attntune;
using attntune::testing::input_error_of;
using attntune::testing::run_attntune;
namespace fs = std::filesystem;

namespace {

std::string model_file(const std::string& name) {
  return (fs::path(attntune::testing::source_dir()) / "tests/data/models" / name).string();
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "attntune-plan-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> specs(const Plan& p, const std::string& regime = "") {
  std::vector<std::string> out;
  for (const auto& e : p.entries)
    if (regime.empty() || e.regime == regime) out.push_back(e.problem.str());
  return out;
}

ModelAttention llama3() { return read_model_config(model_file("llama3_8b.json")); }

// A config.json with the given members (JSON text without the braces).
std::string config_error(const TempDir& dir, const std::string& members) {
  const std::string path = dir.write("m.json", "{" + members + "}");
  return input_error_of([&] { read_model_config(path); });
}

}  // namespace

// ---- config.json ----------------------------------------------------------------------------

TEST(PlanModelConfig, ReadsLlama3Gqa) {
  const ModelAttention m = llama3();
  EXPECT_EQ(m.name, "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(m.source, "llama3_8b.json");
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.dtype, "bf16");
  EXPECT_EQ(m.dtype_note, "");
  EXPECT_EQ(m.max_context, 8192);
  EXPECT_TRUE(m.notes.empty());
}

TEST(PlanModelConfig, ReadsQwen2GroupOfSevenAndNamesItByModelType) {
  const ModelAttention m = read_model_config(model_file("qwen2_7b.json"));
  EXPECT_EQ(m.name, "qwen2");  // no _name_or_path
  EXPECT_EQ(m.heads, 28);
  EXPECT_EQ(m.kv_heads, 4);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.dtype, "bf16");
}

TEST(PlanModelConfig, Gemma2HeadDimWinsOverHiddenAndFloat32IsPlannedAsBf16) {
  const ModelAttention m = read_model_config(model_file("gemma2_9b.json"));
  EXPECT_EQ(m.heads, 16);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 256);  // not 3584 / 16 = 224
  EXPECT_EQ(m.dtype, "bf16");
  EXPECT_TRUE(has(m.dtype_note, "torch_dtype is float32")) << m.dtype_note;
  // Its variants (the soft-cap, the windows of alternate layers, the scale): PlanVariants below.
  EXPECT_EQ(m.notes.size(), 3u);
}

TEST(PlanModelConfig, Llama2IsMhaInFp16WhenKvHeadsAreNotGiven) {
  const ModelAttention m = read_model_config(model_file("llama2_7b.json"));
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 32);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.dtype, "fp16");
  EXPECT_EQ(m.max_context, 4096);
}

TEST(PlanModelConfig, FalconMultiQueryIsOneKvHeadOfDim64) {
  const ModelAttention m = read_model_config(model_file("falcon_7b.json"));
  EXPECT_EQ(m.name, "falcon");
  EXPECT_EQ(m.heads, 71);
  EXPECT_EQ(m.kv_heads, 1);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.max_context, 0);  // the config does not say
}

TEST(PlanModelConfig, MultimodalConfigIsReadFromTextConfig) {
  const ModelAttention m = read_model_config(model_file("gemma3_4b.json"));
  EXPECT_EQ(m.name, "gemma3");
  EXPECT_EQ(m.heads, 8);  // not the vision tower's 16
  EXPECT_EQ(m.kv_heads, 4);
  EXPECT_EQ(m.head_dim, 256);
  EXPECT_EQ(m.dtype, "bf16");  // top-level torch_dtype
  EXPECT_EQ(m.dtype_note, "");
}

TEST(PlanModelConfig, NameFallsBackToTheStemAndLocalPathsLoseTheirDirectories) {
  TempDir dir;
  const std::string plain = dir.write("tiny.json", R"({"num_attention_heads": 4, "hidden_size": 256})");
  const ModelAttention m = read_model_config(plain);
  EXPECT_EQ(m.name, "tiny");
  EXPECT_EQ(m.source, "tiny.json");
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.dtype, "bf16");
  EXPECT_TRUE(has(m.dtype_note, "no torch_dtype")) << m.dtype_note;

  const std::string local =
      dir.write("local.json", R"({"_name_or_path": "/home/me/ckpt/my-model/", "num_attention_heads": 4,
                                  "hidden_size": 256, "dtype": "float16"})");
  const ModelAttention l = read_model_config(local);
  EXPECT_EQ(l.name, "my-model");
  EXPECT_EQ(l.dtype, "fp16");  // transformers >= 4.56 writes "dtype"
}

TEST(PlanModelConfig, FalconNewDecoderKvHeadsAndNullsCountAsAbsent) {
  TempDir dir;
  const ModelAttention f = read_model_config(
      dir.write("f.json", R"({"num_attention_heads": 128, "num_kv_heads": 8, "hidden_size": 8192, "head_dim": null})"));
  EXPECT_EQ(f.kv_heads, 8);
  EXPECT_EQ(f.head_dim, 64);
}

TEST(PlanModelConfig, ErrorsNameTheFileAndTheKey) {
  TempDir dir;
  const std::string file = dir.file("m.json");
  EXPECT_EQ(config_error(dir, R"("hidden_size": 4096)"),
            file + ": no num_attention_heads (is this a Hugging Face config.json of a transformer?)");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32, "num_key_value_heads": 7, "hidden_size": 4096)"),
            file + ": num_key_value_heads (7) does not divide num_attention_heads (32)");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32, "hidden_size": 4100)"),
            file + ": hidden_size (4100) is not a multiple of num_attention_heads (32), and there is no head_dim");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32)"),
            file + ": no head_dim and no hidden_size: one of them gives the head dim");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32, "hidden_size": 2304)"),
            file +
                ": head dim 72 (hidden_size 2304 / num_attention_heads 32) is not supported: attntune's kernels "
                "serve every multiple of 16 from 32 to 256 (and head dims 512 for decode)");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32, "head_dim": 1024)"),
            file + ": head_dim 1024 is not supported: attntune's kernels serve every multiple of 16 from 32 to 256 "
                   "(and head dims 512 for decode)");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": "32", "hidden_size": 4096)"),
            file + ": num_attention_heads: expected a positive whole number, got the string \"32\"");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": -32, "hidden_size": 4096)"),
            file + ": num_attention_heads: expected a positive whole number, got -32");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32.5, "hidden_size": 4096)"),
            file + ": num_attention_heads: expected a positive whole number, got 32.5");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 32, "hidden_size": 4096, "torch_dtype": 16)"),
            file + ": torch_dtype: expected a string like \"bfloat16\", got 16");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 128, "kv_lora_rank": 512, "hidden_size": 7168)"),
            file + ": kv_lora_rank without qk_nope_head_dim: multi-head latent attention's head dims are "
                   "qk_nope_head_dim + qk_rope_head_dim (queries and keys) and v_head_dim (values)");
  EXPECT_EQ(config_error(dir, R"("num_attention_heads": 16, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                  "qk_rope_head_dim": 64, "v_head_dim": 100, "hidden_size": 2048)"),
            file + ": multi-head latent attention: v_head_dim 100 is not supported: attntune's kernels serve every "
                   "multiple of 16 from 32 to 256");
  // Keys in text_config are named with it.
  EXPECT_EQ(config_error(dir, R"("text_config": {"num_attention_heads": 32, "num_key_value_heads": 5,
                                  "hidden_size": 4096})"),
            file + ": text_config.num_key_value_heads (5) does not divide text_config.num_attention_heads (32)");
}

TEST(PlanModelConfig, BadFilesAreInputErrorsWithPositions) {
  TempDir dir;
  const std::string bad = dir.write("bad.json", "{\n  \"num_attention_heads\": 32,\n  \"hidden_size\": 4096,,\n}\n");
  const std::string e = input_error_of([&] { read_model_config(bad); });
  EXPECT_TRUE(e.starts_with(bad + ":3:23: invalid JSON: syntax error")) << e;
  const std::string empty = dir.write("empty.json", "");
  EXPECT_TRUE(input_error_of([&] { read_model_config(empty); }).starts_with(empty + ":1:1: invalid JSON"));
  EXPECT_EQ(input_error_of([&] { read_model_config(dir.file("nope.json")); }),
            dir.file("nope.json") + ": no such file");
  EXPECT_TRUE(has(input_error_of([&] { read_model_config(dir.file("")); }), "is a directory"));
  EXPECT_EQ(input_error_of([&] { read_model_config(dir.write("list.json", "[1, 2]")); }),
            dir.file("list.json") + ": expected a JSON object (a Hugging Face config.json), got a list");
}

// ---- attention variants: windows, soft-caps, sinks, and what is refused ----------------------

namespace {

LayerKind kind(const std::string& name, std::int64_t window, double softcap, bool sinks, int layers) {
  return LayerKind{name, window, softcap, sinks, layers};
}

// sliding_window W's note, at the scope's key name.
std::string window_note(const std::string& key, int w) {
  return key + " " + std::to_string(w) + ": a query of a sliding_attention layer sees " + std::to_string(w) +
         " keys, its own included (transformers, vLLM), so their problems have window=" + std::to_string(w - 1) +
         ": call the library with window_left " + std::to_string(w - 1) + " and is_causal 1";
}

const std::string kAlibi =
    "the model adds ALiBi position biases to its attention scores (a per-head penalty linear in the distance from "
    "query to key), which attntune's kernels do not compute";

}  // namespace

TEST(PlanVariants, MistralSlidesAWindowOf4096KeysOnEveryLayer) {
  const ModelAttention m = read_model_config(model_file("mistral_7b_v01.json"));
  EXPECT_EQ(m.name, "mistralai/Mistral-7B-v0.1");
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.layers, 32);
  // sliding_window 4096 is 4096 keys, the query's own included: window=4095.
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("sliding_attention", 4095, 0, false, 32)}));
  EXPECT_EQ(m.notes, (std::vector<std::string>{window_note("sliding_window", 4096)}));
  EXPECT_EQ(m.softmax_scale, 0);

  const Plan p = make_plan(m, PlanOptions{});
  ASSERT_EQ(p.entries.size(), 15u);  // as a plain model's: one kind of layer
  EXPECT_EQ(p.entries[0],
            (PlanEntry{Problem::parse("b=1,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,window=4095"), "prefill",
                       "sliding_attention, 32 of 32 layers"}));
  EXPECT_EQ(p.entries.back().problem.str(),
            "b=64,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=1,page=16,window=4095");
  for (const PlanEntry& e : p.entries) {
    EXPECT_EQ(e.problem.window_left, 4095) << e.problem.str();
    EXPECT_TRUE(e.problem.causal);
    EXPECT_FALSE(e.problem.softcapped() || e.problem.sinks) << e.problem.str();
    EXPECT_EQ(e.layers, "sliding_attention, 32 of 32 layers");
  }
  // A decode step over 32768 keys reads only the window's 4096.
  const Problem full = Problem::parse("b=64,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=1,page=16");
  EXPECT_LT(p.entries.back().problem.bytes() * 7, full.bytes());

  // The chunk and varlen regimes carry the window too.
  PlanOptions o;
  o.regimes = {"chunk", "varlen"};
  o.batch = {1};
  o.seqlen = {512};
  o.context = {2048};
  EXPECT_EQ(specs(make_plan(m, o)),
            (std::vector<std::string>{"b=1,h=32,hkv=8,s=2048,sk=4096,d=128,dtype=bf16,causal=1,page=16,window=4095",
                                      "b=1,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=32,window=4095"}));
}

TEST(PlanVariants, GptOssPlansItsFullAndWindowedLayersWithSinks) {
  const ModelAttention m = read_model_config(model_file("gpt_oss_20b.json"));
  EXPECT_EQ(m.name, "gpt_oss");
  EXPECT_EQ(m.heads, 64);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 64);  // head_dim, not hidden 2880 / 64 = 45
  EXPECT_EQ(m.dtype, "bf16");
  EXPECT_TRUE(has(m.dtype_note, "no torch_dtype")) << m.dtype_note;  // as the published config
  EXPECT_EQ(m.layers, 24);
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, true, 12),
                                                    kind("sliding_attention", 127, 0, true, 12)}));
  ASSERT_EQ(m.notes.size(), 2u);
  EXPECT_EQ(m.notes[0], window_note("sliding_window", 128));
  EXPECT_EQ(m.notes[1],
            "model_type gpt_oss: every layer has learnable per-head attention sinks (self_attn.sinks in the "
            "checkpoint), so the problems have sinks=1: pass each layer's sink logits as [heads_q] fp32 "
            "(attntune_options.sinks)");

  // Each regime for each kind of layer: prefill full, prefill windowed, decode full, decode windowed.
  const Plan p = make_plan(m, PlanOptions{});
  ASSERT_EQ(p.entries.size(), 30u);
  const std::string full = "full_attention, 12 of 24 layers", sliding = "sliding_attention, 12 of 24 layers";
  EXPECT_EQ(p.entries[0], (PlanEntry{Problem::parse("b=1,h=64,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1,sinks=1"),
                                     "prefill", full}));
  EXPECT_EQ(p.entries[5].problem.str(), "b=8,h=64,hkv=8,s=8192,sk=8192,d=64,dtype=bf16,causal=1,sinks=1");
  EXPECT_EQ(p.entries[6], (PlanEntry{Problem::parse("b=1,h=64,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1,window=127,"
                                                    "sinks=1"),
                                     "prefill", sliding}));
  EXPECT_EQ(p.entries[12], (PlanEntry{Problem::parse("b=1,h=64,hkv=8,s=1,sk=2048,d=64,dtype=bf16,causal=1,page=16,"
                                                     "sinks=1"),
                                      "decode", full}));
  EXPECT_EQ(p.entries[21], (PlanEntry{Problem::parse("b=1,h=64,hkv=8,s=1,sk=2048,d=64,dtype=bf16,causal=1,page=16,"
                                                     "window=127,sinks=1"),
                                      "decode", sliding}));
  EXPECT_EQ(p.entries[29].problem.str(),
            "b=64,h=64,hkv=8,s=1,sk=32768,d=64,dtype=bf16,causal=1,page=16,window=127,sinks=1");
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    const bool windowed = (i >= 6 && i < 12) || i >= 21;
    EXPECT_EQ(p.entries[i].layers, windowed ? sliding : full) << i;
    EXPECT_EQ(p.entries[i].problem.window_left, windowed ? 127 : -1) << i;
    EXPECT_TRUE(p.entries[i].problem.sinks) << i;
  }
  // Tensor parallelism splits the heads (and the sinks with them) as for any model.
  PlanOptions o;
  o.tp = 8;
  o.regimes = {"prefill"};
  o.batch = {1};
  o.seqlen = {512};
  EXPECT_EQ(specs(make_plan(m, o)),
            (std::vector<std::string>{"b=1,h=8,hkv=1,s=512,sk=512,d=64,dtype=bf16,causal=1,sinks=1",
                                      "b=1,h=8,hkv=1,s=512,sk=512,d=64,dtype=bf16,causal=1,window=127,sinks=1"}));
}

TEST(PlanVariants, Qwen2SlidesOnlyPastMaxWindowLayersAndOnlyWhenUseSlidingWindow) {
  const ModelAttention on = read_model_config(model_file("qwen25_1p5b_swa.json"));
  EXPECT_EQ(on.heads, 12);
  EXPECT_EQ(on.kv_heads, 2);
  EXPECT_EQ(on.head_dim, 128);
  // transformers' Qwen2: the first max_window_layers (21) layers full, the other 7 windowed.
  EXPECT_EQ(on.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 21),
                                                     kind("sliding_attention", 32767, 0, false, 7)}));
  EXPECT_EQ(on.notes, (std::vector<std::string>{window_note("sliding_window", 32768)}));
  PlanOptions o;
  o.regimes = {"decode"};
  o.decode_batch = {1};
  o.context = {65536};
  const Plan p = make_plan(on, o);
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0], (PlanEntry{Problem::parse("b=1,h=12,hkv=2,s=1,sk=65536,d=128,dtype=bf16,causal=1,page=16"),
                                     "decode", "full_attention, 21 of 28 layers"}));
  EXPECT_EQ(p.entries[1],
            (PlanEntry{Problem::parse("b=1,h=12,hkv=2,s=1,sk=65536,d=128,dtype=bf16,causal=1,page=16,window=32767"),
                       "decode", "sliding_attention, 7 of 28 layers"}));

  // Qwen2 7B as published: use_sliding_window false, so its sliding_window 131072 is not used.
  const ModelAttention off = read_model_config(model_file("qwen2_7b.json"));
  EXPECT_EQ(off.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 28)}));
  EXPECT_TRUE(off.notes.empty());
  EXPECT_FALSE(off.has_variants());
  for (const PlanEntry& e : make_plan(off, PlanOptions{}).entries) EXPECT_EQ(e.layers, "");
}

TEST(PlanVariants, Gemma2AlternatesWindowedLayersAndCapsEveryLayer) {
  const ModelAttention m = read_model_config(model_file("gemma2_9b.json"));
  EXPECT_EQ(m.layers, 42);
  // transformers' Gemma2: layer 0 windowed, layer 1 full, ...: 21 and 21; the cap on both.
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 50, false, 21),
                                                    kind("sliding_attention", 4095, 50, false, 21)}));
  EXPECT_DOUBLE_EQ(m.softmax_scale, 0.0625);
  EXPECT_EQ(m.notes,
            (std::vector<std::string>{
                window_note("sliding_window", 4096),
                "attn_logit_softcapping 50.0: every layer caps its attention scores, softcap * tanh(scale * q.k / "
                "softcap), so the problems have softcap=50: pass attntune_options.softcap 50",
                "the softmax scale is query_pre_attn_scalar^-0.5 = 256^-0.5 = 0.0625, which is head_dim^-0.5 too: the "
                "usual softmax_scale (1/sqrt(head_dim)) is right"}));
  PlanOptions o;
  o.regimes = {"prefill"};
  o.batch = {1};
  o.seqlen = {8192};
  const Plan p = make_plan(m, o);
  EXPECT_EQ(p.entries, (std::vector<PlanEntry>{
                           {Problem::parse("b=1,h=16,hkv=8,s=8192,sk=8192,d=256,dtype=bf16,causal=1,softcap=50"),
                            "prefill", "full_attention, 21 of 42 layers"},
                           {Problem::parse("b=1,h=16,hkv=8,s=8192,sk=8192,d=256,dtype=bf16,causal=1,window=4095,"
                                           "softcap=50"),
                            "prefill", "sliding_attention, 21 of 42 layers"}}));
  // The windowed layers' FLOPs count only what the window lets a query see.
  EXPECT_LT(p.entries[1].problem.flops(), 0.8 * p.entries[0].problem.flops());
}

TEST(PlanVariants, Gemma3HasOneGlobalLayerInSixFromItsTextConfig) {
  const ModelAttention m = read_model_config(model_file("gemma3_4b.json"));
  EXPECT_EQ(m.layers, 34);
  // sliding_window_pattern 6: layers 5, 11, 17, 23 and 29 full; attn_logit_softcapping null: no cap.
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 5),
                                                    kind("sliding_attention", 1023, 0, false, 29)}));
  EXPECT_EQ(m.notes, (std::vector<std::string>{
                         window_note("text_config.sliding_window", 1024),
                         "the softmax scale is text_config.query_pre_attn_scalar^-0.5 = 256^-0.5 = 0.0625, which is "
                         "head_dim^-0.5 too: the usual softmax_scale (1/sqrt(head_dim)) is right"}));
  const Plan p = make_plan(m, PlanOptions{});
  ASSERT_EQ(p.entries.size(), 30u);
  EXPECT_EQ(p.entries[6].problem.str(), "b=1,h=8,hkv=4,s=512,sk=512,d=256,dtype=bf16,causal=1,window=1023");
  EXPECT_EQ(p.entries[6].layers, "sliding_attention, 29 of 34 layers");
  EXPECT_EQ(p.entries[0].layers, "full_attention, 5 of 34 layers");
}

TEST(PlanVariants, LayerRulesFollowTransformersConfigClasses) {
  TempDir dir;
  auto read = [&](const std::string& members) { return read_model_config(dir.write("m.json", "{" + members + "}")); };
  const std::string heads = R"("num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, )";
  // layer_types wins over every other rule, and counts the layers.
  ModelAttention m = read(heads + R"("model_type": "gemma2", "sliding_window": 512, "layer_types":
                                     ["full_attention", "sliding_attention", "sliding_attention"])");
  EXPECT_EQ(m.layers, 3);
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 1),
                                                    kind("sliding_attention", 511, 0, false, 2)}));
  // Gemma 3 without sliding_window_pattern: transformers' default, one full layer in 6.
  m = read(heads + R"("model_type": "gemma3_text", "sliding_window": 512, "num_hidden_layers": 12)");
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 2),
                                                    kind("sliding_attention", 511, 0, false, 10)}));
  EXPECT_EQ(m.notes.front(), "no sliding_window_pattern: planning transformers' gemma3_text default, one "
                             "full_attention layer in 6");
  // Qwen2 with use_sliding_window and no max_window_layers: transformers' default, 28 full layers.
  m = read(heads + R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4096,
                      "num_hidden_layers": 30)");
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 28),
                                                    kind("sliding_attention", 4095, 0, false, 2)}));
  EXPECT_EQ(m.notes.front(), "use_sliding_window is true and there is no max_window_layers: planning transformers' "
                             "Qwen2 default, the first 28 layers full attention");
  // max_window_layers 0: every layer windowed.
  m = read(heads + R"("use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 0,
                      "num_hidden_layers": 4)");
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("sliding_attention", 4095, 0, false, 4)}));
  // use_sliding_window false: the layers layer_types calls sliding run full attention, said once.
  m = read(heads + R"("use_sliding_window": false, "sliding_window": 4096,
                      "layer_types": ["full_attention", "sliding_attention"])");
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 2)}));
  EXPECT_EQ(m.notes, (std::vector<std::string>{"use_sliding_window is false: the 1 layer that layer_types calls "
                                               "sliding_attention run full attention (as transformers' Qwen2 runs "
                                               "them)"}));
  EXPECT_FALSE(m.has_variants());
  // A window and no layer count (Phi-3 style): every layer, uncounted.
  m = read(heads + R"("sliding_window": 2047)");
  EXPECT_EQ(m.layers, 0);
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("sliding_attention", 2046, 0, false, 0)}));
  PlanOptions o;
  o.regimes = {"prefill"};
  o.batch = {1};
  o.seqlen = {512};
  EXPECT_EQ(make_plan(m, o).entries.at(0).layers, "sliding_attention, every layer");
  // A window of 1 key: the query's own (window=0).
  m = read(heads + R"("sliding_window": 1, "num_hidden_layers": 2)");
  EXPECT_EQ(m.layer_kinds.at(0).window, 0);
  // Nulls are absent: no window, no cap (a Mistral v0.2 style config).
  m = read(heads + R"("model_type": "mistral", "sliding_window": null, "attn_logit_softcapping": null,
                      "num_hidden_layers": 32)");
  EXPECT_EQ(m.layer_kinds, (std::vector<LayerKind>{kind("full_attention", -1, 0, false, 32)}));
  EXPECT_TRUE(m.notes.empty());
}

TEST(PlanVariants, AScaleThatIsNotHeadDimsIsNamedWithTheValueToPass) {
  TempDir dir;
  auto read = [&](const std::string& members) { return read_model_config(dir.write("m.json", "{" + members + "}")); };
  // Gemma 2 27B: query_pre_attn_scalar 144 (hidden 4608 / 32 heads) over heads of 128.
  ModelAttention m = read(R"("model_type": "gemma2", "num_attention_heads": 32, "num_key_value_heads": 16,
                             "head_dim": 128, "hidden_size": 4608, "num_hidden_layers": 46, "sliding_window": 4096,
                             "query_pre_attn_scalar": 144)");
  EXPECT_DOUBLE_EQ(m.softmax_scale, 1.0 / 12);
  EXPECT_EQ(m.notes.back(),
            "the softmax scale is query_pre_attn_scalar^-0.5 = 144^-0.5 = 0.08333333, not head_dim^-0.5 = 0.08838835: "
            "problem specs have no scale (the kernels take it at run time), so pass softmax_scale 0.08333333 on every "
            "call (scale= in PyTorch)");
  // Granite: attention_multiplier is the scale.
  m = read(R"("model_type": "granite", "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "attention_multiplier": 0.0078125)");
  EXPECT_DOUBLE_EQ(m.softmax_scale, 0.0078125);
  EXPECT_EQ(m.notes, (std::vector<std::string>{
                         "the softmax scale is attention_multiplier = 0.0078125, not head_dim^-0.5 = 0.08838835: "
                         "problem specs have no scale (the kernels take it at run time), so pass softmax_scale "
                         "0.0078125 on every call (scale= in PyTorch)"}));
  EXPECT_FALSE(m.has_variants());  // a scale is a run-time argument, not a variant
}

TEST(PlanVariants, AttentionTheKernelsDoNotComputeIsRefusedNamingTheKey) {
  const std::string falcon = model_file("falcon_rw_1b.json");
  EXPECT_EQ(input_error_of([&] { read_model_config(falcon); }), falcon + ": alibi: true: " + kAlibi);
  // Falcon 7B says alibi false: planned.
  EXPECT_NO_THROW(read_model_config(model_file("falcon_7b.json")));

  TempDir dir;
  const std::string file = dir.file("m.json");
  const std::string heads = R"("num_attention_heads": 8, "hidden_size": 1024, )";
  // BLOOM has no key for its ALiBi, and no num_attention_heads either: the refusal comes first.
  EXPECT_EQ(config_error(dir, R"("model_type": "bloom", "n_head": 16, "hidden_size": 1024)"),
            file + ": model_type bloom: " + kAlibi);
  EXPECT_EQ(config_error(dir, R"("model_type": "mpt", "n_heads": 32, "d_model": 4096,
                                  "attn_config": {"alibi": true, "attn_impl": "torch"})"),
            file + ": attn_config.alibi: true: " + kAlibi);
  EXPECT_EQ(config_error(dir, heads + R"("position_embedding_type": "alibi")"),
            file + ": position_embedding_type: \"alibi\": " + kAlibi);
  EXPECT_EQ(config_error(dir, heads + R"("alibi": "yes")"),
            file + ": alibi: expected true or false, got the string \"yes\"");
  EXPECT_EQ(config_error(dir, R"("model_type": "llama4", "text_config": {"num_attention_heads": 40,
                                  "num_key_value_heads": 8, "head_dim": 128, "attention_chunk_size": 8192})"),
            file + ": text_config.attention_chunk_size 8192: chunked attention (Llama 4: a query sees only the keys of "
                   "its own chunk of tokens) is not what attntune's kernels compute");
  EXPECT_EQ(config_error(dir, heads + R"("layer_types": ["chunked_attention", "chunked_attention", "full_attention"])"),
            file + ": layer_types[0] is \"chunked_attention\" (2 of 3 layers): chunked attention (Llama 4: a query "
                   "sees only the keys of its own chunk of attention_chunk_size tokens) is not what attntune's kernels "
                   "compute; they serve full_attention and sliding_attention layers");
  EXPECT_EQ(config_error(dir, heads + R"("layer_types": ["full_attention", "linear_attention"])"),
            file + ": layer_types[1] is \"linear_attention\" (1 of 2 layers): attntune's kernels serve full_attention "
                   "and sliding_attention layers only");
  EXPECT_EQ(config_error(dir, heads + R"("use_bidirectional_attention": true)"),
            file + ": use_bidirectional_attention: true: the model's attention is bidirectional (an encoder), and plan "
                   "plans the causal attention of a decoder");
  // Inconsistent or mistyped layer keys.
  EXPECT_EQ(config_error(dir, heads + R"("num_hidden_layers": 3, "layer_types": ["full_attention"])"),
            file + ": layer_types lists 1 layer and num_hidden_layers is 3");
  EXPECT_EQ(config_error(dir, heads + R"("layer_types": "full_attention")"),
            file + ": layer_types: expected a list of \"full_attention\" and \"sliding_attention\", got the string "
                   "\"full_attention\"");
  EXPECT_EQ(config_error(dir, heads + R"("layer_types": [1])"),
            file + ": layer_types[0]: expected a string like \"full_attention\", got 1");
  EXPECT_EQ(config_error(dir, heads + R"("layer_types": ["sliding_attention", "full_attention"])"),
            file + ": layer_types lists 1 sliding_attention layer and there is no sliding_window (the window's "
                   "length)");
  EXPECT_EQ(config_error(dir, heads + R"("model_type": "mistral")"),
            file + ": no sliding_window: transformers' mistral configuration then uses its default window, which "
                   "attntune does not guess: give sliding_window (null for none)");
  EXPECT_EQ(config_error(dir, heads + R"("model_type": "gpt_oss", "layer_types": ["sliding_attention"])"),
            file + ": no sliding_window: transformers' gpt_oss configuration then uses its default window, which "
                   "attntune does not guess: give sliding_window (null for none)");
  EXPECT_EQ(read_model_config(dir.write("full.json", "{" + heads + R"("model_type": "gpt_oss",
                                        "layer_types": ["full_attention"]})"))
                .layer_kinds,
            (std::vector<LayerKind>{kind("full_attention", -1, 0, true, 1)}));  // no window to guess
  EXPECT_EQ(config_error(dir, heads + R"("model_type": "gemma2", "sliding_window": 4096)"),
            file + ": no num_hidden_layers: gemma2's alternation of sliding and full layers needs the number of "
                   "layers");
  EXPECT_EQ(config_error(dir, heads + R"("sliding_window": 0)"),
            file + ": sliding_window: expected a positive whole number, got 0");
  EXPECT_EQ(config_error(dir, heads + R"("sliding_window": 4096, "use_sliding_window": "true")"),
            file + ": use_sliding_window: expected true or false, got the string \"true\"");
  EXPECT_EQ(config_error(dir, heads + R"("use_sliding_window": true, "sliding_window": 4096, "num_hidden_layers": 4,
                                         "max_window_layers": -1)"),
            file + ": max_window_layers: expected a whole number (0 or more), got -1");
  EXPECT_EQ(config_error(dir, heads + R"("attn_logit_softcapping": -50)"),
            file + ": attn_logit_softcapping: expected a positive number (null: no cap), got -50");
  EXPECT_EQ(config_error(dir, heads + R"("attn_logit_softcapping": "50")"),
            file + ": attn_logit_softcapping: expected a positive number (null: no cap), got the string \"50\"");
  EXPECT_EQ(config_error(dir, heads + R"("query_pre_attn_scalar": 0)"),
            file + ": query_pre_attn_scalar: expected a positive number, got 0");
}

// ---- make_plan ------------------------------------------------------------------------------

TEST(PlanMake, DefaultsArePrefillAndDecodeInTheModelsDtype) {
  const Plan p = make_plan(llama3(), PlanOptions{});
  EXPECT_EQ(p.model, "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(p.source, "llama3_8b.json");
  const std::vector<std::string> prefill = {"b=1,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1",
                                            "b=1,h=32,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=1",
                                            "b=1,h=32,hkv=8,s=8192,sk=8192,d=128,dtype=bf16,causal=1",
                                            "b=8,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1",
                                            "b=8,h=32,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=1",
                                            "b=8,h=32,hkv=8,s=8192,sk=8192,d=128,dtype=bf16,causal=1"};
  EXPECT_EQ(specs(p, "prefill"), prefill);
  const std::vector<std::string> decode = specs(p, "decode");
  ASSERT_EQ(decode.size(), 9u);  // 3 batches x 3 contexts x q-len 1
  EXPECT_EQ(decode.front(), "b=1,h=32,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=1,page=16");
  EXPECT_EQ(decode.back(), "b=64,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=1,page=16");
  EXPECT_EQ(p.entries.size(), 15u);
  EXPECT_TRUE(specs(p, "chunk").empty());
  EXPECT_EQ(p.entries.front().regime, "prefill");
}

TEST(PlanMake, DecodeTakesEachQLenOverEachContext) {
  PlanOptions o;
  o.regimes = {"decode"};
  o.decode_batch = {2};
  o.context = {4096, 1024};
  o.q_len = {4, 1};
  o.page = 0;  // contiguous
  const Plan p = make_plan(read_model_config(model_file("qwen2_7b.json")), o);
  const std::vector<std::string> want = {
      "b=2,h=28,hkv=4,s=1,sk=1024,d=128,dtype=bf16,causal=1", "b=2,h=28,hkv=4,s=1,sk=4096,d=128,dtype=bf16,causal=1",
      "b=2,h=28,hkv=4,s=4,sk=1024,d=128,dtype=bf16,causal=1", "b=2,h=28,hkv=4,s=4,sk=4096,d=128,dtype=bf16,causal=1"};
  EXPECT_EQ(specs(p), want);
}

TEST(PlanMake, ChunkIsAChunkOverAPagedCacheOfContextKeys) {
  PlanOptions o;
  o.regimes = {"chunk"};
  o.batch = {4};
  o.context = {2048, 8192};
  o.chunk = 1024;
  o.page = 64;
  const Plan p = make_plan(read_model_config(model_file("falcon_7b.json")), o);
  const std::vector<std::string> want = {"b=4,h=71,hkv=1,s=1024,sk=3072,d=64,dtype=bf16,causal=1,page=64",
                                         "b=4,h=71,hkv=1,s=1024,sk=9216,d=64,dtype=bf16,causal=1,page=64"};
  EXPECT_EQ(specs(p, "chunk"), want);
  EXPECT_EQ(p.entries.size(), 2u);
}

TEST(PlanMake, VarlenPacksEachPrefillBatchAndLengthWithPromptsFromASixteenth) {
  PlanOptions o;
  o.regimes = {"varlen"};
  const Plan p = make_plan(llama3(), o);
  // The prefill sizes (--batch 1,8 x --seqlen 512,2048,8192), lengths drawn from s/16..s.
  const std::vector<std::string> want = {
      "b=1,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=32",
      "b=1,h=32,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=1,varlen=128",
      "b=1,h=32,hkv=8,s=8192,sk=8192,d=128,dtype=bf16,causal=1,varlen=512",
      "b=8,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=32",
      "b=8,h=32,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=1,varlen=128",
      "b=8,h=32,hkv=8,s=8192,sk=8192,d=128,dtype=bf16,causal=1,varlen=512"};
  EXPECT_EQ(specs(p, "varlen"), want);
  EXPECT_EQ(p.entries.size(), 6u);
  for (const auto& e : p.entries) {
    EXPECT_EQ(Problem::parse(e.problem.str()), e.problem);  // what tune --problem and Plan::load read back
    EXPECT_EQ(e.problem.lens_seed, 0);
  }
  // Under 16 tokens the shortest prompt is 1; --tp and --dtype apply as to prefill.
  o.seqlen = {15, 16, 100};
  o.batch = {4};
  o.tp = 2;
  o.dtype = "fp16";
  EXPECT_EQ(specs(make_plan(llama3(), o)),
            (std::vector<std::string>{"b=4,h=16,hkv=4,s=15,sk=15,d=128,dtype=fp16,causal=1,varlen=1",
                                      "b=4,h=16,hkv=4,s=16,sk=16,d=128,dtype=fp16,causal=1,varlen=1",
                                      "b=4,h=16,hkv=4,s=100,sk=100,d=128,dtype=fp16,causal=1,varlen=6"}));
  EXPECT_EQ(varlen_shortest(1), 1);
  EXPECT_EQ(varlen_shortest(31), 1);
  EXPECT_EQ(varlen_shortest(32), 2);
}

TEST(PlanMake, VarlenIsOptInAndListedAfterTheOtherRegimes) {
  // The default regimes are unchanged: prefill and decode, no packed batches.
  EXPECT_EQ(PlanOptions{}.regimes, (std::vector<std::string>{"prefill", "decode"}));
  EXPECT_TRUE(specs(make_plan(llama3(), PlanOptions{}), "varlen").empty());
  PlanOptions o;
  o.regimes = {"varlen", "prefill", "chunk", "decode"};
  o.dtype = "both";
  const Plan p = make_plan(llama3(), o);
  // 2 dtypes x (prefill 6 + decode 9 + chunk 6 + varlen 6): varlen never collides with dense prefill.
  ASSERT_EQ(p.entries.size(), 54u);
  EXPECT_EQ(p.entries.front().regime, "prefill");
  EXPECT_EQ(p.entries.back().regime, "varlen");
  EXPECT_EQ(p.entries.back().problem.str(), "b=8,h=32,hkv=8,s=8192,sk=8192,d=128,dtype=fp16,causal=1,varlen=512");
  EXPECT_EQ(specs(p, "varlen").size(), 12u);
}

TEST(PlanMake, VarlenRefusesMoreRowsThanCuSeqlensHold) {
  PlanOptions o;
  o.regimes = {"varlen"};
  o.batch = {1, 4096};
  o.seqlen = {1048576};
  EXPECT_EQ(input_error_of([&] { make_plan(llama3(), o); }),
            "varlen: --batch 4096 x --seqlen 1048576 is 4294967296 rows, more than a packed batch holds "
            "(2147483647: cu_seqlens are int)");
  o.batch = {2047};  // 2047 * 2^20 rows fit
  EXPECT_EQ(make_plan(llama3(), o).entries.size(), 1u);
  o.batch = {4096};
  o.regimes = {"prefill"};  // a check of the varlen regime only
  EXPECT_EQ(make_plan(llama3(), o).entries.size(), 1u);
}

TEST(PlanMake, OrderIsRegimeThenDtypeThenSizesWhateverTheOptionsOrder) {
  PlanOptions o;
  o.regimes = {"chunk", "decode", "prefill"};
  o.dtype = "both";
  o.batch = {8, 1};
  o.seqlen = {2048, 512};
  o.decode_batch = {16, 1};
  o.context = {8192, 2048};
  const Plan p = make_plan(read_model_config(model_file("llama2_7b.json")), o);
  // 2 dtypes x (prefill 2x2 + decode 2x2 + chunk 2x2)
  ASSERT_EQ(p.entries.size(), 24u);
  std::map<std::string, int> rank = {{"prefill", 0}, {"decode", 1}, {"chunk", 2}};
  auto key = [&](const PlanEntry& e) {
    return std::make_tuple(rank.at(e.regime), std::string(dtype_name(e.problem.dtype)), e.problem.b, e.problem.s,
                           e.problem.sk);
  };
  for (std::size_t i = 1; i < p.entries.size(); ++i)
    EXPECT_LT(key(p.entries[i - 1]), key(p.entries[i])) << i << ": " << p.entries[i].problem.str();
  EXPECT_EQ(p.entries.front().problem.str(), "b=1,h=32,hkv=32,s=512,sk=512,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(p.entries[4].problem.str(), "b=1,h=32,hkv=32,s=512,sk=512,d=128,dtype=fp16,causal=1");
  EXPECT_EQ(p.entries.back().regime, "chunk");
  EXPECT_EQ(p.entries.back().problem.dtype, DType::kFp16);
}

TEST(PlanMake, DtypeModelFollowsTheConfigAndFixedDtypesOverrideIt) {
  PlanOptions o;
  o.regimes = {"prefill"};
  EXPECT_EQ(make_plan(read_model_config(model_file("llama2_7b.json")), o).entries[0].problem.dtype, DType::kFp16);
  o.dtype = "bf16";
  EXPECT_EQ(make_plan(read_model_config(model_file("llama2_7b.json")), o).entries[0].problem.dtype, DType::kBf16);
  o.dtype = "fp16";
  EXPECT_EQ(make_plan(llama3(), o).entries[0].problem.dtype, DType::kFp16);
}

TEST(PlanMake, RepeatedSizesAndProblemsOfTwoRegimesAppearOnce) {
  PlanOptions o;
  o.regimes = {"prefill", "decode", "chunk"};
  o.batch = {1, 1};
  o.seqlen = {512, 512};
  o.decode_batch = {1};
  o.context = {2048, 2048};
  o.q_len = {512};
  o.chunk = 512;
  o.page = 16;
  const Plan p = make_plan(llama3(), o);
  // decode b=1,s=512,sk=2048 and chunk b=1,s=512,sk=2560 differ; prefill is dense.
  EXPECT_EQ(p.entries.size(), 3u);
  // A chunk over 1536 keys is the decode step of 512 tokens over 2048: listed once, as decode.
  o.context = {1536, 2048};
  const Plan q = make_plan(llama3(), o);
  std::set<std::string> unique;
  for (const auto& e : q.entries) EXPECT_TRUE(unique.insert(e.problem.str()).second) << e.problem.str();
  // prefill 1; decode 2 (sk 1536, 2048); chunk 2 (sk 2048: the decode one, dropped; sk 2560)
  EXPECT_EQ(q.entries.size(), 4u);
  EXPECT_EQ(specs(q, "chunk"),
            std::vector<std::string>{"b=1,h=32,hkv=8,s=512,sk=2560,d=128,dtype=bf16,causal=1,page=16"});
}

TEST(PlanMake, TensorParallelismSplitsHeadsAndReplicatesFewKvHeads) {
  PlanOptions o;
  o.regimes = {"prefill"};
  o.tp = 4;
  EXPECT_EQ(make_plan(llama3(), o).entries[0].problem.str(), "b=1,h=8,hkv=2,s=512,sk=512,d=128,dtype=bf16,causal=1");
  o.tp = 16;
  EXPECT_EQ(make_plan(llama3(), o).entries[0].problem.str(), "b=1,h=2,hkv=1,s=512,sk=512,d=128,dtype=bf16,causal=1");
  o.tp = 3;
  EXPECT_EQ(input_error_of([&] { make_plan(llama3(), o); }), "--tp 3 does not divide the model's 32 query heads");
  ModelAttention odd = llama3();
  odd.heads = 48, odd.kv_heads = 12;
  o.tp = 8;
  EXPECT_EQ(input_error_of([&] { make_plan(odd, o); }),
            "--tp 8 and the model's 12 KV heads: neither divides the other");
}

TEST(PlanMake, NonsenseOptionsAreInputErrors) {
  const ModelAttention m = llama3();
  auto error = [&](auto change) {
    PlanOptions o;
    change(o);
    return input_error_of([&] { make_plan(m, o); });
  };
  EXPECT_EQ(error([](PlanOptions& o) { o.batch.clear(); }), "--batch: empty list");
  EXPECT_EQ(error([](PlanOptions& o) { o.batch = {0}; }), "--batch: 0 is out of range [1, 1048576]");
  EXPECT_EQ(error([](PlanOptions& o) { o.seqlen = {-512}; }), "--seqlen: -512 is out of range [1, 1048576]");
  EXPECT_EQ(error([](PlanOptions& o) {
              o.context = {2048, 2000000};
            }),
            "--context: 2000000 is out of range [1, 1048576]");
  EXPECT_EQ(error([](PlanOptions& o) { o.page = -1; }), "--page: -1 is out of range [0, 1048576]");
  EXPECT_EQ(error([](PlanOptions& o) {
              o.regimes = {"prefill", "training"};
            }),
            "--regimes: unknown regime 'training' (known: prefill, decode, chunk, varlen, train)");
  EXPECT_EQ(error([](PlanOptions& o) { o.regimes.clear(); }),
            "--regimes: empty list (known: prefill, decode, chunk, varlen, train)");
  EXPECT_EQ(error([](PlanOptions& o) { o.dtype = "fp8"; }),
            "--dtype: unknown dtype 'fp8' (expected bf16, fp16, both or model)");
  EXPECT_TRUE(error([](PlanOptions& o) {
                o.q_len = {4096};
              }).starts_with("decode: --q-len 4096 is longer than --context 2048"));
  EXPECT_TRUE(error([](PlanOptions& o) {
                o.regimes = {"chunk"};
                o.chunk = 4096;
              }).starts_with("chunk: --chunk 4096 is longer than --context 2048"));
  EXPECT_EQ(error([](PlanOptions& o) {
              o.regimes = {"chunk"};
              o.context = {1048576};
            }),
            "chunk: --context 1048576 + --chunk 2048 is 1050624 keys, more than 1048576");
  // Checks that belong to a regime apply only when it is planned.
  PlanOptions prefill_only;
  prefill_only.regimes = {"prefill"};
  prefill_only.q_len = {4096};
  prefill_only.chunk = 65536;
  EXPECT_EQ(make_plan(m, prefill_only).entries.size(), 6u);
  ModelAttention bad = m;
  bad.head_dim = 88;  // a multiple of 8, not of 16
  EXPECT_TRUE(has(input_error_of([&] { make_plan(bad, PlanOptions{}); }), "head dim 88 is not supported"));
  ModelAttention phi3 = m;  // d=96 is served now
  phi3.head_dim = 96;
  EXPECT_FALSE(make_plan(phi3, prefill_only).entries.empty());
}

TEST(PlanMake, AModelFilledByHandWithoutLayerKindsIsPlainAndBadKindsAreRefused) {
  ModelAttention m;
  m.name = "hand";
  m.heads = 8, m.kv_heads = 2, m.head_dim = 64, m.dtype = "fp16";
  PlanOptions o;
  o.regimes = {"prefill"};
  o.batch = {1};
  o.seqlen = {128};
  EXPECT_EQ(make_plan(m, o).entries,
            (std::vector<PlanEntry>{
                {Problem::parse("b=1,h=8,hkv=2,s=128,sk=128,d=64,dtype=fp16,causal=1"), "prefill", ""}}));
  m.layers = 4;
  m.layer_kinds = {LayerKind{"sliding_attention", 63, 30, false, 4}};
  EXPECT_EQ(make_plan(m, o).entries,
            (std::vector<PlanEntry>{{Problem::parse("b=1,h=8,hkv=2,s=128,sk=128,d=64,dtype=fp16,causal=1,window=63,"
                                                    "softcap=30"),
                                     "prefill", "sliding_attention, 4 of 4 layers"}}));
  m.layer_kinds = {LayerKind{"sliding_attention", -2, 0, false, 4}};
  EXPECT_TRUE(has(input_error_of([&] { make_plan(m, o); }), "model hand: layer kind sliding_attention: window -2"));
  m.layer_kinds = {LayerKind{"", 5, 0, false, 4}};
  EXPECT_EQ(input_error_of([&] { make_plan(m, o); }), "model hand: a layer kind's name is not one line of text");
}

TEST(PlanMake, ListOptionsParseWholeNumbersOnly) {
  EXPECT_EQ(parse_int_list("1,8,64", "--batch", 1, 100), (std::vector<std::int64_t>{1, 8, 64}));
  EXPECT_EQ(parse_int_list(" 2048 , 4096", "--context", 1, 1 << 20), (std::vector<std::int64_t>{2048, 4096}));
  EXPECT_EQ(input_error_of([] { parse_int_list("nan", "--batch", 1, 100); }), "--batch: 'nan' is not a whole number");
  EXPECT_EQ(input_error_of([] { parse_int_list("1,NaN", "--batch", 1, 100); }), "--batch: 'NaN' is not a whole number");
  EXPECT_EQ(input_error_of([] { parse_int_list("1.5", "--batch", 1, 100); }), "--batch: '1.5' is not a whole number");
  EXPECT_EQ(input_error_of([] { parse_int_list("1e3", "--seqlen", 1, 100); }), "--seqlen: '1e3' is not a whole number");
  EXPECT_EQ(input_error_of([] { parse_int_list("inf", "--seqlen", 1, 100); }), "--seqlen: 'inf' is not a whole number");
  EXPECT_EQ(input_error_of([] { parse_int_list("-4", "--batch", 1, 100); }), "--batch: -4 is out of range [1, 100]");
  EXPECT_EQ(input_error_of([] { parse_int_list("0", "--batch", 1, 100); }), "--batch: 0 is out of range [1, 100]");
  EXPECT_EQ(input_error_of([] { parse_int_list("99999999999999999999", "--batch", 1, 100); }),
            "--batch: 99999999999999999999 is out of range [1, 100]");
  EXPECT_EQ(input_error_of([] { parse_int_list("", "--batch", 1, 100); }), "--batch: empty list (expected e.g. 1,8)");
  EXPECT_EQ(input_error_of([] { parse_int_list("1,,8", "--batch", 1, 100); }), "--batch '1,,8': an empty item");
  EXPECT_EQ(parse_regimes("prefill, chunk"), (std::vector<std::string>{"prefill", "chunk"}));
  EXPECT_EQ(parse_regimes("varlen,prefill"), (std::vector<std::string>{"varlen", "prefill"}));
  EXPECT_EQ(input_error_of([] { parse_regimes("prefil"); }),
            "--regimes: unknown regime 'prefil' (known: prefill, decode, chunk, varlen, train)");
  EXPECT_TRUE(has(input_error_of([] { parse_regimes(""); }), "empty list"));
}

// ---- the plan file --------------------------------------------------------------------------

TEST(PlanFile, YamlRoundTripAndLayout) {
  TempDir dir;
  PlanOptions o;
  o.regimes = {"prefill", "decode", "chunk", "varlen"};
  o.dtype = "both";
  const Plan p = make_plan(llama3(), o);
  const std::string path = dir.file("plan.yaml");
  p.save(path);
  EXPECT_EQ(Plan::load(path), p);
  const std::string text = read_text(path);
  EXPECT_TRUE(
      text.starts_with("# attntune plan: the attention problems of a model (attntune plan --model ...)\n"
                       "model: meta-llama/Meta-Llama-3-8B\nsource: llama3_8b.json\nproblems:\n"
                       "  - {problem: \"b=1,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1\", regime: prefill}\n"))
      << text;
  EXPECT_TRUE(
      has(text, "  - {problem: \"b=1,h=32,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=1,page=16\", regime: decode}\n"));
  EXPECT_TRUE(has(text,
                  "  - {problem: \"b=8,h=32,hkv=8,s=8192,sk=8192,d=128,dtype=fp16,causal=1,varlen=512\", "
                  "regime: varlen}\n"));
  EXPECT_EQ(dir.names(), std::vector<std::string>{"plan.yaml"});  // no temporary file left
}

TEST(PlanFile, JsonRoundTripAndLayout) {
  TempDir dir;
  const Plan p = make_plan(read_model_config(model_file("gemma3_4b.json")), PlanOptions{});
  const std::string path = dir.file("plan.json");
  p.save(path);
  EXPECT_EQ(Plan::load(path), p);
  const nlohmann::json j = nlohmann::json::parse(read_text(path));
  EXPECT_EQ(j.at("model"), "gemma3");
  EXPECT_EQ(j.at("source"), "gemma3_4b.json");
  ASSERT_EQ(j.at("problems").size(), p.entries.size());
  EXPECT_EQ(j.at("problems")[0].at("problem"), "b=1,h=8,hkv=4,s=512,sk=512,d=256,dtype=bf16,causal=1");
  EXPECT_EQ(j.at("problems")[0].at("regime"), "prefill");
  // The same plan saved as YAML reads back the same.
  p.save(dir.file("plan.yml"));
  EXPECT_EQ(Plan::load(dir.file("plan.yml")), Plan::load(path));
}

TEST(PlanFile, NamesThatYamlWouldMisreadAreQuoted) {
  TempDir dir;
  Plan p = make_plan(llama3(), PlanOptions{});
  for (const std::string name : {"yes", "a: b # c", "", "12", "x\"y\\z w", "-dash", "Null", "é/ü"}) {
    p.model = name;
    p.source = name + ".json";
    p.save(dir.file("q.yaml"));
    const Plan back = Plan::load(dir.file("q.yaml"));
    EXPECT_EQ(back.model, name);
    EXPECT_EQ(back.source, name + ".json");
  }
  // A name with a control character is quoted on the way out, and refused on the way in: it would
  // be stored in the queue as more than one line (issue 28, check_stored_text).
  for (const std::string name : {"x\"y\\z\nw", "tab\there"}) {
    p.model = name;
    p.source = "ok.json";
    p.save(dir.file("q.yaml"));
    try {
      Plan::load(dir.file("q.yaml"));
      ADD_FAILURE() << "loaded a model name with a control character";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("q.yaml:"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model: the name is not one line of UTF-8 text"), std::string::npos) << e.what();
    }
  }
}

TEST(PlanFile, HandWrittenBlockYamlLoads) {
  TempDir dir;
  const std::string path = dir.write("hand.yaml",
                                     "model: mine\n"
                                     "problems:\n"
                                     "  - problem: b=2,h=16,s=1024,d=64,dtype=fp16,causal=0\n"
                                     "    regime: prefill\n");
  const Plan p = Plan::load(path);
  EXPECT_EQ(p.model, "mine");
  EXPECT_EQ(p.source, "");
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].problem.str(), "b=2,h=16,hkv=16,s=1024,sk=1024,d=64,dtype=fp16,causal=0");
}

TEST(PlanFile, BadEntriesAreReportedAtLineAndColumn) {
  TempDir dir;
  const std::string head = "model: m\nsource: s.json\nproblems:\n";
  const std::string good =
      "  - {problem: \"b=1,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16\", regime: decode}\n";
  auto error = [&](const std::string& text) {
    const std::string path = dir.write("p.yaml", text);
    return input_error_of([&] { Plan::load(path); });
  };
  const std::string f = dir.file("p.yaml");
  EXPECT_EQ(error(head + good + "  - {problem: \"b=0,h=32,s=1,d=128,dtype=bf16,causal=1\", regime: decode}\n"),
            f + ":5:15: problems[1]: problem: 'b=0' is out of range [1, 1048576]");
  EXPECT_EQ(error(head + good + "  - {problem: \"b=1,h=32,s=1,d=96,dtype=bf16\", regime: decode}\n"),
            f + ":5:15: problems[1]: problem: missing key 'causal' in 'b=1,h=32,s=1,d=96,dtype=bf16'");
  EXPECT_EQ(error(head + good + good),
            f + ":5:5: problems[1]: b=1,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16 is listed twice "
                "(first as problems[0], line 4)");
  EXPECT_EQ(error(head + good + "  - {problem: \"b=2,h=32,s=1,d=128,dtype=bf16,causal=1\", regime: training}\n"),
            f + ":5:65: problems[1].regime: unknown regime 'training' (known: prefill, decode, chunk, varlen, train)");
  EXPECT_EQ(error(head + "  - {problem: \"b=2,h=32,s=1,d=128,dtype=bf16,causal=1\", regime: decode, gpu: 0}\n"),
            f + ":4:73: problems[0]: unknown key 'gpu' (expected problem, regime, layers)");
  EXPECT_EQ(error(head + "  - {regime: decode}\n"), f + ":4:5: problems[0]: no problem");
  EXPECT_EQ(error(head + "  - {problem: \"b=2,h=32,s=1,d=128,dtype=bf16,causal=1\"}\n"),
            f + ":4:5: problems[0]: no regime (prefill, decode, chunk, varlen or train)");
  EXPECT_EQ(error("model: m\nsource: s\n"), f + ":1:1: no problems: a plan lists its problems");
  EXPECT_EQ(error(head + "  - \"b=2,h=32,s=1,d=128,dtype=bf16,causal=1\"\n"),
            f + ":4:5: problems[0]: expected {problem: \"b=...,h=...\", regime: prefill|decode|chunk}");
  EXPECT_EQ(error(head + "  []\n").substr(f.size()), ":4:3: problems: empty list; a plan lists at least one problem");
  EXPECT_EQ(error("model: m\nproblems: []\n"), f + ":2:11: problems: empty list; a plan lists at least one problem");
  EXPECT_EQ(error("model: m\nproblems:\n"), f + ":2:1: problems: expected a list of {problem: ..., regime: ...}");
  EXPECT_EQ(error("model: m\nmodels: n\nproblems:\n" + good),
            f + ":2:1: unknown key 'models' (expected model, source, problems)");
  EXPECT_EQ(error("model: m\nmodel: n\nproblems:\n" + good), f + ":2:1: key 'model' given twice (first at line 1)");
  EXPECT_EQ(error("source: s\nproblems:\n" + good), f + ":1:1: no model: a plan names its model");
  EXPECT_EQ(error(""), f + ":1:1: empty plan file; expected model, source and problems");
  EXPECT_EQ(error("- 1\n- 2\n"), f + ":1:1: expected a mapping with model, source and problems");
  EXPECT_TRUE(error(head + "  - {problem: \"b=1\n").starts_with(f + ":")) << error(head + "  - {problem: \"b=1\n");
  EXPECT_TRUE(error(head + "  - {problem: \"b=1\n").find(": YAML: ") != std::string::npos);
}

TEST(PlanFile, JsonPlansAreCheckedAsJsonWithPositions) {
  TempDir dir;
  auto error = [&](const std::string& text) {
    const std::string path = dir.write("p.json", text);
    return input_error_of([&] { Plan::load(path); });
  };
  const std::string f = dir.file("p.json");
  EXPECT_TRUE(error("{\"model\": \"m\",\n \"problems\": [\n  {\"problem\": \"x\" \"regime\": \"decode\"}]}")
                  .starts_with(f + ":3:26: invalid JSON: syntax error"))
      << error("{\"model\": \"m\",\n \"problems\": [\n  {\"problem\": \"x\" \"regime\": \"decode\"}]}");
  EXPECT_EQ(error("{\"model\": \"m\",\n \"problems\": [\n  {\"problem\": \"b=1,h=3,s=1,d=64,dtype=bf16,causal=1\", "
                  "\"regime\": \"decode\"},\n  {\"problem\": \"b=1,h=3,s=1,d=64,dtype=bf16,causal=2\", \"regime\": "
                  "\"decode\"}]}"),
            f + ":4:15: problems[1]: problem: 'causal=2': expected 0 or 1");
  // JSON that yaml-cpp refuses (a surrogate pair, a newline between a key and its colon) loads
  // through nlohmann; its messages name the entry without a line.
  const std::string emoji =
      "{\"model\": \"\\ud83d\\ude00\",\n \"problems\"\n : [\n  {\"problem\": \"b=1,h=3,s=1,d=64,dtype=bf16,causal=";
  EXPECT_EQ(error(emoji + "2\", \"regime\": \"decode\"}]}"), f + ": problems[0]: problem: 'causal=2': expected 0 or 1");
  EXPECT_EQ(Plan::load(dir.write("e.json", emoji + "1\", \"regime\": \"decode\"}]}")).model, "\xF0\x9F\x98\x80");
  EXPECT_EQ(error("{\"model\": \"m\", \"problems\": []}").substr(f.size()),
            ":1:28: problems: empty list; a plan lists at least one problem");
}

TEST(PlanFile, SaveChecksTheNameAndTheDirectory) {
  TempDir dir;
  const Plan p = make_plan(llama3(), PlanOptions{});
  EXPECT_EQ(input_error_of([&] { p.save(dir.file("plan.txt")); }),
            dir.file("plan.txt") + ": unknown plan file type '.txt' (use a .yaml, .yml or .json name)");
  EXPECT_EQ(input_error_of([&] { p.save(dir.file("no/plan.yaml")); }),
            dir.file("no/plan.yaml") + ": cannot write: directory '" + dir.file("no") + "' does not exist");
  fs::create_directory(dir.file("d.yaml"));
  EXPECT_EQ(input_error_of([&] { p.save(dir.file("d.yaml")); }), dir.file("d.yaml") + ": is a directory");
  EXPECT_EQ(input_error_of([&] { Plan::load(dir.file("absent.yaml")); }), dir.file("absent.yaml") + ": no such file");
  // Saving over an existing plan replaces it whole.
  dir.write("plan.yaml", "old");
  p.save(dir.file("plan.yaml"));
  EXPECT_EQ(Plan::load(dir.file("plan.yaml")), p);
}

// A full disk (here a file-size limit, which fails writes as ENOSPC would) is an environment
// error, the target is not created and no temporary file is left; never a reported success.
TEST(PlanFile, SaveOnAFullDiskFailsAndLeavesNothing) {
  TempDir dir;
  PlanOptions o;
  o.dtype = "both";
  const Plan p = make_plan(llama3(), o);
  ASSERT_GT(p.yaml().size(), 2048u);
  const std::string target = dir.file("plan.yaml");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{1024, 1024};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int code = 0;
    try {
      p.save(target);
    } catch (const EnvError& e) {
      code = std::string(e.what()).find("cannot be written: no space left") != std::string::npos ? 3 : 4;
    } catch (...) {
      code = 5;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_TRUE(dir.names().empty());
}

// ---- the command ----------------------------------------------------------------------------

namespace {

// One line on stderr starting "attntune: error: ", nothing on stdout, exit 2.
void expect_input_error(const std::string& args, const std::string& part) {
  const auto r = run_attntune(args);
  EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  const auto lines = attntune::testing::lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << args << "\n" << r.err;
  EXPECT_TRUE(lines[0].starts_with("attntune: error: ")) << lines[0];
  EXPECT_TRUE(has(lines[0], part)) << args << "\n" << lines[0];
}

}  // namespace

TEST(PlanCli, PrintsATableOfTheProblemsWithTheirCost) {
  const auto r = run_attntune("plan --model " + model_file("qwen2_7b.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");  // qwen2's 131072 positions cover every context: no note
  const auto lines = attntune::testing::lines(r.out);
  ASSERT_EQ(lines.size(), 2u + 2u + 15u);  // summary, blank, header, rule, 15 rows
  EXPECT_EQ(lines[0], "qwen2 (qwen2_7b.json): 28 query heads, 4 KV heads, head dim 128, bf16; 15 problems");
  EXPECT_TRUE(lines[2].starts_with("regime   problem")) << lines[2];
  EXPECT_TRUE(has(lines[2], "GFLOP")) << lines[2];
  EXPECT_TRUE(lines[4].starts_with("prefill  b=1,h=28,hkv=4,s=512,sk=512,d=128,dtype=bf16,causal=1")) << lines[4];
  EXPECT_TRUE(lines.back().starts_with("decode   b=64,h=28,hkv=4,s=1,sk=32768,d=128,dtype=bf16,causal=1,page=16"))
      << lines.back();
  // 4 * b * h * d * visible pairs: b=1, h=28, d=128, s=sk=512 causal (512 * 513 / 2 pairs) = 1.884 GFLOP
  EXPECT_TRUE(has(lines[4], " 1.883 ")) << lines[4];
}

TEST(PlanCli, HelpListsEveryOptionWithItsDefault) {
  const auto r = run_attntune("plan --help");
  ASSERT_EQ(r.rc, 0);
  for (const char* opt : {"--model arg", "--regimes arg (=prefill,decode)", "--dtype arg (=model)",
                          "--batch arg (=1,8)", "--seqlen arg (=512,2048,8192)", "--decode-batch arg (=1,16,64)",
                          "--context arg (=2048,8192,32768)", "--q-len arg (=1)", "--chunk arg (=2048)",
                          "--page arg (=16)", "--tp arg (=1)", "-o [ --output ] arg", "--format arg (=table)"})
    EXPECT_TRUE(has(r.out, opt)) << opt << "\n" << r.out;
  std::string flat;  // the help's text without its line wrapping
  for (char c : r.out)
    if (c != ' ' && c != '\n') flat += c;
  EXPECT_TRUE(has(flat, "chunk(chunkedprefilloverapagedKVcache),varlen(prefillasapacked")) << r.out;
  EXPECT_TRUE(has(flat, "varlen=max(1,seqlen/16)")) << r.out;
  EXPECT_TRUE(has(run_attntune("--help").out, "plan "));
}

TEST(PlanCli, JsonIsThePlanFilesJson) {
  const auto r = run_attntune("plan --model " + model_file("llama3_8b.json") +
                              " --regimes decode,chunk --q-len 1,4 --format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  PlanOptions o;
  o.regimes = {"decode", "chunk"};
  o.q_len = {1, 4};
  const Plan want = make_plan(llama3(), o);
  EXPECT_EQ(nlohmann::ordered_json::parse(r.out), want.json());
  EXPECT_EQ(want.entries.size(), 18u + 6u);
  // Llama 3's 8192 positions are fewer than the longest context: said once, on stderr.
  EXPECT_EQ(r.err,
            "attntune: note: some problems have more keys (up to 34816) than the model's "
            "max_position_embeddings (8192)\n");
}

TEST(PlanCli, VarlenRegimePlansPackedPrefillBatches) {
  TempDir dir;
  const std::string out = dir.file("plan.json");
  const auto r = run_attntune("plan --model " + model_file("qwen2_7b.json") +
                              " --regimes prefill,varlen --batch 4 --seqlen 1024 --format json -o " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  ASSERT_EQ(j["problems"].size(), 2u) << r.out;
  EXPECT_EQ(j["problems"][0]["problem"], "b=4,h=28,hkv=4,s=1024,sk=1024,d=128,dtype=bf16,causal=1");
  EXPECT_EQ(j["problems"][0]["regime"], "prefill");
  EXPECT_EQ(j["problems"][1]["problem"], "b=4,h=28,hkv=4,s=1024,sk=1024,d=128,dtype=bf16,causal=1,varlen=64");
  EXPECT_EQ(j["problems"][1]["regime"], "varlen");
  EXPECT_EQ(Plan::load(out).json(), j);
  // The table names the regime; qwen2 at --regimes varlen: the 6 prefill sizes, packed.
  const auto t = run_attntune("plan --model " + model_file("qwen2_7b.json") + " --regimes varlen");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_TRUE(has(t.out, "; 6 problems\n")) << t.out;
  EXPECT_TRUE(has(t.out, "\nvarlen  b=1,h=28,hkv=4,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=32 ")) << t.out;
  expect_input_error("plan --model " + model_file("qwen2_7b.json") + " --regimes varlen --batch 4096 --seqlen 1048576",
                     "varlen: --batch 4096 x --seqlen 1048576 is 4294967296 rows");
}

TEST(PlanCli, OutputWritesAPlanThatLoadsBack) {
  TempDir dir;
  const std::string out = dir.file("plan.yaml");
  const auto r = run_attntune("plan --model " + model_file("falcon_7b.json") + " --dtype both -o " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "wrote 30 problems to " + out + "\n");
  PlanOptions o;
  o.dtype = "both";
  EXPECT_EQ(Plan::load(out), make_plan(read_model_config(model_file("falcon_7b.json")), o));
  EXPECT_TRUE(has(read_text(out), "source: falcon_7b.json\n"));
  EXPECT_FALSE(has(read_text(out), dir.file("")));  // no directories of this machine

  const std::string json_out = dir.file("plan.json");
  ASSERT_EQ(run_attntune("plan --model " + model_file("falcon_7b.json") + " --dtype both -o " + json_out).rc, 0);
  EXPECT_EQ(Plan::load(json_out), Plan::load(out));
}

TEST(PlanCli, NotesSayWhatWasAssumed) {
  const auto r = run_attntune("plan --model " + model_file("gemma2_9b.json") + " --context 2048,4096");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto lines = attntune::testing::lines(r.err);
  ASSERT_EQ(lines.size(), 4u) << r.err;
  EXPECT_TRUE(lines[0].starts_with("attntune: note: torch_dtype is float32")) << lines[0];
  // What the calls must pass: the window, the cap, the scale.
  EXPECT_TRUE(lines[1].starts_with("attntune: note: sliding_window 4096: ")) << lines[1];
  EXPECT_TRUE(lines[2].starts_with("attntune: note: attn_logit_softcapping 50.0: ")) << lines[2];
  EXPECT_TRUE(lines[3].starts_with("attntune: note: the softmax scale is query_pre_attn_scalar")) << lines[3];
  // With the dtype chosen, the float32 note has nothing to say.
  const auto fixed = run_attntune("plan --model " + model_file("gemma2_9b.json") + " --context 2048 --dtype fp16");
  ASSERT_EQ(fixed.rc, 0);
  EXPECT_EQ(attntune::testing::lines(fixed.err).size(), 3u) << fixed.err;
  EXPECT_TRUE(has(fixed.out, "dtype=fp16"));
}

TEST(PlanCli, BadInputsAreOneLineAndExit2) {
  TempDir dir;
  const std::string llama = " --model " + model_file("llama3_8b.json");
  expect_input_error("plan", "plan: --model CONFIG.json is required");
  expect_input_error("plan --model " + dir.file("none.json"), "none.json: no such file");
  const std::string bad = dir.write("bad.json", "{\"num_attention_heads\": 32,\n \"num_key_value_heads\": 7, }");
  expect_input_error("plan --model " + bad, "bad.json:2:28: invalid JSON");
  const std::string seven =
      dir.write("seven.json", R"({"num_attention_heads": 32, "num_key_value_heads": 7, "hidden_size": 4096})");
  expect_input_error("plan --model " + seven,
                     "seven.json: num_key_value_heads (7) does not divide num_attention_heads (32)");
  expect_input_error("plan" + llama + " --regimes prefill,training", "unknown regime 'training'");
  expect_input_error("plan" + llama + " --batch nan", "--batch: 'nan' is not a whole number");
  expect_input_error("plan" + llama + " --seqlen=-512", "--seqlen: -512 is out of range");
  expect_input_error("plan" + llama + " --decode-batch 0", "--decode-batch: 0 is out of range");
  expect_input_error("plan" + llama + " --context 2048,4194304", "--context: 4194304 is out of range");
  expect_input_error("plan" + llama + " --chunk 1,2", "--chunk '1,2': expected one number");
  expect_input_error("plan" + llama + " --regimes chunk --chunk 4096", "--chunk 4096 is longer than --context 2048");
  expect_input_error("plan" + llama + " --dtype fp32", "unknown dtype 'fp32'");
  expect_input_error("plan" + llama + " --format csv", "unknown --format 'csv'");
  expect_input_error("plan" + llama + " --tp 5", "--tp 5 does not divide the model's 32 query heads");
  expect_input_error("plan" + llama + " --frobnicate", "see attntune plan --help");
  expect_input_error("plan" + llama + " -o " + dir.file("plan.txt"), "unknown plan file type '.txt'");
  // A save that fails prints nothing on stdout and leaves nothing behind.
  expect_input_error("plan" + llama + " -o " + dir.file("missing/plan.yaml"), "does not exist");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"bad.json", "seven.json"}));
}

// ---- variants in the plan file and the command ----------------------------------------------

TEST(PlanFile, LayersAreWrittenForModelsWithVariantsAndReadBack) {
  TempDir dir;
  const Plan p = make_plan(read_model_config(model_file("gpt_oss_20b.json")), PlanOptions{});
  p.save(dir.file("plan.yaml"));
  EXPECT_EQ(Plan::load(dir.file("plan.yaml")), p);
  const std::string text = read_text(dir.file("plan.yaml"));
  EXPECT_TRUE(has(text,
                  "  - {problem: \"b=1,h=64,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1,sinks=1\", regime: prefill, "
                  "layers: \"full_attention, 12 of 24 layers\"}\n"))
      << text;
  EXPECT_TRUE(has(text,
                  "  - {problem: \"b=64,h=64,hkv=8,s=1,sk=32768,d=64,dtype=bf16,causal=1,page=16,window=127,sinks=1\", "
                  "regime: decode, layers: \"sliding_attention, 12 of 24 layers\"}\n"))
      << text;
  p.save(dir.file("plan.json"));
  EXPECT_EQ(Plan::load(dir.file("plan.json")), p);
  const nlohmann::json j = nlohmann::json::parse(read_text(dir.file("plan.json")));
  EXPECT_EQ(j.at("problems")[6],
            nlohmann::json({{"problem", "b=1,h=64,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1,window=127,sinks=1"},
                            {"regime", "prefill"},
                            {"layers", "sliding_attention, 12 of 24 layers"}}));
  // A plain model's plan has no layers: it reads as before.
  EXPECT_FALSE(has(make_plan(llama3(), PlanOptions{}).yaml(), "layers"));
  EXPECT_FALSE(make_plan(llama3(), PlanOptions{}).json().at("problems")[0].contains("layers"));

  // Hand-written: layers is optional text of one line.
  const std::string head = "model: m\nproblems:\n  - {problem: \"b=1,h=8,s=64,d=64,dtype=bf16,causal=1,window=15\", "
                           "regime: prefill";
  EXPECT_EQ(Plan::load(dir.write("ok.yaml", head + ", layers: mine}\n")).entries.at(0).layers, "mine");
  EXPECT_EQ(input_error_of([&] { Plan::load(dir.write("l.yaml", head + ", layers: [1, 2]}\n")); }),
            dir.file("l.yaml") +
                ":3:91: problems[0].layers: expected the layers it serves, e.g. \"sliding_attention, 21 of 42 "
                "layers\"");
  EXPECT_TRUE(has(input_error_of([&] { Plan::load(dir.write("c.yaml", head + ", layers: \"a\\tb\"}\n")); }),
                  "problems[0].layers: not one line of UTF-8 text"));
}

TEST(PlanCli, AModelWithVariantsListsItsLayerKindsAndWhatEachProblemServes) {
  const auto r = run_attntune("plan --model " + model_file("gpt_oss_20b.json") + " --decode-batch 64 --context 32768");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto lines = attntune::testing::lines(r.out);
  ASSERT_EQ(lines.size(), 3u + 1u + 2u + 14u) << r.out;  // summary, 2 kinds, blank, header, rule, 14 rows
  EXPECT_EQ(lines[0], "gpt_oss (gpt_oss_20b.json): 64 query heads, 8 KV heads, head dim 64, bf16; 14 problems");
  EXPECT_EQ(lines[1], "  full_attention: 12 of 24 layers; sinks=1");
  EXPECT_EQ(lines[2], "  sliding_attention: 12 of 24 layers; window=127,sinks=1");
  EXPECT_EQ(lines[3], "");
  EXPECT_TRUE(lines[4].starts_with("regime   problem")) << lines[4];
  EXPECT_TRUE(lines[4].ends_with("layers")) << lines[4];
  EXPECT_TRUE(lines[6].starts_with("prefill  b=1,h=64,hkv=8,s=512,sk=512,d=64,dtype=bf16,causal=1,sinks=1 "))
      << lines[6];
  EXPECT_TRUE(lines[6].ends_with("full_attention, 12 of 24 layers")) << lines[6];
  EXPECT_TRUE(lines.back().starts_with("decode   b=64,h=64,hkv=8,s=1,sk=32768,d=64,dtype=bf16,causal=1,page=16,"
                                       "window=127,sinks=1 "))
      << lines.back();
  EXPECT_TRUE(lines.back().ends_with("sliding_attention, 12 of 24 layers")) << lines.back();
  // The notes: the dtype assumed, the window's convention, the sinks.
  const auto notes = attntune::testing::lines(r.err);
  ASSERT_EQ(notes.size(), 3u) << r.err;
  EXPECT_TRUE(notes[0].starts_with("attntune: note: the config gives no torch_dtype")) << notes[0];
  EXPECT_TRUE(notes[1].starts_with("attntune: note: sliding_window 128: ")) << notes[1];
  EXPECT_TRUE(notes[2].starts_with("attntune: note: model_type gpt_oss: every layer has learnable per-head attention "
                                   "sinks"))
      << notes[2];
  // --format json is the plan file's JSON, layers included.
  const auto j = run_attntune("plan --model " + model_file("gpt_oss_20b.json") + " --format json");
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_EQ(nlohmann::ordered_json::parse(j.out),
            make_plan(read_model_config(model_file("gpt_oss_20b.json")), PlanOptions{}).json());
}

TEST(PlanCli, AWindowAsLongAsEveryKeyCountIsPlannedAsAWindowAndSaidSo) {
  const std::string qwen = " --model " + model_file("qwen25_1p5b_swa.json");
  const auto r = run_attntune("plan" + qwen);  // contexts up to 32768, the window's length
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "causal=1,page=16,window=32767 ")) << r.out;
  EXPECT_TRUE(has(r.err, "attntune: note: the sliding_attention layers' window (32768 keys) is as long as every key "
                         "count planned for them (up to 32768): their problems see every key, as full attention's do, "
                         "and stay windowed"))
      << r.err;
  const auto longer = run_attntune("plan" + qwen + " --context 65536");
  ASSERT_EQ(longer.rc, 0) << longer.err;
  EXPECT_FALSE(has(longer.err, "is as long as every key count")) << longer.err;
}

TEST(PlanCli, AttentionTheKernelsDoNotComputeStopsPlanWithExit2) {
  TempDir dir;
  expect_input_error("plan --model " + model_file("falcon_rw_1b.json"),
                     "falcon_rw_1b.json: alibi: true: the model adds ALiBi position biases to its attention scores");
  const std::string llama4 = dir.write("llama4.json", R"({"model_type": "llama4", "text_config": {
      "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "attention_chunk_size": 8192}})");
  expect_input_error("plan --model " + llama4 + " -o " + dir.file("plan.yaml"),
                     "text_config.attention_chunk_size 8192: chunked attention");
  EXPECT_EQ(dir.names(), std::vector<std::string>{"llama4.json"});  // no plan written
}

// The head dims a plan takes come from the shipped spaces (every family's problem.d and rules), and
// a message says them as a rule where they are one.
TEST(PlanHeadDims, FromTheShippedSpaces) {
  const std::vector<int>& dims = supported_head_dims();
  for (int d : {32, 64, 80, 96, 112, 128, 160, 192, 256})
    EXPECT_NE(std::find(dims.begin(), dims.end(), d), dims.end()) << d;
  for (int d : {8, 72, 264, 1024}) EXPECT_EQ(std::find(dims.begin(), dims.end(), d), dims.end()) << d;
  EXPECT_EQ(describe_head_dims({64, 128, 256}), "head dims 64, 128 and 256");
  EXPECT_EQ(describe_head_dims({32, 48, 64, 80, 96}), "every multiple of 16 from 32 to 96");
  EXPECT_EQ(describe_head_dims({64, 128, 192, 256}), "every multiple of 64 from 64 to 256");
  EXPECT_EQ(describe_head_dims({64, 96, 128}), "head dims 64, 96 and 128");
  EXPECT_EQ(describe_head_dims({24, 40, 56, 72}), "head dims 24, 40, 56 and 72");  // not multiples of their step
}

// A head dim some family serves for decode only (512, Gemma-4-like full layers: flash_decode_wgmma):
// the plan holds its decode problems alone, says why, and refuses a plan of prefill alone.
TEST(PlanModelConfig, AHeadDimServedForDecodeOnlyPlansDecodeAndSaysWhy) {
  TempDir dir;
  const std::string file = dir.write("g.json", R"({"num_attention_heads": 16, "num_key_value_heads": 4,
                                                    "head_dim": 512, "hidden_size": 4096})");
  const ModelAttention m = read_model_config(file);
  EXPECT_TRUE(m.decode_only);
  EXPECT_EQ(m.head_dim, 512);
  ASSERT_EQ(m.notes.size(), 1u);
  EXPECT_EQ(m.notes[0], "head_dim 512: attntune's kernels serve its decode (flash_decode_wgmma) but no prefill "
                        "family holds it: the plan has decode problems only");
  const Plan p = make_plan(m, PlanOptions{});
  ASSERT_FALSE(p.entries.empty());
  for (const PlanEntry& e : p.entries) {
    EXPECT_EQ(e.regime, "decode") << e.problem.str();
    EXPECT_EQ(e.problem.d, 512) << e.problem.str();
  }
  PlanOptions prefill;
  prefill.regimes = {"prefill"};
  try {
    make_plan(m, prefill);
    ADD_FAILURE() << "a prefill plan of a decode-only head dim was made";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("served for decode only"), std::string::npos) << e.what();
  }
}

// Multi-head latent attention (DeepSeek-V3): prefill on the decompressed K/V, one per query head, at
// head dims 192 (qk_nope 128 + qk_rope 64) / 128 (v_head_dim); decode over the latent cache, one KV
// head of 576 dims (kv_lora_rank 512 + qk_rope 64) whose first 512 are V (latent=1), in pages of 64;
// chunked prefill left out, with the reason.
TEST(PlanModelConfig, DeepSeekV3LatentAttentionPlansPrefillDecompressedAndDecodeOverTheLatentCache) {
  const ModelAttention m = read_model_config(model_file("deepseek_v3.json"));
  EXPECT_EQ(m.name, "deepseek-ai/DeepSeek-V3");
  EXPECT_TRUE(m.latent);
  EXPECT_EQ(m.heads, 128);
  EXPECT_EQ(m.kv_heads, 128);
  EXPECT_EQ(m.head_dim, 192);
  EXPECT_EQ(m.head_dim_v, 128);
  EXPECT_EQ(m.latent_head_dim, 576);
  EXPECT_EQ(m.latent_head_dim_v, 512);
  ASSERT_EQ(m.notes.size(), 1u);
  EXPECT_EQ(m.notes[0],
            "multi-head latent attention (kv_lora_rank 512): planning prefill on the decompressed K/V, 128 heads of "
            "head dims 192 / 128 (d=192,dv=128), and decode over the latent cache: one KV head of 576 dims (512 + 64) "
            "whose first 512 are V (d=576,dv=512,latent=1; call with v = k and head_dim_v 512), in pages of 64 "
            "(FlashMLA's); chunked prefill is left out: a chunk's thousands of query rows make it compute-bound, "
            "where serving engines decompress the cache and run it as a prefill (d=192,dv=128, the prefill regime's "
            "problems)");
  const Plan p = make_plan(m, PlanOptions{});  // prefill and decode
  ASSERT_EQ(p.entries.size(), 6u + 9u);
  for (std::size_t i = 0; i < 6; ++i) {
    const PlanEntry& e = p.entries[i];
    EXPECT_EQ(e.regime, "prefill");
    EXPECT_EQ(e.problem.d, 192);
    EXPECT_EQ(e.problem.dv, 128);
    EXPECT_EQ(e.problem.h, 128);
    EXPECT_EQ(e.problem.hkv, 128);
    EXPECT_FALSE(e.problem.latent);
  }
  EXPECT_EQ(p.entries[0].problem.str(), "b=1,h=128,hkv=128,s=512,sk=512,d=192,dv=128,dtype=bf16,causal=1");
  std::vector<std::string> decode;
  for (std::size_t i = 6; i < p.entries.size(); ++i) {
    EXPECT_EQ(p.entries[i].regime, "decode");
    decode.push_back(p.entries[i].problem.str());
  }
  EXPECT_EQ(decode, (std::vector<std::string>{
                        "b=1,h=128,hkv=1,s=1,sk=2048,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=1,h=128,hkv=1,s=1,sk=8192,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=1,h=128,hkv=1,s=1,sk=32768,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=16,h=128,hkv=1,s=1,sk=2048,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=16,h=128,hkv=1,s=1,sk=8192,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=16,h=128,hkv=1,s=1,sk=32768,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=64,h=128,hkv=1,s=1,sk=2048,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=64,h=128,hkv=1,s=1,sk=8192,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
                        "b=64,h=128,hkv=1,s=1,sk=32768,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1"}));
  // Tensor parallelism splits the decompressed heads as any others, and the query heads of decode;
  // the latent cache is replicated (one KV head on every GPU). Speculative q-lens and any --page:
  // decode pages stay 64.
  PlanOptions tp8;
  tp8.tp = 8;
  tp8.regimes = {"prefill", "varlen", "decode", "chunk"};
  tp8.q_len = {1, 4};
  tp8.decode_batch = {32};
  tp8.context = {4096};
  tp8.page = 16;
  const Plan q = make_plan(m, tp8);
  std::vector<std::string> specs;
  for (const PlanEntry& e : q.entries) {
    EXPECT_NE(e.regime, "chunk");
    if (e.regime != "prefill") specs.push_back(e.problem.str());
  }
  EXPECT_EQ(q.entries.size(), 6u + 2u + 6u);
  ASSERT_EQ(specs.size(), 8u);
  EXPECT_EQ(specs[0], "b=32,h=16,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1");
  EXPECT_EQ(specs[1], "b=32,h=16,hkv=1,s=4,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1");
  EXPECT_EQ(specs.back(), "b=8,h=16,hkv=16,s=8192,sk=8192,d=192,dv=128,dtype=bf16,causal=1,varlen=512");
  // Chunked prefill alone is refused with the reason.
  PlanOptions chunk;
  chunk.regimes = {"chunk"};
  EXPECT_NE(input_error_of([&] { make_plan(m, chunk); })
                .find("multi-head latent attention's chunked prefill is left out: serving engines run it on the "
                      "decompressed K/V as a prefill; plan --regimes prefill,decode (decode reads the latent cache)"),
            std::string::npos);
  // Decode alone is planned.
  PlanOptions decode_only;
  decode_only.regimes = {"decode"};
  EXPECT_EQ(make_plan(m, decode_only).entries.size(), 9u);
  // Every planned problem parses back (the latent ones checked as latent caches: dv < d, no varlen).
  for (const PlanEntry& e : q.entries) EXPECT_EQ(Problem::parse(e.problem.str()), e.problem) << e.problem.str();
  for (const PlanEntry& e : p.entries) EXPECT_EQ(Problem::parse(e.problem.str()), e.problem) << e.problem.str();
  // A plan file keeps them.
  TempDir dir;
  const std::string file = dir.file("deepseek.yaml");
  q.save(file);
  EXPECT_EQ(Plan::load(file), q);
}

// A latent model filled in by hand must say a latent cache whose V is fewer dims than it.
TEST(PlanModelConfig, ALatentCacheWithoutRoomForItsRopePartIsRefused) {
  ModelAttention m = read_model_config(model_file("deepseek_v3.json"));
  m.latent_head_dim = 512;
  EXPECT_NE(input_error_of([&] { make_plan(m, PlanOptions{}); })
                .find("a latent cache of 512 dims with V its first 512 (V must be fewer dims, at most 1024 in all)"),
            std::string::npos);
}

// A latent cache wider than a problem spec's head dims (1024) is refused when the config is read.
TEST(PlanModelConfig, ALatentCacheWiderThanAProblemsHeadDimIsRefused) {
  TempDir dir;
  EXPECT_NE(config_error(dir, R"("num_attention_heads": 16, "kv_lora_rank": 1000, "qk_nope_head_dim": 128,
                                  "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_size": 2048)")
                .find("multi-head latent attention: the latent cache's 1064 dims (kv_lora_rank 1000 + "
                      "qk_rope_head_dim 64) are more than a problem's head dim may be (1024)"),
            std::string::npos);
}

// ---- --kv-dtype fp8 -----------------------------------------------------------------------

// An FP8 KV cache: decode steps (up to 16 query rows) read it (kv_dtype=fp8); chunked prefill and
// longer decode steps keep a 16-bit cache (no family serves them over FP8 yet, and the note says so);
// prefill and varlen read no cache.
TEST(PlanKvFp8, DecodeAndChunkedPrefillReadAnFp8CacheWhereAFamilyServesIt) {
  PlanOptions o;
  o.regimes = {"prefill", "decode", "chunk", "varlen"};
  o.batch = {4};
  o.seqlen = {2048};
  o.decode_batch = {16};
  o.context = {4096};
  o.q_len = {1, 16, 32};
  o.kv_dtype = "fp8";
  const Plan p = make_plan(llama3(), o);
  EXPECT_EQ(specs(p, "prefill"), (std::vector<std::string>{"b=4,h=32,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=1"}));
  EXPECT_EQ(specs(p, "decode"),
            (std::vector<std::string>{"b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8",
                                      "b=16,h=32,hkv=8,s=16,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8",
                                      "b=16,h=32,hkv=8,s=32,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8"}));
  EXPECT_EQ(specs(p, "chunk"),
            (std::vector<std::string>{"b=4,h=32,hkv=8,s=2048,sk=6144,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8"}));
  EXPECT_EQ(specs(p, "varlen"),
            (std::vector<std::string>{"b=4,h=32,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=1,varlen=128"}));
  const std::string hopper =
      "--kv-dtype fp8: chunked prefill and decode steps of more than 16 query rows read the FP8 cache through "
      "flash_fwd_wgmma, on Hopper (sm_90) only: for other GPUs plan them with --kv-dtype model";
  EXPECT_EQ(kv_dtype_note(o, p), hopper);
  o.q_len = {1};
  EXPECT_EQ(kv_dtype_note(o, make_plan(llama3(), o)), hopper);
  // A soft-capped model (Gemma-2): no family serves its chunks over an FP8 cache; its decode steps
  // of up to 16 rows read one (flash_decode).
  PlanOptions g = o;
  g.regimes = {"decode", "chunk"};
  const Plan gp = make_plan(read_model_config(model_file("gemma2_9b.json")), g);
  for (const PlanEntry& e : gp.entries) EXPECT_EQ(e.problem.kv_fp8, e.regime == "decode") << e.problem.str();
  EXPECT_EQ(kv_dtype_note(g, gp),
            "--kv-dtype fp8: chunked prefill and decode steps of more than 16 query rows with a soft-cap or a head "
            "dim that is not a multiple of 32 still plan a 16-bit KV cache of q's dtype (no kernel family serves "
            "them over an FP8 cache)");
  // Without chunks, nothing to say; every problem parses back and a plan file keeps them.
  o.regimes = {"decode"};
  const Plan d = make_plan(llama3(), o);
  EXPECT_EQ(kv_dtype_note(o, d), "");
  for (const PlanEntry& e : d.entries) EXPECT_EQ(Problem::parse(e.problem.str()), e.problem) << e.problem.str();
  TempDir dir;
  d.save(dir.file("fp8.yaml"));
  EXPECT_EQ(Plan::load(dir.file("fp8.yaml")), d);
  // The 16-bit names (and model, the default) plan what no option plans, with no note.
  for (const char* name : {"model", "bf16", "fp16"}) {
    PlanOptions q = o;
    q.regimes = {"decode", "chunk"};
    q.kv_dtype = name;
    PlanOptions plain = q;
    plain.kv_dtype = PlanOptions{}.kv_dtype;
    EXPECT_EQ(make_plan(llama3(), q), make_plan(llama3(), plain)) << name;
    EXPECT_EQ(kv_dtype_note(q, make_plan(llama3(), q)), "") << name;
  }
  o.kv_dtype = "e4m3";
  EXPECT_EQ(input_error_of([&] { make_plan(llama3(), o); }),
            "--kv-dtype: unknown dtype 'e4m3' (expected fp8, or fp16, bf16 or model: a cache of q's dtype)");
  // An MLA model's decode reads its latent cache in FP8.
  PlanOptions mla;
  mla.regimes = {"decode"};
  mla.decode_batch = {16};
  mla.context = {4096};
  mla.kv_dtype = "fp8";
  EXPECT_EQ(specs(make_plan(read_model_config(model_file("deepseek_v3.json")), mla)),
            (std::vector<std::string>{
                "b=16,h=128,hkv=1,s=1,sk=4096,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1,kv_dtype=fp8"}));
}

TEST(PlanCli, KvDtypeFp8PlansFp8DecodeAndChunkedPrefillAndSaysWhereTheChunksRun) {
  const auto r = run_attntune("plan --model " + model_file("qwen2_7b.json") +
                              " --regimes decode,chunk --batch 1 --decode-batch 1 --context 4096 --kv-dtype fp8 "
                              "--format json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  ASSERT_EQ(j["problems"].size(), 2u) << r.out;
  EXPECT_EQ(j["problems"][0]["problem"], "b=1,h=28,hkv=4,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8");
  EXPECT_EQ(j["problems"][1]["problem"],
            "b=1,h=28,hkv=4,s=2048,sk=6144,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8");
  EXPECT_EQ(r.err,
            "attntune: note: --kv-dtype fp8: chunked prefill and decode steps of more than 16 query rows read the FP8 "
            "cache through flash_fwd_wgmma, on Hopper (sm_90) only: for other GPUs plan them with --kv-dtype model\n");
  EXPECT_TRUE(has(run_attntune("plan --help").out, "--kv-dtype arg (=model)"));
  expect_input_error("plan --model " + model_file("qwen2_7b.json") + " --kv-dtype int8", "--kv-dtype: unknown dtype 'int8'");
}

// --regimes train (issue 45): a training step's forward and backward over --batch x --seqlen, the
// forward listed once (under prefill when both are asked), the backward only where a backward
// family can serve the layers, and a note for what is left out.
TEST(PlanTrain, PlansEachStepsForwardAndBackward) {
  PlanOptions o;
  o.regimes = {"train"};
  o.batch = {1, 4};
  o.seqlen = {4096};
  const Plan p = make_plan(llama3(), o);
  EXPECT_EQ(specs(p), (std::vector<std::string>{
                          "b=1,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1",
                          "b=1,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,pass=bwd",
                          "b=4,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1",
                          "b=4,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,pass=bwd",
                      }));
  for (const PlanEntry& e : p.entries) {
    EXPECT_EQ(e.regime, "train");
    EXPECT_EQ(Problem::parse(e.problem.str()), e.problem);
  }
  EXPECT_EQ(train_note(llama3(), o), "");
  // With prefill the forward is prefill's, once; the backward stays train's.
  o.regimes = {"prefill", "train"};
  const Plan both = make_plan(llama3(), o);
  EXPECT_EQ(specs(both, "prefill").size(), 2u);
  EXPECT_EQ(specs(both, "train"), (std::vector<std::string>{
                                      "b=1,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,pass=bwd",
                                      "b=4,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,pass=bwd",
                                  }));
  // A plan file of train problems reads back as written.
  TempDir dir;
  const std::string path = dir.file("train.yaml");
  both.save(path);
  EXPECT_EQ(Plan::load(path), both);
}

TEST(PlanTrain, LayersWithoutABackwardFamilyPlanTheForwardAndSaySo) {
  PlanOptions o;
  o.regimes = {"train"};
  o.batch = {2};
  o.seqlen = {4096};
  // Mistral's window: its backward is planned, windowed.
  const ModelAttention mistral = read_model_config(model_file("mistral_7b_v01.json"));
  const auto mistral_specs = specs(make_plan(mistral, o));
  ASSERT_EQ(mistral_specs.size(), 2u);
  EXPECT_NE(mistral_specs[1].find("window=4095,pass=bwd"), std::string::npos) << mistral_specs[1];
  // gpt-oss's sinks: planned backward too, on both layer kinds (windowed and full), no note.
  const ModelAttention goss = read_model_config(model_file("gpt_oss_20b.json"));
  int sink_bwd = 0;
  for (const std::string& s : specs(make_plan(goss, o)))
    if (s.find("sinks=1,pass=bwd") != std::string::npos) ++sink_bwd;
  EXPECT_EQ(sink_bwd, 2);
  EXPECT_EQ(train_note(goss, o), "");
  // Gemma 2's soft-cap: planned backward too (its windowed and full layers), no note.
  const ModelAttention gemma = read_model_config(model_file("gemma2_9b.json"));
  int cap_bwd = 0;
  for (const std::string& s : specs(make_plan(gemma, o)))
    if (s.find("softcap=50") != std::string::npos && s.find("pass=bwd") != std::string::npos) ++cap_bwd;
  EXPECT_EQ(cap_bwd, 2);
  EXPECT_EQ(train_note(gemma, o), "");
  // DeepSeek's MLA prefill (d=192, dv=128): forward only.
  const ModelAttention ds = read_model_config(model_file("deepseek_v3.json"));
  for (const std::string& s : specs(make_plan(ds, o))) EXPECT_EQ(s.find("pass=bwd"), std::string::npos) << s;
  EXPECT_NE(train_note(ds, o).find("V's head dim 128"), std::string::npos) << train_note(ds, o);
  // Without train, no note.
  o.regimes = {"prefill"};
  EXPECT_EQ(train_note(ds, o), "");
}
}  // namespace test_plan
