// GPT-2 byte-level alphabet shared by the tokenizer (UTF-8 itself is common/text/utf8.h).
//
// GPT-2 style vocabularies store tokens in a "mapped" alphabet where each byte is a printable code
// point: 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to themselves, the other 68 bytes map in order to
// U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). These helpers convert between
// raw bytes and that alphabet.
#ifndef MAGICPIG_GPU_NODE_MODEL_BYTE_UNICODE_H_
#define MAGICPIG_GPU_NODE_MODEL_BYTE_UNICODE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace magicpig::model {

// The code point that byte `b` is written as in a GPT-2 vocabulary.
char32_t ByteToCodepoint(uint8_t b);

// Inverse of ByteToCodepoint; nullopt for code points outside the 256-symbol alphabet.
std::optional<uint8_t> CodepointToByte(char32_t cp);

// Raw bytes -> mapped alphabet (UTF-8 encoded).
std::string BytesToMapped(std::string_view bytes);

// Mapped alphabet -> raw bytes. nullopt if `mapped` is not valid UTF-8 or holds a code point that
// is not in the alphabet (such tokens cannot come out of byte-level BPE).
std::optional<std::string> MappedToBytes(std::string_view mapped);

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_BYTE_UNICODE_H_
