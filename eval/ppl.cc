// `magicpig eval ppl`: teacher-forced decode agreement (eval-tasks.md §6.1); see evaluators.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json/serialize.h"
#include "common/status_macros.h"
#include "eval/evaluators.h"
#include "eval/fork_decoder.h"
#include "eval/tasks.h"

namespace magicpig::eval {

namespace {

void LogSoftmax(const std::vector<float>& logits, std::vector<float>* out) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const float lz = max + static_cast<float>(std::log(sum));
  out->resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - lz;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(v.size() - 1, q * (v.size() - 1) + 0.5))];
}

struct RunStats {
  std::string method, family;
  LshConfig config{0, 0};
  uint64_t seed = 0;
  int64_t budget = 0;
  double nll = 0, kl = 0, kl_p90 = 0, kl_p99 = 0, top1 = 0, density = 1;
  int64_t positions = 0;
};

}  // namespace

std::string PplText(uint64_t seed, int64_t n_docs, int64_t words_per_doc) {
  std::string text;
  for (int64_t i = 0; i < n_docs; ++i) {
    if (i > 0) text += "\n\n";
    absl::StrAppend(&text, "Document ", i + 1, ":\n",
                    PseudoEssay(words_per_doc, seed * 1000003ull + static_cast<uint64_t>(i)));
  }
  return text;
}

absl::Status RunPpl(const PplOptions& o, std::ostream& out) {
  engine::EngineOptions eo;
  eo.model_path = o.model_path;
  eo.num_threads = o.threads;
  eo.attention.mode = attention::EstimatorKind::kFull;
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Load(eo));
  ForkDecoder decoder(engine.get(), o.threads);
  const int64_t max_p = *std::max_element(o.prefixes.begin(), o.prefixes.end());
  const int64_t need = max_p + o.steps + 1;
  // Several generated documents, about 1.3 tokens per word: enough words for `need` tokens.
  const int64_t n_docs = 8;
  const std::string text = PplText(o.text_seed, n_docs, need / n_docs + 200);
  std::vector<int32_t> tokens = engine->tokenizer().Encode(text, false);
  if (static_cast<int64_t>(tokens.size()) < need) {
    return absl::FailedPreconditionError(
        absl::StrCat("the generated text has ", tokens.size(), " tokens < ", need));
  }
  if (need > engine->context_length()) {
    return absl::OutOfRangeError(
        absl::StrCat("P + M = ", need, " exceeds the context length ", engine->context_length()));
  }
  tokens.resize(static_cast<size_t>(need));
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  json::Value rows = json::Value::Array();
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv, std::ios::trunc);
    csv << "prefix,method,family,k,l,lsh_seed,budget,positions,ppl,nll,delta_nll,ppl_ratio,kl,"
           "kl_p90,kl_p99,top1,density\n";
  }
  out << absl::StrFormat("ppl text: %d generated documents, %d tokens used; word lists: %s\n",
                         n_docs, need, WordSource());
  for (int64_t p : o.prefixes) {
    const auto ids = absl::MakeConstSpan(tokens);
    const double tp = elapsed();
    MAGICPIG_ASSIGN_OR_RETURN(Prefix prefix, decoder.Prefill(ids.subspan(0, p), p));
    if (!o.quiet) std::cerr << absl::StrFormat("[ppl] P=%d prefill %.1fs\n", p, elapsed() - tp);
    // Full attention through the same decode path: the reference distributions.
    std::vector<std::vector<float>> full_lp;
    std::vector<int32_t> full_top;
    std::vector<RunStats> runs;
    auto run_mode = [&](RunStats r, const engine::SparseAttentionOptions& a) -> absl::Status {
      const double tm = elapsed();
      MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<Branch> b, decoder.Fork(prefix, a, o.steps));
      std::vector<float> lp;
      std::vector<double> kls;
      double nll = 0, top1 = 0;
      const bool is_full = a.mode == attention::EstimatorKind::kFull;
      for (int64_t j = 0; j < o.steps; ++j) {
        MAGICPIG_RETURN_IF_ERROR(b->Feed(tokens[static_cast<size_t>(p + j)]));
        const int32_t target = tokens[static_cast<size_t>(p + j + 1)];
        LogSoftmax(b->logits(), &lp);
        nll -= lp[static_cast<size_t>(target)];
        const int32_t arg = Argmax(b->logits());
        if (is_full) {
          full_lp.push_back(lp);
          full_top.push_back(arg);
          kls.push_back(0);
          top1 += 1;
        } else {
          const std::vector<float>& f = full_lp[static_cast<size_t>(j)];
          double kl = 0;
          for (size_t v = 0; v < lp.size(); ++v) {
            kl += std::exp(static_cast<double>(f[v])) * (static_cast<double>(f[v]) - lp[v]);
          }
          kls.push_back(std::max(0.0, kl));
          top1 += arg == full_top[static_cast<size_t>(j)];
        }
      }
      r.positions = o.steps;
      r.nll = nll / o.steps;
      double s = 0;
      for (double k : kls) s += k;
      r.kl = s / kls.size();
      r.kl_p90 = Quantile(kls, 0.9);
      r.kl_p99 = Quantile(kls, 0.99);
      r.top1 = top1 / o.steps;
      r.density = b->keys_offloaded() > 0
                      ? static_cast<double>(b->keys_touched()) / b->keys_offloaded()
                      : (is_full ? 1.0 : 0.0);
      r.budget = b->budget();  // 0 for estimators without a budget
      if (!o.quiet) {
        std::cerr << absl::StrFormat(
            "  P=%d %-18s seed %-5d ppl %8.3f  KL %.4f  top1 %.3f  density %.2f%%  %.1fs\n", p,
            r.method, r.seed, std::exp(r.nll), r.kl, r.top1, 100 * r.density, elapsed() - tm);
      }
      runs.push_back(r);
      return absl::OkStatus();
    };
    {
      engine::SparseAttentionOptions a = OneBlock();
      a.mode = attention::EstimatorKind::kFull;
      MAGICPIG_RETURN_IF_ERROR(run_mode(RunStats{"full", "full"}, a));
    }
    for (const LshConfig& c : o.configs) {
      const std::string kl = absl::StrCat("(", c.first, ",", c.second, ")");
      double density_sum = 0;
      for (uint64_t seed : o.lsh_seeds) {
        engine::SparseAttentionOptions a = OneBlock();
        a.mode = attention::EstimatorKind::kMagicPig;
        a.lsh_k = c.first;
        a.lsh_l = c.second;
        a.lsh_seed = seed;
        MAGICPIG_RETURN_IF_ERROR(
            run_mode(RunStats{absl::StrCat("magicpig", kl), "magicpig", c, seed}, a));
        density_sum += runs.back().density;
      }
      if (!o.baselines) continue;
      const double density = density_sum / o.lsh_seeds.size();
      const int64_t n_off = std::max<int64_t>(1, p - 4 - 64);
      const int64_t budget = std::max<int64_t>(1, std::llround(density * n_off));
      for (const char* fam : {"topk", "oracle"}) {
        engine::SparseAttentionOptions a = OneBlock();
        MAGICPIG_ASSIGN_OR_RETURN(a.mode, attention::ParseEstimator(fam));
        a.lsh_k = c.first;
        a.lsh_l = c.second;
        a.budget = budget;
        // top-k is deterministic; oracle sampling draws with each seed, or by default only the
        // first, to bound the cost.
        const std::vector<uint64_t> seeds =
            a.mode == attention::EstimatorKind::kTopK ? std::vector<uint64_t>{0}
            : o.oracle_all_seeds                      ? o.lsh_seeds
                                                      : std::vector<uint64_t>{o.lsh_seeds[0]};
        for (uint64_t seed : seeds) {
          a.lsh_seed = seed == 0 ? 1234 : seed;
          MAGICPIG_RETURN_IF_ERROR(run_mode(RunStats{absl::StrCat(fam, "@", kl), fam, c, seed}, a));
        }
      }
    }
    // Rows and a per-method summary (mean and sd over seeds).
    const double full_nll = runs[0].nll;
    std::map<std::string, std::vector<const RunStats*>> by_method;
    std::vector<std::string> order;
    for (const RunStats& r : runs) {
      if (!by_method.count(r.method)) order.push_back(r.method);
      by_method[r.method].push_back(&r);
      json::Value row = json::Value::Object();
      row.Set("prefix", p);
      row.Set("method", r.method);
      row.Set("family", r.family);
      row.Set("k", r.config.first);
      row.Set("l", r.config.second);
      row.Set("lsh_seed", static_cast<int64_t>(r.seed));
      row.Set("budget", r.budget);
      row.Set("positions", r.positions);
      row.Set("ppl", std::exp(r.nll));
      row.Set("nll", r.nll);
      row.Set("delta_nll", r.nll - full_nll);
      row.Set("ppl_ratio", std::exp(r.nll - full_nll));
      row.Set("kl", r.kl);
      row.Set("kl_p90", r.kl_p90);
      row.Set("kl_p99", r.kl_p99);
      row.Set("top1", r.top1);
      row.Set("density", r.density);
      if (csv.is_open()) {
        csv << p << "," << r.method << "," << r.family << "," << r.config.first << ","
            << r.config.second << "," << r.seed << "," << r.budget << "," << r.positions << ","
            << std::exp(r.nll) << "," << r.nll << "," << r.nll - full_nll << ","
            << std::exp(r.nll - full_nll) << "," << r.kl << "," << r.kl_p90 << "," << r.kl_p99
            << "," << r.top1 << "," << r.density << "\n";
      }
      rows.Push(std::move(row));
    }
    out << absl::StrFormat(
        "\n== teacher-forced decode, P = %d exact prefix, M = %d steps (mean ± sd over seeds) ==\n",
        p, o.steps);
    out << absl::StrFormat("%-18s %5s %16s %9s %16s %9s %9s %14s %8s\n", "method", "runs", "ppl",
                           "ppl/full", "KL(full||m)", "KL p90", "KL p99", "top-1 agree", "density");
    for (const std::string& m : order) {
      const auto& v = by_method[m];
      auto stat = [&](auto f) {
        double s = 0, ss = 0;
        for (const RunStats* r : v) s += f(*r);
        const double mean = s / v.size();
        for (const RunStats* r : v) ss += (f(*r) - mean) * (f(*r) - mean);
        return std::make_pair(mean, v.size() > 1 ? std::sqrt(ss / (v.size() - 1)) : 0.0);
      };
      const auto ppl = stat([](const RunStats& r) { return std::exp(r.nll); });
      const auto ratio = stat([&](const RunStats& r) { return std::exp(r.nll - full_nll); });
      const auto kl = stat([](const RunStats& r) { return r.kl; });
      const auto p90 = stat([](const RunStats& r) { return r.kl_p90; });
      const auto p99 = stat([](const RunStats& r) { return r.kl_p99; });
      const auto top1 = stat([](const RunStats& r) { return r.top1; });
      const auto dens = stat([](const RunStats& r) { return r.density; });
      out << absl::StrFormat(
          "%-18s %5d %8.3f ± %5.3f %9.4f %8.4f ± %5.4f %9.4f %9.4f %6.3f ± %5.3f %7.2f%%\n", m,
          v.size(), ppl.first, ppl.second, ratio.first, kl.first, kl.second, p90.first, p99.first,
          top1.first, top1.second, 100 * dens.first);
    }
  }
  if (!o.json.empty()) {
    std::ofstream js(o.json, std::ios::trunc);
    json::Value root = json::Value::Object();
    root.Set("steps", o.steps);
    root.Set("text", "eval::PplText: 8 generated pseudo-essay documents");
    root.Set("text_seed", static_cast<int64_t>(o.text_seed));
    root.Set("word_source", WordSource());
    root.Set("rows", std::move(rows));
    js << json::Serialize(root) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace magicpig::eval
