// attntune plan: the attention problems a model runs (its heads, KV heads, head dim and dtype from
// a Hugging Face config.json) over the batch sizes, lengths and regimes asked for; printed, and
// with -o saved as a plan file (docs/design/plan.md). Needs no GPU and no database.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/format.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "service/plan.hpp"

namespace attntune::cli::cmd_plan {

namespace {

constexpr const char* kSummary = "list the attention problems a model runs (from its config.json), save them as a plan";

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string out;
  for (auto x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

std::string join_regimes(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& r : v) out += (out.empty() ? "" : ",") + r;
  return out;
}

std::int64_t one_number(const std::string& text, const std::string& option, std::int64_t lo, std::int64_t hi) {
  const auto v = parse_int_list(text, option, lo, hi);
  if (v.size() != 1) throw InputError(fmt::format("{} '{}': expected one number", option, text));
  return v.front();
}

// Counts in tables: about four significant digits, no exponents.
std::string amount(double v) { return v < 0.001 ? "<0.001" : format_us(v); }

// "21 of 42 layers", or "every layer" when the config does not count them.
std::string layer_count(const ModelAttention& m, const LayerKind& k) {
  if (k.layers > 0 && m.layers > 0) return fmt::format("{} of {} layers", k.layers, m.layers);
  return "every layer";
}

// A layer kind's variants as its problem specs spell them ("window=4095,softcap=50"), "plain".
std::string variant_text(const LayerKind& k) {
  Problem p;
  p.causal = true;
  p.window_left = k.window;
  p.softcap = k.softcap;
  p.sinks = k.sinks;
  const std::string v = p.variant_spec();
  return v.empty() ? "plain attention" : v;
}

void print_table(std::ostream& out, const ModelAttention& m, const PlanOptions& o, const Plan& plan) {
  const PlanEntry& first = plan.entries.front();
  std::string per_gpu;
  if (o.tp > 1) per_gpu = fmt::format(" (per GPU at --tp {}: {} and {})", o.tp, first.problem.h, first.problem.hkv);
  out << fmt::format("{} ({}): {} query heads, {} KV head{}{}, head dim {}, {}; {} problem{}\n",
                     printable_line(m.name), printable_line(m.source), m.heads, m.kv_heads, m.kv_heads == 1 ? "" : "s",
                     per_gpu, m.head_dim, m.dtype, plan.entries.size(), plan.entries.size() == 1 ? "" : "s");
  // A model with variants: what each kind of layer runs, one line each.
  if (m.has_variants())
    for (const LayerKind& k : m.layer_kinds)
      out << fmt::format("  {}: {}; {}\n", k.name, layer_count(m, k), variant_text(k));
  out << "\n";
  // FLOPs as FlashAttention counts them (causal: the visible half; a window: what it lets a query
  // see); bytes: Q, K, V read and O written once, the least any kernel moves (a window: the K/V
  // rows some query sees). Their ratio says whether the problem is bound by compute (prefill:
  // hundreds of FLOP/B) or by memory (decode: about h / hkv).
  const bool layers = std::any_of(plan.entries.begin(), plan.entries.end(),
                                  [](const PlanEntry& e) { return !e.layers.empty(); });
  std::vector<std::string> head = {"regime", "problem", "GFLOP", "MB", "FLOP/B"};
  if (layers) head.push_back("layers");
  Table t(head);
  for (const auto& e : plan.entries) {
    const double flops = e.problem.flops(), bytes = e.problem.bytes();
    std::vector<std::string> row = {e.regime, e.problem.str(), amount(flops / 1e9), amount(bytes / 1e6),
                                    amount(flops / bytes)};
    if (layers) row.push_back(printable_line(e.layers));
    t.add_row(row);
  }
  t.print(out);
}

int run_plan(const std::vector<std::string>& args) {
  const PlanOptions defaults;
  std::string model_path, regimes, dtype, kv_dtype, batch, seqlen, decode_batch, context, q_len, chunk, page, output, format;
  int tp = 1;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model", po::value(&model_path), "the model's Hugging Face config.json (required)")
      ("regimes", po::value(&regimes)->default_value(join_regimes(defaults.regimes)),
       "which of prefill, decode, chunk (chunked prefill over a paged KV cache), varlen (prefill as a packed "
       "batch of prompts of lengths seqlen/16..seqlen: varlen=max(1, seqlen/16))")
      ("dtype", po::value(&dtype)->default_value(defaults.dtype), "bf16, fp16, both, or model (the config's torch_dtype)")
      ("kv-dtype", po::value(&kv_dtype)->default_value(defaults.kv_dtype),
       "the KV cache's dtype: fp8 (FP8 e4m3: decode and chunked prefill problems get kv_dtype=fp8; beyond 16 "
       "query rows on Hopper only), or fp16, bf16, model: a cache of q's dtype (--dtype)")
      ("batch", po::value(&batch)->default_value(list_text(defaults.batch)), "prefill, varlen and chunk: batch sizes")
      ("seqlen", po::value(&seqlen)->default_value(list_text(defaults.seqlen)),
       "prefill: prompt lengths (s = sk); varlen: the longest prompt")
      ("decode-batch", po::value(&decode_batch)->default_value(list_text(defaults.decode_batch)),
       "decode: batch sizes (sequences decoded together)")
      ("context", po::value(&context)->default_value(list_text(defaults.context)),
       "decode: keys in the cache (sk); chunk: keys before the chunk")
      ("q-len", po::value(&q_len)->default_value(list_text(defaults.q_len)),
       "decode: new tokens per step (s; e.g. 1,4 for speculative decoding)")
      ("chunk", po::value(&chunk)->default_value(std::to_string(defaults.chunk)),
       "chunk: tokens per chunk (s; sk = context + chunk)")
      ("page", po::value(&page)->default_value(std::to_string(defaults.page)),
       "decode and chunk: KV cache page size in rows (0: a contiguous cache)")
      ("tp", po::value(&tp)->default_value(defaults.tp),
       "tensor parallelism: plan one GPU's share of the heads (KV heads fewer than GPUs are replicated)")
      ("output,o", po::value(&output), "save the plan: PLAN.yaml, .yml or .json")
      ("format", po::value(&format)->default_value("table"), "table or json (the plan file's JSON)");
  // clang-format on
  po::variables_map vm;
  if (parse_args("plan", kSummary, opts, args, vm)) return 0;
  const Format kind = parse_format(format, /*allow_csv=*/false);
  if (!vm.count("model") || model_path.empty()) throw InputError("plan: --model CONFIG.json is required");
  if (vm.count("output") && output.empty()) throw InputError("plan: -o needs a file name (PLAN.yaml or PLAN.json)");

  PlanOptions o;
  o.regimes = parse_regimes(regimes);
  o.dtype = dtype;
  o.kv_dtype = kv_dtype;
  o.batch = parse_int_list(batch, "--batch", 1, kPlanMaxBatch);
  o.seqlen = parse_int_list(seqlen, "--seqlen", 1, kPlanMaxLength);
  o.decode_batch = parse_int_list(decode_batch, "--decode-batch", 1, kPlanMaxBatch);
  o.context = parse_int_list(context, "--context", 1, kPlanMaxLength);
  o.q_len = parse_int_list(q_len, "--q-len", 1, kPlanMaxLength);
  o.chunk = one_number(chunk, "--chunk", 1, kPlanMaxLength);
  o.page = one_number(page, "--page", 0, kPlanMaxLength);
  o.tp = tp;

  const ModelAttention model = read_model_config(model_path);
  const Plan plan = make_plan(model, o);
  if (vm.count("output")) plan.save(output, {default_db_path()}, "plan -o");  // before printing: a failed save prints only its error

  if (kind == Format::kJson)
    print_json(std::cout, plan.json());
  else
    print_table(std::cout, model, o, plan);
  std::cout.flush();

  std::vector<std::string> notes;
  if (o.dtype == "model" && !model.dtype_note.empty()) notes.push_back(model.dtype_note);
  notes.insert(notes.end(), model.notes.begin(), model.notes.end());
  if (const std::string n = kv_dtype_note(o, plan); !n.empty()) notes.push_back(n);
  if (const std::string n = train_note(model, o); !n.empty()) notes.push_back(n);
  std::int64_t longest = 0;
  for (const auto& e : plan.entries) longest = std::max(longest, e.problem.sk);
  if (model.max_context > 0 && longest > model.max_context)
    notes.push_back(fmt::format("some problems have more keys (up to {}) than the model's max_position_embeddings ({})",
                                longest, model.max_context));
  // A window at least as long as every key count planned lets each query see every key, as full
  // attention does; its problems stay windowed (docs/design/plan.md says why).
  for (const LayerKind& k : model.layer_kinds) {
    if (k.window < 0) continue;
    std::int64_t keys = 0;
    for (const auto& e : plan.entries)
      if (e.problem.window_left == k.window) keys = std::max(keys, e.problem.sk);
    if (keys > 0 && k.window + 1 >= keys)
      notes.push_back(fmt::format(
          "the {} layers' window ({} keys) is as long as every key count planned for them (up to {}): their "
          "problems see every key, as full attention's do, and stay windowed, since those layers' calls pass the "
          "window and the library runs only windowed kernels for windowed calls",
          k.name, k.window + 1, keys));
  }
  for (const auto& n : notes) std::cerr << "attntune: note: " << n << "\n";
  if (vm.count("output"))
    std::cerr << fmt::format("wrote {} problem{} to {}\n", plan.entries.size(), plan.entries.size() == 1 ? "" : "s",
                             output);
  return 0;
}

const bool registered = register_command({"plan", kSummary, false, run_plan});

}  // namespace

}  // namespace attntune::cli::cmd_plan
