// Status plumbing shared by every library: early-return macros over absl::Status / StatusOr.
//
//   MAGICPIG_RETURN_IF_ERROR(DoThing());
//   MAGICPIG_ASSIGN_OR_RETURN(auto file, GgufFile::Open(path));
#ifndef MAGICPIG_COMMON_STATUS_MACROS_H_
#define MAGICPIG_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MAGICPIG_STATUS_CONCAT_INNER(a, b) a##b
#define MAGICPIG_STATUS_CONCAT(a, b) MAGICPIG_STATUS_CONCAT_INNER(a, b)

#define MAGICPIG_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status magicpig_status_ = (expr);            \
    if (!magicpig_status_.ok()) return magicpig_status_; \
  } while (0)

#define MAGICPIG_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(*tmp)

#define MAGICPIG_ASSIGN_OR_RETURN(lhs, expr) \
  MAGICPIG_ASSIGN_OR_RETURN_IMPL(MAGICPIG_STATUS_CONCAT(magicpig_statusor_, __LINE__), lhs, expr)

#endif  // MAGICPIG_COMMON_STATUS_MACROS_H_
