// An allocator for std::vector buffers that are large and written in full right after they are
// sized (LSH table indices, transposed codes):
// - resize() leaves the elements default-initialised (for arithmetic types: not written) instead
//   of zero-filling memory that the next pass overwrites;
// - allocations of kHugePageMinBytes or more ask the kernel for transparent huge pages
//   (madvise(MADV_HUGEPAGE), for the 2 MiB-aligned part): one fault per 2 MiB instead of per
//   4 KiB when the buffer is first written, and fewer TLB misses when it is read at random. Where
//   huge pages are off or unsupported the advice is ignored and nothing else changes.
#ifndef MAGICPIG_COMMON_LARGE_BUFFER_ALLOCATOR_H_
#define MAGICPIG_COMMON_LARGE_BUFFER_ALLOCATOR_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace magicpig {

inline constexpr size_t kHugePageMinBytes = size_t{4} << 20;

// Advises huge pages for the 2 MiB-aligned pages inside [p, p + bytes).
inline void AdviseHugePages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

template <class T>
class LargeBufferAllocator : public std::allocator<T> {
 public:
  template <class U>
  struct rebind {
    using other = LargeBufferAllocator<U>;
  };
  LargeBufferAllocator() noexcept = default;
  template <class U>
  LargeBufferAllocator(const LargeBufferAllocator<U>&) noexcept {}  // NOLINT(runtime/explicit)

  T* allocate(size_t n) {
    T* p = std::allocator<T>::allocate(n);
    if (n * sizeof(T) >= kHugePageMinBytes) AdviseHugePages(p, n * sizeof(T));
    return p;
  }

  // Value-less construction default-initialises; everything else constructs as usual.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <class T, class U>
bool operator==(const LargeBufferAllocator<T>&, const LargeBufferAllocator<U>&) noexcept {
  return true;
}

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_LARGE_BUFFER_ALLOCATOR_H_
