// `magicpig eval ruler`: see evaluators.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json/parse.h"
#include "common/json/serialize.h"
#include "common/status_macros.h"
#include "eval/evaluators.h"
#include "eval/fork_decoder.h"
#include "eval/prompt.h"
#include "eval/tasks.h"

namespace magicpig::eval {

namespace {

using engine::SparseAttentionOptions;

struct Method {
  std::string name;  // "full", "magicpig(10,150)", "topk@(10,150)", "oracle@(10,150)"
  // full | magicpig | topk | oracle | vattention | vattention-lsh | spotlight |
  // vattention-spotlight | sketch | vattention-sketch
  std::string family;
  LshConfig config{0, 0};
  int64_t spotlight_rerank = 1;  // spotlight: candidates scored per retrieved key
  int64_t sketch_dims = 0;       // sketch, vattention-sketch: int8 coordinates per key
};

std::vector<Method> Methods(const RulerOptions& o) {
  std::vector<Method> m = {{"full", "full", {0, 0}}};
  for (const LshConfig& c : o.configs) {
    const std::string kl = absl::StrCat("(", c.first, ",", c.second, ")");
    m.push_back({absl::StrCat("magicpig", kl), "magicpig", c});
    if (o.baselines) {
      m.push_back({absl::StrCat("topk@", kl), "topk", c});
      m.push_back({absl::StrCat("oracle@", kl), "oracle", c});
    }
    if (o.vattention) m.push_back({absl::StrCat("vattention-lsh", kl), "vattention-lsh", c});
    if (!o.spotlight_file.empty()) m.push_back({absl::StrCat("spotlight@", kl), "spotlight", c});
    for (int64_t r : o.spotlight_file.empty() ? std::vector<int64_t>{} : o.spotlight_rerank) {
      m.push_back({absl::StrCat("spotlight-rerank", r, "@", kl), "spotlight", c, r});
    }
    for (int64_t r : o.sketch_dims) {
      m.push_back({absl::StrCat("sketch", r, "@", kl), "sketch", c, 1, r});
    }
  }
  // vattention reads no tables; its config only names which tables the fork builds.
  if (o.vattention && !o.configs.empty()) m.push_back({"vattention", "vattention", o.configs[0]});
  if (o.vattention && !o.spotlight_file.empty() && !o.configs.empty()) {
    m.push_back({"vattention-spotlight", "vattention-spotlight", o.configs[0]});
  }
  for (int64_t r : o.vattention && !o.configs.empty() ? o.sketch_dims : std::vector<int64_t>{}) {
    m.push_back({absl::StrCat("vattention-sketch", r), "vattention-sketch", o.configs[0], 1, r});
  }
  return m;
}

bool Skip(const RulerOptions& o, const std::string& setup, const Method& m) {
  const std::vector<std::string>& only = setup == "A" ? o.a_methods : o.b_methods;
  return !only.empty() && std::find(only.begin(), only.end(), m.name) == only.end();
}

std::string RowKey(const std::string& task, int64_t length, int64_t index, const std::string& setup,
                   const std::string& method) {
  return absl::StrCat(task, "|", length, "|", index, "|", setup, "|", method);
}

struct GenOutcome {
  std::string text;
  int64_t tokens = 0;
  std::string stop;
};

// Greedy generation of every branch at once: each step feeds the unfinished branches their next
// token in one batched decode step. Per branch the same tokens as generating it alone: stop at
// EOS, at the sample's cap, or (early_stop) once every reference is in the output.
absl::StatusOr<std::vector<GenOutcome>> GenerateAll(ForkDecoder& decoder,
                                                    absl::Span<Branch* const> branches,
                                                    const Sample& sample,
                                                    const model::Tokenizer& tok, bool early_stop) {
  std::vector<GenOutcome> g(branches.size());
  std::vector<std::vector<int32_t>> ids(branches.size());
  std::vector<size_t> active;
  for (size_t b = 0; b < branches.size(); ++b) {
    g[b].stop = "length";
    active.push_back(b);
  }
  for (int64_t i = 0; i < sample.max_new_tokens && !active.empty(); ++i) {
    std::vector<size_t> still;
    std::vector<Branch*> feed;
    std::vector<int32_t> tokens;
    for (size_t b : active) {
      const int32_t t = Argmax(branches[b]->logits());
      if (tok.IsEndOfGeneration(t)) {
        g[b].stop = "eos";
        continue;
      }
      ids[b].push_back(t);
      g[b].text = tok.Decode(ids[b]);
      if (early_stop && ScoreSample(sample, g[b].text) >= 1.0) {
        g[b].stop = "all_found";  // string matching cannot lose a match: the score is final
        continue;
      }
      still.push_back(b);
      feed.push_back(branches[b]);
      tokens.push_back(t);
    }
    if (i + 1 < sample.max_new_tokens) MAGICPIG_RETURN_IF_ERROR(decoder.FeedBatch(feed, tokens));
    active = std::move(still);
  }
  for (size_t b = 0; b < branches.size(); ++b) g[b].tokens = static_cast<int64_t>(ids[b].size());
  return g;
}

absl::StatusOr<std::vector<Sample>> LoadOrGenerate(const RulerOptions& o, const PromptRenderer& r,
                                                   const std::string& task, int64_t length) {
  std::filesystem::create_directories(o.data_dir);
  const std::string path =
      absl::StrCat(o.data_dir, "/", task, "_", length, "_seed", o.seed, ".jsonl");
  absl::StatusOr<std::vector<Sample>> have = ReadSamples(path);
  if (have.ok() && static_cast<int64_t>(have->size()) >= o.samples) {
    have->resize(static_cast<size_t>(o.samples));
    return have;
  }
  std::vector<Sample> samples;
  const TokenCounter count = [&](const std::string& input, int64_t q, const std::string& prefix) {
    return r.Count(input, q, prefix);
  };
  for (int64_t i = 0; i < o.samples; ++i) {
    MAGICPIG_ASSIGN_OR_RETURN(
        Sample s, GenerateSample(task, length, i, SampleSeed(o.seed, task, length, i), count));
    samples.push_back(std::move(s));
  }
  MAGICPIG_RETURN_IF_ERROR(WriteSamples(path, samples));
  if (!o.quiet) std::cerr << "[ruler] generated " << path << "\n";
  return samples;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}
double StdErr(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = Mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / (v.size() - 1) / v.size());
}

absl::Status Summarize(const RulerOptions& o, const std::vector<Method>& methods,
                       std::ostream& out) {
  std::ifstream in(o.out);
  std::string line;
  // (length, setup, method, task) -> scores, densities
  std::map<std::tuple<int64_t, std::string, std::string, std::string>,
           std::pair<std::vector<double>, std::vector<double>>>
      cells;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    absl::StatusOr<json::Value> v = json::Parse(line);
    if (!v.ok()) continue;
    auto& c = cells[{v->Find("length")->as_int(), v->Find("setup")->as_string(),
                     v->Find("method")->as_string(), v->Find("task")->as_string()}];
    c.first.push_back(100.0 * v->Find("score")->as_double());
    c.second.push_back(v->Find("density")->as_double());
  }
  const std::vector<std::string>& tasks = o.tasks.empty() ? RulerTasks() : o.tasks;
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv, std::ios::trunc);
    csv << "length,setup,method,task,n,score,stderr,density\n";
  }
  json::Value summary = json::Value::Array();
  for (int64_t length : o.lengths) {
    for (const std::string& setup : o.setups) {
      out << "\n== RULER-like, length " << length << ", setup " << setup
          << " (score x100, mean over samples; avg over the method's tasks; gap = mean over "
             "tasks of (method - full); density = keys touched / offloaded) ==\n";
      out << absl::StrFormat("%-18s", "method");
      for (const std::string& t : tasks)
        out << absl::StrFormat(" %8.8s", t.substr(5 * (t.rfind("niah_", 0) == 0)));
      out << absl::StrFormat(" %7s %7s %8s\n", "avg", "gap", "density");
      std::map<std::string, double> full_by_task;  // for the gap over the same tasks
      for (const Method& m : methods) {
        std::vector<double> task_means, dens;
        double gap_sum = 0;
        int64_t gap_n = 0;
        std::string row = absl::StrFormat("%-18s", m.name);
        int64_t n_min = -1;
        for (const std::string& t : tasks) {
          auto it = cells.find({length, setup, m.name, t});
          if (it == cells.end() || it->second.first.empty()) {
            row += absl::StrFormat(" %8s", "-");
            continue;
          }
          const double mean = Mean(it->second.first), se = StdErr(it->second.first);
          task_means.push_back(mean);
          if (m.family == "full") full_by_task[t] = mean;
          if (full_by_task.count(t)) {
            gap_sum += mean - full_by_task[t];
            ++gap_n;
          }
          for (double d : it->second.second) dens.push_back(d);
          const int64_t n = static_cast<int64_t>(it->second.first.size());
          n_min = n_min < 0 ? n : std::min(n_min, n);
          row += absl::StrFormat(" %8.1f", mean);
          if (csv.is_open()) {
            csv << length << "," << setup << "," << m.name << "," << t << "," << n << "," << mean
                << "," << se << "," << Mean(it->second.second) << "\n";
          }
          json::Value cell = json::Value::Object();
          cell.Set("length", length);
          cell.Set("setup", setup);
          cell.Set("method", m.name);
          cell.Set("family", m.family);
          cell.Set("task", t);
          cell.Set("n", n);
          cell.Set("score", mean);
          cell.Set("stderr", se);
          cell.Set("density", Mean(it->second.second));
          summary.Push(std::move(cell));
        }
        if (task_means.empty()) continue;
        const double avg = Mean(task_means);
        const double gap = gap_n > 0 ? gap_sum / gap_n : std::nan("");
        const bool complete = task_means.size() == tasks.size();
        row += absl::StrFormat(" %7.1f %7.1f %7.2f%%%s  n>=%d\n", avg, gap, 100.0 * Mean(dens),
                               complete ? "" : " (partial)", n_min);
        out << row;
        if (csv.is_open()) {
          csv << length << "," << setup << "," << m.name << ",average," << n_min << "," << avg
              << ",," << Mean(dens) << "\n";
        }
        json::Value cell = json::Value::Object();
        cell.Set("length", length);
        cell.Set("setup", setup);
        cell.Set("method", m.name);
        cell.Set("family", m.family);
        cell.Set("task", "average");
        cell.Set("tasks", static_cast<int64_t>(task_means.size()));
        cell.Set("n", n_min);
        cell.Set("score", avg);
        if (gap_n > 0) cell.Set("gap_to_full", gap);
        cell.Set("density", Mean(dens));
        summary.Push(std::move(cell));
      }
    }
  }
  if (!o.json.empty()) {
    std::ofstream js(o.json, std::ios::trunc);
    json::Value root = json::Value::Object();
    root.Set("word_source", WordSource());
    root.Set("cells", std::move(summary));
    js << json::Serialize(root) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRuler(const RulerOptions& o, std::ostream& out) {
  const std::vector<std::string>& tasks = o.tasks.empty() ? RulerTasks() : o.tasks;
  const std::vector<Method> methods = Methods(o);
  if (o.summary_only) return Summarize(o, methods, out);
  // Rows already in the output file (resume).
  std::set<std::string> done;
  {
    std::ifstream in(o.out);
    std::string line;
    while (std::getline(in, line)) {
      absl::StatusOr<json::Value> v = json::Parse(line);
      if (!v.ok()) continue;  // a torn last line from an interrupted run
      done.insert(RowKey(v->Find("task")->as_string(), v->Find("length")->as_int(),
                         v->Find("index")->as_int(), v->Find("setup")->as_string(),
                         v->Find("method")->as_string()));
    }
  }
  std::filesystem::path out_path(o.out);
  if (out_path.has_parent_path()) std::filesystem::create_directories(out_path.parent_path());
  std::ofstream rows(o.out, std::ios::app);
  if (!rows) return absl::UnavailableError(absl::StrCat("cannot append to ", o.out));

  engine::EngineOptions eo;
  eo.model_path = o.model_path;
  eo.num_threads = o.threads;
  eo.attention.mode = attention::EstimatorKind::kFull;
  eo.attention.spotlight_file = o.spotlight_file;
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Load(eo));
  const PromptRenderer renderer(engine.get());
  ForkDecoder decoder(engine.get(), o.threads);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  int64_t total =
      static_cast<int64_t>(o.lengths.size() * tasks.size()) * (o.samples - o.first_sample);
  int64_t at = 0;
  bool ran_a_sample = false, out_of_time = false;
  for (int64_t length : o.lengths) {
    if (out_of_time) break;
    std::vector<std::vector<Sample>> per_task;
    for (const std::string& task : tasks) {
      MAGICPIG_ASSIGN_OR_RETURN(std::vector<Sample> samples,
                                LoadOrGenerate(o, renderer, task, length));
      per_task.push_back(std::move(samples));
    }
    // Sample-major: an interrupted run still has every task's first samples.
    for (int64_t i = o.first_sample; i < o.samples; ++i) {
      if (ran_a_sample && o.max_minutes > 0 && elapsed() > 60 * o.max_minutes) {
        out_of_time = true;
        if (!o.quiet) {
          std::cerr << absl::StrFormat(
              "[ruler] --max-minutes %g reached: stopping before sample %d at length %d; "
              "rerun the same command to resume\n",
              o.max_minutes, i, length);
        }
        break;
      }
      for (size_t ti = 0; ti < tasks.size(); ++ti) {
        const std::string& task = tasks[ti];
        const Sample& s = per_task[ti][static_cast<size_t>(i)];
        ++at;
        std::vector<std::string> todo;
        for (const std::string& setup : o.setups) {
          for (const Method& m : methods) {
            if (Skip(o, setup, m)) continue;
            if (!done.count(RowKey(task, length, s.index, setup, m.name))) {
              todo.push_back(setup);
              break;
            }
          }
        }
        if (todo.empty()) continue;
        ran_a_sample = true;
        MAGICPIG_ASSIGN_OR_RETURN(RenderedPrompt p, renderer.Render(s));
        const int64_t n = static_cast<int64_t>(p.tokens.size());
        const auto ctx = absl::MakeConstSpan(p.tokens).subspan(0, p.split);
        const auto tail = absl::MakeConstSpan(p.tokens).subspan(p.split);
        const double tp = elapsed();
        MAGICPIG_ASSIGN_OR_RETURN(Prefix context, decoder.Prefill(ctx, p.split));
        if (!o.quiet) {
          std::cerr << absl::StrFormat(
              "[ruler %d/%d] %s len=%d #%d: %d tokens (%d context), "
              "prefill %.1fs\n",
              at, total, task, length, s.index, n, p.split, elapsed() - tp);
        }
        for (const std::string& setup : todo) {
          Prefix whole;
          const Prefix* base = &context;
          if (setup == "A") {
            MAGICPIG_ASSIGN_OR_RETURN(whole, decoder.Extend(context, tail, n));
            base = &whole;
          }
          // Two rounds of branches decoded together: full and MagicPIG first, then top-k,
          // oracle sampling, spotlight and sketch, whose budgets are the keys MagicPIG touched on
          // this sample (spotlight's and sketch's as the fraction of the offloaded keys).
          std::map<LshConfig, int64_t> matched_budget;
          std::map<LshConfig, double> matched_density;
          for (const bool baselines : {false, true}) {
            std::vector<const Method*> round;
            for (const Method& m : methods) {
              const bool baseline = m.family == "topk" || m.family == "oracle" ||
                                    m.family == "spotlight" || m.family == "sketch";
              if (baseline != baselines || Skip(o, setup, m)) continue;
              // A baseline whose row exists needs no rerun; MagicPIG always runs (its budget).
              if (baseline && done.count(RowKey(task, length, s.index, setup, m.name))) continue;
              round.push_back(&m);
            }
            if (round.empty()) continue;
            const double tm = elapsed();
            std::vector<std::unique_ptr<Branch>> owned;
            std::vector<Branch*> branches;
            for (const Method* m : round) {
              SparseAttentionOptions a = OneBlock();
              a.lsh_seed = o.lsh_seed;
              a.vattention = o.va;
              MAGICPIG_ASSIGN_OR_RETURN(a.mode, attention::ParseEstimator(m->family));
              if (attention::SpecOf(a.mode).sparse) {
                a.lsh_k = m->config.first;
                a.lsh_l = m->config.second;
                if (attention::SpecOf(a.mode).default_budget != nullptr) {
                  a.budget = matched_budget[m->config];
                }
                if (a.mode == attention::EstimatorKind::kVAttentionSpotlight ||
                    a.mode == attention::EstimatorKind::kVAttentionSketch) {
                  a.spotlight_fraction = o.spotlight_candidates;
                  if (m->sketch_dims > 0) a.sketch_dims = m->sketch_dims;
                }
                if (a.mode == attention::EstimatorKind::kSpotlight ||
                    a.mode == attention::EstimatorKind::kSketch) {
                  a.spotlight_fraction =
                      std::clamp(matched_density[m->config], attention::kSpotFraction.min, 1.0);
                  a.spotlight_rerank = m->spotlight_rerank;
                  if (m->sketch_dims > 0) a.sketch_dims = m->sketch_dims;
                }
              }
              MAGICPIG_ASSIGN_OR_RETURN(
                  std::unique_ptr<Branch> b,
                  decoder.Fork(*base, a, s.max_new_tokens + (setup == "B" ? n - p.split : 0)));
              branches.push_back(b.get());
              owned.push_back(std::move(b));
            }
            if (setup == "B") {
              for (int32_t t : tail) {
                MAGICPIG_RETURN_IF_ERROR(
                    decoder.FeedBatch(branches, std::vector<int32_t>(branches.size(), t)));
              }
            }
            MAGICPIG_ASSIGN_OR_RETURN(
                std::vector<GenOutcome> outcomes,
                GenerateAll(decoder, branches, s, engine->tokenizer(), o.early_stop));
            const double seconds = elapsed() - tm;
            for (size_t bi = 0; bi < round.size(); ++bi) {
              const Method& m = *round[bi];
              const Branch* b = branches[bi];
              const GenOutcome& g = outcomes[bi];
              const double density =
                  b->keys_offloaded() > 0
                      ? static_cast<double>(b->keys_touched()) / b->keys_offloaded()
                      : (m.family == "full" ? 1.0 : 0.0);
              if (m.family == "magicpig") {
                matched_budget[m.config] = std::max<int64_t>(
                    1, std::llround(density * static_cast<double>(b->offloaded_at_fork())));
                matched_density[m.config] = density;
              }
              const double score = ScoreSample(s, g.text);
              if (done.count(RowKey(task, length, s.index, setup, m.name))) continue;
              json::Value row = json::Value::Object();
              row.Set("task", task);
              row.Set("length", length);
              row.Set("index", s.index);
              row.Set("seed", std::to_string(s.seed));
              row.Set("setup", setup);
              row.Set("method", m.name);
              row.Set("family", m.family);
              row.Set("k", m.config.first);
              row.Set("l", m.config.second);
              row.Set("budget", b->budget());
              row.Set("score", score);
              row.Set("prediction", g.text);
              row.Set("stop", g.stop);
              row.Set("generated_tokens", g.tokens);
              row.Set("prompt_tokens", n);
              row.Set("context_tokens", p.split);
              row.Set("keys_touched", b->keys_touched());
              row.Set("keys_offloaded", b->keys_offloaded());
              row.Set("density", density);
              row.Set("answer_depth", s.answer_depth);
              // The wall time of the round this branch was decoded in, shared with the
              // `batched` - 1 other branches of that round.
              row.Set("seconds", seconds);
              row.Set("batched", static_cast<int64_t>(round.size()));
              rows << json::Serialize(row) << "\n" << std::flush;
              done.insert(RowKey(task, length, s.index, setup, m.name));
              if (!o.quiet) {
                std::cerr << absl::StrFormat(
                    "  %s %-17s score %5.1f  density %6.2f%%  %3d tok (%s)  round of %d %.1fs  "
                    "[%.0fs]\n",
                    setup, m.name, 100 * score, 100 * density, g.tokens, g.stop,
                    static_cast<int>(round.size()), seconds, elapsed());
              }
            }
          }
        }
      }
    }
  }
  rows.close();
  out << "word lists: " << WordSource() << "\n";
  return Summarize(o, methods, out);
}

}  // namespace magicpig::eval
