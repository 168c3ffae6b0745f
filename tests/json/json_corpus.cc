// Driver for the differential JSON test (json_python_compare.py): parses every document of a
// corpus with json::Parse and prints, one line per document, "OK <Serialize(value)>" or
// "ERR <status message>".
//
//   magicpig_json_corpus CORPUS OUT
//
// CORPUS holds records "<decimal byte count>\n<bytes>", so documents may contain any byte.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include "common/json/parse.h"
#include "common/json/serialize.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: magicpig_json_corpus CORPUS OUT\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << argv[1] << "\n";
    return 2;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string corpus = buffer.str();
  std::ofstream out(argv[2], std::ios::binary);
  if (!out) {
    std::cerr << "cannot write " << argv[2] << "\n";
    return 2;
  }

  size_t pos = 0;
  size_t count = 0;
  std::string line;
  while (pos < corpus.size()) {
    const size_t newline = corpus.find('\n', pos);
    if (newline == std::string::npos) {
      std::cerr << "corrupt corpus at byte " << pos << "\n";
      return 2;
    }
    const size_t size = std::strtoull(corpus.c_str() + pos, nullptr, 10);
    pos = newline + 1;
    if (size > corpus.size() - pos) {
      std::cerr << "corrupt corpus: record " << count << " runs past the end\n";
      return 2;
    }
    const std::string_view doc(corpus.data() + pos, size);
    pos += size;
    ++count;

    absl::StatusOr<magicpig::json::Value> v = magicpig::json::Parse(doc);
    line.clear();
    if (v.ok()) {
      line = "OK ";
      magicpig::json::AppendSerialized(*v, &line);
    } else {
      line = "ERR ";
      line += std::string(v.status().message());
    }
    line += '\n';
    out << line;
  }
  std::cerr << "parsed " << count << " documents\n";
  return out ? 0 : 1;
}
