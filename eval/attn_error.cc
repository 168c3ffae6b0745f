// `magicpig eval attn-error`: per-head attention-output error on real activations; see
// evaluators.h. Reuses tests/accuracy's CaptureQk (exact prefill, post-RoPE keys, fp16-cache
// values, the last Q queries) and HeadEvaluator (magicpig(K, L), then oracle sampling and top-k
// with B = |S| of that query, each LSE-merged with the exact static part, against exact attention).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json/serialize.h"
#include "common/status_macros.h"
#include "eval/accuracy_eval.h"
#include "eval/evaluators.h"
#include "eval/qk_dump.h"
#include "eval/tasks.h"
#include "gpu_node/engine/attention_router.h"

namespace magicpig::eval {

using ::magicpig::attention::SimHash;

namespace {

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(v.size() - 1, q * (v.size() - 1) + 0.5))];
}
double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// The evaluator of one sparse layer's (dump slot's) kv head over the whole captured context.
absl::StatusOr<accuracy::HeadEvaluator> EvaluatorOf(const accuracy::QkDump& dump, size_t slot,
                                                    int64_t kvh, const SimHash& hash) {
  const int64_t n = dump.n_tokens;
  return accuracy::HeadEvaluator::Create(dump.HeadRows(dump.keys[slot], kvh, 0, n),
                                         dump.HeadRows(dump.values[slot], kvh, 0, n), n, hash);
}

// The estimators' draw seed for (SimHash seed, layer, query head): distinct per triple.
uint64_t DrawSeedOf(uint64_t seed, int64_t layer, int64_t h) {
  return seed * 1000003ull + static_cast<uint64_t>(layer * 64 + h);
}

// Per (config, layer): over the sparse layer's (head, query, SimHash seed) triples, the fraction
// whose output error (merged with the static part) and whose offloaded denominator error are
// within epsilon, for vattention and vattention-lsh(K,L), and the keys each touched.
absl::Status VerifiedTable(const accuracy::QkDump& dump, const std::vector<bool>& dense,
                           const AttnErrorOptions& o, float scale, std::ostream& out,
                           json::Value& rows) {
  const int64_t d = dump.head_dim, n = dump.n_tokens;
  const int64_t group = dump.n_head / dump.n_head_kv;
  const attention::VAttentionParams& va = o.va;
  out << absl::StrFormat(
      "empirical guarantee, epsilon %.3g delta %.3g (heavy %d, base rate %.3g): per layer, the "
      "share of (head, query, seed) with |o - o_exact| / |o_exact| <= epsilon (out) and with "
      "the offloaded denominator within epsilon (den); keys touched as %% of the offloaded\n",
      va.epsilon, va.delta, va.heavy, va.base_rate);
  out << absl::StrFormat("%-10s %5s %7s | %-26s | %-26s\n", "(K,L)", "layer", "triples",
                         "vattention out den keys%", "vattention-lsh out den keys%");
  for (const LshConfig& c : o.configs) {
    for (size_t slot = 0; slot < dump.layers.size(); ++slot) {
      const int64_t layer = dump.layers[slot];
      if (dense[static_cast<size_t>(layer)]) continue;
      int64_t triples = 0;
      double out_ok[2] = {0, 0}, den_ok[2] = {0, 0}, keys[2] = {0, 0};
      for (uint64_t seed : o.lsh_seeds) {
        MAGICPIG_ASSIGN_OR_RETURN(SimHash hash, SimHash::Create(d, c.first, c.second, seed));
        for (int64_t kvh = 0; kvh < dump.n_head_kv; ++kvh) {
          MAGICPIG_ASSIGN_OR_RETURN(accuracy::HeadEvaluator ev, EvaluatorOf(dump, slot, kvh, hash));
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            for (int64_t j = 0; j < dump.n_queries; ++j) {
              const int64_t pos = n - dump.n_queries + j;
              MAGICPIG_ASSIGN_OR_RETURN(
                  auto e, ev.EvaluateVerified(dump.Query(slot, j, h), pos + 1, scale, va,
                                              DrawSeedOf(seed, layer, h)));
              int i = 0;
              for (const accuracy::VerifiedErrors* v : {&e.first, &e.second}) {
                out_ok[i] += v->err <= va.epsilon;
                den_ok[i] += v->off_den_err <= va.epsilon;
                keys[i] += static_cast<double>(v->touched) / std::max<int64_t>(1, ev.n_off());
                ++i;
              }
              ++triples;
            }
          }
        }
      }
      const double t = static_cast<double>(std::max<int64_t>(1, triples));
      out << absl::StrFormat(
          "(%d,%d)%*s %5d %7d | %7.3f %7.3f %7.2f%%   | %7.3f %7.3f %7.2f%%\n", c.first, c.second,
          static_cast<int>(10 - absl::StrCat("(", c.first, ",", c.second, ")").size()), "", layer,
          triples, out_ok[0] / t, den_ok[0] / t, 100 * keys[0] / t, out_ok[1] / t, den_ok[1] / t,
          100 * keys[1] / t);
      json::Value row = json::Value::Object();
      row.Set("k", c.first);
      row.Set("l", c.second);
      row.Set("layer", layer);
      row.Set("triples", triples);
      for (int i = 0; i < 2; ++i) {
        json::Value m = json::Value::Object();
        m.Set("out_within", out_ok[i] / t);
        m.Set("den_within", den_ok[i] / t);
        m.Set("keys_frac", keys[i] / t);
        row.Set(i == 0 ? "vattention" : "vattention_lsh", std::move(m));
      }
      rows.Push(std::move(row));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunAttnError(const AttnErrorOptions& o, std::ostream& out) {
  std::filesystem::create_directories(o.work_dir);
  const std::string text_path = absl::StrCat(o.work_dir, "/attn_error_text.txt");
  {
    std::ofstream t(text_path, std::ios::trunc);
    t << PplText(o.text_seed, 8, o.tokens / 8 + 200);
  }
  accuracy::QkCaptureOptions co;
  co.model_path = o.model_path;
  co.text_paths = {text_path};
  co.n_tokens = o.tokens;
  co.n_queries = o.queries;
  co.capture_values = true;
  co.num_threads = o.threads;
  const auto t0 = std::chrono::steady_clock::now();
  MAGICPIG_ASSIGN_OR_RETURN(accuracy::QkDump dump, accuracy::CaptureQk(co));
  if (!o.quiet) {
    std::cerr << absl::StrFormat(
        "[attn-error] captured %d tokens (%d of text before repetition), %d layers in %.1fs\n",
        dump.n_tokens, dump.text_tokens, dump.layers.size(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // The engine's default dense layers stay exact; evaluate the sparse ones.
  const std::vector<bool> dense =
      engine::DenseLayers(dump.n_layer_model, engine::SparseAttentionOptions{});
  const int64_t d = dump.head_dim, n = dump.n_tokens;
  const int64_t group = dump.n_head / dump.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv, std::ios::trunc);
    csv << "k,l,lsh_seed,layer,head,queries,sampled_frac,magicpig,oracle,topk,off_magicpig,"
           "off_oracle,off_topk,topk_mass\n";
  }
  json::Value summary = json::Value::Array();
  json::Value json_verified = json::Value::Array();
  out << absl::StrFormat(
      "attention output error on real activations: %d tokens of generated documents, last %d "
      "queries, sparse layers only, 4 sinks + 64 local exact; relative L2 |o - o_exact| / "
      "|o_exact| (merged with the static part)\n",
      n, o.queries);
  out << absl::StrFormat("%-10s %8s | %-24s | %-24s | %-24s | %s\n", "(K,L)", "|S|/n",
                         "magicpig mean p50 p90 p99", "oracle mean p50 p90 p99",
                         "topk mean p50 p90 p99", "mp<topk heads");
  if (o.vattention) {
    MAGICPIG_RETURN_IF_ERROR(VerifiedTable(dump, dense, o, scale, out, json_verified));
  }
  for (const LshConfig& c : o.configs) {
    std::vector<double> mp, orc, tk, frac;
    int64_t heads = 0, mp_better = 0;
    for (uint64_t seed : o.lsh_seeds) {
      MAGICPIG_ASSIGN_OR_RETURN(SimHash hash, SimHash::Create(d, c.first, c.second, seed));
      for (size_t slot = 0; slot < dump.layers.size(); ++slot) {
        const int64_t layer = dump.layers[slot];
        if (dense[static_cast<size_t>(layer)]) continue;
        for (int64_t kvh = 0; kvh < dump.n_head_kv; ++kvh) {
          MAGICPIG_ASSIGN_OR_RETURN(accuracy::HeadEvaluator ev, EvaluatorOf(dump, slot, kvh, hash));
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            std::vector<accuracy::QueryErrors> errs;
            for (int64_t j = 0; j < dump.n_queries; ++j) {
              const int64_t pos = n - dump.n_queries + j;
              MAGICPIG_ASSIGN_OR_RETURN(
                  accuracy::QueryErrors e,
                  ev.Evaluate(dump.Query(slot, j, h), pos + 1, scale, DrawSeedOf(seed, layer, h)));
              mp.push_back(e.magicpig);
              orc.push_back(e.oracle);
              tk.push_back(e.topk);
              frac.push_back(static_cast<double>(e.sampled) / std::max<int64_t>(1, e.n_off));
              errs.push_back(e);
            }
            const accuracy::ErrorSummary s = accuracy::Summarize(errs);
            ++heads;
            mp_better += s.magicpig < s.topk;
            if (csv.is_open()) {
              csv << c.first << "," << c.second << "," << seed << "," << layer << "," << h << ","
                  << s.queries << "," << s.sampled_frac << "," << s.magicpig << "," << s.oracle
                  << "," << s.topk << "," << s.off_magicpig << "," << s.off_oracle << ","
                  << s.off_topk << "," << s.topk_mass << "\n";
            }
          }
        }
      }
    }
    auto q4 = [](const std::vector<double>& v) {
      return absl::StrFormat("%.3f %.3f %.3f %.3f", Mean(v), Quantile(v, 0.5), Quantile(v, 0.9),
                             Quantile(v, 0.99));
    };
    out << absl::StrFormat(
        "(%d,%d)%*s %7.2f%% | %-24s | %-24s | %-24s | %d/%d\n", c.first, c.second,
        static_cast<int>(10 - absl::StrCat("(", c.first, ",", c.second, ")").size()), "",
        100 * Mean(frac), q4(mp), q4(orc), q4(tk), mp_better, heads);
    json::Value row = json::Value::Object();
    row.Set("k", c.first);
    row.Set("l", c.second);
    row.Set("sampled_frac", Mean(frac));
    row.Set("queries", static_cast<int64_t>(mp.size()));
    for (const auto& [name, v] :
         {std::pair<const char*, const std::vector<double>*>{"magicpig", &mp},
          {"oracle", &orc},
          {"topk", &tk}}) {
      json::Value m = json::Value::Object();
      m.Set("mean", Mean(*v));
      m.Set("p50", Quantile(*v, 0.5));
      m.Set("p90", Quantile(*v, 0.9));
      m.Set("p99", Quantile(*v, 0.99));
      row.Set(name, std::move(m));
    }
    row.Set("heads_magicpig_below_topk", mp_better);
    row.Set("heads", heads);
    summary.Push(std::move(row));
  }
  if (!o.json.empty()) {
    std::ofstream js(o.json, std::ios::trunc);
    json::Value root = json::Value::Object();
    root.Set("tokens", n);
    root.Set("queries", o.queries);
    root.Set("text", "eval::PplText: 8 generated pseudo-essay documents");
    root.Set("configs", std::move(summary));
    if (o.vattention) root.Set("verified", std::move(json_verified));
    js << json::Serialize(root) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace magicpig::eval
