#include "common/process_runtime.h"

#include "absl/synchronization/mutex.h"

namespace magicpig {

void ConfigureProcessRuntime() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace magicpig
