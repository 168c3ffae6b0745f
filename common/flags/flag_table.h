// One declaration per command-line option. A FlagTable holds a command's options: each is declared
// once with its flag, value name, help, default (the target's value at declaration), bounds or
// choices, and the MAGICPIG_* environment variable that sets it when the flag is absent. CLI11
// (Debian's libcli11-dev) tokenises the command line and reads the environment; `--help` (Help())
// and docs/flags.md (Markdown(), written by magicpig_flags_doc) are generated from the same
// declarations, so neither can drift from what the parser accepts.
//
//   engine::EngineOptions options;
//   flags::FlagTable table("magicpig run", "generate text with the embedded engine");
//   table.Number("threads", &options.num_threads, "CPU threads; 0 = all cores", 0, 4096);
//   absl::Status s = table.Parse(args);  // INVALID_ARGUMENT naming the flag, or OK
//   if (table.help_requested()) std::cout << table.Help();
//
// Values: "--name value" and "--name=value"; a flag given twice keeps the last value (Repeated
// keeps all); bare switches take no value. The environment variable of "--lsh-k" is
// MAGICPIG_LSH_K; a value from the environment is checked like one from the command line.
//
// Thread-safety: declare and parse on one thread. The table keeps pointers to the targets, which
// must outlive Parse.
#ifndef MAGICPIG_COMMON_FLAGS_FLAG_TABLE_H_
#define MAGICPIG_COMMON_FLAGS_FLAG_TABLE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace CLI {
class App;
}  // namespace CLI

namespace magicpig::flags {

// MAGICPIG_ + the flag name in upper case with '-' as '_'.
std::string EnvName(absl::string_view flag_name);

// One declared option, as --help and the docs show it.
struct FlagInfo {
  std::string name;        // without "--"
  std::string env;         // MAGICPIG_...
  std::string value_name;  // "N", "FILE", ...; empty for switches
  std::string help;
  std::string default_text;  // empty: no default
  std::string section;
  bool required = false;
};

class FlagTable {
 public:
  // program as typed ("magicpig run"); summary: one line for --help and the docs.
  FlagTable(std::string program, std::string summary);
  ~FlagTable();
  FlagTable(const FlagTable&) = delete;
  FlagTable& operator=(const FlagTable&) = delete;

  // Flags declared after this call are listed under `title` in --help and the docs.
  void Section(std::string title);

  // The general form: `set` parses one value and returns INVALID_ARGUMENT naming what is wrong
  // (the table prefixes the flag). `default_text` is what --help shows as the default.
  void Custom(absl::string_view name, absl::string_view value_name, absl::string_view help,
              std::string default_text, std::function<absl::Status(absl::string_view)> set);

  void Text(absl::string_view name, std::string* target, absl::string_view value_name,
            absl::string_view help);

  // An integer or floating-point value in [min, max].
  template <typename T>
  void Number(absl::string_view name, T* target, absl::string_view help, T min, T max,
              absl::string_view value_name = std::is_floating_point_v<T> ? "X" : "N") {
    static_assert(std::is_arithmetic_v<T>);
    const std::string bounds = BoundsText(min, max);
    Custom(name, value_name, bounds.empty() ? help : absl::StrCat(help, " ", bounds),
           absl::StrCat(*target), [target, min, max](absl::string_view text) {
             return ParseNumber(text, min, max, target);
           });
  }

  // One of named values, e.g. {{"on", true}, {"off", false}}.
  template <typename E>
  void Choice(absl::string_view name, E* target, absl::string_view help,
              std::vector<std::pair<std::string, E>> choices) {
    std::string names, current;
    for (const auto& [n, v] : choices) {
      absl::StrAppend(&names, names.empty() ? "" : "|", n);
      if (v == *target && current.empty()) current = n;
    }
    Custom(name, names, help, current,
           [target, choices, names](absl::string_view text) -> absl::Status {
             for (const auto& [n, v] : choices) {
               if (text == n) {
                 *target = v;
                 return absl::OkStatus();
               }
             }
             return absl::InvalidArgumentError(
                 absl::StrCat("expected one of ", names, ", got '", text, "'"));
           });
  }

  // A HOST:PORT address (ParseHostPort). off_allowed: "off" or "" clears *target (no listener).
  void Address(absl::string_view name, std::string* target, absl::string_view help,
               bool off_allowed = false);

  // A byte count: "1234", "64K", "512M", "8G", "1T" (ParseByteSize).
  void Bytes(absl::string_view name, int64_t* target, absl::string_view help);

  // A bare switch: present sets *target to `present_value` ("--no-X" switches pass false). From
  // the environment: true/1/yes/on mean present.
  void Switch(absl::string_view name, bool* target, absl::string_view help,
              bool present_value = true);

  // A comma-separated list ("a,b,c"; empty items dropped); a second --name replaces the first.
  void List(absl::string_view name, std::vector<std::string>* target, absl::string_view value_name,
            absl::string_view help);

  // A comma-separated list of numbers in [min, max]; a second --name replaces the first.
  template <typename T>
  void NumberList(absl::string_view name, std::vector<T>* target, absl::string_view help, T min,
                  T max) {
    static_assert(std::is_arithmetic_v<T>);
    const std::string bounds = BoundsText(min, max);
    Custom(name, std::is_floating_point_v<T> ? "X,..." : "N,...",
           bounds.empty() ? help : absl::StrCat(help, "; each ", bounds),
           absl::StrJoin(*target, ","), [target, min, max](absl::string_view text) {
             std::vector<T> values;
             for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
               T v{};
               absl::Status s = ParseNumber(item, min, max, &v);
               if (!s.ok()) return s;
               values.push_back(v);
             }
             *target = std::move(values);
             return absl::OkStatus();
           });
  }

  // A flag that may be given many times; every value is kept in order.
  void Repeated(absl::string_view name, std::vector<std::string>* target,
                absl::string_view value_name, absl::string_view help);

  // Marks the flag (declared above) as required: Parse fails naming it when it is absent from
  // both the command line and the environment.
  void Require(absl::string_view name);

  // Replaces the default --help shows (where it depends on the machine: "half the RAM").
  void ShowDefault(absl::string_view name, std::string text);

  // args exclude the program name. INVALID_ARGUMENT whose message names the flag for unknown
  // flags, missing values, values out of bounds and missing required flags. "--help" sets
  // help_requested() and returns OK without checking required flags.
  absl::Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }

  // True when the flag was given on the command line or through its environment variable.
  bool Given(absl::string_view name) const;

  std::string Help() const;      // usage line, summary and the options by section
  std::string Markdown() const;  // a "## program" section with one table row per option

  const std::string& program() const { return program_; }
  const std::vector<FlagInfo>& flags() const { return infos_; }

 private:
  template <typename T>
  static std::string BoundsText(T min, T max) {
    if (min == std::numeric_limits<T>::lowest() && max == std::numeric_limits<T>::max()) return "";
    // Bounds that only keep a value in its type (INT64_MAX for a uint64) are not worth showing.
    if (max == std::numeric_limits<T>::max() ||
        (std::is_integral_v<T> && static_cast<double>(max) >= 9.2e18)) {
      return absl::StrCat("(>= ", min, ")");
    }
    return absl::StrCat("[", min, ", ", max, "]");
  }
  template <typename T>
  static absl::Status ParseNumber(absl::string_view text, T min, T max, T* target) {
    T v{};
    bool ok = false;
    if constexpr (std::is_floating_point_v<T>) {
      double d = 0;
      ok = absl::SimpleAtod(text, &d) && d == d;
      v = static_cast<T>(d);
    } else {
      ok = absl::SimpleAtoi(text, &v);
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected ", std::is_floating_point_v<T> ? "a number" : "an integer",
                       ", got '", text, "'"));
    }
    if (v < min || v > max) {
      return absl::InvalidArgumentError(
          max == std::numeric_limits<T>::max()
              ? absl::StrCat("must be >= ", min, ", got ", text)
              : absl::StrCat("must be in [", min, ", ", max, "], got ", text));
    }
    *target = v;
    return absl::OkStatus();
  }

  FlagInfo& Declare(absl::string_view name, absl::string_view value_name, absl::string_view help,
                    std::string default_text);
  FlagInfo* Find(absl::string_view name);

  std::string program_;
  std::string summary_;
  std::string section_;
  std::unique_ptr<CLI::App> app_;
  std::vector<FlagInfo> infos_;
  bool help_requested_ = false;
};

}  // namespace magicpig::flags

#endif  // MAGICPIG_COMMON_FLAGS_FLAG_TABLE_H_
