// magicpig's JSON library: json::Value, strict json::Parse, json::Serialize / json::Quote.
//
// Written for the OpenAI-compatible HTTP server: request bodies are untrusted and parsed strictly
// (RFC 8259) with located error messages; responses and streaming chunks are always valid UTF-8.
// See value.h, parse.h and serialize.h.
//
//   MAGICPIG_ASSIGN_OR_RETURN(json::Value request, json::Parse(body));
//   const json::Value* max_tokens = request.Find("max_tokens");
//   if (max_tokens != nullptr && !max_tokens->is_int()) {
//     return absl::InvalidArgumentError(absl::StrCat("max_tokens must be an integer, not a ",
//                                                    json::TypeName(max_tokens->type())));
//   }
#ifndef MAGICPIG_COMMON_JSON_JSON_H_
#define MAGICPIG_COMMON_JSON_JSON_H_

#include "common/json/parse.h"      // IWYU pragma: export
#include "common/json/serialize.h"  // IWYU pragma: export
#include "common/json/value.h"      // IWYU pragma: export

#endif  // MAGICPIG_COMMON_JSON_JSON_H_
