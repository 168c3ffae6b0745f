# Per-ISA flags for kernel translation units (the only places wider instructions may appear; the
# rest of the build stays at the x86-64 baseline, no -march=native).
set(MAGICPIG_AVX2_FLAGS -mavx2 -mfma -mf16c)
# (-Wno-*uninitialized: GCC 12 warns inside avx512fintrin.h about its own _mm*_undefined_* temps.)
set(MAGICPIG_AVX512_FLAGS -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma
    -mf16c -Wno-uninitialized -Wno-maybe-uninitialized)

# magicpig_cc_test(NAME name SRCS ... DEPS ...): a GoogleTest binary registered with CTest.
function(magicpig_cc_test)
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT MAGICPIG_BUILD_TESTS)
    return()
  endif()
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  # A test that includes gmock's matchers links gmock (not reached through gtest alone).
  foreach(src IN LISTS T_SRCS)
    file(READ ${CMAKE_CURRENT_SOURCE_DIR}/${src} text)
    if(text MATCHES "#include \"gmock/")
      target_link_libraries(${T_NAME} PRIVATE GTest::gmock)
      break()
    endif()
  endforeach()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES LABELS unit
                       ENVIRONMENT "MAGICPIG_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
