#include "common/cli_args.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace magicpig {

absl::StatusOr<CliArgs> CliArgs::Parse(const std::vector<std::string>& args,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags) {
  CliArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (bool_flags.count(name)) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      out.values_[name].push_back(has_value ? value : "true");
      continue;
    }
    if (!value_flags.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    out.values_[name].push_back(value);
  }
  return out;
}

std::string CliArgs::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> CliArgs::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> CliArgs::GetInt(const std::string& name, int64_t fallback) const {
  if (!Has(name)) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer, got '", Get(name), "'"));
  }
  return v;
}

absl::StatusOr<double> CliArgs::GetDouble(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  double v;
  if (!absl::SimpleAtod(Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a number, got '", Get(name), "'"));
  }
  return v;
}

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  std::string s = absl::AsciiStrToUpper(absl::string_view(text.data(), text.size()));
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("byte size '", absl::string_view(text.data(), text.size()),
                     "': expected a non-negative integer with an optional K, M, G or T suffix"));
  };
  for (std::string_view unit : {"IB", "B"}) {
    if (s.size() > unit.size() && s.compare(s.size() - unit.size(), unit.size(), unit) == 0) {
      s.resize(s.size() - unit.size());
      break;
    }
  }
  int shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift > 0) s.pop_back();
  }
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(c); })) {
    return bad();
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(s, &value)) return bad();
  if (value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) >> shift)) return bad();
  return static_cast<int64_t>(value << shift);
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view address) {
  const std::string a(address);
  const size_t colon = a.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(a.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", a, "': expected HOST:PORT"));
  }
  HostPort out{a.substr(0, colon), port};
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

}  // namespace magicpig
