// GPT-2 byte-level alphabet and small UTF-8 helpers shared by the tokenizer.
//
// GPT-2 style vocabularies store tokens in a "mapped" alphabet where each byte is a printable code
// point: 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to themselves, the other 68 bytes map in order to
// U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). These helpers convert between
// raw bytes and that alphabet.
#ifndef MAGICPIG_GPU_NODE_MODEL_BYTE_UNICODE_H_
#define MAGICPIG_GPU_NODE_MODEL_BYTE_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace magicpig::model {

// The code point that byte `b` is written as in a GPT-2 vocabulary.
char32_t ByteToCodepoint(uint8_t b);

// Inverse of ByteToCodepoint; nullopt for code points outside the 256-symbol alphabet.
std::optional<uint8_t> CodepointToByte(char32_t cp);

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string& out);

// Raw bytes -> mapped alphabet (UTF-8 encoded).
std::string BytesToMapped(std::string_view bytes);

// Mapped alphabet -> raw bytes. nullopt if `mapped` is not valid UTF-8 or holds a code point that
// is not in the alphabet (such tokens cannot come out of byte-level BPE).
std::optional<std::string> MappedToBytes(std::string_view mapped);

// Length of the UTF-8 sequence announced by lead byte `b`: 1..4, or 0 if `b` cannot start one
// (continuation byte, 0xC0/0xC1, 0xF5..0xFF).
int Utf8SequenceLength(uint8_t b);

// Decodes one code point at `s[pos]`. Returns its length and stores the code point, or returns 0
// for an invalid, overlong, surrogate or truncated sequence.
int DecodeUtf8(std::string_view s, size_t pos, char32_t* cp);

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_BYTE_UNICODE_H_
