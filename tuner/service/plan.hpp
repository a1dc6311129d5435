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

// One kind of attention layer of a model: the variants its problems carry and how many of the
// model's layers run it (docs/design/plan.md "Layers that are not plain attention").
struct LayerKind {
  std::string name = "full_attention";  // transformers' layer_types word: full_attention | sliding_attention
  std::int64_t window = -1;  // the problems' window=L: keys left of the query's own (sliding_window - 1); -1 none
  double softcap = 0;        // attn_logit_softcapping: the problems' softcap=C; 0 none
  bool sinks = false;        // learnable per-head sink logits (gpt-oss): sinks=1
  int layers = 0;            // how many of the model's layers are of this kind; 0: every layer (uncounted)
  bool plain() const { return window < 0 && softcap == 0 && !sinks; }
  bool operator==(const LayerKind&) const = default;
};

// What a model's attention looks like, read from its config.json.
struct ModelAttention {
  std::string name;                // _name_or_path, else model_type, else the file's stem
  int heads = 0;                   // num_attention_heads
  int kv_heads = 0;                // num_key_value_heads (Falcon: num_kv_heads, or 1 for multi_query); default heads
  int head_dim = 0;                // head_dim, else hidden_size / num_attention_heads
  // Multi-head latent attention (DeepSeek-V2/V3, kv_lora_rank): prefill runs on the decompressed
  // K/V, one per query head, at head_dim = qk_nope_head_dim + qk_rope_head_dim and a value head dim
  // head_dim_v = v_head_dim (problems `d=192,dv=128`); decode runs over the latent cache, one KV head
  // of latent_head_dim = kv_lora_rank + qk_rope_head_dim whose first latent_head_dim_v = kv_lora_rank
  // dims are V (problems `d=576,dv=512,latent=1`, pages of kLatentPage). Chunked prefill is left out
  // (a note says why).
  bool latent = false;
  // A head dim some family serves for decode only (512: flash_decode_wgmma; no prefill family holds
  // it): the plan has decode problems alone, and a note says why.
  bool decode_only = false;
  int head_dim_v = 0;              // V's head dim where it is not head_dim; 0: head_dim
  int latent_head_dim = 0;         // latent: the cache's dims (576); else 0
  int latent_head_dim_v = 0;       // latent: V's, the cache's first (512); else 0
  std::string dtype;               // "bf16" | "fp16" (torch_dtype; float32 or absent -> bf16, with a note)
  std::string dtype_note;          // why dtype was assumed (float32, no torch_dtype); empty when the config says
  std::string source;              // the config file's name, without its directories
  std::int64_t max_context = 0;    // max_position_embeddings; 0 when the config does not say
  int layers = 0;                  // num_hidden_layers (or layer_types' length); 0 when the config does not say
  // What the layers run: full_attention first, then sliding_attention; each kind with at least one
  // layer. Empty (callers that fill the struct themselves): every layer plain full attention.
  std::vector<LayerKind> layer_kinds;
  // The softmax scale the model uses when it is not head_dim^-0.5 as written (Gemma's
  // query_pre_attn_scalar^-0.5, Granite's attention_multiplier); 0: the config does not set one.
  // Problem specs have no scale (the kernels take it at run time): a note says what to pass.
  double softmax_scale = 0;
  std::vector<std::string> notes;  // what was assumed or is worth knowing, one sentence each
  // Whether some layer is not plain full attention (a window, a cap, sinks).
  bool has_variants() const;
};

// Reads a config.json (keys at the top level, else in a nested "text_config", as multimodal
// configs have them). InputError "FILE: KEY ..." for a missing, mistyped or inconsistent key,
// "FILE:LINE:COLUMN: invalid JSON: ..." for a syntax error, for a head dim the kernels do not
// support (supported_head_dims), and for attention the kernels do not compute, naming the key (ALiBi,
// chunked attention, layer kinds other than full_attention and sliding_attention, bidirectional
// attention, multi-head latent attention). Sliding windows (sliding_window, layer_types,
// use_sliding_window / max_window_layers, the Gemma 2/3 and gpt-oss layer patterns), soft-caps
// (attn_logit_softcapping) and sinks (gpt_oss) become layer_kinds.
ModelAttention read_model_config(const std::string& path);

// The head dims the kernel families serve (search_spaces/*.yaml, `problem: d:`): those some family
// serves for prefill and some for decode. describe_head_dims says them in a message.
const std::vector<int>& supported_head_dims();
// Those some family serves for decode but none for prefill (512: flash_decode_wgmma's).
const std::vector<int>& decode_only_head_dims();
std::string describe_head_dims(const std::vector<int>& dims);

// The regimes, in the order a plan lists them. varlen: prefill as serving engines run it, a packed
// batch of prompts of different lengths (`varlen=N`); opt-in, as chunk. train (issue 45): a training
// step's attention over --batch micro-batches of --seqlen tokens, its forward (the prefill problem;
// listed once, under prefill when both are asked) and its backward (`pass=bwd`); opt-in.
inline constexpr const char* kRegimes[] = {"prefill", "decode", "chunk", "varlen", "train"};

// The shortest prompt of the varlen regime's packed batch of longest prompt `s`: s / 16, at least 1
// (lengths s/16..s, the spread of a serving batch's prompts).
inline constexpr std::int64_t varlen_shortest(std::int64_t s) { return s / 16 > 0 ? s / 16 : 1; }

// The page rows of a latent model's decode problems (FlashMLA's block size, what serving engines
// page DeepSeek's latent cache by), whatever --page says for other models.
inline constexpr std::int64_t kLatentPage = 64;

struct PlanOptions {
  std::vector<std::string> regimes = {"prefill", "decode"};  // prefill | decode | chunk | varlen | train
  std::string dtype = "model";                               // bf16 | fp16 | both | model
  std::vector<std::int64_t> batch = {1, 8};                  // prefill, varlen, chunk and train
  std::vector<std::int64_t> seqlen = {512, 2048, 8192};      // prefill, train: s = sk; varlen: the longest prompt
  std::vector<std::int64_t> decode_batch = {1, 16, 64};      // decode
  std::vector<std::int64_t> context = {2048, 8192, 32768};   // decode: sk; chunk: keys before the chunk
  std::vector<std::int64_t> q_len = {1};                     // decode: s (more than 1: speculative decoding)
  std::int64_t chunk = 2048;                                 // chunk: s; sk = context + chunk
  std::int64_t page = 16;                                    // decode and chunk: KV cache page rows; 0 contiguous
  int tp = 1;  // tensor parallelism: each GPU runs heads / tp query heads and max(1, kv_heads / tp) KV heads
  // The KV cache's dtype: fp8 (FP8 e4m3: decode problems get kv_dtype=fp8, and so do chunked
  // prefill and decode steps of more than kPlanDecodeMaxQ rows, which flash_fwd_wgmma serves on
  // Hopper, where their head dims are multiples of 32 and there is no soft-cap; kv_dtype_note says
  // so), or fp16, bf16, model: a cache of q's dtype (every problem as without the option).
  std::string kv_dtype = "model";
};

// Query rows up to which a step reads its cache as decode (flash_decode's kDecodeMaxSeqlenQ): the
// decode problems --kv-dtype fp8 plans over an FP8 cache.
inline constexpr std::int64_t kPlanDecodeMaxQ = 16;

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
  std::string regime;  // prefill | decode | chunk | varlen | train
  // The layers whose calls the problem is ("sliding_attention, 21 of 42 layers"); "" when every
  // layer of the model runs it (plain attention): the plan file's optional `layers`.
  std::string layers;
  bool operator==(const PlanEntry&) const = default;
};

struct Plan {
  std::string model;   // the model's name
  std::string source;  // the config file's name, never a full path
  std::vector<PlanEntry> entries;

  std::string yaml() const;             // the YAML plan file, one problem a line
  // {"model", "source", "problems": [{"problem": spec, "regime"[, "layers"]}]}
  nlohmann::ordered_json json() const;
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

// The problems `model` runs in the regimes and sizes `opts` asks for, for each of its layer kinds
// (the kind's variants in the spec, its layers in `layers` when the model has variants):
// deduplicated, ordered by regime (prefill, decode, chunk, varlen), dtype, layer kind, b, s, sk.
// InputError for nonsense options (an
// empty list, zero or negative sizes, lengths over kPlanMaxLength, an unknown regime or dtype, a
// decode q-len longer than its context, a chunk longer than the context before it, a varlen batch
// of more rows than cu_seqlens' int holds).
Plan make_plan(const ModelAttention& model, const PlanOptions& opts);

// The note `plan` prints for --kv-dtype fp8 where chunked prefill or decode steps of more than
// kPlanDecodeMaxQ rows are in the plan: those planned over the FP8 cache run on Hopper only
// (flash_fwd_wgmma), and those that keep a 16-bit cache (a soft-cap, a head dim not a multiple of
// 32) say why; "" for every other plan.
std::string kv_dtype_note(const PlanOptions& opts, const Plan& plan);
// What --regimes train leaves out, for stderr ("" when nothing): the backward of a model whose V
// head dim is not its Q/K one (no backward family serves it yet; its forward is planned).
std::string train_note(const ModelAttention& m, const PlanOptions& opts);

}  // namespace attntune
