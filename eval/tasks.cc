#include "eval/tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/json/parse.h"
#include "common/json/serialize.h"

namespace magicpig::eval {

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Word lists.

bool GoodWord(const std::string& w) {
  if (w.size() < 3 || w.size() > 10) return false;
  for (char c : w) {
    if (c < 'a' || c > 'z') return false;
  }
  return true;
}

std::vector<std::string> ReadWordNetIndex(const std::string& path) {
  std::ifstream in(path);
  std::set<std::string> words;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == ' ') continue;  // licence header
    const std::string lemma = line.substr(0, line.find(' '));
    if (GoodWord(lemma)) words.insert(lemma);
  }
  return {words.begin(), words.end()};
}

// Fallback when wordnet-base is not installed (the substitution is stated in docs/evaluation.md).
constexpr const char* kBuiltinAdjectives[] = {
    "able",    "ancient", "bold",   "brave",  "bright", "calm",   "clever", "cold",   "crisp",
    "curious", "dark",    "deep",   "eager",  "early",  "faint",  "fancy",  "gentle", "giant",
    "golden",  "grand",   "happy",  "hollow", "humble", "icy",    "jolly",  "kind",   "large",
    "lively",  "lonely",  "lucky",  "mellow", "modest", "narrow", "noble",  "odd",    "pale",
    "plain",   "polite",  "proud",  "quiet",  "rapid",  "rare",   "rough",  "rusty",  "shiny",
    "silent",  "simple",  "sleepy", "slow",   "smooth", "soft",   "solid",  "steady", "sturdy",
    "sudden",  "sweet",   "swift",  "tall",   "tender", "tidy",   "tiny",   "vast",   "warm",
    "wild",    "wise",    "witty",  "young",  "zesty"};
constexpr const char* kBuiltinNouns[] = {
    "anchor", "apple",  "arrow",    "basket", "beacon",  "bell",    "blanket", "boat",
    "bottle", "bridge", "bucket",   "cabin",  "candle",  "canyon",  "castle",  "cellar",
    "chair",  "cliff",  "cloud",    "coast",  "comet",   "cottage", "crystal", "desert",
    "door",   "dragon", "drum",     "eagle",  "engine",  "falcon",  "feather", "field",
    "flame",  "forest", "fountain", "garden", "gate",    "glacier", "harbor",  "helmet",
    "hill",   "island", "jacket",   "jungle", "kettle",  "ladder",  "lake",    "lantern",
    "meadow", "mirror", "mountain", "needle", "ocean",   "orchard", "palace",  "parrot",
    "pebble", "pencil", "pepper",   "piano",  "planet",  "pocket",  "pond",    "quarry",
    "rabbit", "river",  "rocket",   "saddle", "shadow",  "shelf",   "signal",  "spoon",
    "stone",  "storm",  "table",    "temple", "thunder", "tiger",   "tower",   "trumpet",
    "tunnel", "valley", "violin",   "wagon",  "window",  "wizard",  "wolf",    "yarn"};
constexpr const char* kBuiltinVerbs[] = {
    "admire",   "borrow", "build",   "carry",  "chase",  "climb",   "collect", "cover",
    "discover", "follow", "gather",  "guard",  "heal",   "improve", "invent",  "juggle",
    "keep",     "lift",   "measure", "mend",   "notice", "offer",   "paint",   "polish",
    "praise",   "repair", "rescue",  "follow", "search", "select",  "share",   "shelter",
    "study",    "trade",  "travel",  "wander", "watch",  "weave"};

WordLists BuildWordLists() {
  WordLists w;
  const std::string dir = "/usr/share/wordnet/";
  w.nouns = ReadWordNetIndex(dir + "index.noun");
  w.adjectives = ReadWordNetIndex(dir + "index.adj");
  w.verbs = ReadWordNetIndex(dir + "index.verb");
  if (w.nouns.size() > 1000 && w.adjectives.size() > 1000 && w.verbs.size() > 1000) {
    w.source = "wordnet-base (/usr/share/wordnet index.noun/adj/verb)";
    return w;
  }
  auto load = [](auto& arr) {
    std::set<std::string> s(std::begin(arr), std::end(arr));
    return std::vector<std::string>(s.begin(), s.end());
  };
  w.adjectives = load(kBuiltinAdjectives);
  w.nouns = load(kBuiltinNouns);
  w.verbs = load(kBuiltinVerbs);
  w.source = "built-in list (wordnet-base not installed)";
  return w;
}

// Words that needle, question or template sentences use: kept out of the essay so needles stay
// unique and the instructions unambiguous.
const std::set<std::string>& ReservedWords() {
  static const std::set<std::string> r = {
      "one",   "special",  "magic", "number",   "numbers", "word",     "words",    "uuid",
      "uuids", "for",      "is",    "var",      "value",   "variable", "town",     "founded",
      "born",  "director", "first", "document", "answer",  "question", "memorise", "text"};
  return r;
}

std::string RandomWordKey(Rng& rng) {
  const WordLists& w = Words();
  return absl::StrCat(w.adjectives[rng.Uniform(w.adjectives.size())], "-",
                      w.nouns[rng.Uniform(w.nouns.size())]);
}

std::string RandomNumber(Rng& rng) { return std::to_string(rng.Range(1000000, 9999999)); }

std::string RandomUuid(Rng& rng) {
  const uint64_t hi = rng.Next(), lo = rng.Next();
  uint8_t b[16];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(hi >> (8 * i));
  for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<uint8_t>(lo >> (8 * i));
  b[6] = static_cast<uint8_t>((b[6] & 0x0F) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3F) | 0x80);  // variant
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s.push_back(hex[b[i] >> 4]);
    s.push_back(hex[b[i] & 15]);
  }
  return s;
}

std::string RandomValue(const std::string& type, Rng& rng) {
  if (type == "number") return RandomNumber(rng);
  if (type == "uuid") return RandomUuid(rng);
  return RandomWordKey(rng);
}

// ---------------------------------------------------------------------------------------------
// Haystacks.

// RULER's filler line, in our own wording: five short, bland, digit-free sentences.
constexpr const char* kNoiseLine =
    "The meadow is green. The clouds are white. The river is calm. Here we rest. Then we walk home "
    "again.";

const std::vector<std::string>& EssayVocabulary(int which) {  // 0 adj, 1 noun, 2 verb
  static const std::vector<std::string>* lists = [] {
    auto* out = new std::vector<std::string>[3];
    const WordLists& w = Words();
    const std::vector<std::string>* src[3] = {&w.adjectives, &w.nouns, &w.verbs};
    for (int i = 0; i < 3; ++i) {
      for (const std::string& s : *src[i]) {
        if (!ReservedWords().count(s)) out[i].push_back(s);
      }
    }
    return out;
  }();
  return lists[which];
}

constexpr const char* kEssayTemplates[] = {
    "The {A} {N} can {V} the {N}.",
    "Every {N} of the {A} {N} seems {A}, and the {N} will {V} it.",
    "In a {A} {N}, the {N} may {V} without a {N}.",
    "Perhaps the {N} should {V} a {A} {N} before the {N} grows {A}.",
    "Nobody knew why the {N} would {V} so {A} a {N}!",
    "Could a {A} {N} {V} the {N} of the {A} {N}?",
    "We often {V} the {N}, yet the {A} {N} rarely seems to {V} anything.",
    "When the {N} is {A}, people {V} their {N} and {V} the {N}.",
    "It is {A} to {V} a {N} that nobody can {V}.",
    "The {N} and the {N} both {V} with {A} care.",
    "Long ago a {A} {N} taught us to {V} every {N} we meet.",
    "Why should a {N} {V} when the {N} is already {A}?",
};

const std::vector<std::string>& EssayCorpusWords() {
  static const std::vector<std::string>* words = [] {
    auto* out = new std::vector<std::string>();
    const std::string text = PseudoEssay(40000, 20261122);
    std::istringstream in(text);
    std::string w;
    while (in >> w) out->push_back(w);
    return out;
  }();
  return *words;
}

// The first n words of the essay corpus (cycling), split into sentences.
std::vector<std::string> EssaySentences(int64_t n_words, int64_t offset = 0) {
  const std::vector<std::string>& words = EssayCorpusWords();
  std::vector<std::string> sentences;
  std::string cur;
  for (int64_t i = 0; i < n_words; ++i) {
    const std::string& w = words[static_cast<size_t>((offset + i) % words.size())];
    if (!cur.empty()) cur.push_back(' ');
    cur += w;
    const char last = w.back();
    if (last == '.' || last == '!' || last == '?') {
      sentences.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) sentences.push_back(std::move(cur));
  return sentences;
}

// Inserts needles into essay sentences at depths drawn from 40 evenly spaced percentages.
std::string EssayWithNeedles(int64_t n_words, const std::vector<std::string>& needles, Rng& rng) {
  std::vector<std::string> sentences = EssaySentences(n_words);
  std::vector<int> depths(40);
  for (int i = 0; i < 40; ++i) depths[i] = static_cast<int>(std::lround(i * 100.0 / 39.0));
  rng.Shuffle(depths);
  std::vector<int64_t> idx;
  for (size_t i = 0; i < needles.size(); ++i) {
    idx.push_back(static_cast<int64_t>(sentences.size()) * depths[i % 40] / 100);
  }
  std::sort(idx.begin(), idx.end());
  std::vector<std::string> out;
  size_t next = 0;
  for (int64_t s = 0; s <= static_cast<int64_t>(sentences.size()); ++s) {
    while (next < idx.size() && idx[next] == s) out.push_back(needles[next++]);
    if (s < static_cast<int64_t>(sentences.size())) out.push_back(sentences[s]);
  }
  return absl::StrJoin(out, " ");
}

// Inserts `items` into `lines` at distinct random indices in [0, n), highest index first.
void InsertLines(std::vector<std::string>& lines, const std::vector<std::string>& items, Rng& rng) {
  const int64_t n = static_cast<int64_t>(lines.size());
  std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  rng.Shuffle(all);
  std::vector<std::pair<int64_t, size_t>> pos;
  for (size_t i = 0; i < items.size(); ++i) {
    pos.emplace_back(i < all.size() ? all[i] : all.back(), i);
  }
  std::sort(pos.rbegin(), pos.rend());
  for (const auto& [p, i] : pos) lines.insert(lines.begin() + std::min(p, n), items[i]);
}

// ---------------------------------------------------------------------------------------------
// Tasks.

struct Built {
  std::string input;
  int64_t question_offset = 0;
  std::vector<std::string> outputs;
  std::string answer_prefix;
};

using Builder = std::function<Built(int64_t n, uint64_t seed)>;

struct NiahSpec {
  std::string key_type, value_type, haystack;
  int num_keys, num_values, num_queries;
};

const std::map<std::string, NiahSpec>& NiahSpecs() {
  static const std::map<std::string, NiahSpec> m = {
      {"niah_single_1", {"word", "number", "noise", 1, 1, 1}},
      {"niah_single_2", {"word", "number", "essay", 1, 1, 1}},
      {"niah_single_3", {"word", "uuid", "essay", 1, 1, 1}},
      {"niah_multikey_1", {"word", "number", "essay", 4, 1, 1}},
      {"niah_multikey_2", {"word", "number", "needle", 1, 1, 1}},
      {"niah_multikey_3", {"uuid", "uuid", "needle", 1, 1, 1}},
      {"niah_multivalue", {"word", "number", "essay", 1, 4, 1}},
      {"niah_multiquery", {"word", "number", "essay", 4, 1, 4}},
  };
  return m;
}

std::string Needle(const std::string& type, const std::string& key, const std::string& value) {
  return absl::StrCat("One special magic ", type, " for ", key, " is: ", value, ".");
}

Built BuildNiah(const NiahSpec& spec, int64_t n, uint64_t seed) {
  Rng rng(seed);
  const int num_keys = std::max(spec.num_keys, spec.num_queries);
  std::vector<std::string> keys, needles;
  std::vector<std::vector<std::string>> values;
  std::set<std::string> used;
  for (int k = 0; k < num_keys; ++k) {
    std::string key;
    do key = spec.key_type == "uuid" ? RandomUuid(rng) : RandomWordKey(rng);
    while (!used.insert(key).second);
    keys.push_back(key);
    values.emplace_back();
    for (int v = 0; v < spec.num_values; ++v) {
      std::string value;
      do value = RandomValue(spec.value_type, rng);
      while (!used.insert(value).second);
      values.back().push_back(value);
      needles.push_back(Needle(spec.value_type, key, value));
    }
  }
  // A fixed-seed shuffle (the same permutation for every sample, as RULER).
  Rng fixed(42);
  fixed.Shuffle(needles);
  std::string context;
  if (spec.haystack == "essay") {
    context = EssayWithNeedles(n, needles, rng);
  } else {
    std::vector<std::string> lines;
    if (spec.haystack == "noise") {
      lines.assign(static_cast<size_t>(n), kNoiseLine);
    } else {  // needle: every line a distractor needle with fresh key and value
      for (int64_t i = 0; i < n; ++i) {
        std::string key, value;
        do key = spec.key_type == "uuid" ? RandomUuid(rng) : RandomWordKey(rng);
        while (used.count(key));
        do value = RandomValue(spec.value_type, rng);
        while (used.count(value));
        lines.push_back(Needle(spec.value_type, key, value));
      }
    }
    InsertLines(lines, needles, rng);
    context = absl::StrJoin(lines, "\n");
  }
  // Queried keys, at random.
  std::vector<int> order(static_cast<size_t>(num_keys));
  for (int i = 0; i < num_keys; ++i) order[i] = i;
  rng.Shuffle(order);
  order.resize(static_cast<size_t>(spec.num_queries));
  std::vector<std::string> qkeys;
  Built b;
  for (int i : order) {
    qkeys.push_back(keys[i]);
    for (const std::string& v : values[i]) b.outputs.push_back(v);
  }
  std::string query = qkeys[0];
  if (qkeys.size() > 1) {
    query =
        absl::StrCat(absl::StrJoin(std::vector<std::string>(qkeys.begin(), qkeys.end() - 1), ", "),
                     ", and ", qkeys.back());
  }
  const bool singular = spec.num_queries * spec.num_values == 1;
  const std::string type = spec.value_type, types = type + "s";
  std::string instruction, question;
  if (singular) {
    instruction = absl::StrCat("The text below hides a special magic ", type,
                               ". Memorise it; you will be asked about the ", type, " afterwards.");
    question =
        absl::StrCat("Which special magic ", type, " for ", query, " appears in the text above?");
    b.answer_prefix =
        absl::StrCat(" The special magic ", type, " for ", query, " in the text above is");
  } else {
    instruction =
        absl::StrCat("The text below hides special magic ", types,
                     ". Memorise them; you will be asked about the ", types, " afterwards.");
    question =
        absl::StrCat("Which special magic ", types, " for ", query, " appear in the text above?");
    b.answer_prefix =
        absl::StrCat(" The special magic ", types, " for ", query, " in the text above are");
  }
  b.input = absl::StrCat(instruction, "\n", context);
  b.question_offset = static_cast<int64_t>(b.input.size());
  absl::StrAppend(&b.input, "\n", question);
  return b;
}

std::string RandomUpper(int len, Rng& rng) {
  std::string s;
  for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('A' + rng.Uniform(26)));
  return s;
}

// A vt context: n noise lines with one chain of hops+1 statements; returns (context, names).
std::pair<std::string, std::vector<std::string>> VtContext(int64_t n, int name_len, int value,
                                                           int hops, Rng& rng) {
  std::vector<std::string> names;
  std::set<std::string> used;
  while (static_cast<int>(names.size()) < hops + 1) {
    std::string s = RandomUpper(name_len, rng);
    if (used.insert(s).second) names.push_back(s);
  }
  std::vector<std::string> chain;
  chain.push_back(absl::StrCat("VAR ", names[0], " = ", value));
  for (int j = 1; j <= hops; ++j) {
    chain.push_back(absl::StrCat("VAR ", names[j], " = VAR ", names[j - 1], " "));
  }
  std::vector<std::string> lines(static_cast<size_t>(n), kNoiseLine);
  std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  rng.Shuffle(all);
  std::vector<int64_t> pos(all.begin(), all.begin() + std::min<size_t>(chain.size(), all.size()));
  while (pos.size() < chain.size()) pos.push_back(pos.empty() ? 0 : pos.back());
  std::sort(pos.begin(), pos.end());
  for (size_t j = 0; j < chain.size(); ++j) {
    const int64_t at =
        std::min<int64_t>(pos[j] + static_cast<int64_t>(j), static_cast<int64_t>(lines.size()));
    lines.insert(lines.begin() + at, chain[j]);
  }
  std::string context = absl::StrJoin(lines, "\n");
  context = absl::StrReplaceAll(context, {{". \n", ".\n"}});
  return {context, names};
}

Built BuildVt(int64_t n, uint64_t seed) {
  Rng rng(seed);
  constexpr int kHops = 4;
  const std::string instruction =
      "Track every chain of variable assignments hidden in the text below.";
  auto question = [](int v) {
    return absl::StrCat("Question: Which variables are assigned the value ", v,
                        " in the text above?");
  };
  auto prefix = [](int v) {
    return absl::StrCat(" Answer: Following the assignment chains in the text above, ", kHops + 1,
                        " variables are assigned the value ", v, ", they are: ");
  };
  // One-shot example (about 500 tokens): 3-letter names, a random value.
  const int ex_value = static_cast<int>(rng.Range(10000, 99999));
  auto [ex_context, ex_names] = VtContext(18, 3, ex_value, kHops, rng);
  const int value = static_cast<int>(rng.Range(10000, 99999));
  auto [context, names] = VtContext(n, 5, value, kHops, rng);
  Built b;
  b.input = absl::StrCat(instruction, "\n\n", ex_context, "\n", question(ex_value), "\n",
                         prefix(ex_value), absl::StrJoin(ex_names, " "), "\n\n", instruction,
                         "\n\n", context);
  b.question_offset = static_cast<int64_t>(b.input.size());
  absl::StrAppend(&b.input, "\n", question(value));
  b.answer_prefix = prefix(value);
  b.outputs = names;
  return b;
}

// Extra pseudo-words when a list needs more distinct words than the vocabulary has.
std::string PseudoWord(Rng& rng) {
  static const char* syl[] = {"ka",  "lo",  "mi",  "ren", "tha", "vor", "zel", "bri", "dun",  "fen",
                              "gar", "hul", "ist", "jor", "kel", "mar", "nor", "pel", "quin", "ros",
                              "sal", "tor", "ul",  "ven", "wyn", "yar", "zor", "ab",  "el",   "or"};
  std::string s;
  const int n = static_cast<int>(rng.Range(2, 3));
  for (int i = 0; i < n; ++i) s += syl[rng.Uniform(30)];
  return s;
}

// The deduplicated, sorted union of the three lists.
const std::vector<std::string>& AllWords() {
  static const std::vector<std::string>* v = [] {
    const WordLists& w = Words();
    std::set<std::string> all(w.nouns.begin(), w.nouns.end());
    all.insert(w.adjectives.begin(), w.adjectives.end());
    all.insert(w.verbs.begin(), w.verbs.end());
    return new std::vector<std::string>(all.begin(), all.end());
  }();
  return *v;
}

std::vector<std::string> CweVocabulary(Rng& rng) {
  std::vector<std::string> v = AllWords();
  rng.Shuffle(v);
  return v;
}

std::string NumberedList(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) s.push_back(' ');
    absl::StrAppend(&s, i + 1, ". ", words[i]);
  }
  return s;
}

Built BuildCwe(int64_t n, uint64_t seed, int64_t length) {
  Rng rng(seed);
  std::vector<std::string> vocab = CweVocabulary(rng);
  const size_t need = static_cast<size_t>(n + 40);
  std::set<std::string> have;
  if (vocab.size() < need) have.insert(vocab.begin(), vocab.end());
  while (vocab.size() < need) {
    std::string p = PseudoWord(rng);
    if (have.insert(p).second) vocab.push_back(p);
  }
  const bool short_ctx = length < 4096;
  const int freq_cw = short_ctx ? 6 : 30, freq_ucw = short_ctx ? 1 : 3;
  const int ex_words = short_ctx ? 20 : 40, ex_cw = short_ctx ? 3 : 10, ex_ucw = short_ctx ? 1 : 3;
  auto make_list = [&](const std::vector<std::string>& words, int cw, int ucw) {
    std::vector<std::string> multiset;
    for (size_t i = 0; i < words.size(); ++i) {
      for (int r = 0; r < (i < 10 ? cw : ucw); ++r) multiset.push_back(words[i]);
    }
    rng.Shuffle(multiset);
    return NumberedList(multiset);
  };
  const std::vector<std::string> words(vocab.begin(), vocab.begin() + n);
  const std::vector<std::string> ex(vocab.begin() + n, vocab.begin() + n + ex_words);
  const std::string instruction =
      "Below is a numbered list of words. Some appear more often than the others; memorise the "
      "most frequent ones.";
  const std::string question = "Question: Which 10 words appear most often in the list above?";
  const std::string prefix = " Answer: The 10 most frequent words in the list are:";
  const std::string ex_answer = NumberedList(std::vector<std::string>(ex.begin(), ex.begin() + 10));
  Built b;
  b.input =
      absl::StrCat(instruction, "\n", make_list(ex, ex_cw, ex_ucw), "\n", question, "\n", prefix,
                   " ", ex_answer, "\n\n", instruction, "\n", make_list(words, freq_cw, freq_ucw));
  b.question_offset = static_cast<int64_t>(b.input.size());
  absl::StrAppend(&b.input, "\n", question);
  b.answer_prefix = prefix;
  b.outputs.assign(words.begin(), words.begin() + 10);
  return b;
}

Built BuildFwe(int64_t n, uint64_t seed, int64_t length) {
  Rng rng(seed);
  const int64_t v_count = std::max<int64_t>(10, (length - 50) / 50);
  std::set<std::string> set;
  while (static_cast<int64_t>(set.size()) < v_count) {
    std::string s;
    for (int i = 0; i < 6; ++i) s.push_back(static_cast<char>('a' + rng.Uniform(26)));
    set.insert(s);
  }
  std::vector<std::string> vocab(set.begin(), set.end());
  rng.Shuffle(vocab);
  vocab[0] = "...";
  const double zeta2 = M_PI * M_PI / 6.0;
  std::vector<std::string> multiset;
  for (size_t k = 1; k <= vocab.size(); ++k) {
    const int64_t c = static_cast<int64_t>(std::floor(n * std::pow(k, -2.0) / zeta2));
    for (int64_t r = 0; r < c; ++r) multiset.push_back(vocab[k - 1]);
  }
  rng.Shuffle(multiset);
  Built b;
  b.input = absl::StrCat(
      "Read the coded text below and count how often each coded word occurs, to find the three "
      "most frequent ones. ",
      absl::StrJoin(multiset, " "));
  b.question_offset = static_cast<int64_t>(b.input.size());
  absl::StrAppend(&b.input,
                  "\nQuestion: Give no explanation and ignore the dots '....'. Which three coded "
                  "words occur most often in the text above?");
  b.answer_prefix =
      " Answer: According to the coded text above, the three most frequent words are:";
  b.outputs = {vocab[1], vocab[2], vocab[3]};
  return b;
}

// ---- qa substitute ----

std::string Capitalise(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

struct NameMaker {
  Rng* rng;
  std::set<std::string> used;
  std::string Proper() {  // a pseudo-word place or person name, unique, not a vocabulary word
    static const std::set<std::string>* vocab = [] {
      auto* s = new std::set<std::string>();
      const WordLists& w = Words();
      s->insert(w.nouns.begin(), w.nouns.end());
      s->insert(w.adjectives.begin(), w.adjectives.end());
      s->insert(w.verbs.begin(), w.verbs.end());
      return s;
    }();
    while (true) {
      std::string p = PseudoWord(*rng);
      if (vocab->count(p) || !used.insert(p).second) continue;
      return Capitalise(p);
    }
  }
  std::string Person() { return absl::StrCat(Proper(), " ", Proper()); }
};

constexpr const char* kKinds[] = {"Society",    "Institute",   "Company", "Guild",
                                  "Foundation", "Observatory", "Academy", "Library"};

struct Entity {
  std::string adj, noun, kind;
  std::string Name() const { return absl::StrCat("the ", adj, " ", noun, " ", kind); }
};

std::string EntityDoc(const Entity& e, const std::string* town, const std::string* director,
                      Rng& rng) {
  const std::string name = e.Name();
  std::vector<std::string> facts;
  if (town)
    facts.push_back(absl::StrCat(Capitalise(name), " was founded in the town of ", *town, "."));
  facts.push_back(
      absl::StrCat(Capitalise(name), " was established in the year ", rng.Range(1700, 1999), "."));
  if (director) facts.push_back(absl::StrCat(*director, " was the first director of ", name, "."));
  const auto& adj = EssayVocabulary(0);
  const auto& noun = EssayVocabulary(1);
  facts.push_back(absl::StrCat(Capitalise(name), " is known for its ", adj[rng.Uniform(adj.size())],
                               " ", noun[rng.Uniform(noun.size())], " collection."));
  rng.Shuffle(facts);
  const std::vector<std::string> pad =
      EssaySentences(rng.Range(30, 60), static_cast<int64_t>(rng.Uniform(30000)));
  return absl::StrCat(absl::StrJoin(facts, " "), " ", absl::StrJoin(pad, " "));
}

std::string PersonDoc(const std::string& person, const std::string& town, Rng& rng) {
  const auto& noun = EssayVocabulary(1);
  std::vector<std::string> facts = {
      absl::StrCat(person, " was born in the town of ", town, "."),
      absl::StrCat(person, " wrote a long study of the ", noun[rng.Uniform(noun.size())], "."),
      absl::StrCat("Friends remember ", person, " as patient and curious.")};
  rng.Shuffle(facts);
  const std::vector<std::string> pad =
      EssaySentences(rng.Range(30, 60), static_cast<int64_t>(rng.Uniform(30000)));
  return absl::StrCat(absl::StrJoin(facts, " "), " ", absl::StrJoin(pad, " "));
}

Built BuildQa(bool two_hop, int64_t n_docs, uint64_t seed) {
  Rng rng(seed);
  NameMaker names{&rng, {}};
  const auto& adj = EssayVocabulary(0);
  const auto& noun = EssayVocabulary(1);
  std::set<std::string> entity_names;
  auto new_entity = [&]() {
    while (true) {
      Entity e{Capitalise(adj[rng.Uniform(adj.size())]), Capitalise(noun[rng.Uniform(noun.size())]),
               kKinds[rng.Uniform(8)]};
      if (entity_names.insert(e.Name()).second) return e;
    }
  };
  const Entity gold = new_entity();
  const std::string town = names.Proper();
  std::vector<std::string> gold_docs;
  std::string query;
  const std::string director = names.Person();
  if (!two_hop) {
    gold_docs.push_back(EntityDoc(gold, &town, nullptr, rng));
    query = absl::StrCat("In which town was ", gold.Name(), " founded?");
  } else {
    gold_docs.push_back(EntityDoc(gold, nullptr, &director, rng));
    gold_docs.push_back(PersonDoc(director, town, rng));
    query = absl::StrCat("In which town was the first director of ", gold.Name(), " born?");
  }
  // Distractors: two hard ones (share two of the three name words), then others.
  std::vector<std::string> distractors;
  const int64_t n_distractors =
      std::max<int64_t>(2, n_docs - static_cast<int64_t>(gold_docs.size()));
  for (int64_t i = 0; i < n_distractors; ++i) {
    Entity e;
    if (i == 0) {
      do e = Entity{gold.adj, gold.noun, kKinds[rng.Uniform(8)]};
      while (!entity_names.insert(e.Name()).second);
    } else if (i == 1) {
      do e = Entity{Capitalise(adj[rng.Uniform(adj.size())]), gold.noun, gold.kind};
      while (!entity_names.insert(e.Name()).second);
    } else {
      e = new_entity();
    }
    const std::string other_town = names.Proper(), other_person = names.Person();
    if (two_hop && i % 2 == 1) {
      distractors.push_back(PersonDoc(other_person, other_town, rng));
    } else {
      distractors.push_back(EntityDoc(e, &other_town, &other_person, rng));
    }
  }
  // Gold documents at random indices.
  std::vector<std::string> docs = distractors;
  for (const std::string& g : gold_docs) {
    const size_t at = rng.Uniform(docs.size() + 1);
    docs.insert(docs.begin() + static_cast<int64_t>(at), g);
  }
  const std::string instruction =
      "Answer the question from the documents below. Reply with the answer only.";
  std::vector<std::string> rendered;
  for (size_t i = 0; i < docs.size(); ++i) {
    rendered.push_back(absl::StrCat("Document ", i + 1, ":\n", docs[i]));
  }
  Built b;
  b.input = absl::StrCat(instruction, "\n\n", absl::StrJoin(rendered, "\n\n"));
  b.question_offset = static_cast<int64_t>(b.input.size());
  absl::StrAppend(&b.input, "\n\n", instruction, "\nQuestion: ", query);
  b.answer_prefix = " Answer:";
  b.outputs = {town};
  return b;
}

}  // namespace

const WordLists& Words() {
  static const WordLists* w = new WordLists(BuildWordLists());
  return *w;
}

std::string WordSource() { return Words().source; }

const std::vector<std::string>& RulerTasks() {
  static const std::vector<std::string> t = {"niah_single_1",
                                             "niah_single_2",
                                             "niah_single_3",
                                             "niah_multikey_1",
                                             "niah_multikey_2",
                                             "niah_multikey_3",
                                             "niah_multivalue",
                                             "niah_multiquery",
                                             "vt",
                                             "cwe",
                                             "fwe",
                                             "qa_1",
                                             "qa_2"};
  return t;
}

int64_t TaskMaxNewTokens(std::string_view task) {
  if (task.starts_with("niah")) return 128;
  if (task == "vt") return 30;
  if (task == "cwe") return 120;
  if (task == "fwe") return 50;
  if (task == "qa_1" || task == "qa_2") return 32;
  return 0;
}

uint64_t SampleSeed(uint64_t base_seed, std::string_view task, int64_t length, int64_t index) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the task name
  for (char c : task) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  Rng r(h ^ (base_seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(length) << 20) ^
        static_cast<uint64_t>(index));
  return r.Next() >> 11;  // 53 bits: exact in JSON numbers
}

std::string PseudoEssay(int64_t n_words, uint64_t seed) {
  Rng rng(seed);
  const auto& a = EssayVocabulary(0);
  const auto& nn = EssayVocabulary(1);
  const auto& v = EssayVocabulary(2);
  std::string out;
  int64_t words = 0;
  bool sentence_start = true;
  while (words < n_words) {
    const std::string t = kEssayTemplates[rng.Uniform(std::size(kEssayTemplates))];
    std::string s;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '{' && i + 2 < t.size() && t[i + 2] == '}') {
        const char k = t[i + 1];
        s += k == 'A'   ? a[rng.Uniform(a.size())]
             : k == 'N' ? nn[rng.Uniform(nn.size())]
                        : v[rng.Uniform(v.size())];
        i += 2;
      } else {
        s.push_back(t[i]);
      }
    }
    if (sentence_start) s = Capitalise(s);
    if (!out.empty()) out.push_back(' ');
    out += s;
    for (char c : s) words += c == ' ';
    ++words;
  }
  return out;
}

absl::StatusOr<Sample> GenerateSample(const std::string& task, int64_t length, int64_t index,
                                      uint64_t seed, const TokenCounter& count) {
  Builder build;
  int64_t n_min = 1, probe = 10;
  const auto niah = NiahSpecs().find(task);
  if (niah != NiahSpecs().end()) {
    const NiahSpec spec = niah->second;
    build = [spec](int64_t n, uint64_t s) { return BuildNiah(spec, n, s); };
    n_min = spec.haystack == "essay" ? 50 : 5;
    probe = spec.haystack == "essay" ? 200 : 10;
  } else if (task == "vt") {
    build = BuildVt;
    n_min = 5;
  } else if (task == "cwe") {
    build = [length](int64_t n, uint64_t s) { return BuildCwe(n, s, length); };
    n_min = 10;
    probe = 20;
  } else if (task == "fwe") {
    build = [length](int64_t n, uint64_t s) { return BuildFwe(n, s, length); };
    n_min = 50;
    probe = 100;
  } else if (task == "qa_1" || task == "qa_2") {
    const bool two = task == "qa_2";
    build = [two](int64_t n, uint64_t s) { return BuildQa(two, n, s); };
    n_min = 3;
    probe = 3;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown task '", task, "'"));
  }
  const int64_t max_new = TaskMaxNewTokens(task);
  const int64_t limit = length - max_new;
  std::map<int64_t, int64_t> memo;
  auto tokens = [&](int64_t n) {
    auto it = memo.find(n);
    if (it != memo.end()) return it->second;
    const Built b = build(n, seed);
    const int64_t t = count(b.input, b.question_offset, b.answer_prefix);
    memo[n] = t;
    return t;
  };
  const int64_t t_min = tokens(n_min);
  if (t_min > limit) {
    return absl::FailedPreconditionError(absl::StrCat(task, ": even the smallest haystack takes ",
                                                      t_min + max_new, " tokens > ", length));
  }
  const double per_unit =
      std::max(1e-3, static_cast<double>(tokens(n_min + probe) - t_min) / probe);
  int64_t hi = n_min + std::max<int64_t>(1, static_cast<int64_t>(3.0 * (limit - t_min) / per_unit));
  int64_t lo = n_min;
  while (tokens(hi) <= limit) {  // grow until it does not fit
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (tokens(mid) <= limit ? lo : hi) = mid;
  }
  const Built b = build(lo, seed);
  Sample s;
  s.task = task;
  s.length = length;
  s.index = index;
  s.seed = seed;
  s.input = b.input;
  s.question_offset = b.question_offset;
  s.outputs = b.outputs;
  s.answer_prefix = b.answer_prefix;
  s.max_new_tokens = max_new;
  s.tokens = tokens(lo);
  s.haystack_n = lo;
  s.metric = task.starts_with("qa") ? "part" : "all";
  const size_t at = s.input.find(s.outputs[0]);
  if (at != std::string::npos) {
    s.answer_char = static_cast<int64_t>(at);
    s.answer_depth = static_cast<double>(at) / std::max<int64_t>(1, s.question_offset);
  }
  return s;
}

std::string NormalizePrediction(std::string_view prediction) {
  std::string s(prediction);
  for (char& c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 32) c = '\n';
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  const size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\n\r\f\v");
  return s.substr(b, e - b + 1);
}

namespace {
std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

double StringMatchAll(std::string_view prediction, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0;
  const std::string p = NormalizePrediction(prediction);
  int hit = 0;
  for (const std::string& r : refs) hit += p.find(Lower(r)) != std::string::npos;
  return static_cast<double>(hit) / refs.size();
}

double StringMatchPart(std::string_view prediction, const std::vector<std::string>& refs) {
  const std::string p = NormalizePrediction(prediction);
  for (const std::string& r : refs) {
    if (p.find(Lower(r)) != std::string::npos) return 1;
  }
  return 0;
}

double ScoreSample(const Sample& sample, std::string_view prediction) {
  return sample.metric == "part" ? StringMatchPart(prediction, sample.outputs)
                                 : StringMatchAll(prediction, sample.outputs);
}

int64_t CountOccurrences(std::string_view text, std::string_view needle) {
  if (needle.empty()) return 0;
  int64_t n = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

json::Value SampleToJson(const Sample& s) {
  json::Value v = json::Value::Object();
  v.Set("task", s.task);
  v.Set("length", s.length);
  v.Set("index", s.index);
  v.Set("seed", std::to_string(s.seed));
  v.Set("input", s.input);
  v.Set("question_offset", s.question_offset);
  json::Value outs = json::Value::Array();
  for (const std::string& o : s.outputs) outs.Push(o);
  v.Set("outputs", std::move(outs));
  v.Set("answer_prefix", s.answer_prefix);
  v.Set("max_new_tokens", s.max_new_tokens);
  v.Set("tokens", s.tokens);
  v.Set("haystack_n", s.haystack_n);
  v.Set("answer_char", s.answer_char);
  v.Set("answer_depth", s.answer_depth);
  v.Set("metric", s.metric);
  v.Set("word_source", WordSource());
  return v;
}

absl::StatusOr<Sample> SampleFromJson(const json::Value& v) {
  Sample s;
  auto str = [&](const char* k) -> absl::StatusOr<std::string> {
    const json::Value* f = v.Find(k);
    if (f == nullptr || !f->is_string()) return absl::DataLossError(absl::StrCat("no ", k));
    return f->as_string();
  };
  auto num = [&](const char* k) -> absl::StatusOr<double> {
    const json::Value* f = v.Find(k);
    if (f == nullptr || !f->is_number()) return absl::DataLossError(absl::StrCat("no ", k));
    return f->as_double();
  };
  auto get_str = [&](const char* k, std::string* out) -> absl::Status {
    absl::StatusOr<std::string> r = str(k);
    if (!r.ok()) return r.status();
    *out = *r;
    return absl::OkStatus();
  };
  auto get_int = [&](const char* k, int64_t* out) -> absl::Status {
    absl::StatusOr<double> r = num(k);
    if (!r.ok()) return r.status();
    *out = static_cast<int64_t>(*r);
    return absl::OkStatus();
  };
  std::string seed;
  for (absl::Status st :
       {get_str("task", &s.task), get_int("length", &s.length), get_int("index", &s.index),
        get_str("seed", &seed), get_str("input", &s.input),
        get_int("question_offset", &s.question_offset), get_str("answer_prefix", &s.answer_prefix),
        get_int("max_new_tokens", &s.max_new_tokens), get_int("tokens", &s.tokens),
        get_int("haystack_n", &s.haystack_n), get_int("answer_char", &s.answer_char),
        get_str("metric", &s.metric)}) {
    if (!st.ok()) return st;
  }
  s.seed = std::stoull(seed);
  absl::StatusOr<double> depth = num("answer_depth");
  if (depth.ok()) s.answer_depth = *depth;
  const json::Value* outs = v.Find("outputs");
  if (outs == nullptr || !outs->is_array()) return absl::DataLossError("no outputs");
  for (const json::Value& o : outs->as_array()) s.outputs.push_back(o.as_string());
  return s;
}

absl::Status WriteSamples(const std::string& path, const std::vector<Sample>& samples) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    for (const Sample& s : samples) out << json::Serialize(SampleToJson(s)) << "\n";
    if (!out) return absl::UnavailableError(absl::StrCat("write failed: ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Sample>> ReadSamples(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<Sample> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    absl::StatusOr<json::Value> v = json::Parse(line);
    if (!v.ok()) return v.status();
    absl::StatusOr<Sample> s = SampleFromJson(*v);
    if (!s.ok()) return s.status();
    out.push_back(std::move(*s));
  }
  return out;
}

}  // namespace magicpig::eval
