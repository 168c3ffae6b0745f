# magicpig_cc_test(NAME name SRCS ... DEPS ...): a GoogleTest binary registered with CTest.
function(magicpig_cc_test)
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT MAGICPIG_BUILD_TESTS)
    return()
  endif()
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES LABELS unit
                       ENVIRONMENT "MAGICPIG_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
