// magicpig_tokenize_corpus: encodes a conformance corpus with magicpig's tokenizer, for comparison
// with Hugging Face `tokenizers` (compare_hf.sh).
//
//   magicpig_tokenize_corpus MODEL.gguf CORPUS.bin IDS_OUT.txt DECODED_OUT.bin [PRE]
//
// PRE overrides tokenizer.ggml.pre, to check other pre-tokenizers (llama-bpe, qwen2) on the same
// vocabulary against HF configured the same way.
//
// CORPUS.bin holds "<byte length>\n<bytes>\n" records (make_corpus.py --bin). Each document is
// encoded with parse_special; IDS_OUT gets one line of space-separated ids per document and
// DECODED_OUT the Decode() of those ids (control tokens skipped) in the same record format. The
// tool also checks Decode(Encode(x), render_special) == x, minus the bytes the vocabulary has no
// token for, and exits 1 if that fails for any document.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_node/model/byte_unicode.h"
#include "gpu_node/model/gguf_file.h"
#include "gpu_node/model/tokenizer.h"

namespace {

using magicpig::model::BytesToMapped;
using magicpig::model::GgufFile;
using magicpig::model::Tokenizer;

// Reads length-prefixed records; false (with a message) on a malformed file.
bool ReadRecords(const std::string& path, std::vector<std::string>* docs) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot open " << path << "\n";
    return false;
  }
  std::string header;
  while (std::getline(in, header)) {
    size_t len = 0;
    if (header.empty() || header.size() > 12) {
      std::cerr << path << ": bad record header \"" << header << "\"\n";
      return false;
    }
    for (char c : header) {
      if (c < '0' || c > '9') {
        std::cerr << path << ": bad record header \"" << header << "\"\n";
        return false;
      }
      len = len * 10 + static_cast<size_t>(c - '0');
    }
    std::string doc(len, '\0');
    if (!in.read(doc.data(), static_cast<std::streamsize>(len)) || in.get() != '\n') {
      std::cerr << path << ": truncated record " << docs->size() << "\n";
      return false;
    }
    docs->push_back(std::move(doc));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::cerr << "usage: " << argv[0]
              << " MODEL.gguf CORPUS.bin IDS_OUT.txt DECODED_OUT.bin [PRE]\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 2;
  }
  absl::StatusOr<magicpig::model::TokenizerVocab> vocab = Tokenizer::ReadVocab(**file);
  if (!vocab.ok()) {
    std::cerr << vocab.status() << "\n";
    return 2;
  }
  if (argc == 6) vocab->pre = argv[5];
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Create(*std::move(vocab));
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    return 2;
  }
  std::vector<std::string> docs;
  if (!ReadRecords(argv[2], &docs)) return 2;

  // Bytes without a token are dropped by the encoder (and by HF); the round trip ignores them.
  bool has_byte[256];
  for (int b = 0; b < 256; ++b) {
    has_byte[b] =
        (*tok)->FindToken(BytesToMapped(std::string(1, static_cast<char>(b)))).has_value();
  }

  std::ofstream ids_out(argv[3], std::ios::binary);
  std::ofstream dec_out(argv[4], std::ios::binary);
  size_t total_bytes = 0;
  size_t total_tokens = 0;
  size_t round_trip_failures = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string& doc = docs[i];
    std::vector<int32_t> ids = (*tok)->Encode(doc, /*parse_special=*/true);
    total_bytes += doc.size();
    total_tokens += ids.size();
    for (size_t j = 0; j < ids.size(); ++j) ids_out << (j ? " " : "") << ids[j];
    ids_out << "\n";
    std::string decoded = (*tok)->Decode(ids);
    dec_out << decoded.size() << "\n" << decoded << "\n";

    std::string expected;
    for (char c : doc) {
      if (has_byte[static_cast<uint8_t>(c)]) expected.push_back(c);
    }
    if ((*tok)->Decode(ids, /*render_special=*/true) != expected) {
      if (round_trip_failures++ == 0) std::cerr << "round trip failed for document " << i << "\n";
    }
  }
  std::cout << "magicpig: " << docs.size() << " documents, " << total_bytes << " bytes, "
            << total_tokens << " tokens; decode(encode(x)) == x for "
            << docs.size() - round_trip_failures << "/" << docs.size() << " documents\n";
  return round_trip_failures == 0 ? 0 : 1;
}
