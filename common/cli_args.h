// A small command-line parser shared by the `magicpig` tool and the node binaries: `--name value`,
// `--name=value` and bare boolean `--name`; repeated flags accumulate. Unknown flags are an error
// naming the flag.
#ifndef MAGICPIG_COMMON_CLI_ARGS_H_
#define MAGICPIG_COMMON_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace magicpig {

class CliArgs {
 public:
  // value_flags take a value; bool_flags do not.
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& args,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// "1234", "64K", "512M", "8G", "1T" (case-insensitive suffix, optional trailing "B" or "iB");
// INVALID_ARGUMENT for anything else, negative values or overflow.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// "HOST:PORT" or "[IPV6]:PORT" -> (HOST without brackets, PORT in 0..65535); INVALID_ARGUMENT
// naming the address otherwise.
struct HostPort {
  std::string host;
  int port = 0;
};
absl::StatusOr<HostPort> ParseHostPort(std::string_view address);

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_CLI_ARGS_H_
