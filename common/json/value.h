// json::Value: an in-memory JSON document (null, boolean, number, string, array, object).
//
// Numbers keep a double and, when they came from an integer literal that fits int64 exactly (or
// were built from an integer), the exact int64 as well, so token ids and 64-bit seeds survive a
// round trip: `is_int()` / `as_int()`. Objects keep insertion order in a vector of members;
// `Set` replaces the value of an existing key in place, so keys are unique (the parser applies the
// same rule: on duplicate keys the last value wins, at the position of the first, as Python's
// json does). Lookups are linear: objects in requests are small.
//
//   json::Value msg = json::Value::Object();
//   msg.Set("role", "assistant");
//   msg.Set("content", text);
//   json::Value ids = json::Value::Array();
//   ids.Push(int64_t{50256});
//   if (const json::Value* t = request.Find("temperature"); t != nullptr && t->is_number()) ...
//
// The as_* accessors require the matching type and abort with a message otherwise (check with
// is_* or Find first; a type mismatch on input is the caller's INVALID_ARGUMENT to report, see
// TypeName). Values are regular types: copyable, movable, comparable with ==.
//
// Thread-safety: like std::vector, const methods may run concurrently; mutation needs exclusion.
#ifndef MAGICPIG_COMMON_JSON_VALUE_H_
#define MAGICPIG_COMMON_JSON_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace magicpig::json {

class Value {
 public:
  // The order matches the storage variant's alternatives.
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

  using Member = std::pair<std::string, Value>;
  using Elements = std::vector<Value>;
  using Members = std::vector<Member>;

  // Null.
  Value() = default;
  Value(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  // Exactly bool (a template so that pointers do not silently convert to a boolean).
  template <typename T, std::enable_if_t<std::is_same_v<T, bool>, int> = 0>
  Value(T b) : v_(b) {}  // NOLINT(google-explicit-constructor)
  // Any integer type (int, int64_t, size_t, ...): exact when it fits int64, otherwise (a uint64
  // above INT64_MAX) a plain double.
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T i) : v_(MakeInt(i)) {}  // NOLINT(google-explicit-constructor)
  // A double is never is_int(), even when integral (it prints the same; see operator==).
  Value(double d) : v_(Number{d, 0, false}) {}       // NOLINT(google-explicit-constructor)
  Value(std::string s) : v_(std::move(s)) {}         // NOLINT(google-explicit-constructor)
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT(google-explicit-constructor)

  // Value::Array: an array holding `elements`.
  static Value Array(Elements elements = {});
  // Value::Object: an object holding `members`, added in order with Set (a later duplicate key
  // replaces the earlier value).
  static Value Object(Members members = {});

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_null() const { return type() == Type::kNull; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_number() const { return type() == Type::kNumber; }
  // A number from an integer literal (no fraction, no exponent, not "-0") that fits int64, or
  // built from an integer that fits.
  bool is_int() const {
    const Number* n = std::get_if<Number>(&v_);
    return n != nullptr && n->is_int;
  }
  bool is_string() const { return type() == Type::kString; }
  bool is_array() const { return type() == Type::kArray; }
  bool is_object() const { return type() == Type::kObject; }

  bool as_bool() const;
  // Any number; for an integer this is the nearest double.
  double as_double() const;
  // Requires is_int().
  int64_t as_int() const;
  const std::string& as_string() const;
  const Elements& as_array() const;
  const Members& as_object() const;
  // Direct access for building; keys added through mutable_object() must stay unique.
  std::string& mutable_string();
  Elements& mutable_array();
  Members& mutable_object();

  // The member's value, or nullptr if absent or this is not an object.
  const Value* Find(std::string_view key) const;
  Value* Find(std::string_view key);

  // Value::Set: requires an object. Replaces the value if `key` is present (keeping its position),
  // otherwise appends. Returns the stored value.
  Value& Set(std::string key, Value value);
  // Value::Push: requires an array. Appends and returns the stored value.
  Value& Push(Value value);

  // Elements of an array or members of an object; 0 for other types.
  size_t size() const;

  // Structural equality. Numbers compare by mathematical value (an int64 equals a double only
  // when the double is exactly that integer; -0 equals 0); objects compare as key -> value maps
  // (member order is ignored, as in Python).
  friend bool operator==(const Value& a, const Value& b);

 private:
  struct Number {
    double d;
    int64_t i;    // valid when is_int
    bool is_int;  // d == static_cast<double>(i) when set
  };

  template <typename T>
  static Number MakeInt(T i) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (i > static_cast<T>(INT64_MAX)) return Number{static_cast<double>(i), 0, false};
    }
    const auto v = static_cast<int64_t>(i);
    return Number{static_cast<double>(v), v, true};
  }

  std::variant<std::monostate, bool, Number, std::string, Elements, Members> v_;
};

// "null", "boolean", "number", "string", "array" or "object", for error messages.
std::string_view TypeName(Value::Type type);

}  // namespace magicpig::json

#endif  // MAGICPIG_COMMON_JSON_VALUE_H_
