// GoogleTest printing of json::Value for the common/json tests (failures show the JSON text).
#ifndef MAGICPIG_COMMON_JSON_TEST_PRINTING_H_
#define MAGICPIG_COMMON_JSON_TEST_PRINTING_H_

#include <ostream>

#include "common/json/serialize.h"
#include "common/json/value.h"

namespace magicpig::json {

inline void PrintTo(const Value& value, std::ostream* os) { *os << Serialize(value); }

}  // namespace magicpig::json

#endif  // MAGICPIG_COMMON_JSON_TEST_PRINTING_H_
