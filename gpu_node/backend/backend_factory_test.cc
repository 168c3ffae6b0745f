#include "gpu_node/backend/backend_factory.h"

#include "gtest/gtest.h"

namespace magicpig::backend {
namespace {

TEST(BackendFactoryTest, CpuIsAlwaysThere) {
  auto b = MakeBackend(BackendOptions{BackendKind::kCpu, 1, false, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cpu");
  EXPECT_TRUE((*b)->host_memory());
}

TEST(BackendFactoryTest, AutoPicksCudaExactlyWhenADeviceIsVisible) {
  auto b = MakeBackend(BackendOptions{BackendKind::kAuto, 1, false, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), VisibleCudaDevices() > 0 ? "cuda" : "cpu");
}

TEST(BackendFactoryTest, CudaWithoutADeviceIsAClearError) {
  if (VisibleCudaDevices() > 0) {
    auto b = MakeBackend(BackendOptions{BackendKind::kCuda, 1, false, VisibleCudaDevices()});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
    GTEST_SKIP() << "a CUDA device is visible: only the bad-index case was checked";
  }
  auto b = MakeBackend(BackendOptions{BackendKind::kCuda, 1, false, 0});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find(CudaBackendBuilt() ? "no CUDA device" : "no CUDA backend"),
            absl::string_view::npos)
      << b.status();
}

}  // namespace
}  // namespace magicpig::backend
