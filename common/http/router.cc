// Router: exact path + method routing (router.h).
#include "common/http/router.h"

namespace magicpig::http {

Router& Router::Handle(std::string method, std::string path, Handler handler) {
  auto& methods = routes_[std::move(path)];
  for (auto& [m, h] : methods) {
    if (m == method) {
      h = std::move(handler);
      return *this;
    }
  }
  methods.emplace_back(std::move(method), std::move(handler));
  return *this;
}

const Handler* Router::Find(std::string_view method, std::string_view path,
                            std::string* allow) const {
  allow->clear();
  const auto it = routes_.find(path);
  if (it == routes_.end()) return nullptr;
  for (const auto& [m, h] : it->second) {
    if (m == method) return &h;
  }
  for (const auto& [m, h] : it->second) {
    if (!allow->empty()) allow->append(", ");
    allow->append(m);
  }
  return nullptr;
}

}  // namespace magicpig::http
