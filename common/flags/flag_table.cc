#include "common/flags/flag_table.h"

#include <algorithm>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/flags/flag_values.h"

namespace magicpig::flags {
namespace {

std::string Dashed(absl::string_view name) { return absl::StrCat("--", std::string(name)); }

// Greedy word wrap of `text` to `width` columns, continuation lines indented by `indent`.
std::string Wrap(const std::string& text, size_t first_column, size_t indent, size_t width) {
  std::string out;
  size_t column = first_column;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > width) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
    } else if (column > indent || !out.empty()) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
  return out;
}

std::string MarkdownCell(const std::string& text) {
  return absl::StrReplaceAll(text, {{"|", "\\|"}});
}

}  // namespace

std::string EnvName(absl::string_view flag_name) {
  std::string env = absl::StrCat("MAGICPIG_", std::string(flag_name));
  absl::AsciiStrToUpper(&env);
  std::replace(env.begin(), env.end(), '-', '_');
  return env;
}

FlagTable::FlagTable(std::string program, std::string summary)
    : program_(std::move(program)),
      summary_(std::move(summary)),
      app_(std::make_unique<CLI::App>(summary_, program_)) {
  app_->set_help_flag("--help", "print this help and exit");
}

FlagTable::~FlagTable() = default;

void FlagTable::Section(std::string title) { section_ = std::move(title); }

FlagInfo& FlagTable::Declare(absl::string_view name, absl::string_view value_name,
                             absl::string_view help, std::string default_text) {
  FlagInfo info;
  info.name = std::string(name);
  info.env = EnvName(name);
  info.value_name = std::string(value_name);
  info.help = std::string(help);
  info.default_text = std::move(default_text);
  info.section = section_;
  infos_.push_back(std::move(info));
  return infos_.back();
}

FlagInfo* FlagTable::Find(absl::string_view name) {
  for (FlagInfo& info : infos_) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

void FlagTable::Custom(absl::string_view name, absl::string_view value_name, absl::string_view help,
                       std::string default_text,
                       std::function<absl::Status(absl::string_view)> set) {
  const FlagInfo& info = Declare(name, value_name, help, std::move(default_text));
  const std::string flag = Dashed(name);
  app_->add_option(
          flag,
          [flag, set = std::move(set)](const CLI::results_t& results) {
            for (const std::string& value : results) {
              if (absl::Status s = set(value); !s.ok()) {
                throw CLI::ValidationError(flag, std::string(s.message()));
              }
            }
            return true;
          },
          info.help)
      ->type_name(info.value_name)
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->envname(info.env);
}

void FlagTable::Text(absl::string_view name, std::string* target, absl::string_view value_name,
                     absl::string_view help) {
  Custom(name, value_name, help, *target, [target](absl::string_view text) {
    *target = std::string(text);
    return absl::OkStatus();
  });
}

void FlagTable::Address(absl::string_view name, std::string* target, absl::string_view help,
                        bool off_allowed) {
  Custom(name, off_allowed ? "HOST:PORT|off" : "HOST:PORT", help, *target,
         [target, off_allowed](absl::string_view text) -> absl::Status {
           if (off_allowed && (text.empty() || text == "off")) {
             target->clear();
             return absl::OkStatus();
           }
           if (absl::Status s = ParseHostPort(text).status(); !s.ok()) return s;
           *target = std::string(text);
           return absl::OkStatus();
         });
}

void FlagTable::Bytes(absl::string_view name, int64_t* target, absl::string_view help) {
  Custom(name, "BYTES", absl::StrCat(help, " (suffixes K, M, G, T: powers of 1024)"),
         FormatByteSize(*target), [target](absl::string_view text) -> absl::Status {
           absl::StatusOr<int64_t> bytes = ParseByteSize(text);
           if (!bytes.ok()) return bytes.status();
           *target = *bytes;
           return absl::OkStatus();
         });
}

void FlagTable::Switch(absl::string_view name, bool* target, absl::string_view help,
                       bool present_value) {
  const FlagInfo& info = Declare(name, "", help, "off");
  app_->add_flag_function(
          Dashed(name),
          [target, present_value](std::int64_t count) {
            if (count > 0) *target = present_value;
          },
          info.help)
      ->envname(info.env);
}

void FlagTable::List(absl::string_view name, std::vector<std::string>* target,
                     absl::string_view value_name, absl::string_view help) {
  Custom(name, value_name, help, absl::StrJoin(*target, ","), [target](absl::string_view text) {
    target->clear();
    for (absl::string_view item :
         absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipEmpty())) {
      target->emplace_back(item);
    }
    return absl::OkStatus();
  });
}

void FlagTable::Repeated(absl::string_view name, std::vector<std::string>* target,
                         absl::string_view value_name, absl::string_view help) {
  const FlagInfo& info = Declare(name, value_name, absl::StrCat(help, " (repeatable)"), "");
  app_->add_option(
          Dashed(name),
          [target](const CLI::results_t& results) {
            target->insert(target->end(), results.begin(), results.end());
            return true;
          },
          info.help)
      ->type_name(info.value_name)
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->envname(info.env);
}

void FlagTable::Require(absl::string_view name) {
  FlagInfo* info = Find(name);
  if (info == nullptr) return;
  info->required = true;
  app_->get_option(Dashed(name))->required();
}

void FlagTable::ShowDefault(absl::string_view name, std::string text) {
  if (FlagInfo* info = Find(name)) info->default_text = std::move(text);
}

absl::Status FlagTable::Parse(const std::vector<std::string>& args) {
  // CLI11 consumes its argument vector from the back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app_->parse(reversed);
  } catch (const CLI::CallForHelp&) {
    help_requested_ = true;
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

bool FlagTable::Given(absl::string_view name) const {
  const CLI::Option* option = app_->get_option_no_throw(Dashed(name));
  return option != nullptr && option->count() > 0;
}

std::string FlagTable::Help() const {
  constexpr size_t kHelpColumn = 30, kWidth = 100;
  std::string out =
      absl::StrCat("usage: ", program_, " [options]\n", Wrap(summary_, 0, 0, kWidth), "\n");
  std::string section = "\n";  // no flag has this section: forces the first heading
  for (const FlagInfo& f : infos_) {
    if (f.section != section) {
      section = f.section;
      absl::StrAppend(&out, "\n", section.empty() ? "options" : section, ":\n");
    }
    std::string left = absl::StrCat("  --", f.name, f.value_name.empty() ? "" : " ", f.value_name);
    std::string text = f.help;
    if (f.required) {
      absl::StrAppend(&text, " (required)");
    } else if (!f.default_text.empty()) {
      absl::StrAppend(&text, " (default ", f.default_text, ")");
    }
    absl::StrAppend(&text, " [", f.env, "]");
    if (left.size() + 1 >= kHelpColumn) {
      absl::StrAppend(&out, left, "\n", std::string(kHelpColumn, ' '));
    } else {
      absl::StrAppend(&out, left, std::string(kHelpColumn - left.size(), ' '));
    }
    absl::StrAppend(&out, Wrap(text, kHelpColumn, kHelpColumn, kWidth), "\n");
  }
  absl::StrAppend(&out, "\n  --help                      print this help and exit\n");
  return out;
}

std::string FlagTable::Markdown() const {
  std::string out =
      absl::StrCat("## `", program_, "`\n\n", summary_, "\n\n",
                   "| flag | environment | default | meaning |\n", "|---|---|---|---|\n");
  for (const FlagInfo& f : infos_) {
    absl::StrAppend(&out, "| `--", f.name, f.value_name.empty() ? "" : " ",
                    MarkdownCell(f.value_name), "` | `", f.env, "` | ",
                    f.required ? "required" : MarkdownCell(f.default_text), " | ",
                    MarkdownCell(f.help), " |\n");
  }
  return out;
}

}  // namespace magicpig::flags
