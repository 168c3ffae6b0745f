// Reading Prometheus text exposition in tests: the value of one sample line.
#ifndef MAGICPIG_TESTS_TESTING_EXPOSITION_H_
#define MAGICPIG_TESTS_TESTING_EXPOSITION_H_

#include <limits>
#include <string>

namespace magicpig::testing {

// The value of the sample line `series` ("name" or "name{labels}", labels as rendered) in the
// exposition `text`; NaN when there is no such line.
inline double ExpositionSample(const std::string& text, const std::string& series) {
  const std::string lines = "\n" + text;
  const std::string needle = "\n" + series + " ";
  const size_t at = lines.find(needle);
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  return std::stod(lines.substr(at + needle.size()));
}

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_EXPOSITION_H_
