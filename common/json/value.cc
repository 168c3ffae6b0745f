// json::Value accessors, mutators and equality.
#include "common/json/value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace magicpig::json {
namespace {

[[noreturn]] void TypeMismatch(const char* accessor, Value::Type actual) {
  const std::string_view name = TypeName(actual);
  std::fprintf(stderr, "json::Value::%s called on a value of type %.*s\n", accessor,
               static_cast<int>(name.size()), name.data());
  std::abort();
}

// True when the double is exactly the integer i.
bool DoubleEqualsInt(double d, int64_t i) {
  // [-2^63, 2^63) is the range where the cast below is defined.
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return false;
  if (d != std::trunc(d)) return false;
  return static_cast<int64_t>(d) == i;
}

}  // namespace

Value Value::Array(Elements elements) {
  Value v;
  v.v_ = std::move(elements);
  return v;
}

Value Value::Object(Members members) {
  Value v;
  v.v_ = Members();
  for (Member& m : members) v.Set(std::move(m.first), std::move(m.second));
  return v;
}

bool Value::as_bool() const {
  if (!is_bool()) TypeMismatch("as_bool", type());
  return *std::get_if<bool>(&v_);
}

double Value::as_double() const {
  if (!is_number()) TypeMismatch("as_double", type());
  return std::get_if<Number>(&v_)->d;
}

int64_t Value::as_int() const {
  if (!is_int()) TypeMismatch("as_int", type());
  return std::get_if<Number>(&v_)->i;
}

const std::string& Value::as_string() const {
  if (!is_string()) TypeMismatch("as_string", type());
  return *std::get_if<std::string>(&v_);
}

const Value::Elements& Value::as_array() const {
  if (!is_array()) TypeMismatch("as_array", type());
  return *std::get_if<Elements>(&v_);
}

const Value::Members& Value::as_object() const {
  if (!is_object()) TypeMismatch("as_object", type());
  return *std::get_if<Members>(&v_);
}

std::string& Value::mutable_string() {
  if (!is_string()) TypeMismatch("mutable_string", type());
  return *std::get_if<std::string>(&v_);
}

Value::Elements& Value::mutable_array() {
  if (!is_array()) TypeMismatch("mutable_array", type());
  return *std::get_if<Elements>(&v_);
}

Value::Members& Value::mutable_object() {
  if (!is_object()) TypeMismatch("mutable_object", type());
  return *std::get_if<Members>(&v_);
}

const Value* Value::Find(std::string_view key) const {
  const Members* members = std::get_if<Members>(&v_);
  if (members == nullptr) return nullptr;
  for (const Member& m : *members) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

Value* Value::Find(std::string_view key) {
  return const_cast<Value*>(static_cast<const Value*>(this)->Find(key));
}

Value& Value::Set(std::string key, Value value) {
  Members& members = mutable_object();
  for (Member& m : members) {
    if (m.first == key) {
      m.second = std::move(value);
      return m.second;
    }
  }
  members.emplace_back(std::move(key), std::move(value));
  return members.back().second;
}

Value& Value::Push(Value value) {
  Elements& elements = mutable_array();
  elements.push_back(std::move(value));
  return elements.back();
}

size_t Value::size() const {
  if (const Elements* e = std::get_if<Elements>(&v_)) return e->size();
  if (const Members* m = std::get_if<Members>(&v_)) return m->size();
  return 0;
}

bool operator==(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kNull:
      return true;
    case Value::Type::kBool:
      return a.as_bool() == b.as_bool();
    case Value::Type::kNumber: {
      const Value::Number& x = *std::get_if<Value::Number>(&a.v_);
      const Value::Number& y = *std::get_if<Value::Number>(&b.v_);
      if (x.is_int && y.is_int) return x.i == y.i;
      if (x.is_int) return DoubleEqualsInt(y.d, x.i);
      if (y.is_int) return DoubleEqualsInt(x.d, y.i);
      return x.d == y.d;
    }
    case Value::Type::kString:
      return a.as_string() == b.as_string();
    case Value::Type::kArray:
      return a.as_array() == b.as_array();
    case Value::Type::kObject: {
      const Value::Members& x = a.as_object();
      const Value::Members& y = b.as_object();
      if (x.size() != y.size()) return false;
      // Keys are unique on both sides, so equal sizes and every key of x found in y with an equal
      // value means equal maps. Same order is the common case and costs one pass.
      for (size_t k = 0; k < x.size(); ++k) {
        if (x[k].first == y[k].first) {
          if (!(x[k].second == y[k].second)) return false;
          continue;
        }
        const Value* other = b.Find(x[k].first);
        if (other == nullptr || !(x[k].second == *other)) return false;
      }
      return true;
    }
  }
  return false;
}

std::string_view TypeName(Value::Type type) {
  switch (type) {
    case Value::Type::kNull:
      return "null";
    case Value::Type::kBool:
      return "boolean";
    case Value::Type::kNumber:
      return "number";
    case Value::Type::kString:
      return "string";
    case Value::Type::kArray:
      return "array";
    case Value::Type::kObject:
      return "object";
  }
  return "unknown";
}

}  // namespace magicpig::json
