// `attntune plan`: from a model's Hugging Face config.json and the batch sizes, lengths and
// regimes a deployment runs, the list of attention problems to tune (docs/design/plan.md).
//   read_model_config: config.json -> the model's attention shape (heads, KV heads, head dim, dtype)
//   make_plan:         that shape x PlanOptions -> a Plan (deduplicated, in a stable order)
//   Plan::save/load:   the plan file, YAML (.yaml, .yml) or JSON (.json), both read back
// Plain library code: no CLI, no database, no CUDA. Every bad input is an InputError naming the
// file (and line:column, or the key) it came from.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/problem.hpp"

namespace attntune {

// What a model's attention looks like, read from its config.json.
struct ModelAttention {
  std::string name;                // _name_or_path, else model_type, else the file's stem
  int heads = 0;                   // num_attention_heads
  int kv_heads = 0;                // num_key_value_heads (Falcon: num_kv_heads, or 1 for multi_query); default heads
  int head_dim = 0;                // head_dim, else hidden_size / num_attention_heads
  std::string dtype;               // "bf16" | "fp16" (torch_dtype; float32 or absent -> bf16, with a note)
  std::string dtype_note;          // why dtype was assumed (float32, no torch_dtype); empty when the config says
  std::string source;              // the config file's name, without its directories
  std::int64_t max_context = 0;    // max_position_embeddings; 0 when the config does not say
  std::vector<std::string> notes;  // what was assumed or is worth knowing, one sentence each
};

// Reads a config.json (keys at the top level, else in a nested "text_config", as multimodal
// configs have them). InputError "FILE: KEY ..." for a missing, mistyped or inconsistent key,
// "FILE:LINE:COLUMN: invalid JSON: ..." for a syntax error, and for a head dim the kernels do not
// support (64, 128, 256).
ModelAttention read_model_config(const std::string& path);

// The head dims the kernel families serve (search_spaces/*.yaml, `problem: d:`).
const std::vector<int>& supported_head_dims();

// The regimes, in the order a plan lists them. varlen: prefill as serving engines run it, a packed
// batch of prompts of different lengths (`varlen=N`); opt-in, as chunk.
inline constexpr const char* kRegimes[] = {"prefill", "decode", "chunk", "varlen"};

// The shortest prompt of the varlen regime's packed batch of longest prompt `s`: s / 16, at least 1
// (lengths s/16..s, the spread of a serving batch's prompts).
inline constexpr std::int64_t varlen_shortest(std::int64_t s) { return s / 16 > 0 ? s / 16 : 1; }

struct PlanOptions {
  std::vector<std::string> regimes = {"prefill", "decode"};  // prefill | decode | chunk | varlen
  std::string dtype = "model";                               // bf16 | fp16 | both | model
  std::vector<std::int64_t> batch = {1, 8};                  // prefill, varlen and chunk
  std::vector<std::int64_t> seqlen = {512, 2048, 8192};      // prefill: s = sk; varlen: the longest prompt
  std::vector<std::int64_t> decode_batch = {1, 16, 64};      // decode
  std::vector<std::int64_t> context = {2048, 8192, 32768};   // decode: sk; chunk: keys before the chunk
  std::vector<std::int64_t> q_len = {1};                     // decode: s (more than 1: speculative decoding)
  std::int64_t chunk = 2048;                                 // chunk: s; sk = context + chunk
  std::int64_t page = 16;                                    // decode and chunk: KV cache page rows; 0 contiguous
  int tp = 1;  // tensor parallelism: each GPU runs heads / tp query heads and max(1, kv_heads / tp) KV heads
};

// The longest length (s, sk) and the largest batch a plan may ask for.
inline constexpr std::int64_t kPlanMaxLength = std::int64_t{1} << 20;
inline constexpr std::int64_t kPlanMaxBatch = std::int64_t{1} << 20;

// "1,8,64" -> {1, 8, 64}, for the CLI's list options. InputError naming `option` ("--batch") for
// an empty list or item, anything but a whole number (NaN, 1.5, 1e3), and values outside [lo, hi].
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& option, std::int64_t lo,
                                         std::int64_t hi);
// "prefill,chunk" -> {"prefill", "chunk"}; InputError for an empty list or an unknown regime.
std::vector<std::string> parse_regimes(const std::string& text);

struct PlanEntry {
  Problem problem;
  std::string regime;  // prefill | decode | chunk | varlen
  bool operator==(const PlanEntry&) const = default;
};

struct Plan {
  std::string model;   // the model's name
  std::string source;  // the config file's name, never a full path
  std::vector<PlanEntry> entries;

  std::string yaml() const;             // the YAML plan file, one problem a line
  nlohmann::ordered_json json() const;  // {"model", "source", "problems": [{"problem": spec, "regime"}]}
  // Reads a plan file, YAML or JSON by its extension. Every entry's problem goes through
  // Problem::parse; bad entries, unknown keys, duplicate problems and an empty list are
  // InputErrors at FILE:LINE:COLUMN.
  static Plan load(const std::string& path);
  // Writes the file whole or not at all (a temporary file beside it, then rename), YAML or JSON by
  // the extension. EnvError (exit 3) when the disk, quota or file-size limit is full; InputError for
  // the rest (a missing directory, no permission, an unknown extension, a path that is one of
  // `databases` or their SQLite companions). The output writer of core/output_file.hpp; `what`
  // prefixes its messages ("plan -o"; "" for none).
  void save(const std::string& path, const std::vector<std::string>& databases = {},
            const std::string& what = "") const;
  bool operator==(const Plan&) const = default;
};

// The problems `model` runs in the regimes and sizes `opts` asks for: deduplicated, ordered by
// regime (prefill, decode, chunk, varlen), dtype, b, s, sk. InputError for nonsense options (an
// empty list, zero or negative sizes, lengths over kPlanMaxLength, an unknown regime or dtype, a
// decode q-len longer than its context, a chunk longer than the context before it, a varlen batch
// of more rows than cu_seqlens' int holds).
Plan make_plan(const ModelAttention& model, const PlanOptions& opts);

}  // namespace attntune
